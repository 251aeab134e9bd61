"""Checkpoint images and KV pages as views of the planes, packed to a tier and restored.

A boundary's image is one *unit* per KDA group: the pages of the leading published planes in
the group's boundary block (:class:`~k3layout.offload.CheckpointImage`). On vLLM's layout
those pages *are* the KDA state, so :func:`image_units` copies nothing: every page is a view of
the plane an attention layer registered (prove it with ``data_ptr``). :func:`pack_units` lays
units out contiguously, unit by unit, plane by plane (the tier's buffer, byte for byte the
image the offload plans); :func:`restore_units` writes a tier back into the units of other
blocks. The KV of a prefix is the same thing over every published plane in the attention
group's blocks (:func:`kv_units`).

Every ``copy_`` pays the thread pool's fork and join, which on a busy host costs more than an
884 KB page. On one backing (planes equally spaced in one storage, as
:func:`~.allocation.allocate` and vLLM 0.33 lay them out) a pack is therefore one gather and a
restore one scatter of the pages' rows (:class:`~.copies.PageRows`), each a single pass as a
plain copy is; where no row fits, one strided copy per unit; planes in tensors of their own
are copied page by page.

``meta`` tensors hold no bytes: packing or restoring into a ``meta`` tier or ``meta`` units is
a dry run (every size is checked, nothing is copied); packing ``meta`` units into a real tier,
or restoring a ``meta`` tier into real pages, is refused, as there are no bytes to give.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import cast

import torch

from .._args import expect, expect_args, expect_sequence
from ..errors import Refusal
from ..offload import checkpoint_image
from ..offload.stage import num_image_planes, ridable
from ._checks import expect_registered, registered_parts
from .allocation import Registered, _plane_view
from .copies import PageRows, page_rows, stacked_planes
from .live import LiveLayout
from .tables import BlockTables, boundary_row


@dataclass(frozen=True, eq=False)
class PageUnits:
    """Pages of ``planes`` (``uint8 [num_blocks, page]`` each) in ``blocks``: unit ``u`` is one
    page of every plane in block ``blocks[u]``. Building it copies nothing."""

    planes: tuple[torch.Tensor, ...]
    blocks: tuple[int, ...]

    def __post_init__(self) -> None:
        expect_sequence("planes", self.planes, torch.Tensor)
        expect_sequence("blocks", self.blocks, object)
        sparse = next((p for p in self.planes if p.layout != torch.strided), None)
        if sparse is not None:
            raise Refusal(
                "tensor_mismatch",
                f"page units need strided planes, got a {sparse.layout} one",
                facts={"field": "planes", "layout": str(sparse.layout)},
                hint="take the planes with plane_view",
            )
        shapes = {tuple(plane.shape) for plane in self.planes}
        if len(shapes) != 1 or any(p.dtype != torch.uint8 or p.dim() != 2 for p in self.planes):
            raise Refusal(
                "tensor_mismatch",
                f"page units need uint8 planes of one shape [num_blocks, page] (got shapes "
                f"{sorted(shapes)})",
                facts={"shapes": tuple(str(s) for s in sorted(shapes))},
                hint="take the planes with plane_view",
            )
        devices = sorted({str(plane.device) for plane in self.planes})
        if len(devices) != 1:
            raise Refusal(
                "tensor_mismatch",
                f"page units need planes on one device (got {devices})",
                facts={"devices": tuple(devices)},
                hint="take every plane from the one cache of a rank",
            )
        num_blocks = self.planes[0].shape[0]
        for unit, block in enumerate(self.blocks):
            if not _is_index(block) or not 0 <= block < num_blocks:
                raise Refusal(
                    "invalid_argument",
                    f"unit {unit}: block {block!r} is not one of the {num_blocks} blocks",
                    facts={
                        "unit": unit,
                        "block_id": block if isinstance(block, int) else repr(block),
                        "num_blocks": num_blocks,
                    },
                    hint=f"use block ids in [0, {num_blocks})",
                )
        for j, plane in enumerate(self.planes):
            _check_writable(f"planes[{j}]", plane)
        _check_distinct(self.blocks)

    @property
    def page_bytes(self) -> int:
        """Bytes of one page."""
        return int(self.planes[0].shape[1])

    @property
    def num_units(self) -> int:
        """Units: one per block."""
        return len(self.blocks)

    @property
    def num_planes(self) -> int:
        """Planes every unit spans."""
        return len(self.planes)

    @property
    def num_bytes(self) -> int:
        """Bytes of all units: units x planes x page."""
        return self.num_units * self.num_planes * self.page_bytes

    def page(self, unit: int, plane: int) -> torch.Tensor:
        """The page of plane ``plane`` in unit ``unit``'s block (a view)."""
        return self.planes[plane][self.blocks[unit]]

    def pages(self) -> tuple[torch.Tensor, ...]:
        """Every page, unit by unit, plane by plane: the order they are packed in."""
        return tuple(
            self.page(unit, plane)
            for unit in range(self.num_units)
            for plane in range(self.num_planes)
        )

    @property
    def is_meta(self) -> bool:
        """Whether the planes are ``meta`` tensors (shapes only, no bytes)."""
        return self.planes[0].device.type == "meta"

    @cached_property
    def stacked(self) -> torch.Tensor | None:
        """The planes as one ``[planes, num_blocks, page]`` view when they are equally spaced
        in one storage (one backing), else ``None``: a unit's pages are then ``stacked[:,
        block]``, one strided view."""
        return stacked_planes(self.planes)

    @cached_property
    def rows(self) -> PageRows | None:
        """On one backing, its bytes as short rows and the rows of every page in packing
        order (:func:`~.copies.page_rows`); ``None`` where rows do not fit the pages."""
        return None if self.stacked is None else page_rows(self.stacked, self.blocks)


def _is_index(block: object) -> bool:
    """Whether ``block`` is an integer (Python's, numpy's, a 0-d integer tensor's)."""
    try:
        operator.index(block)  # type: ignore[arg-type]
    except TypeError:
        return False
    return not isinstance(block, bool)


def _check_distinct(blocks: Sequence[int]) -> None:
    """Units on one block alias: they are the same pages, so a restore keeps only the last."""
    units: dict[int, list[int]] = {}
    for unit, block in enumerate(blocks):
        units.setdefault(operator.index(block), []).append(unit)
    for block, repeats in units.items():
        if len(repeats) > 1:
            raise Refusal(
                "aliasing",
                f"block {block} is the block of units {repeats}: they would be the same pages "
                "(one per plane), so a restore into them keeps only the last unit's bytes",
                facts={"block_id": block, "units": tuple(repeats)},
                hint="give every unit its own block (a KDA group's boundary block, an "
                "attention block of the prefix)",
            )


def _publish_order(layout: LiveLayout) -> tuple[str, ...]:
    """The planes the image and the KV are read in (``layout.published``); refused on a
    ``tokenspeed`` layout (``engine_mismatch``) and on a pipeline stage whose state cannot ride
    (``aliasing``): more KDA positions than attention layers, so no publish order exists."""
    plan = ridable(layout.plan)
    if layout.published:
        return layout.published
    stage = plan.stage(layout.spec.stage)
    positions = num_image_planes(stage)
    attention = tuple(
        layout.names.name(layer) for group in stage.groups_of("attention") for layer in group.layers
    )
    raise Refusal(
        "aliasing",
        f"stage {stage.index}: its KDA groups have {positions} positions, one plane each, and "
        f"{len(attention)} attention layers publish planes ({list(attention[:4])}"
        f"{' ...' if len(attention) > 4 else ''}): its state cannot ride, so the layout has no "
        "publish order to read an image or KV in",
        facts={"stage": stage.index, "kda_positions": positions, "attention_layers": attention},
        hint="split the pipeline so that every stage holds at least as many attention layers "
        "as its longest KDA group",
    )


def _published_planes(layout: LiveLayout, registered: Registered) -> tuple[torch.Tensor, ...]:
    spec = layout.spec
    return tuple(
        _plane_view(registered_parts(registered, name)[0], spec.num_blocks, spec.page_bytes)
        for name in _publish_order(layout)
    )


def _check_units_args(layout: object, registered: object, blocks: object) -> Sequence[int]:
    """The arguments :func:`image_units` and :func:`kv_units` take, checked; ``blocks``
    returned (its items are checked as the units' blocks)."""
    expect("layout", layout, LiveLayout)
    expect_registered("registered", registered)
    return cast(Sequence[int], expect_sequence("blocks", blocks, object))


def image_units(layout: LiveLayout, registered: Registered, blocks: Sequence[int]) -> PageUnits:
    """The checkpoint image as views: unit ``g`` is KDA group ``g``'s block ``blocks[g]`` on the
    leading published planes of a validated layout.

    >>> from k3layout import Deployment, plan, preset
    >>> from k3layout.torch import allocate, validate
    >>> p = plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2))
    >>> cache = allocate(p, num_blocks=4)
    >>> units = image_units(validate(p, cache.registered), cache.registered, [3, 1, 0])
    >>> units.num_bytes, units.page(1, 0).data_ptr() == cache.planes[0][1].data_ptr()
    (61046784, True)
    """
    blocks = _check_units_args(layout, registered, blocks)
    _publish_order(layout)  # the same refusal as the KV's on a stage that cannot ride
    image = checkpoint_image(layout.plan, stage=layout.spec.stage, names=layout.names)
    if len(blocks) != image.num_units:
        raise Refusal(
            "invalid_argument",
            f"the image has {image.num_units} units, one per KDA group; got {len(blocks)} blocks",
            facts={"num_units": image.num_units, "num_blocks_given": len(blocks)},
            hint="pass each KDA group's boundary block, in the plan's group order",
        )
    planes = _published_planes(layout, registered)[: image.num_planes]
    return PageUnits(planes=planes, blocks=tuple(blocks))


def boundary_blocks(
    layout: LiveLayout, tables: BlockTables, computed_tokens: int
) -> tuple[int, ...]:
    """Each KDA group's block holding the state after ``computed_tokens`` (a block multiple):
    row ``(n - 1) // block`` of its table, in the image's unit order."""
    expect_args(("layout", layout, LiveLayout), ("tables", tables, BlockTables))
    row = boundary_row(layout.plan, computed_tokens)
    groups = ridable(layout.plan).groups_of("kda", layout.spec.stage)
    return tuple(tables.block(group.name, row) for group in groups)


def kv_units(layout: LiveLayout, registered: Registered, blocks: Sequence[int]) -> PageUnits:
    """The KV pages of attention ``blocks`` on every published plane (a view per page)."""
    blocks = _check_units_args(layout, registered, blocks)
    return PageUnits(planes=_published_planes(layout, registered), blocks=tuple(blocks))


def pack_units(units: PageUnits, out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy ``units`` into one contiguous ``uint8`` buffer (``out`` or a new one, on the CPU;
    ``meta`` for ``meta`` units), unit by unit, plane by plane: the tier's bytes."""
    expect_args(("units", units, PageUnits), ("out", out, (torch.Tensor, type(None))))
    if out is None:
        device = "meta" if units.is_meta else "cpu"
        out = torch.empty(units.num_bytes, dtype=torch.uint8, device=device)
    _check_tier(out, units)
    _check_writable("out", out)
    if _dry_run(source_meta=units.is_meta, target_meta=out.device.type == "meta", what="pack"):
        return out
    rows = units.rows
    if rows is not None and rows.rows.device == out.device and out.is_contiguous():
        # one gather in a single pass of the thread pool: a copy per page or per unit pays a
        # fork and join each and the threads' uneven finish, which a busy host multiplies
        rows.gather(out)
        return out
    for into, pages in _runs(out, units):
        into.copy_(pages)
    return out


def restore_units(tier: torch.Tensor, units: PageUnits) -> None:
    """Write a packed ``tier`` back into ``units`` (other blocks, another cache): byte-exact.
    Into ``meta`` units it is a dry run: the sizes are checked, nothing is copied."""
    expect_args(("tier", tier, torch.Tensor), ("units", units, PageUnits))
    _check_tier(tier, units)
    if _dry_run(source_meta=tier.device.type == "meta", target_meta=units.is_meta, what="restore"):
        return
    rows = units.rows
    if rows is not None and rows.rows.device == tier.device and tier.is_contiguous():
        rows.scatter(tier)  # one pass of the thread pool, as the pack
        return
    for stored, pages in _runs(tier, units):
        pages.copy_(stored)


def _runs(tier: torch.Tensor, units: PageUnits) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The tier and the units cut alike, in packing order: a ``[planes, page]`` view of each
    per unit on one backing (one copy per unit), else a page of each per page."""
    per_unit = tier.view(units.num_units, units.num_planes, units.page_bytes)
    stacked = units.stacked
    for unit, block in enumerate(units.blocks):
        if stacked is not None:
            yield per_unit[unit], stacked[:, block]
            continue
        for plane in range(units.num_planes):
            yield per_unit[unit, plane], units.page(unit, plane)


def _dry_run(*, source_meta: bool, target_meta: bool, what: str) -> bool:
    """Whether a copy is a dry run (a ``meta`` target: checked, nothing to write); a ``meta``
    source has no bytes to give a real target, and is refused."""
    if source_meta and not target_meta:
        raise Refusal(
            "tensor_mismatch",
            f"{what}: the source is a meta tensor, which holds no bytes, and the target is real "
            "memory",
            facts={"operation": what, "source_device": "meta"},
            hint="copy from real tensors; meta tensors only check sizes (a dry run into meta)",
        )
    return target_meta


def _check_tier(tier: torch.Tensor, units: PageUnits) -> None:
    if (
        tier.dtype != torch.uint8
        or tier.layout != torch.strided
        or tier.dim() != 1
        or tier.numel() != units.num_bytes
    ):
        raise Refusal(
            "tensor_mismatch",
            f"a tier for {units.num_units} units x {units.num_planes} planes x "
            f"{units.page_bytes} B is uint8 [{units.num_bytes}], got {tier.dtype} "
            f"{list(tier.shape)}",
            facts={
                "dtype": str(tier.dtype),
                "shape": tuple(tier.shape),
                "expected_bytes": units.num_bytes,
            },
            hint="pack into torch.empty(units.num_bytes, dtype=torch.uint8)",
        )


def _check_writable(name: str, tensor: torch.Tensor) -> None:
    """Refuse (``tensor_mismatch``) a target whose elements share bytes (a zero stride, as
    ``expand`` makes): a copy into it would write one byte many times."""
    if any(
        size > 1 and stride == 0 for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    ):
        raise Refusal(
            "tensor_mismatch",
            f"{name} has a zero stride (strides {list(tensor.stride())}): its elements share "
            "bytes, so it cannot be written",
            facts={"field": name, "strides": tuple(tensor.stride())},
            hint=f"pass {name} with bytes of its own (clone an expanded tensor)",
        )
