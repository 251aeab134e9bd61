"""Checkpoint images and KV pages as views of the planes, packed to a tier and restored.

A boundary's image is one *unit* per KDA group: the pages of the leading published planes in
the group's boundary block (:class:`~k3layout.offload.CheckpointImage`). On vLLM's layout
those pages *are* the KDA state, so :func:`image_units` copies nothing: every page is a view of
the plane an attention layer registered (prove it with ``data_ptr``). :func:`pack_units` lays
units out contiguously, unit by unit, plane by plane (the tier's buffer, byte for byte the
image the offload plans); :func:`restore_units` writes a tier back into the units of other
blocks. The KV of a prefix is the same thing over every published plane in the attention
group's blocks (:func:`kv_units`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import Refusal
from ..offload import checkpoint_image
from ..offload.stage import ridable
from .allocation import Registered, parts_of
from .live import LiveLayout
from .tables import BlockTables, boundary_row


def plane_view(tensor: torch.Tensor, num_blocks: int, page_bytes: int) -> torch.Tensor:
    """``uint8 [num_blocks, page]`` over the bytes of the plane ``tensor`` starts; no copy.

    >>> plane = torch.arange(8, dtype=torch.uint8).reshape(2, 4)
    >>> latent = plane.view(torch.bfloat16)  # a layer's view: 2 blocks x 2 bf16
    >>> plane_view(latent, 2, 4).data_ptr() == plane.data_ptr()
    True
    """
    storage = tensor.untyped_storage()
    offset = tensor.data_ptr() - storage.data_ptr()
    if offset < 0 or offset + num_blocks * page_bytes > storage.nbytes():
        raise Refusal(
            "tensor_mismatch",
            f"a plane of {num_blocks} pages of {page_bytes} B from byte {offset} runs past the "
            f"tensor's storage ({storage.nbytes()} B)",
            facts={
                "offset_bytes": offset,
                "num_blocks": num_blocks,
                "page_bytes": page_bytes,
                "storage_bytes": storage.nbytes(),
            },
            hint="validate the registered tensors against the plan first",
        )
    view = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return view.set_(storage, offset, (num_blocks, page_bytes), (page_bytes, 1))


@dataclass(frozen=True, eq=False)
class PageUnits:
    """Pages of ``planes`` (``uint8 [num_blocks, page]`` each) in ``blocks``: unit ``u`` is one
    page of every plane in block ``blocks[u]``. Building it copies nothing."""

    planes: tuple[torch.Tensor, ...]
    blocks: tuple[int, ...]

    def __post_init__(self) -> None:
        shapes = {tuple(plane.shape) for plane in self.planes}
        if len(shapes) != 1 or any(p.dtype != torch.uint8 or p.dim() != 2 for p in self.planes):
            raise Refusal(
                "tensor_mismatch",
                f"page units need uint8 planes of one shape [num_blocks, page] (got shapes "
                f"{sorted(shapes)})",
                facts={"shapes": tuple(str(s) for s in sorted(shapes))},
                hint="take the planes with plane_view",
            )
        num_blocks = self.planes[0].shape[0]
        for unit, block in enumerate(self.blocks):
            if not 0 <= block < num_blocks:
                raise Refusal(
                    "invalid_argument",
                    f"unit {unit}: block {block} is not one of the {num_blocks} blocks",
                    facts={"unit": unit, "block_id": block, "num_blocks": num_blocks},
                    hint=f"use block ids in [0, {num_blocks})",
                )

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


def _published_planes(layout: LiveLayout, registered: Registered) -> tuple[torch.Tensor, ...]:
    spec = layout.spec
    return tuple(
        plane_view(parts_of(registered[name])[0], spec.num_blocks, spec.page_bytes)
        for name in layout.published
    )


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
    row = boundary_row(layout.plan, computed_tokens)
    groups = ridable(layout.plan).groups_of("kda", layout.spec.stage)
    return tuple(tables.block(group.name, row) for group in groups)


def kv_units(layout: LiveLayout, registered: Registered, blocks: Sequence[int]) -> PageUnits:
    """The KV pages of attention ``blocks`` on every published plane (a view per page)."""
    return PageUnits(planes=_published_planes(layout, registered), blocks=tuple(blocks))


def pack_units(units: PageUnits, out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy ``units`` into one contiguous ``uint8`` buffer (``out`` or a new one), unit by
    unit, plane by plane: the tier's bytes."""
    tier = torch.empty(units.num_bytes, dtype=torch.uint8) if out is None else out
    _check_tier(tier, units)
    page = units.page_bytes
    for index, source in enumerate(units.pages()):
        tier[index * page : (index + 1) * page].copy_(source)
    return tier


def restore_units(tier: torch.Tensor, units: PageUnits) -> None:
    """Write a packed ``tier`` back into ``units`` (other blocks, another cache): byte-exact."""
    _check_tier(tier, units)
    page = units.page_bytes
    for index, target in enumerate(units.pages()):
        target.copy_(tier[index * page : (index + 1) * page])


def _check_tier(tier: object, units: PageUnits) -> None:
    if not isinstance(tier, torch.Tensor):
        raise Refusal(
            "tensor_mismatch",
            f"a tier is a uint8 tensor, got {type(tier).__name__}",
            facts={"type": type(tier).__name__, "expected_bytes": units.num_bytes},
            hint="pack into torch.empty(units.num_bytes, dtype=torch.uint8)",
        )
    if tier.dtype != torch.uint8 or tier.dim() != 1 or tier.numel() != units.num_bytes:
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
