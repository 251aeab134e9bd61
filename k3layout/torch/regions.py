"""Restore a prefix across TP: a transfer plan's segments, executed on tiers and live caches.

A :class:`~k3layout.transfer.TransferPlan` addresses abstract regions per rank (latent rows per
MLA layer, conv and recurrent state per KDA layer). Here they meet bytes:

- :func:`restore_across_tp` copies every segment straight from the producers' tiers into the
  consumers' blocks: a region is a run of contiguous *chunks* on both sides (an attention
  part's rows in each of its blocks, a state part in one page), and a segment's strided
  copies are cut where a chunk ends. Nothing is staged and nothing zero-filled, so it moves
  each byte once, as a plain copy does.
- The steps, for an engine that wants the regions as buffers: :func:`tier_regions` reads a
  producer rank's regions out of its :class:`~.tier.Tier` (latent row ``i`` of an MLA layer
  from the KV pages, the row's latent bytes then its DSA index bytes; a KDA layer's conv
  (q|k|v) and recurrent bytes from its state range in the image); :func:`apply_segments`
  runs every pair's strided copies into new consumer regions; :func:`write_regions` puts a
  consumer's regions into its blocks (latent rows through the attention table, state into
  row ``(n - 1) // block`` of each KDA group).

Every byte range comes from the layers' cache specs: a region is one part of one layer, and
:meth:`~k3layout.layouts.LayoutBase.part_range` says where that part sits in the layer's page.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import cast

import torch

from .._args import expect, expect_args, expect_sequence
from ..cache import PartRange
from ..errors import Refusal
from ..layouts import Group
from ..transfer import Region, RegionKey, Segment, TransferPlan
from ._checks import (
    expect_bytes,
    expect_region_key,
    expect_region_map,
    expect_registered,
    refuse_meta_source,
    registered_parts,
)
from .allocation import Registered, _plane_view
from .copies import Chunks, Cut, Run, cuts, execute, repeated
from .live import LiveLayout
from .tables import BlockTables, boundary_row
from .tier import Tier


def _check_conv_layout(transfer: TransferPlan, layout: LiveLayout, side: str) -> None:
    theirs = transfer.decode.conv_layout_run
    ours = layout.plan.deployment.conv_layout_run
    if theirs != ours:
        raise Refusal(
            "tensor_mismatch",
            f"the transfer plan moves conv state {theirs}, the {side} registered it {ours}",
            facts={"side": side, "conv_layout": ours, "transfer_conv_layout": theirs},
            hint=f"plan both sides with conv_layout={ours}",
        )


def _unsupported(field: str, layer: int | None) -> Refusal:
    return Refusal(
        "tensor_mismatch",
        f"region {field} of layer {layer}: vLLM's layout holds no such bytes",
        facts={"field": field, "layer": layer},
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


def _held(tier: Tier, region: Region) -> tuple[Group, int, PartRange]:
    """Where a producer's ``region`` sits in its tier's layout (its group, position in the
    group and part range); refuses a region the tier does not hold at the plan's size."""
    layout = tier.layout
    plan = layout.plan
    if region.layer is None:
        raise _unsupported(region.field, region.layer)
    # the position in the stage's group: the tier's image holds this stage's layers only
    group, position = plan.group_of(region.layer, layout.spec.stage)
    spec = plan.group_spec(group)
    if region.field not in spec.part_names:
        raise _unsupported(region.field, region.layer)
    kind = "page" if spec.paging == "token" else "slot"
    if region.kind != kind:
        raise Refusal(
            "tensor_mismatch",
            f"region {region.field} of layer {region.layer} is a {region.kind} region; the "
            f"layer's cache holds it as a {kind}",
            facts={"field": region.field, "layer": region.layer, "kind": region.kind},
            hint="read the regions the transfer plan gives the producer (producer_regions)",
        )
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
    return group, position, inner


def tier_regions(tier: Tier, regions: Sequence[Region]) -> dict[RegionKey, torch.Tensor]:
    """A producer rank's ``regions`` (``transfer.producer_regions(rank)``) read from its tier,
    each a contiguous ``uint8`` buffer of the region's size."""
    expect("tier", tier, Tier)
    out: dict[RegionKey, torch.Tensor] = {}
    for region in cast(Sequence[Region], expect_sequence("regions", regions, Region)):
        group, position, inner = _held(tier, region)
        if region.kind == "page":
            rows = _rows(tier.kv, tier.layout, region, tier.computed_tokens)
            out[region.key] = rows.reshape(-1)
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
    expect("transfer", transfer, TransferPlan)
    given = [
        expect_region_map(f"sources[{i}]", s) for i, s in enumerate(_items("sources", sources))
    ]
    if len(given) != transfer.num_producers:
        raise Refusal(
            "invalid_argument",
            f"the transfer has {transfer.num_producers} producer ranks, got {len(given)} sources",
            facts={"num_producers": transfer.num_producers, "num_sources": len(given)},
            hint="pass one region mapping per producer rank",
        )
    # a transfer plan tiles every consumer region exactly (transfer_violations): no zero-fill
    targets = [
        {r.key: torch.empty(r.size_bytes, dtype=torch.uint8) for r in transfer.consumer_regions(c)}
        for c in range(transfer.num_consumers)
    ]
    for pair in transfer.pairs:
        for segment in pair.segments:
            shape = (segment.num_copies, segment.length_bytes)
            for region in segment.regions:  # the same copies in each of the segment's layers
                source = _source(given, pair.producer, region)
                target = targets[pair.consumer][region]
                _strided(target, segment.dst_offset_bytes, segment.dst_stride_bytes, shape).copy_(
                    _strided(source, segment.src_offset_bytes, segment.src_stride_bytes, shape)
                )
    return targets


def _items(name: str, value: object) -> Sequence[object]:
    """``value`` if it is a sequence (not a ``str``); else refused, naming ``name``."""
    return expect_sequence(name, value, object)


def _source(
    sources: Sequence[Mapping[RegionKey, object]], producer: int, key: RegionKey
) -> torch.Tensor:
    """Producer ``producer``'s buffer of region ``key``: refused where it is missing
    (``tensor_mismatch``) or not a contiguous ``uint8`` CPU buffer."""
    found = sources[producer].get(key)
    name = f"sources[{producer}][{key!r}]"
    if found is None:
        raise Refusal(
            "tensor_mismatch",
            f"sources[{producer}] has no region {key!r}, which the transfer copies from",
            facts={"field": "sources", "producer": producer, "region": repr(key)},
            hint="pass every region of the producer, as tier_regions reads them",
        )
    data = expect_bytes(name, found)
    if data.device.type != "cpu":
        raise Refusal(
            "tensor_mismatch",
            f"{name} is on {data.device}; the consumer regions are built on the CPU",
            facts={"field": "sources", "device": str(data.device)},
            hint="pass the producers' regions on the CPU, as tier_regions reads a CPU tier",
        )
    return data


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
    expect_args(
        ("layout", layout, LiveLayout),
        ("tables", tables, BlockTables),
        ("transfer", transfer, (TransferPlan, type(None))),
    )
    held = expect_registered("registered", registered)
    given = expect_region_map("regions", regions)
    plan = layout.plan
    if transfer is not None:
        _check_conv_layout(transfer, layout, "consumer")
    row = boundary_row(plan, computed_tokens)
    spec = layout.spec
    for key, value in given.items():
        field, layer = expect_region_key("regions", key)
        if layer is None:
            raise _unsupported(field, layer)
        group, _ = plan.group_of(layer)
        if field not in plan.group_spec(group).part_names:
            raise _unsupported(field, layer)
        name = layout.names.name(layer)
        owner = spec.layer(name)
        tensor = registered_parts(held, name)[0]
        plane = _plane_view(tensor, spec.num_blocks, spec.page_bytes)
        inner = plan.part_range(layer, field)
        token = plan.group_spec(group).paging == "token"
        data = expect_bytes(f"regions[{key!r}]", value, size=None if token else inner.size_bytes)
        refuse_meta_source(f"regions[{key!r}]", data, plane)
        if token:
            table = _in_cache(owner.group, tables.table(owner.group), spec.num_blocks)
            _write_rows(plane, data, table, inner, plan.tokens_per_page(group))
            continue
        (block,) = _in_cache(owner.group, (tables.block(owner.group, row),), spec.num_blocks)
        plane[block, inner.offset_bytes : inner.end_bytes].copy_(data)


def _in_cache(group: str, blocks: tuple[int, ...], num_blocks: int) -> tuple[int, ...]:
    """``blocks`` of ``group``'s table, refused (``invalid_argument``) where one is not a
    block of the cache (``num_blocks`` blocks)."""
    outside = next((block for block in blocks if block >= num_blocks), None)
    if outside is not None:
        raise Refusal(
            "invalid_argument",
            f"tables: group {group} names block {outside}, beyond the cache's {num_blocks} blocks",
            facts={
                "field": "tables",
                "group": group,
                "block_id": outside,
                "num_blocks": num_blocks,
            },
            hint=f"give the request blocks of its cache (ids below {num_blocks})",
        )
    return blocks


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
    if data.numel() % row_bytes:
        raise Refusal(
            "tensor_mismatch",
            f"a region of {data.numel()} B is not a whole number of {row_bytes} B rows",
            facts={"region_bytes": data.numel(), "row_bytes": row_bytes},
            hint="pass a consumer region of whole rows, as apply_segments fills them",
        )
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
    (``prompt_tokens == computed_tokens``) and the layouts' deployments. Every copy is planned
    (and every refusal raised) before the first byte moves; each then goes straight from a
    tier to a consumer's pages.
    """
    expect("transfer", transfer, TransferPlan)
    tiers = cast(Sequence[Tier], expect_sequence("tiers", tiers, Tier))
    consumers = [_consumer(i, c) for i, c in enumerate(_items("consumers", consumers))]
    _check_ranks(transfer, tiers, consumers)
    for tier in tiers:
        _check_side(transfer, tier.layout, "producer")
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
    for layout, _, _ in consumers:
        _check_side(transfer, layout, "consumer")
    if any(t.kv.device.type == "meta" or t.image.device.type == "meta" for t in tiers):
        raise Refusal(
            "tensor_mismatch",
            "tiers: a meta tier holds no bytes to restore",
            facts={"field": "tiers", "device": "meta"},
            hint="restore from tiers stored from real memory (meta only checks sizes)",
        )
    shared = _Shared()
    sources = [_Producer(tier, shared) for tier in tiers]
    targets = [_Consumer(*consumer, transfer.prompt_tokens, shared) for consumer in consumers]
    execute(
        [
            run
            for pair in transfer.pairs
            for segment in pair.segments
            for run in _segment_runs(segment, sources[pair.producer], targets[pair.consumer])
        ]
    )


def _consumer(index: int, value: object) -> tuple[LiveLayout, Registered, BlockTables]:
    """``consumers[index]``: a ``(layout, registered, tables)`` triple, else refused."""
    name = f"consumers[{index}]"
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise Refusal(
            "invalid_argument",
            f"{name} must be a (layout, registered, tables) triple, got {type(value).__name__}",
            facts={"field": name, "got": type(value).__name__},
            hint="pass (LiveLayout, registered tensors, BlockTables) per consumer rank",
        )
    layout, registered, tables = value
    expect_args((f"{name}[0]", layout, LiveLayout), (f"{name}[2]", tables, BlockTables))
    expect_registered(f"{name}[1]", registered)
    return layout, registered, tables


def _segment_runs(segment: Segment, source: _Side, target: _Side) -> Iterator[Run]:
    """A segment's copies in every one of its layers: cut once per chunking the layers share
    (the same part of one group), then placed at each layer's regions."""
    together: dict[tuple[int, ...], tuple[list[Cut], torch.Tensor, torch.Tensor, list[Origin]]]
    together = {}
    for (src_chunks, src_base, src), (dst_chunks, dst_base, dst) in zip(
        source.place(segment), target.place(segment), strict=True
    ):
        key = (id(src_chunks), id(dst_chunks), id(src_base), id(dst_base))
        found = together.get(key)
        if found is None:
            planned = list(cuts(segment, src_chunks, dst_chunks))
            found = together[key] = (planned, dst_base, src_base, [])
        found[3].append((dst, src))
    for planned, dst_base, src_base, origins in together.values():
        # in source order, a group's consecutive layers come at a fixed step on both sides
        origins.sort(key=lambda origin: origin[1])
        yield from repeated(planned, dst_base, src_base, origins)


def _check_side(transfer: TransferPlan, layout: LiveLayout, side: str) -> None:
    """A producer's or consumer's layout is planned as the transfer's side: its conv layout,
    its attention TP and DCP (they size every share)."""
    _check_conv_layout(transfer, layout, side)
    planned = transfer.prefill if side == "producer" else transfer.decode
    ours = layout.plan.deployment
    for field in ("attn_tp", "dcp"):
        theirs, mine = getattr(planned, field), getattr(ours, field)
        if theirs != mine:
            raise Refusal(
                "tensor_mismatch",
                f"the transfer plan's {side} has {field}={theirs}, the {side}'s layout {mine}",
                facts={"side": side, field: mine, f"transfer_{field}": theirs},
                hint=f"plan the transfer for the deployments the {side}s were validated under",
            )


def _check_ranks(
    transfer: TransferPlan, tiers: Sequence[Tier], consumers: Sequence[object]
) -> None:
    """One tier per producer rank and one layout per consumer rank of the transfer."""
    if len(tiers) != transfer.num_producers:
        raise Refusal(
            "invalid_argument",
            f"the transfer has {transfer.num_producers} producer ranks, got {len(tiers)} tiers",
            facts={"num_producers": transfer.num_producers, "num_sources": len(tiers)},
            hint="pass one tier per producer rank",
        )
    if len(consumers) != transfer.num_consumers:
        raise Refusal(
            "invalid_argument",
            f"the transfer has {transfer.num_consumers} consumer ranks, got {len(consumers)} "
            "layouts",
            facts={"num_consumers": transfer.num_consumers, "num_layouts": len(consumers)},
            hint="pass one (layout, registered, tables) per consumer rank",
        )


@dataclass(frozen=True)
class _Part:
    """Where a region's part sits in a plan's stage: the layer's registered ``name``, its
    ``group`` (name) and ``position`` there, its paging, the rows a page holds (token paging)
    and the part's byte range in the page."""

    name: str
    group: str
    position: int
    paging: str
    tokens: int
    inner: PartRange


@dataclass(frozen=True)
class _Located:
    """A segment's regions on one side, one per layer, as every rank of a plan has them: the
    layer whose plane holds it (consumer), its byte offset (from the plane's start on a
    consumer, from the tier buffer's on a producer) and its chunks."""

    names: tuple[str, ...]
    offsets: tuple[int, ...]
    chunks: tuple[Chunks, ...]


Origin = tuple[int, int]
"""A pair of region origins: ``(target byte, source byte)`` in their storages."""

Placed = tuple[Chunks, torch.Tensor, int]
"""A region on one rank: its chunks, the ``uint8`` tensor whose storage holds it and the
storage byte its chunk offsets count from."""


class _Shared:
    """What every rank of a plan shares in one restore: each part located (:meth:`part`),
    each segment's regions (by the key its side gives) and each chunking, made once."""

    def __init__(self) -> None:
        self.parts: dict[tuple[object, ...], _Part] = {}
        self.located: dict[tuple[object, ...], _Located] = {}
        self.chunkings: dict[tuple[object, ...], Chunks] = {}

    def part(self, layout: LiveLayout, key: RegionKey) -> _Part:
        """Where region ``key`` sits in ``layout``'s stage; refuses a region vLLM's layout
        holds no bytes for (the slot's cursor, ReplaySSM's records)."""
        plan, stage = layout.plan, layout.spec.stage
        memo = (id(plan), stage, layout.names.names, key)
        found = self.parts.get(memo)
        if found is not None:
            return found
        field, layer = key
        if layer is None:
            raise _unsupported(field, layer)
        group, position = plan.group_of(layer, stage)
        spec = plan.group_spec(group)
        if field not in spec.part_names:
            raise _unsupported(field, layer)
        found = self.parts[memo] = _Part(
            name=layout.names.name(layer),
            group=group.name,
            position=position,
            paging=spec.paging,
            tokens=plan.tokens_per_page(group),
            inner=plan.part_range(layer, field),
        )
        return found

    def chunking(
        self,
        offsets: Callable[[], tuple[int, ...]],
        chunk_bytes: int,
        size_bytes: int,
        *kind: object,
    ) -> Chunks:
        """The chunks of a region of ``kind``, made once (``offsets`` is called only then)."""
        key = (chunk_bytes, size_bytes, *kind)
        found = self.chunkings.get(key)
        if found is None:
            found = self.chunkings[key] = Chunks(offsets(), chunk_bytes, size_bytes)
        return found


class _Side(ABC):
    """One side of a restore: one rank's regions of a segment, from what the plan's ranks
    share (:meth:`_locate`, once per plan) and the rank's own storage."""

    shared: _Shared

    def located(self, key: tuple[object, ...], segment: Segment) -> _Located:
        """The segment's regions as every rank of a plan has them (``key`` names the plan)."""
        found = self.shared.located.get(key)
        if found is None:
            found = self.shared.located[key] = self._locate(segment)
        return found

    @abstractmethod
    def place(self, segment: Segment) -> list[Placed]:
        """The segment's regions on this rank, layer by layer."""

    @abstractmethod
    def _locate(self, segment: Segment) -> _Located:
        """The segment's regions as every rank of this one's plan has them."""


class _Producer(_Side):
    """A producer's regions on its tier: a page part's rows in each stored block of the KV
    (the layer's plane of every unit), a state part's bytes in the image."""

    def __init__(self, tier: Tier, shared: _Shared) -> None:
        self.tier, self.shared = tier, shared
        layout = tier.layout
        self.plan_key = (
            "producer",
            id(layout.plan),
            layout.spec.stage,
            layout.names.names,
            layout.published,
            tier.computed_tokens,
            tier.kv.numel(),
        )

    def place(self, segment: Segment) -> list[Placed]:
        located = self.located((*self.plan_key, segment.field, segment.layers), segment)
        tier = self.tier
        base = tier.kv if segment.kind == "page" else tier.image
        start = int(base.storage_offset())
        return [
            (chunks, base, start + offset)
            for chunks, offset in zip(located.chunks, located.offsets, strict=True)
        ]

    def _locate(self, segment: Segment) -> _Located:
        tier = self.tier
        layout = tier.layout
        page = layout.spec.page_bytes
        parts = [self.shared.part(layout, key) for key in segment.regions]
        if segment.kind == "page":  # block r's page of the layer's plane, unit by unit
            planes = {name: j for j, name in enumerate(layout.published)}
            unit = len(planes) * page
            units = tier.kv.numel() // unit
            offsets = [planes[part.name] * page for part in parts]
            chunks = [
                self.shared.chunking(
                    lambda: tuple(r * unit for r in range(units)),
                    part.inner.size_bytes,
                    tier.computed_tokens * part.inner.size_bytes // part.tokens,
                    "tier kv",
                    unit,
                    units,
                )
                for part in parts
            ]
        else:
            states = {(r.group, r.layer): r.offset_bytes for r in tier.geometry.ranges}
            offsets = [states[part.group, part.position] for part in parts]
            chunks = [
                self.shared.chunking(lambda: (0,), part.inner.size_bytes, part.inner.size_bytes)
                for part in parts
            ]
        return _Located(
            names=tuple(part.name for part in parts),
            offsets=tuple(
                o + part.inner.offset_bytes for o, part in zip(offsets, parts, strict=True)
            ),
            chunks=tuple(chunks),
        )


class _Consumer(_Side):
    """A consumer's regions in its cache: an attention part's rows in the blocks of its
    group's table, a state part in the page of its group's boundary row. Offsets are read on
    one ``uint8`` view of each storage (the backing)."""

    def __init__(
        self,
        layout: LiveLayout,
        registered: Registered,
        tables: BlockTables,
        computed_tokens: int,
        shared: _Shared,
    ) -> None:
        self.layout, self.registered, self.tables, self.shared = layout, registered, tables, shared
        self.row = boundary_row(layout.plan, computed_tokens)
        self.plan_key = (
            "consumer",
            id(layout.plan),
            layout.spec.stage,
            layout.spec.num_blocks,
            layout.names.names,
            id(tables),
            self.row,
        )
        self.backings: dict[tuple[str, int], torch.Tensor] = {}
        self.planes: dict[str, tuple[torch.Tensor, int]] = {}

    def place(self, segment: Segment) -> list[Placed]:
        located = self.located((*self.plan_key, segment.field, segment.layers), segment)
        placed: list[Placed] = []
        for name, offset, chunks in zip(
            located.names, located.offsets, located.chunks, strict=True
        ):
            backing, start = self._plane(name)
            placed.append((chunks, backing, start + offset))
        return placed

    def _plane(self, name: str) -> tuple[torch.Tensor, int]:
        """A ``uint8`` view of the storage layer ``name``'s plane is on (one per storage: the
        backing), and the byte the plane starts at; refuses a plane that runs past it."""
        found = self.planes.get(name)
        if found is not None:
            return found
        tensor = registered_parts(self.registered, name)[0]
        if tensor.layout != torch.strided:
            _plane_view(tensor, 1, 1)  # refuses, naming the layout
        storage = tensor.untyped_storage()
        # meta storages all start at 0: one view per layer there (nothing is copied)
        meta = tensor.device.type == "meta"
        where = (str(tensor.device), id(tensor) if meta else storage.data_ptr())
        backing = self.backings.get(where)
        if backing is None:
            backing = self.backings[where] = torch.empty(
                0, dtype=torch.uint8, device=tensor.device
            ).set_(storage)
        spec = self.layout.spec
        start = tensor.data_ptr() - storage.data_ptr()
        if start + spec.num_blocks * spec.page_bytes > storage.nbytes():
            _plane_view(tensor, spec.num_blocks, spec.page_bytes)  # refuses, with the facts
        found = self.planes[name] = (backing, start)
        return found

    def _locate(self, segment: Segment) -> _Located:
        layout, tables = self.layout, self.tables
        page = layout.spec.page_bytes
        parts = [self.shared.part(layout, key) for key in segment.regions]
        offsets: list[int] = []
        chunks: list[Chunks] = []
        for part in parts:
            inner = part.inner
            if part.paging == "token":  # the rows, block by block through the table
                table = _in_cache(part.group, tables.table(part.group), layout.spec.num_blocks)
                offsets.append(inner.offset_bytes)
                chunks.append(
                    self.shared.chunking(
                        partial(_block_starts, table, page),
                        inner.size_bytes,
                        len(table) * inner.size_bytes,
                        "table",
                        id(tables),
                        part.group,
                        page,
                    )
                )
                continue
            (block,) = _in_cache(
                part.group, (tables.block(part.group, self.row),), layout.spec.num_blocks
            )
            offsets.append(inner.offset_bytes + block * page)
            chunks.append(self.shared.chunking(lambda: (0,), inner.size_bytes, inner.size_bytes))
        return _Located(
            names=tuple(part.name for part in parts), offsets=tuple(offsets), chunks=tuple(chunks)
        )


def _block_starts(table: Sequence[int], page: int) -> tuple[int, ...]:
    """Where each block of ``table`` starts on a plane of ``page``-byte pages."""
    return tuple(block * page for block in table)
