"""Restore a prefix across TP: a transfer plan's segments, executed on tiers and live caches.

A :class:`~k3layout.transfer.TransferPlan` addresses abstract regions per rank (latent rows per
MLA layer, conv and recurrent state per KDA layer). Here they meet bytes:

- :func:`tier_regions` reads a producer rank's regions out of its :class:`~.tier.Tier`: latent
  row ``i`` of an MLA layer from the KV pages (the row's latent bytes, then its DSA index bytes),
  a KDA layer's conv (q|k|v) and recurrent bytes from its state range in the image;
- :func:`apply_segments` runs every pair's strided copies into fresh consumer regions;
- :func:`write_regions` puts a consumer's regions into its blocks: latent rows through the
  attention table, state into row ``(n - 1) // block`` of each KDA group.

vLLM's time-major conv parts are ``(3, K-1+s, C)`` per layer where the transfer plan speaks of
``(K-1+s, 3, H, D)``; the segments are the same bytes, since a split of the head axis copies
the outer axes' slabs in order on both sides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..errors import Refusal
from ..offload.stage import vllm_plan_of
from ..transfer import Region, RegionField, TransferPlan
from .allocation import Registered, parts_of
from .images import plane_bytes
from .live import LiveLayout
from .tables import BlockTables, boundary_row
from .tier import Tier

RegionKey = tuple[RegionField, int | None]
"""``(field, module layer)``: how segments name a region."""


def _check_conv_layout(transfer: TransferPlan, layout: LiveLayout, side: str) -> None:
    if transfer.conv_layout != layout.spec.conv_layout:
        raise Refusal(
            "tensor_mismatch",
            f"the transfer plan moves conv state {transfer.conv_layout}, the {side} registered "
            f"it {layout.spec.conv_layout}",
            facts={
                "side": side,
                "conv_layout": layout.spec.conv_layout,
                "transfer_conv_layout": transfer.conv_layout,
            },
            hint=f"plan the transfer with conv_layout={layout.spec.conv_layout}",
        )


def _unsupported(region: Region) -> Refusal:
    return Refusal(
        "tensor_mismatch",
        f"region {region.field} of layer {region.layer}: vLLM's layout holds no such bytes",
        facts={"field": region.field, "layer": region.layer},
        hint="plan the transfer without ReplaySSM records for a vllm layout",
    )


def _rows(kv: torch.Tensor, layout: LiveLayout, name: str, num_rows: int) -> torch.Tensor:
    """``[num_rows, row bytes]``: latent then index bytes of each token of layer ``name``."""
    plan = vllm_plan_of(layout.plan)
    page, block = layout.spec.page_bytes, plan.block_tokens
    attention = plan.sizes.attention
    planes = len(layout.published)
    pages = kv.view(-1, planes, page)[:, layout.published.index(name)]  # [blocks, page]
    latent_end = block * attention.latent_bytes_per_token
    latent = pages[:, :latent_end].reshape(-1, attention.latent_bytes_per_token)
    columns = [latent[:num_rows]]
    if attention.index_bytes_per_token:
        index = pages[:, latent_end:].reshape(-1, attention.index_bytes_per_token)
        columns.append(index[:num_rows])
    return torch.cat(columns, dim=1)


def tier_regions(tier: Tier, regions: Sequence[Region]) -> dict[RegionKey, torch.Tensor]:
    """A producer rank's ``regions`` (``transfer.producer_regions(rank)``) read from its tier,
    each a contiguous ``uint8`` buffer of the region's size."""
    layout = tier.layout
    geometry = tier.geometry
    sizes = vllm_plan_of(layout.plan).sizes
    conv = 0 if sizes.kda is None else sizes.kda.conv_bytes
    held = {
        "latent": tier.computed_tokens * sizes.attention.bytes_per_token,
        "conv": conv,
        "recurrent": 0 if sizes.kda is None else sizes.kda.recurrent_bytes,
    }
    out: dict[RegionKey, torch.Tensor] = {}
    for region in regions:
        if region.layer is None or region.field not in held:
            raise _unsupported(region)
        if region.size_bytes != held[region.field]:
            raise Refusal(
                "tensor_mismatch",
                f"region {region.field} of layer {region.layer} is {region.size_bytes} B in the "
                f"transfer plan, {held[region.field]} B on the tier",
                facts={
                    "field": region.field,
                    "layer": region.layer,
                    "size_bytes": region.size_bytes,
                    "tier_bytes": held[region.field],
                },
                hint="plan the transfer for the tier's prefix length and deployment",
            )
        name = layout.names.name(region.layer)
        if region.field == "latent":
            rows = tier.computed_tokens
            out[region.key] = _rows(tier.kv, layout, name, rows).reshape(-1)
            continue
        spec = layout.spec.layer(name)
        start = geometry.range_of(spec.group, spec.position).offset_bytes
        start += conv if region.field == "recurrent" else 0
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
            source = sources[pair.producer][segment.region]
            target = targets[pair.consumer][segment.region]
            shape = (segment.num_copies, segment.length_bytes)
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
    """Put a consumer rank's ``regions`` into its blocks: latent rows through the attention
    table, conv and recurrent bytes into the boundary row of each KDA group."""
    plan = vllm_plan_of(layout.plan)
    if transfer is not None:
        _check_conv_layout(transfer, layout, "consumer")
    row = boundary_row(plan, computed_tokens)
    spec, kda = layout.spec, plan.sizes.kda
    for (field, layer), data in regions.items():
        if layer is None or field not in ("latent", "conv", "recurrent"):
            raise _unsupported(Region(field=field, layer=layer, size_bytes=data.numel()))
        name = layout.names.name(layer)
        owner = spec.layer(name)
        plane = plane_bytes(parts_of(registered[name])[0], spec.num_blocks, spec.page_bytes)
        if field == "latent":
            _write_rows(plane, data, tables.table(owner.group), layout)
            continue
        start = 0 if field == "conv" or kda is None else kda.conv_bytes
        page = plane[tables.block(owner.group, row)]
        page[start : start + data.numel()].copy_(data)


def _write_rows(
    plane: torch.Tensor, data: torch.Tensor, table: Sequence[int], layout: LiveLayout
) -> None:
    """Latent rows (latent bytes, then index bytes, per token) into their blocks' pages: local
    row ``i`` in table row ``i // block`` at slot ``i % block``."""
    plan = vllm_plan_of(layout.plan)
    attention, block = plan.sizes.attention, plan.block_tokens
    latent, index = attention.latent_bytes_per_token, attention.index_bytes_per_token
    rows = data.view(-1, latent + index)
    for table_row, start in enumerate(range(0, rows.shape[0], block)):
        chunk = rows[start : start + block]
        if table_row >= len(table):
            raise Refusal(
                "invalid_argument",
                f"{rows.shape[0]} latent rows need {table_row + 1} attention blocks; the table "
                f"has {len(table)}",
                facts={"num_rows": rows.shape[0], "num_table_rows": len(table)},
                hint="give the attention group enough blocks for the prefix",
            )
        page = plane[table[table_row]]
        page[: block * latent].view(block, latent)[: len(chunk)].copy_(chunk[:, :latent])
        if index:
            page[block * latent :].view(block, index)[: len(chunk)].copy_(chunk[:, latent:])


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
