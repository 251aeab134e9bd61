"""PAGE plane order: publish the attention layers the KDA state aliases first.

vLLM aliases KDA layer ``j`` of every group onto the ``j``-th attention layer it *allocates*
(module order), while an engine may publish the PAGE object's planes in *name* order. With
K3's DSpark draft the two differ: the five draft layers sort first, so KDA layer ``j`` would
sit on published plane ``j + 5`` (or further: ``model.layers.11`` sorts before
``model.layers.3``). The fix is to publish the aliased attention layers first, in KDA-layer
order (plane ``j`` = the attention layer KDA layer ``j`` aliases), then the rest in the order
given. The checkpoint image is then the leading planes, sized from allocation order.

K3 + DSpark, one stage::

    published plane   attention layer                    riders (KDA group, module layer)
    0                 model.layers.3.self_attn.attn      (linear_attention_0, 0), (_1, 1), (_2, 2)
    1                 model.layers.7.self_attn.attn      (linear_attention_0, 4), (_1, 5), (_2, 6)
    ...
    22                model.layers.91.self_attn.attn     (linear_attention_0, 88), ...
    23..28            the rest, in the given order (draft.layers.0..4, model.layers.92)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from functools import lru_cache

from pydantic import NonNegativeInt, model_validator

from .._args import expect_args, expect_bounded_int, expect_items, expect_mapping
from .._derivation import SelfChecked, is_deriving, mismatch
from .._frozen import Frozen, trusted
from ..constants import MAX_RANKS
from ..errors import CheckName, Refusal, check_refusal
from ..layouts import EngineLayout, Group, GroupKind, LayoutBase, PlaneMember, Stage
from ..names import LayerNames, engine_layer_names, sorted_names
from .stage import image_attention_layers, ridable
from .views import TensorView, views_of


class PlaneShare(Frozen):
    """One published plane: the attention layer that publishes it and the KDA layers whose
    state starts on the same bytes (``riders``: layer ``allocation_plane`` of each KDA group)."""

    plane: NonNegativeInt
    attention_layer: str
    module_layer: NonNegativeInt
    allocation_plane: NonNegativeInt
    riders: tuple[PlaneMember, ...]


class PlaneOrder(SelfChecked):
    """The publish order of one stage's attention layers, aliased planes first.

    ``given`` is the order the engine would publish in (name order by default), ``planes`` the
    reordered planes; the first ``num_image_planes`` are the ones the KDA state rides, plane
    ``j`` aliased by layer ``j`` of every KDA group.

    Built by hand (or loaded, or ``model_copy``'d), it is refused (``plan_mismatch``) unless
    plane ``j`` is published ``j``-th, the planes publish every given layer once, and image
    plane ``j`` is allocation plane ``j`` with KDA riders.
    """

    stage: NonNegativeInt
    given: tuple[str, ...]
    planes: tuple[PlaneShare, ...]
    num_image_planes: NonNegativeInt

    @model_validator(mode="after")
    def _holds_together(self) -> PlaneOrder:
        if is_deriving():
            return self
        thing = f"plane order of stage {self.stage}"
        for index, share in enumerate(self.planes):
            if share.plane != index:
                raise mismatch(
                    thing, f"planes[{index}].plane", "plane j is published j-th", share.plane, index
                )
            if any(rider.kind != "kda" for rider in share.riders):
                raise mismatch(
                    thing,
                    f"planes[{index}].riders",
                    "only KDA layers ride an attention plane",
                    tuple(rider.kind for rider in share.riders),
                    tuple("kda" for _ in share.riders),
                )
        if sorted(self.order) != sorted(self.given) or len(set(self.given)) != len(self.given):
            raise mismatch(
                thing,
                "planes",
                "the planes publish each given attention layer once",
                self.order,
                self.given,
            )
        if self.num_image_planes > len(self.planes):
            raise mismatch(
                thing,
                "num_image_planes",
                "the image planes are some of the planes",
                self.num_image_planes,
                len(self.planes),
            )
        for index, share in enumerate(self.image_planes):
            if share.allocation_plane != index or not share.riders:
                raise mismatch(
                    thing,
                    f"planes[{index}].allocation_plane",
                    "image plane j is allocation plane j, which KDA layers ride",
                    share.allocation_plane,
                    index,
                )
        return self

    @property
    def order(self) -> tuple[str, ...]:
        """Attention layer names in publish order."""
        return tuple(plane.attention_layer for plane in self.planes)

    @property
    def image_planes(self) -> tuple[PlaneShare, ...]:
        """The leading planes the checkpoint image covers."""
        return self.planes[: self.num_image_planes]

    @property
    def moved(self) -> bool:
        """Whether the publish order differs from the given order."""
        return self.order != self.given

    def plane_of(self, attention_layer: str) -> int:
        """The published plane of ``attention_layer``."""
        try:
            return self.order.index(attention_layer)
        except ValueError:
            raise Refusal(
                "layer_names",
                f"{attention_layer!r} is not an attention layer of stage {self.stage}",
                facts={"name": attention_layer, "stage": self.stage},
                hint="use one of the names in PlaneOrder.order",
            ) from None


def stage_attention_names(stage: Stage, names: LayerNames) -> tuple[str, ...]:
    """The stage's attention layer names in registration (module) order."""
    layers = sorted(
        layer for group in stage.groups if group.kind == "attention" for layer in group.layers
    )
    every_name = names.names
    if layers and layers[-1] >= len(every_name):
        return tuple(names.name(layer) for layer in layers)  # refuses the unnamed layer
    return tuple(every_name[layer] for layer in layers)


def check_permutation(
    given: Sequence[str], expected: Sequence[str], stage: int, check: CheckName
) -> None:
    """Refuse (``layer_names``) a publish order that is not the stage's attention layers,
    with the facts of ``check``."""
    expected_set, given_set = set(expected), set(given)
    unknown = tuple(name for name in dict.fromkeys(given) if name not in expected_set)
    missing = tuple(name for name in expected if name not in given_set)
    repeated = tuple(sorted(name for name, count in Counter(given).items() if count > 1))
    if unknown or missing or repeated:
        raise check_refusal(
            "layer_names",
            f"stage {stage}: the publish order must list each of the {len(expected)} attention "
            f"layers once (unknown {list(unknown)}, missing {list(missing)}, "
            f"repeated {list(repeated)})",
            check=check,
            field="names",
            stage=stage,
            expected=tuple(expected),
            actual=tuple(given),
            layer_name=(missing or unknown or repeated)[0],
            missing=missing,
            extra=unknown,
            repeated=repeated,
            hint="publish every attention layer of the stage exactly once, by its engine name",
        )


def _rider_refusal(
    stage: int,
    rider: Group,
    j: int,
    name: str,
    message: str,
    *,
    expected: str,
    actual: str | None,
    other_layer: str | None = None,
) -> Refusal:
    """KDA layer ``j`` of group ``rider`` does not start on the plane of the attention layer
    the plan aliases it with (``expected``; ``actual``: the one it starts on, if any)."""
    return check_refusal(
        "aliasing",
        f"stage {stage}: KDA group {rider.name} layer {j} ({name}) {message}",
        check="plane_order",
        field="plane",
        stage=stage,
        expected=expected,
        actual=actual,
        layer=rider.layers[j],
        layer_name=name,
        group=rider.name,
        position=j,
        plane=j,
        extra_facts={"other_layer": other_layer} if other_layer else None,
        hint="register every KDA layer's state on the plane of the attention layer it "
        "aliases (vLLM's hybrid allocator does): layer j of every group on plane j",
    )


def aliased_by_address(
    stage: Stage,
    names: LayerNames,
    given: Sequence[str],
    views: Mapping[str, TensorView],
    planned: Sequence[str],
) -> tuple[str, ...]:
    """For every image plane ``j``, the attention layer that starts where KDA layer ``j`` of the
    first group that has one starts (the planned one when several do); refuses ``aliasing``
    when none does."""
    attention = views_of(views, given, stage.index, "plane_order")
    aliased: list[str] = []
    for j, expected in enumerate(planned):
        rider = next(group for group in stage.groups_of("kda") if j < len(group.layers))
        rider_name = names.name(rider.layers[j])
        base = views_of(views, (rider_name,), stage.index, "plane_order")[0].base_address
        matches = [n for n, v in zip(given, attention, strict=True) if v.base_address == base]
        if not matches:
            raise _rider_refusal(
                stage.index,
                rider,
                j,
                rider_name,
                f"starts at {base:#x}, where no attention layer starts (expected {expected}'s "
                "plane)",
                expected=expected,
                actual=None,
            )
        chosen = expected if expected in matches else matches[0]
        if chosen in aliased:
            other = aliased.index(chosen)
            first = next(group for group in stage.groups_of("kda") if other < len(group.layers))
            raise _rider_refusal(
                stage.index,
                rider,
                j,
                rider_name,
                f"starts on the plane of {chosen}, which layer {other} already rides",
                expected=expected,
                actual=chosen,
                other_layer=names.name(first.layers[other]),
            )
        aliased.append(chosen)
    return tuple(aliased)


@lru_cache(maxsize=4096)
def _rider(group: str, kind: GroupKind, layer: int) -> PlaneMember:
    """A rider record, shared between plane orders (a frozen value: sharing is safe, and every
    plan of a model has the same riders)."""
    return trusted(PlaneMember, group=group, kind=kind, layer=layer)


@lru_cache(maxsize=256)
def _planes(
    on_stage: Stage, every_name: tuple[str, ...], ordered: tuple[str, ...]
) -> tuple[PlaneShare, ...]:
    """The plane shares of ``ordered`` (registered attention layers of ``on_stage``, checked by
    the caller): a pure function of frozen values, so memoised; module layers and allocation
    planes are looked up in tables built once."""
    layer_of = {name: layer for layer, name in enumerate(every_name)}
    allocation_of: dict[int, int] = {}
    riders_at: dict[int, list[tuple[str, GroupKind, int]]] = {}
    for group in on_stage.groups:
        for position, layer in enumerate(group.layers):
            allocation_of.setdefault(layer, position)
            if group.kind == "kda":
                riders_at.setdefault(position, []).append((group.name, group.kind, layer))
    planes: list[PlaneShare] = []
    for index, name in enumerate(ordered):
        module_layer = layer_of[name]
        allocation = allocation_of[module_layer]
        riders = tuple(riders_at.get(allocation, ()))
        planes.append(_share(index, name, module_layer, allocation, riders))
    return tuple(planes)


@lru_cache(maxsize=4096)
def _share(
    plane: int,
    attention_layer: str,
    module_layer: int,
    allocation_plane: int,
    riders: tuple[tuple[str, GroupKind, int], ...],
) -> PlaneShare:
    """A plane share record, shared between plane orders like its riders (keyed by plain
    values: hashing them is cheaper than hashing records)."""
    return trusted(
        PlaneShare,
        plane=plane,
        attention_layer=attention_layer,
        module_layer=module_layer,
        allocation_plane=allocation_plane,
        riders=tuple(_rider(*rider) for rider in riders),
    )


def plane_order(
    plan: EngineLayout,
    published: Sequence[str] | None = None,
    *,
    stage: int = 0,
    names: LayerNames | None = None,
    views: Mapping[str, TensorView] | None = None,
) -> PlaneOrder:
    """Reorder ``published`` (the engine's order of attention layer names; name order when
    ``None``) so that the attention layers the KDA state aliases come first, in KDA-layer order.

    Without ``views`` the aliased layers come from the plan (allocation order); with the
    engine's ``views`` they are matched on addresses: plane ``j`` is the attention layer that
    starts where KDA layer ``j`` starts. On vLLM's layout the two agree;
    :func:`~k3layout.offload.check_aliasing` then checks every group.

    >>> from k3layout import Deployment, plan, preset
    >>> order = plane_order(plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2)))
    >>> order.given[:2], order.order[:2], order.num_image_planes
    (('draft.layers.0.self_attn.attn', 'draft.layers.1.self_attn.attn'), \
('model.layers.3.self_attn.attn', 'model.layers.7.self_attn.attn'), 23)
    """
    expect_args(
        ("plan", plan, (LayoutBase,)),
        ("names", names, (LayerNames, type(None))),
    )
    if views is not None:
        expect_mapping("views", views, str, TensorView)
    expect_bounded_int("stage", stage, MAX_RANKS)
    expect_items("published", published, str, optional=True)
    plan = ridable(plan)
    names = names or engine_layer_names(plan.model)
    names.check_covers(plan.model)
    on_stage = plan.stage(stage)
    registered = stage_attention_names(on_stage, names)
    given = sorted_names(registered) if published is None else tuple(published)
    check_permutation(given, registered, stage, "plane_order")
    every_name = names.names  # covers every module layer (checked above)
    aliased = tuple(every_name[layer] for layer in image_attention_layers(on_stage, "plane_order"))
    if views is not None:
        aliased = aliased_by_address(on_stage, names, given, views, aliased)
    aliased_set = set(aliased)
    rest = tuple(name for name in given if name not in aliased_set)
    planes = _planes(on_stage, every_name, aliased + rest)
    return trusted(
        PlaneOrder, stage=stage, given=given, planes=planes, num_image_planes=len(aliased)
    )
