"""What the ride needs of one pipeline stage of a ``vllm`` plan: its groups and their planes.

vLLM shares plane ``j`` between layer ``j`` of every group, so on a rank the state of KDA layer
``j`` of any group starts where attention layer ``j`` of the stage's attention group starts.
The ride publishes that attention layer's pages, so every plane a KDA layer sits on needs an
attention layer; a pipeline stage whose KDA groups are longer than its attention groups has
state on planes no attention layer publishes, and is refused.
"""

from __future__ import annotations

from ..errors import CheckName, Refusal, check_refusal
from ..layouts import EngineLayout, Stage
from ..layouts.protocol import check_planes


def ridable(plan: EngineLayout) -> EngineLayout:
    """``plan`` if its state rides the PAGE object; refuses (``engine_mismatch``) a layout
    whose state pages are not whole attention pages (the ``tokenspeed`` engine), and
    (``layout_unsupported``) a block-outermost vLLM layout, whose planes the ride's views do
    not describe."""
    check_planes(plan, "the ride")
    if plan.block_outermost:
        raise Refusal(
            "layout_unsupported",
            "kv_cache_layout=BLHNC: the ride publishes layer-outermost planes (LBNHC)",
            facts={"kv_cache_layout": "BLHNC"},
            hint="plan the ride's deployment with kv_cache_layout='LBNHC'",
        )
    if plan.state_rides_pages:
        return plan
    raise Refusal(
        "engine_mismatch",
        f"plan engine={plan.engine}: the state rides the PAGE object only in vLLM's hybrid "
        "layout (engine=vllm), where a KDA layer shares its plane with an attention layer",
        facts={"engine": plan.engine, "required_engine": "vllm"},
        hint="plan the deployment with engine=vllm",
    )


def page_bytes(plan: EngineLayout) -> int:
    """The page every plane repeats per block (one size for every group of a riding plan)."""
    return plan.page_stride_bytes(plan.groups[0])


def num_image_planes(stage: Stage) -> int:
    """Planes one unit of the image spans: the stage's longest KDA group (0 without KDA)."""
    return max((len(group.layers) for group in stage.groups_of("kda")), default=0)


def image_attention_layers(stage: Stage, check: CheckName = "plane_order") -> tuple[int, ...]:
    """For every image plane ``j``, the module layer of the attention layer that publishes it:
    layer ``j`` of the first attention group that has one.

    K3 + DSpark, one stage: planes 0..22 are attention layers 3, 7, ..., 91 (the first 23 of
    the attention group); 92 and the draft's 93..97 are not aliased.
    """
    attention = stage.groups_of("attention")
    planes = num_image_planes(stage)
    if attention and len(attention[0].layers) >= planes:
        return attention[0].layers[:planes]  # the first attention group owns every plane
    layers: list[int] = []
    for plane in range(planes):
        owner = next((group for group in attention if plane < len(group.layers)), None)
        if owner is None:
            rider = next(group for group in stage.groups_of("kda") if plane < len(group.layers))
            num_attention = max((len(group.layers) for group in attention), default=0)
            raise check_refusal(
                "aliasing",
                f"stage {stage.index}: KDA group {rider.name} layer {plane} (module layer "
                f"{rider.layers[plane]}) sits on plane {plane}, which no attention layer of the "
                f"stage publishes (the stage has {num_attention} attention planes)",
                check=check,
                field="planes",
                stage=stage.index,
                expected=plane + 1,
                actual=num_attention,
                layer=rider.layers[plane],
                group=rider.name,
                position=plane,
                plane=plane,
                hint="split the pipeline so that every stage holds at least as many attention "
                "layers as its longest KDA group (Kimi-K3 at pp=1 does)",
            )
        layers.append(owner.layers[plane])
    return tuple(layers)
