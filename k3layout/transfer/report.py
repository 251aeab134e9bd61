"""The transfer report: a plan's totals per pair and per rank, flat and JSON-ready.

``k3layout transfer --json`` prints it. The plan itself keeps every segment; the report keeps
the counts and byte totals an operator reads (``pairs``, ``segments``, ``bytes_per_consumer``),
and names what they hold for: each side's engine and layout, the P/D rule that decided the
pairing, and the prompt length (and whether it was the command line's default).
"""

from __future__ import annotations

from .._args import expect, expect_args
from .._frozen import Frozen
from ..layouts import plan
from .connectors import pd_rule_of
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
    """Counts and byte totals of a :class:`~k3layout.transfer.TransferPlan`.

    ``prefill_engine`` / ``decode_engine`` name each side's engine (``*_engine_version`` its
    release) and ``prefill_layout`` /
    ``decode_layout`` its layout (the plan's packing label: ``block 1536`` for vLLM's hybrid
    allocator); ``pd_rule`` is the release and connector whose TP rule the decode's engine
    registered (``vLLM 0.33.0 and 0.34.0 NIXL``), ``None`` where it registered none.
    ``prompt_tokens_default`` says the prompt length was not given but defaulted.
    """

    model: str
    prompt_tokens: int
    prompt_tokens_default: bool = False
    prefill_engine: str
    prefill_engine_version: str
    prefill_layout: str
    decode_engine: str
    decode_engine_version: str
    decode_layout: str
    pd_rule: str | None
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


def transfer_report(result: TransferPlan, *, prompt_tokens_default: bool = False) -> TransferReport:
    """Spell out ``result``'s totals; ``prompt_tokens_default`` records that its prompt
    length was a default rather than given (the command line's ``--tokens``)."""
    expect("result", result, TransferPlan)
    expect_args(("prompt_tokens_default", prompt_tokens_default, bool))
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
    rule = pd_rule_of(result.decode.engine)
    return TransferReport(
        model=result.model.name,
        prompt_tokens=result.prompt_tokens,
        prompt_tokens_default=prompt_tokens_default,
        prefill_engine=result.prefill.engine,
        prefill_engine_version=result.prefill.version_run,
        prefill_layout=plan(result.model, result.prefill).packing_label,
        decode_engine=result.decode.engine,
        decode_engine_version=result.decode.version_run,
        decode_layout=plan(result.model, result.decode).packing_label,
        pd_rule=None if rule is None else rule.label,
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
