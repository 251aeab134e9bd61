"""The transfer report: a plan's totals per pair and per rank, flat and JSON-ready.

``k3layout transfer --json`` prints it. The plan itself keeps every segment; the report keeps
the counts and byte totals an operator reads (``pairs``, ``segments``, ``bytes_per_consumer``).
"""

from __future__ import annotations

from .._args import expect
from .._frozen import Frozen
from .plan import TransferPlan


class RankPairReport(Frozen):
    """One (producer, consumer) pair: where both sit and what moves between them."""

    producer: int
    producer_stage: int
    producer_tp_rank: int
    consumer: int
    consumer_stage: int
    consumer_tp_rank: int
    segments: int
    copies: int
    page_bytes: int
    slot_bytes: int


class TransferReport(Frozen):
    """Counts and byte totals of a :class:`~k3layout.transfer.TransferPlan`."""

    model: str
    prompt_tokens: int
    conv_layout: str
    num_producers: int
    num_consumers: int
    pairs: int
    segments: int
    copies: int
    total_bytes: int
    bytes_per_consumer: tuple[int, ...]
    page_bytes_per_consumer: tuple[int, ...]
    slot_bytes_per_consumer: tuple[int, ...]
    bytes_per_producer: tuple[int, ...]
    rank_pairs: tuple[RankPairReport, ...]


def transfer_report(result: TransferPlan) -> TransferReport:
    """Spell out ``result``'s totals."""
    expect("result", result, TransferPlan)
    page = [0] * result.num_consumers
    slot = [0] * result.num_consumers
    rows: list[RankPairReport] = []
    for pair in result.pairs:
        page[pair.consumer] += pair.kind_bytes("page")
        slot[pair.consumer] += pair.kind_bytes("slot")
        p_stage, p_tp = result.producer_coords(pair.producer)
        c_stage, c_tp = result.consumer_coords(pair.consumer)
        rows.append(
            RankPairReport(
                producer=pair.producer,
                producer_stage=p_stage,
                producer_tp_rank=p_tp,
                consumer=pair.consumer,
                consumer_stage=c_stage,
                consumer_tp_rank=c_tp,
                segments=len(pair.segments),
                copies=pair.num_copies,
                page_bytes=pair.kind_bytes("page"),
                slot_bytes=pair.kind_bytes("slot"),
            )
        )
    return TransferReport(
        model=result.model.name,
        prompt_tokens=result.prompt_tokens,
        conv_layout=result.decode.conv_layout,
        num_producers=result.num_producers,
        num_consumers=result.num_consumers,
        pairs=result.num_pairs,
        segments=result.num_segments,
        copies=result.num_copies,
        total_bytes=result.total_bytes,
        bytes_per_consumer=result.bytes_per_consumer,
        page_bytes_per_consumer=tuple(page),
        slot_bytes_per_consumer=tuple(slot),
        bytes_per_producer=result.bytes_per_producer,
        rank_pairs=tuple(rows),
    )
