"""Restore a prefix across TP: a transfer plan's segments, executed on tiers and live caches.

A :class:`~k3layout.transfer.TransferPlan` addresses abstract regions per rank (latent rows per
MLA layer, conv and recurrent state per KDA layer). Here they meet bytes:

- :func:`tier_regions` reads a producer rank's regions out of its :class:`~.tier.Tier`: latent
  row ``i`` of an MLA layer from the KV pages (the row's latent bytes, then its DSA index bytes),
  a KDA layer's conv (q|k|v) and recurrent bytes from its state range in the image;
- :func:`apply_segments` runs every pair's strided copies into fresh consumer regions;
- :func:`write_regions` puts a consumer's regions into its blocks: latent rows through the
  attention table, state into row ``(n - 1) // block`` of each KDA group.

Every byte range comes from the layers' cache specs: a region is one part of one layer, and
:meth:`~k3layout.layouts.LayoutBase.part_range` says where that part sits in the layer's page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..cache import PartRange
from ..errors import Refusal
from ..transfer import Region, RegionKey, TransferPlan
from .allocation import Registered, parts_of
from .images import plane_view
from .live import LiveLayout
from .tables import BlockTables, boundary_row
from .tier import Tier


def _check_conv_layout(transfer: TransferPlan, layout: LiveLayout, side: str) -> None:
    theirs = transfer.decode.conv_layout
    ours = layout.plan.deployment.conv_layout
    if theirs != ours:
        raise Refusal(
            "tensor_mismatch",
            f"the transfer plan moves conv state {theirs}, the {side} registered it {ours}",
            facts={"side": side, "conv_layout": ours, "transfer_conv_layout": theirs},
            hint=f"plan both sides with conv_layout={ours}",
        )


def _unsupported(region: Region) -> Refusal:
    return Refusal(
        "tensor_mismatch",
        f"region {region.field} of layer {region.layer}: vLLM's layout holds no such bytes",
        facts={"field": region.field, "layer": region.layer},
        hint="plan the transfer without ReplaySSM records for a vllm layout",
    )


def _rows(kv: torch.Tensor, layout: LiveLayout, region: Region, num_rows: int) -> torch.Tensor:
    """``[num_rows, row bytes]`` of one part of an attention layer, from its published pages."""
    plan = layout.plan
    assert region.layer is not None  # a page region names its layer
    name = layout.names.name(region.layer)
    inner = plan.part_range(region.layer, region.field)
    group, _ = plan.group_of(region.layer)
    tokens = plan.tokens_per_page(group)
    planes = len(layout.published)
    pages = kv.view(-1, planes, layout.spec.page_bytes)[:, layout.published.index(name)]
    part = pages[:, inner.offset_bytes : inner.end_bytes]
    return part.reshape(-1, inner.size_bytes // tokens)[:num_rows]


def tier_regions(tier: Tier, regions: Sequence[Region]) -> dict[RegionKey, torch.Tensor]:
    """A producer rank's ``regions`` (``transfer.producer_regions(rank)``) read from its tier,
    each a contiguous ``uint8`` buffer of the region's size."""
    layout = tier.layout
    plan = layout.plan
    out: dict[RegionKey, torch.Tensor] = {}
    for region in regions:
        if region.layer is None:
            raise _unsupported(region)
        # the position in the stage's group: the tier's image holds this stage's layers only
        group, position = plan.group_of(region.layer, layout.spec.stage)
        if region.field not in plan.group_spec(group).part_names:
            raise _unsupported(region)
        inner = plan.part_range(region.layer, region.field)
        held = (
            tier.computed_tokens * inner.size_bytes // plan.tokens_per_page(group)
            if region.kind == "page"
            else inner.size_bytes
        )
        if region.size_bytes != held:
            raise Refusal(
                "tensor_mismatch",
                f"region {region.field} of layer {region.layer} is {region.size_bytes} B in the "
                f"transfer plan, {held} B on the tier",
                facts={
                    "field": region.field,
                    "layer": region.layer,
                    "size_bytes": region.size_bytes,
                    "tier_bytes": held,
                },
                hint="plan the transfer for the tier's prefix length and deployment",
            )
        if region.kind == "page":
            out[region.key] = _rows(tier.kv, layout, region, tier.computed_tokens).reshape(-1)
            continue
        start = tier.geometry.range_of(group.name, position).offset_bytes + inner.offset_bytes
        out[region.key] = tier.image[start : start + region.size_bytes]
    return out


def _strided(
    region: torch.Tensor, offset: int, stride: int, shape: tuple[int, int]
) -> torch.Tensor:
    """``shape[0]`` runs of ``shape[1]`` bytes of ``region``, ``stride`` apart from ``offset``
    (``as_strided`` counts from the storage, so the region's own offset is added)."""
    end = offset + (shape[0] - 1) * stride + shape[1]
    if end > region.numel():
        raise Refusal(
            "tensor_mismatch",
            f"a segment reads or writes up to byte {end} of a {region.numel()} B region",
            facts={"end_bytes": end, "region_bytes": region.numel()},
            hint="plan the transfer for the same prefix and deployments as the tiers",
        )
    return region.as_strided(shape, (stride, 1), region.storage_offset() + offset)


def apply_segments(
    transfer: TransferPlan, sources: Sequence[Mapping[RegionKey, torch.Tensor]]
) -> list[dict[RegionKey, torch.Tensor]]:
    """Every consumer rank's regions, filled by the plan's copies from ``sources`` (one
    mapping per producer rank, from :func:`tier_regions`)."""
    if len(sources) != transfer.num_producers:
        raise Refusal(
            "invalid_argument",
            f"the transfer has {transfer.num_producers} producer ranks, got {len(sources)} sources",
            facts={"num_producers": transfer.num_producers, "num_sources": len(sources)},
            hint="pass one region mapping per producer rank",
        )
    targets = [
        {r.key: torch.zeros(r.size_bytes, dtype=torch.uint8) for r in transfer.consumer_regions(c)}
        for c in range(transfer.num_consumers)
    ]
    for pair in transfer.pairs:
        for segment in pair.segments:
            shape = (segment.num_copies, segment.length_bytes)
            for region in segment.regions:  # the same copies in each of the segment's layers
                source = sources[pair.producer][region]
                target = targets[pair.consumer][region]
                _strided(target, segment.dst_offset_bytes, segment.dst_stride_bytes, shape).copy_(
                    _strided(source, segment.src_offset_bytes, segment.src_stride_bytes, shape)
                )
    return targets


def write_regions(
    layout: LiveLayout,
    registered: Registered,
    tables: BlockTables,
    computed_tokens: int,
    regions: Mapping[RegionKey, torch.Tensor],
    *,
    transfer: TransferPlan | None = None,
) -> None:
    """Put a consumer rank's ``regions`` into its blocks: attention rows through the attention
    table, state parts into the boundary row of each KDA group."""
    plan = layout.plan
    if transfer is not None:
        _check_conv_layout(transfer, layout, "consumer")
    row = boundary_row(plan, computed_tokens)
    spec = layout.spec
    for (field, layer), data in regions.items():
        if layer is None:
            raise _unsupported(Region(field=field, layer=layer, kind="slot", size_bytes=0))
        group, _ = plan.group_of(layer)
        if field not in plan.group_spec(group).part_names:
            raise _unsupported(Region(field=field, layer=layer, kind="slot", size_bytes=0))
        name = layout.names.name(layer)
        owner = spec.layer(name)
        plane = plane_view(parts_of(registered[name])[0], spec.num_blocks, spec.page_bytes)
        inner = plan.part_range(layer, field)
        if plan.group_spec(group).paging == "token":
            _write_rows(plane, data, tables.table(owner.group), inner, plan.tokens_per_page(group))
            continue
        page = plane[tables.block(owner.group, row)]
        page[inner.offset_bytes : inner.offset_bytes + data.numel()].copy_(data)


def _write_rows(
    plane: torch.Tensor,
    data: torch.Tensor,
    table: Sequence[int],
    inner: PartRange,
    tokens: int,
) -> None:
    """One part's rows into their blocks' pages: local row ``i`` in table row
    ``i // tokens`` at slot ``i % tokens`` of the part's range."""
    row_bytes = inner.size_bytes // tokens
    rows = data.view(-1, row_bytes)
    for table_row, start in enumerate(range(0, rows.shape[0], tokens)):
        chunk = rows[start : start + tokens]
        if table_row >= len(table):
            raise Refusal(
                "invalid_argument",
                f"{rows.shape[0]} rows need {table_row + 1} attention blocks; the table "
                f"has {len(table)}",
                facts={"num_rows": rows.shape[0], "num_table_rows": len(table)},
                hint="give the attention group enough blocks for the prefix",
            )
        page = plane[table[table_row]]
        part = page[inner.offset_bytes : inner.end_bytes].view(tokens, row_bytes)
        part[: len(chunk)].copy_(chunk)


def restore_across_tp(
    transfer: TransferPlan,
    tiers: Sequence[Tier],
    consumers: Sequence[tuple[LiveLayout, Registered, BlockTables]],
) -> None:
    """Move a prefix stored on every producer rank's tier into every consumer rank's blocks.

    ``tiers`` and ``consumers`` are in the transfer plan's rank order (pipeline stage outer, TP
    rank inner). The transfer must be planned for the tiers' prefix
    (``prompt_tokens == computed_tokens``) and the layouts' conv layout.
    """
    for tier in tiers:
        _check_conv_layout(transfer, tier.layout, "producer")
        if tier.computed_tokens != transfer.prompt_tokens:
            raise Refusal(
                "invalid_argument",
                f"the tier holds {tier.computed_tokens} tokens, the transfer moves "
                f"{transfer.prompt_tokens}",
                facts={
                    "computed_tokens": tier.computed_tokens,
                    "prompt_tokens": transfer.prompt_tokens,
                },
                hint="plan the transfer with prompt_tokens = the stored prefix",
            )
    sources = [
        tier_regions(tier, transfer.producer_regions(rank)) for rank, tier in enumerate(tiers)
    ]
    targets = apply_segments(transfer, sources)
    if len(consumers) != len(targets):
        raise Refusal(
            "invalid_argument",
            f"the transfer has {len(targets)} consumer ranks, got {len(consumers)} layouts",
            facts={"num_consumers": len(targets), "num_layouts": len(consumers)},
            hint="pass one (layout, registered, tables) per consumer rank",
        )
    for (layout, registered, tables), regions in zip(consumers, targets, strict=True):
        write_regions(
            layout, registered, tables, transfer.prompt_tokens, regions, transfer=transfer
        )
