"""The checkpoint image: the KDA state of one boundary, as views of the PAGE object's planes.

At a boundary every KDA group holds its state in one block (row ``(n-1)//block`` of its block
table), and in that block layer ``j`` of the group starts on plane ``j``. So the state of a
boundary is one PAGE *unit* per KDA group: the pages of the leading planes in that group's
block. The image lays the units out group by group, plane by plane; no byte is copied::

    image = unit 0 (group 0) | unit 1 (group 1) | ...      unit = planes 0..P-1, one page each
    state of (group g, layer j) = [(g*P + j) * page, (g*P + j) * page + S)

K3 + DSpark, attention TP 8, fp8, 2 spec tokens: 3 units x 23 planes x 884,736 B =
61,046,784 B, of which 69 x 832,512 = 57,443,328 B is state.

A DSA attention layer publishes two PAGE regions, its latent and its ``index_cache``; the image
counts the layer as one plane whose movable bytes are latent + index (the page), since vLLM
folds the index into the page of the layer that owns it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TypeAlias

from pydantic import NonNegativeInt, PositiveInt, model_validator

from .._args import expect_args, expect_bounded_int
from .._derivation import SelfChecked, is_deriving, mismatch
from .._frozen import Frozen, trusted
from ..constants import MAX_RANKS
from ..errors import Refusal
from ..layouts import EngineLayout, Group, LayoutBase
from ..names import LayerNames, index_region_name
from .plane_order import PlaneOrder, PlaneShare, plane_order
from .stage import page_bytes, ridable

RegionPart: TypeAlias = str
"""What a PAGE region of an attention layer holds: a part of its cache spec (the MLA
``latent``, the DSA ``index`` rows)."""


class PageRegion(Frozen):
    """One region of the PAGE object: one part of one attention layer's page.

    ``offset_bytes`` is where the part starts inside the layer's page, ``num_bytes`` its bytes
    per block (``block * bytes_per_token`` of the part).
    """

    name: str
    attention_layer: str
    module_layer: NonNegativeInt
    part: RegionPart
    offset_bytes: NonNegativeInt
    num_bytes: PositiveInt


class StateRange(Frozen):
    """Where one KDA layer's state sits: unit ``unit`` (its group), plane ``plane``, and the
    bytes ``[offset_bytes, offset_bytes + num_bytes)`` of the image."""

    unit: NonNegativeInt
    group: str
    layer: NonNegativeInt
    module_layer: NonNegativeInt
    plane: NonNegativeInt
    attention_layer: str
    offset_bytes: NonNegativeInt
    num_bytes: PositiveInt

    @property
    def end_bytes(self) -> int:
        """One past the last byte of the state in the image."""
        return self.offset_bytes + self.num_bytes


class CheckpointImage(SelfChecked):
    """The geometry of one boundary's image on one rank: ``groups`` are the KDA groups (one
    unit each), ``planes`` the leading published planes every unit spans, ``regions`` the PAGE
    regions of those planes (two per DSA layer).

    Built by hand (or loaded, or ``model_copy``'d), it is refused (``plan_mismatch``) unless the
    groups are non-empty KDA groups, the planes are plane ``j`` = allocation plane ``j`` for
    ``j`` below the longest group, a state fits its page, and each plane's regions follow each
    other on its page (latent, then the index) in plane order.
    """

    stage: NonNegativeInt
    page_bytes: PositiveInt
    layer_state_bytes: NonNegativeInt
    groups: tuple[Group, ...]
    planes: tuple[PlaneShare, ...]
    regions: tuple[PageRegion, ...]

    @model_validator(mode="after")
    def _holds_together(self) -> CheckpointImage:
        if is_deriving():
            return self
        thing = f"checkpoint image of stage {self.stage}"
        for index, group in enumerate(self.groups):
            if group.kind != "kda" or not group.layers:
                raise mismatch(
                    thing, f"groups[{index}]", "a unit is a KDA group with layers", group, "kda"
                )
        longest = max((len(group.layers) for group in self.groups), default=0)
        if len(self.planes) != longest:
            raise mismatch(
                thing,
                "len(planes)",
                "a unit spans the longest KDA group",
                len(self.planes),
                longest,
            )
        for index, share in enumerate(self.planes):
            if (share.plane, share.allocation_plane) != (index, index):
                raise mismatch(
                    thing,
                    f"planes[{index}].plane",
                    "image plane j is published and allocated j-th",
                    (share.plane, share.allocation_plane),
                    (index, index),
                )
        if self.layer_state_bytes > self.page_bytes or (self.groups and not self.layer_state_bytes):
            raise mismatch(
                thing,
                "layer_state_bytes",
                "a KDA state is not empty and fits its page",
                self.layer_state_bytes,
                self.page_bytes,
            )
        self._regions_tile_pages(thing)
        return self

    def _regions_tile_pages(self, thing: str) -> None:
        layers = {share.attention_layer: share.module_layer for share in self.planes}
        filled: dict[str, int] = {}
        for index, region in enumerate(self.regions):
            start = filled.get(region.attention_layer, 0)
            if layers.get(region.attention_layer) != region.module_layer or (
                region.offset_bytes < start
            ):
                raise mismatch(
                    thing,
                    f"regions[{index}].offset_bytes",
                    "an image plane's regions follow each other on its page, without overlap",
                    region.offset_bytes,
                    start,
                )
            filled[region.attention_layer] = region.offset_bytes + region.num_bytes
        order = tuple(dict.fromkeys(region.attention_layer for region in self.regions))
        planes = tuple(share.attention_layer for share in self.planes)
        if order != planes:
            raise mismatch(thing, "regions", "the regions follow the planes", order, planes)
        for name, end in filled.items():
            if end > self.page_bytes:
                raise mismatch(
                    thing, f"regions of {name}", "regions fit the page", end, self.page_bytes
                )

    @property
    def num_units(self) -> int:
        """Units per boundary: one per KDA group."""
        return len(self.groups)

    @property
    def num_planes(self) -> int:
        """Planes of a unit, an attention layer counted once whatever regions it publishes."""
        return len(self.planes)

    @property
    def num_regions(self) -> int:
        """PAGE regions the image planes publish (a DSA layer publishes two)."""
        return len(self.regions)

    @property
    def plane_movable_bytes(self) -> tuple[int, ...]:
        """Movable bytes per block of each image plane: the bytes of its regions (the page)."""
        return tuple(
            sum(r.num_bytes for r in self.regions if r.attention_layer == p.attention_layer)
            for p in self.planes
        )

    @property
    def unit_bytes(self) -> int:
        """Bytes of one unit: a page on each image plane."""
        return self.num_planes * self.page_bytes

    @property
    def image_bytes(self) -> int:
        """Bytes of the image: units x planes x page."""
        return self.num_units * self.unit_bytes

    @property
    def num_kda_layers(self) -> int:
        """KDA layers whose state the image holds."""
        return sum(len(group.layers) for group in self.groups)

    @property
    def state_bytes(self) -> int:
        """State bytes in the image: KDA layers x ``S(tp, s)``."""
        return self.num_kda_layers * self.layer_state_bytes

    @property
    def padding_bytes(self) -> int:
        """Image bytes that are not state (page padding and planes a shorter group skips)."""
        return self.image_bytes - self.state_bytes

    @property
    def ranges(self) -> tuple[StateRange, ...]:
        """The state range of every (group, layer), unit by unit."""
        return tuple(
            StateRange(
                unit=unit,
                group=group.name,
                layer=layer,
                module_layer=module_layer,
                plane=layer,
                attention_layer=self.planes[layer].attention_layer,
                offset_bytes=(unit * self.num_planes + layer) * self.page_bytes,
                num_bytes=self.layer_state_bytes,
            )
            for unit, group in enumerate(self.groups)
            for layer, module_layer in enumerate(group.layers)
        )

    def range_of(self, group: str, layer: int) -> StateRange:
        """The state range of layer ``layer`` (position in the group) of KDA group ``group``."""
        found = next((r for r in self.ranges if (r.group, r.layer) == (group, layer)), None)
        if found is None:
            lengths = {g.name: len(g.layers) for g in self.groups}
            raise Refusal(
                "invalid_argument",
                f"KDA group {group!r} has no layer {layer} in the image (groups: {lengths})",
                facts={"group": group, "layer": layer, "groups": tuple(lengths)},
                hint="use a group of the image and 0 <= layer < its length",
            )
        return found


def part_region_name(attention_layer: str, part: str, first: bool) -> str:
    """The name a part of an attention layer is published under: the layer's own name for
    its first part, the DSA index region's name for ``index``, ``<layer>.<part>`` else."""
    if first:
        return attention_layer
    return index_region_name(attention_layer) if part == "index" else f"{attention_layer}.{part}"


def page_regions(plan: EngineLayout, order: PlaneOrder) -> tuple[PageRegion, ...]:
    """The PAGE object's regions in publish order: every part of each attention layer's page
    (K3: its latent, one region per layer; a DSA model: the latent, then the index rows).
    Refuses (``invalid_argument``) a ``plan`` or ``order`` of the wrong type."""
    expect_args(("plan", plan, (LayoutBase,)), ("order", order, PlaneOrder))
    return _regions(plan, order.planes)


def _regions(plan: EngineLayout, shares: tuple[PlaneShare, ...]) -> tuple[PageRegion, ...]:
    regions: list[PageRegion] = []
    for share in shares:
        ranges = plan.part_range_list(share.module_layer)
        regions.extend(
            _region(
                share.attention_layer,
                share.module_layer,
                r.part,
                i == 0,
                offset_bytes=r.offset_bytes,
                num_bytes=r.size_bytes,
            )
            for i, r in enumerate(ranges)
        )
    return tuple(regions)


@lru_cache(maxsize=4096)
def _region(
    attention_layer: str,
    module_layer: int,
    part: RegionPart,
    first: bool,
    *,
    offset_bytes: int,
    num_bytes: int,
) -> PageRegion:
    """One region record, shared between images (a frozen value: sharing is safe). Names and
    sizes come from a validated plan and plane order: nothing to re-validate."""
    return trusted(
        PageRegion,
        name=part_region_name(attention_layer, part, first),
        attention_layer=attention_layer,
        module_layer=module_layer,
        part=part,
        offset_bytes=offset_bytes,
        num_bytes=num_bytes,
    )


def checkpoint_image(
    plan: EngineLayout, *, stage: int = 0, names: LayerNames | None = None
) -> CheckpointImage:
    """The image of one boundary on a rank of pipeline stage ``stage``.

    >>> from k3layout import Deployment, plan, preset
    >>> p = plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2))
    >>> image = checkpoint_image(p)
    >>> image.num_units, image.num_planes, image.image_bytes, image.state_bytes
    (3, 23, 61046784, 57443328)
    """
    expect_args(
        ("plan", plan, (LayoutBase,)),
        ("names", names, (LayerNames, type(None))),
    )
    expect_bounded_int("stage", stage, MAX_RANKS)
    plan = ridable(plan)
    return image_of_order(plan, plane_order(plan, stage=stage, names=names), stage)


def image_of_order(plan: EngineLayout, order: PlaneOrder, stage: int) -> CheckpointImage:
    """The image of ``stage`` from a plane order already made for it (any publish order gives
    the same image: the aliased planes lead in KDA-layer order whatever the given order)."""
    image_planes = order.image_planes
    return trusted(
        CheckpointImage,
        stage=stage,
        page_bytes=page_bytes(plan),
        layer_state_bytes=plan.sizes.state_bytes,
        groups=plan.stage(stage).groups_of("kda"),
        planes=image_planes,
        regions=_regions(plan, image_planes),
    )
