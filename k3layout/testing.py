"""Hypothesis strategies and invariant checks for sweeping the planner.

Used by this project's own property tests and importable by engines for theirs::

    from hypothesis import given
    from k3layout import plan
    from k3layout.testing import plannable_inputs, plan_invariant_violations

    @given(plannable_inputs())
    def test_every_plan_holds_together(inputs):
        model, deployment = inputs
        assert plan_invariant_violations(plan(model, deployment)) == []

Needs ``hypothesis`` (``pip install k3layout[dev]``).
"""

from __future__ import annotations

import math
from functools import reduce

from hypothesis import strategies as st

from .constants import MLA_KERNEL_BLOCK_TOKENS, PARENT_ALIGNMENT_BYTES
from .deployment import CONV_LAYOUTS, ENGINES, Deployment, EngineFlavour
from .dtypes import KV_CACHE_DTYPES
from .errors import RefusalCode
from .layouts import EngineLayout, ParentPlan, VllmPlan
from .layouts.groups import num_planes
from .layouts.vllm import block_tokens_for
from .model import PRESETS, HybridModel, KDALayer, Layer, MLALayer, preset
from .placements import pp_stage_bounds

__all__ = [
    "deployments",
    "hybrid_models",
    "kda_layers",
    "mla_layers",
    "models",
    "plan_invariant_violations",
    "plannable_inputs",
    "preset_models",
    "refused_inputs",
]

HEAD_COUNTS = (4, 8, 12, 16, 24, 32, 48, 64, 96)


def mla_layers(num_heads: int | None = None) -> st.SearchStrategy[MLALayer]:
    """MLA layers with small latents, optionally with a DSA index row."""
    return st.builds(
        MLALayer,
        num_heads=st.just(num_heads) if num_heads else st.sampled_from(HEAD_COUNTS),
        kv_lora_rank=st.sampled_from((128, 256, 512)),
        qk_rope_head_dim=st.sampled_from((32, 64)),
        q_lora_rank=st.one_of(st.none(), st.sampled_from((256, 1536))),
        index_bytes_per_token=st.sampled_from((0, 0, 132)),
    )


def kda_layers(num_heads: int | None = None) -> st.SearchStrategy[KDALayer]:
    """KDA layers with a range of heads, head dims and conv kernels."""
    return st.builds(
        KDALayer,
        num_heads=st.just(num_heads) if num_heads else st.sampled_from(HEAD_COUNTS),
        head_dim=st.sampled_from((32, 64, 128)),
        conv_kernel=st.sampled_from((2, 3, 4)),
    )


@st.composite
def hybrid_models(
    draw: st.DrawFn, max_layers: int = 48, draft: bool | None = None, kda: bool = True
) -> HybridModel:
    """Hybrid models: one MLA and one KDA geometry, any layer pattern with at least one MLA
    layer, optionally draft layers (``draft=None``: either) and DSA index rows."""
    num_layers = draw(st.integers(1, max_layers))
    heads = draw(st.sampled_from(HEAD_COUNTS))
    mla = draw(mla_layers(heads))
    kda_layer = draw(kda_layers(draw(st.sampled_from((heads, heads * 2, heads // 2 or 1)))))
    kinds = draw(st.lists(st.booleans(), min_size=num_layers, max_size=num_layers))
    if not kda:
        kinds = [True] * num_layers
    if not any(kinds):
        kinds[draw(st.integers(0, num_layers - 1))] = True
    layers: tuple[Layer, ...] = tuple(mla if is_mla else kda_layer for is_mla in kinds)
    least, most = {None: (0, 6), True: (1, 6), False: (0, 0)}[draft]
    num_draft = draw(st.integers(least, most))
    return HybridModel(
        name=f"synthetic-{num_layers}",
        model_type="kimi_k3",
        layers=layers,
        draft_layers=(mla,) * num_draft,
    )


def preset_models() -> st.SearchStrategy[HybridModel]:
    """The built-in presets."""
    return st.sampled_from(tuple(PRESETS)).map(preset)


def models() -> st.SearchStrategy[HybridModel]:
    """Presets and synthetic hybrid models."""
    return st.one_of(preset_models(), hybrid_models())


def _heads(model: HybridModel) -> int:
    return reduce(math.gcd, (layer.num_heads for layer in model.module_layers))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def deployments(
    draw: st.DrawFn,
    model: HybridModel,
    engine: EngineFlavour | None = None,
    plannable: bool = True,
) -> Deployment:
    """Deployments of ``model``. With ``plannable`` the parallelism is valid for the model
    (attention TP divides the heads, DCP divides TP, PP fits the layers); the packing may still
    be refused (padding limit), which a sweep must accept as a refusal with a code."""
    engine = engine or draw(st.sampled_from(ENGINES))
    heads = _heads(model)
    attn_tp = draw(st.sampled_from(_divisors(heads)) if plannable else st.integers(1, 2 * heads))
    dcp = 1
    if engine == "vllm":
        dcp = draw(st.sampled_from(_divisors(attn_tp)) if plannable else st.integers(1, 16))
    pp = draw(st.integers(1, min(model.num_layers, 8)))
    block = draw(st.one_of(st.none(), st.sampled_from((16, 64, 128, 256, 512, 2048))))
    # Every raised block is a multiple of 128, so an interleave of up to 16 always divides it.
    interleave = draw(st.sampled_from((1, 1, 2, 4, 8, 16)))
    return Deployment(
        engine=engine,
        attn_tp=attn_tp,
        attn_dp=draw(st.sampled_from((1, 1, 2, 8))),
        pp=pp,
        dcp=dcp,
        dcp_interleave=interleave,
        kv_dtype=draw(st.sampled_from(KV_CACHE_DTYPES)),
        spec_tokens=draw(st.integers(0, 7)),
        block_tokens=block,
        max_padding=draw(st.one_of(st.none(), st.floats(0.05, 1.0))),
        replayssm=draw(st.booleans()),
        conv_layout=draw(st.sampled_from(CONV_LAYOUTS)),
    )


@st.composite
def plannable_inputs(
    draw: st.DrawFn, engine: EngineFlavour | None = None
) -> tuple[HybridModel, Deployment]:
    """A model and a deployment whose parallelism is valid for it."""
    model = draw(models())
    return model, draw(deployments(model, engine=engine))


@st.composite
def refused_inputs(draw: st.DrawFn) -> tuple[HybridModel, Deployment, RefusalCode]:
    """Near misses: one rule broken on purpose, with the refusal code it must raise."""
    model = draw(models())
    heads = _heads(model)
    case = draw(st.sampled_from(("heads", "dcp", "pp", "dcp_parent")))
    if case == "heads":
        tp = draw(st.integers(2, 4 * heads).filter(lambda t: heads % t != 0))
        return model, Deployment(attn_tp=tp), "heads_not_divisible"
    if case == "dcp":
        tp = draw(st.sampled_from(_divisors(heads)))
        dcp = draw(st.integers(2, 32).filter(lambda d: tp % d != 0))
        return model, Deployment(attn_tp=tp, dcp=dcp), "dcp_not_dividing_tp"
    if case == "pp":
        pp = draw(st.integers(model.num_layers + 1, model.num_layers + 8))
        return model, Deployment(pp=pp), "pp_too_deep"
    tp = draw(st.sampled_from([d for d in _divisors(heads) if d > 1] or [1]))
    return (
        model,
        Deployment(engine="parent", attn_tp=tp, dcp=tp if tp > 1 else 2),
        ("dcp_unsupported" if tp > 1 else "dcp_not_dividing_tp"),
    )


def _common_violations(result: EngineLayout) -> list[str]:
    model = result.model
    problems: list[str] = []
    module_ids = list(range(len(model.module_layers)))
    grouped = sorted(layer for group in result.groups for layer in group.layers)
    if grouped != module_ids:
        problems.append(f"groups do not partition the module layers: {grouped} != {module_ids}")
    for group in result.groups:
        wanted = "mla" if group.kind == "attention" else "kda"
        wrong = [i for i in group.layers if model.module_layers[i].kind != wanted]
        if wrong:
            problems.append(f"group {group.name} ({group.kind}) holds layers {wrong}")
    if result.num_planes != num_planes(result.groups):
        problems.append(f"num_planes {result.num_planes} != longest group")
    bounds = pp_stage_bounds(model.num_layers, result.deployment.pp, result.deployment.pp_partition)
    held = [layer for stage in result.stages for layer in stage.layers]
    if sorted(held) != module_ids or len(result.stages) != len(bounds):
        problems.append("stages do not partition the module layers")
    for stage in result.stages:
        if len(stage.groups) != len(result.groups):
            problems.append(f"stage {stage.index} has {len(stage.groups)} groups")
        for mine, whole in zip(stage.groups, result.groups, strict=False):
            kept = tuple(layer for layer in whole.layers if layer in stage.layers)
            if mine.name != whole.name or mine.layers != kept:
                problems.append(f"stage {stage.index} group {mine.name} is not a projection")
    sizes = result.sizes
    if sizes.attention_bytes_per_token <= 0 or (sizes.state and sizes.state_bytes <= 0):
        problems.append("a size is not positive")
    if (sizes.state is None) != (not model.kda_layer_ids):
        problems.append("KDA sizes present without KDA layers (or missing with them)")
    return problems


def _vllm_violations(result: VllmPlan) -> list[str]:
    problems: list[str] = []
    sizes = result.sizes
    align = max(MLA_KERNEL_BLOCK_TOKENS, result.deployment.block_tokens or 0)
    if result.block_tokens % align:
        problems.append(f"block {result.block_tokens} is not a multiple of {align}")
    if result.block_tokens != block_tokens_for(sizes, result.deployment.block_tokens):
        problems.append("block is not the raise of the requested block")
    if result.page_bytes != result.block_tokens * sizes.attention_bytes_per_token:
        problems.append("page is not block x attention bytes per token")
    state = sizes.kda_state_bytes
    if state > result.page_bytes:
        problems.append(f"KDA state {state} does not fit the page {result.page_bytes}")
    if state and (result.block_tokens - align) * sizes.attention_bytes_per_token >= state:
        problems.append("a smaller block would hold the state: the raise is not minimal")
    if result.block_bytes != result.num_planes * result.page_bytes:
        problems.append("block bytes are not planes x page")
    if result.block_tokens % result.deployment.dcp_interleave:
        problems.append("DCP interleave does not divide the block")
    return problems


def _parent_violations(result: ParentPlan) -> list[str]:
    problems: list[str] = []
    packing = result.packing
    page = result.mla_page_bytes
    state = result.sizes.kda_state_bytes
    if packing.plane_bytes != packing.mla_pages * page:
        problems.append("plane is not exactly p_m MLA pages (exact page stride)")
    if packing.plane_bytes % PARENT_ALIGNMENT_BYTES:
        problems.append("plane is not 256-byte aligned")
    if state and packing.state_pages * state > packing.plane_bytes:
        problems.append("p_l states do not fit the plane")
    if state and packing.state_pages < 1:
        problems.append("no state page per plane")
    if result.parent_bytes != result.num_planes * packing.plane_bytes:
        problems.append("parent is not planes x plane")
    limit = result.max_padding
    for name, fraction in result.padding_fraction.items():
        if fraction < -1e-12:
            problems.append(f"negative padding {fraction} for {name}")
        if limit is not None and fraction > limit + 1e-12:
            problems.append(f"padding {fraction:.4f} of {name} exceeds {limit}")
    for name, share in result.utilization.items():
        if not 0 < share <= 1 + 1e-12:
            problems.append(f"utilization {share} of {name} outside (0, 1]")
    if result.num_planes != len(result.model.attention_layer_ids):
        problems.append("planes are not one per MLA layer plus draft")
    return problems


def plan_invariant_violations(result: VllmPlan | ParentPlan) -> list[str]:
    """Every invariant of ``result`` that does not hold, described (``[]`` when all hold):
    groups partition the layers by kind, planes match groups, stages partition the layers and
    project the groups, sizes positive; per engine, the block raise or the packing rules."""
    problems = _common_violations(result)
    if isinstance(result, VllmPlan):
        return problems + _vllm_violations(result)
    return problems + _parent_violations(result)
