"""The aliasing check: does every KDA layer's state start where the image expects it?

An engine reads, off the tensors it registered, each layer's base address, the bytes between
two blocks and the bytes it spans (a :class:`TensorView`), and publishes its attention layers
in some order. SPEC section 5's rule, checked exactly: **layer ``j`` of every KDA group starts
at the base address of published plane ``j`` and strides by the page**. A looser check ("starts
on one of the leading planes") passes layouts whose layers or groups are permuted; this one
names the first KDA layer that breaks the rule, the plane it is on and the plane it should be
on, and every layer that starts outside the image.

The seed's first boot: K3 + DSpark at TP 8 published in name order. The five draft layers and
``model.layers.11`` .. sort ahead of ``model.layers.3``, so KDA group 0 layer 0 starts on
plane 10 instead of 0, and layers 18..22 of every group start on planes 23..27, outside the
image's 23 planes (the loose check's refusal: "group 0 layer 18 starts on plane 23").

A whole KDA group exchanged with another, position for position, is not visible here: vLLM
puts layer ``j`` of *every* group on plane ``j``, so the addresses are the same either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, TypeAlias

from pydantic import NonNegativeInt

from .._args import expect_args, expect_bounded_int, expect_items, expect_mapping
from .._frozen import Frozen
from ..constants import MAX_RANKS
from ..errors import CheckName, check_refusal
from ..layouts import EngineLayout, LayoutBase
from ..names import LayerNames, engine_layer_names
from .plane_order import check_permutation, stage_attention_names
from .stage import image_attention_layers, page_bytes, ridable
from .views import TensorView, views_of

CHECK: CheckName = "check_aliasing"

MisplacedBy: TypeAlias = Literal["plane", "offset", "outside", "stride", "extent"]
"""How a KDA layer breaks the rule: on another ``plane``; inside its plane at an ``offset``;
``outside`` every published plane; a block ``stride`` that is not the page; or an ``extent``
that runs past the end of its plane."""


class Misplaced(Frozen):
    """A KDA layer that breaks the rule: layer ``layer`` of KDA group ``group`` (``unit``-th
    KDA group) found on ``found_plane`` (``None``: on no published plane), expected on
    ``expected_plane``."""

    unit: NonNegativeInt
    group: str
    layer: NonNegativeInt
    module_layer: NonNegativeInt
    layer_name: str
    found_plane: NonNegativeInt | None
    expected_plane: NonNegativeInt
    offset_bytes: int
    block_stride_bytes: int
    by: MisplacedBy

    @property
    def where(self) -> str:
        """The finding in words: ``KDA group 0 layer 18 starts on plane 23``."""
        found = "no published plane" if self.found_plane is None else f"plane {self.found_plane}"
        return f"KDA group {self.unit} layer {self.layer} starts on {found}"


def _locate(
    view: TensorView, planes: Sequence[TensorView], expected: int
) -> tuple[int | None, int]:
    """The published plane ``view`` starts on, and how far into it: the expected plane if it
    starts there (attention layers of several groups may share a plane), else the first plane
    that starts there, else the first that holds the address."""
    if expected < len(planes) and planes[expected].base_address == view.base_address:
        return expected, 0
    for index, plane in enumerate(planes):
        if plane.base_address == view.base_address:
            return index, 0
    for index, plane in enumerate(planes):
        if plane.base_address <= view.base_address < plane.end_address:
            return index, view.base_address - plane.base_address
    return None, 0


def aliasing_problems(
    plan: EngineLayout,
    views: Mapping[str, TensorView],
    published: Sequence[str],
    *,
    stage: int = 0,
    names: LayerNames | None = None,
) -> tuple[Misplaced, ...]:
    """Every KDA layer of the stage that does not start at published plane ``j`` (its position
    ``j`` in its group) with the page as block stride; ``()`` when the layout is right.

    ``published`` is the engine's order of attention layer names (PAGE plane ``p`` is
    ``published[p]``). Refuses ``layer_names`` for names that do not match the stage and
    ``aliasing`` for an attention plane whose block stride is not the page, and
    (``invalid_argument``) arguments of the wrong type.
    """
    _check_arguments(plan, views, published, stage, names)
    return _problems(plan, views, published, stage, names)


def _check_arguments(
    plan: object, views: object, published: object, stage: object, names: object
) -> None:
    expect_args(("plan", plan, (LayoutBase,)), ("names", names, (LayerNames, type(None))))
    expect_mapping("views", views, str, TensorView)
    expect_bounded_int("stage", stage, MAX_RANKS)
    expect_items("published", published, str)


def _problems(
    plan: EngineLayout,
    views: Mapping[str, TensorView],
    published: Sequence[str],
    stage: int,
    names: LayerNames | None,
) -> tuple[Misplaced, ...]:
    plan = ridable(plan)
    names = names or engine_layer_names(plan.model)
    names.check_covers(plan.model)
    on_stage = plan.stage(stage)
    check_permutation(published, stage_attention_names(on_stage, names), stage, CHECK)
    image_attention_layers(on_stage, CHECK)  # every image plane has an attention layer
    page = page_bytes(plan)
    planes = views_of(views, published, stage, CHECK)
    for index, (name, plane) in enumerate(zip(published, planes, strict=True)):
        if plane.block_stride_bytes != page:
            group, position = plan.group_of(names.layer_of(name), stage)
            raise check_refusal(
                "aliasing",
                f"attention layer {name} (plane {index}) strides by "
                f"{plane.block_stride_bytes} B per block, not the page ({page} B)",
                check=CHECK,
                field="block_stride_bytes",
                stage=stage,
                expected=page,
                actual=plane.block_stride_bytes,
                layer=names.layer_of(name),
                layer_name=name,
                group=group.name,
                position=position,
                plane=index,
                hint="register each attention layer as num_blocks x page",
            )
    problems: list[Misplaced] = []
    for unit, group in enumerate(on_stage.groups_of("kda")):
        layer_names = tuple(names.name(layer) for layer in group.layers)
        for j, (module_layer, view) in enumerate(
            zip(group.layers, views_of(views, layer_names, stage, CHECK), strict=True)
        ):
            found, offset = _locate(view, planes, j)
            by: MisplacedBy | None = None
            if found is None:
                by = "outside"
            elif found != j:
                by = "plane"
            elif offset:
                by = "offset"
            elif view.block_stride_bytes != page:
                by = "stride"
            elif view.end_address > planes[j].end_address:
                by = "extent"
            if by is not None:
                problems.append(
                    Misplaced(
                        unit=unit,
                        group=group.name,
                        layer=j,
                        module_layer=module_layer,
                        layer_name=layer_names[j],
                        found_plane=found,
                        expected_plane=j,
                        offset_bytes=offset,
                        block_stride_bytes=view.block_stride_bytes,
                        by=by,
                    )
                )
    return tuple(problems)


def _rule_broken(first: Misplaced, published: Sequence[str], page: int) -> str:
    found = (
        "no published plane"
        if first.found_plane is None
        else f"plane {first.found_plane} ({published[first.found_plane]})"
    )
    where = f"KDA group {first.unit} layer {first.layer} ({first.layer_name}) starts on {found}"
    if first.by == "offset":
        return f"{where}, {first.offset_bytes} B past the plane's start"
    if first.by == "stride":
        return f"{where} but strides by {first.block_stride_bytes} B, not the page ({page} B)"
    if first.by == "extent":
        return f"{where} but runs past the end of that plane"
    expected = published[first.expected_plane]
    return f"{where}, expected plane {first.expected_plane} ({expected})"


def check_aliasing(
    plan: EngineLayout,
    views: Mapping[str, TensorView],
    published: Sequence[str],
    *,
    stage: int = 0,
    names: LayerNames | None = None,
) -> None:
    """Refuse (``aliasing``) a layout in which some KDA layer ``j`` does not start at published
    plane ``j`` with the page as stride; the message names the first such layer (group, layer,
    plane found, plane expected) and the layers that start outside the image."""
    _check_arguments(plan, views, published, stage, names)
    problems = _problems(plan, views, published, stage, names)
    if not problems:
        return
    plan = ridable(plan)
    on_stage = plan.stage(stage)
    num_image = len(image_attention_layers(on_stage))
    total = sum(len(group.layers) for group in on_stage.groups_of("kda"))
    outside = tuple(p for p in problems if p.found_plane is None or p.found_plane >= num_image)
    first = problems[0]
    message = (
        f"stage {stage}: {_rule_broken(first, published, page_bytes(plan))}; "
        f"{len(problems)} of {total} KDA layers break the rule (layer j of every KDA group "
        "starts at published plane j and strides by the page)"
    )
    if outside:
        message += (
            f", {len(outside)} start outside the image's {num_image} planes, "
            f"the first: {outside[0].where}"
        )
    raise check_refusal(
        "aliasing",
        message,
        check=CHECK,
        field="plane",
        stage=stage,
        expected=first.expected_plane,
        actual=first.found_plane,
        layer=first.module_layer,
        layer_name=first.layer_name,
        group=first.group,
        position=first.layer,
        plane=first.expected_plane,
        block=0,
        found_plane=first.found_plane,
        misplaced_by=first.by,
        num_misplaced=len(problems),
        outside_image=tuple(p.layer_name for p in outside),
        hint="publish the aliased attention layers first, in KDA-layer order (plane_order), "
        "and register each KDA layer's state at its plane's start with the page as stride",
    )
