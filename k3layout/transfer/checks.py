"""Invariants of a transfer plan, checked from its regions: what an engine (or a property test)
can assert before moving a byte.

- every segment reads a region its producer holds and writes one its consumer holds (same field
  and module layer), for each of its layers, and the pair is in one head group;
- the layers of one segment share a cache spec;
- every source copy lies inside its producer's region;
- each consumer region is tiled exactly by its copies: every destination byte written once,
  no two copies overlap, none is left unwritten;
- replicated regions arrive whole: the cursor in one copy of its full size, latent rows whole.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._args import expect_args
from .connectors import gathers_state
from .pairing import pairing_refusal
from .plan import TransferPlan
from .regions import Region
from .segments import RegionKey, Segment


def _tiling_violations(
    consumer: int, region: Region, spans: Iterable[tuple[int, int]]
) -> list[str]:
    problems: list[str] = []
    end = 0
    for start, length in sorted(spans):
        if start < end:
            problems.append(
                f"consumer {consumer} {region.key}: byte {start} written twice (overlap)"
            )
        elif start > end:
            problems.append(f"consumer {consumer} {region.key}: bytes [{end}, {start}) unwritten")
        end = max(end, start + length)
    if end != region.size_bytes:
        problems.append(
            f"consumer {consumer} {region.key}: written up to byte {end} of {region.size_bytes}"
        )
    return problems


def _written(segment: Segment) -> Iterable[tuple[int, int]]:
    """The destination spans ``(start, length)`` of ``segment``'s copies into one region:
    copies that touch end to end on the destination side (the MLA rows of one DCP rank, read
    from strided source rows) as one span, so a transfer of ``2**32`` tokens is checked
    without listing its ``2**29`` copies; others one per copy (:meth:`Segment.copies`)."""
    if segment.num_copies == 1 or segment.dst_stride_bytes == segment.length_bytes:
        return ((segment.dst_offset_bytes, segment.num_copies * segment.length_bytes),)
    return [(dst, length) for _, dst, length in segment.copies()]


def _segment_violations(
    result: TransferPlan,
    producer: int,
    held: dict[RegionKey, Region],
    segment: Segment,
    region: RegionKey,
) -> list[str]:
    """What is wrong with ``segment``'s copies in one of its regions, read from ``producer``."""
    problems: list[str] = []
    source = held.get(region)
    if source is None:
        problems.append(f"producer {producer} holds no region {region}")
    elif segment.src_end_bytes > source.size_bytes:
        problems.append(
            f"producer {producer} {region}: reads up to byte {segment.src_end_bytes} of "
            f"{source.size_bytes}"
        )
    field, layer = region
    row_bytes = (
        result.decode_sizes.spec_of(layer).part(field).local_bytes(result.decode.attn_tp)
        if segment.kind == "page" and layer is not None
        else 1
    )
    if any(
        value % row_bytes
        for value in (
            segment.length_bytes,
            segment.src_offset_bytes,
            segment.dst_offset_bytes,
            segment.src_stride_bytes,
            segment.dst_stride_bytes,
        )
    ):
        problems.append(f"latent segment {segment} splits a {row_bytes} B row of {region}")
    return problems


def transfer_violations(result: TransferPlan) -> list[str]:
    """Every invariant of ``result`` that does not hold, described (``[]`` when all hold)."""
    expect_args(("result", result, TransferPlan))
    problems: list[str] = []
    sizes = result.decode_sizes
    gathers = gathers_state(result.decode.engine)
    producer_regions = [
        {r.key: r for r in result.producer_regions(rank)} for rank in range(result.num_producers)
    ]
    written: list[dict[RegionKey, list[tuple[int, int]]]] = [
        {} for _ in range(result.num_consumers)
    ]
    for pair in result.pairs:
        held = producer_regions[pair.producer]
        (_, src_tp), (_, dst_tp) = (
            result.producer_coords(pair.producer),
            result.consumer_coords(pair.consumer),
        )
        refusal = pairing_refusal(
            src_tp, dst_tp, result.prefill.attn_tp, result.decode.attn_tp, gathers
        )
        if refusal is not None:
            problems.append(f"pair {pair.producer} -> {pair.consumer}: {refusal}")
        for segment in pair.segments:
            specs = {sizes.layer_specs[n] for n in segment.layers if n < len(sizes.layer_specs)}
            if len(specs) > 1:
                problems.append(
                    f"pair {pair.producer} -> {pair.consumer}: segment {segment.field} names "
                    f"layers {segment.layers} of different cache specs"
                )
            for key in segment.regions:
                problems += _segment_violations(result, pair.producer, held, segment, key)
                spans = written[pair.consumer].setdefault(key, [])
                spans.extend(_written(segment))
    for consumer in range(result.num_consumers):
        regions = result.consumer_regions(consumer)
        keys = {region.key for region in regions}
        for key in written[consumer].keys() - keys:
            problems.append(f"consumer {consumer} holds no region {key}")
        for region in regions:
            spans = written[consumer].get(region.key, [])
            problems += _tiling_violations(consumer, region, spans)
            if region.field == "cursor" and spans != [(0, region.size_bytes)]:
                problems.append(f"consumer {consumer}: cursor not written whole once: {spans}")
    return problems
