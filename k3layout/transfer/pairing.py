"""Who sends to whom: rank numbering, DCP ranks and the producer/consumer head-group pairing.

KDA state is head-sharded, so a consumer can only be fed by the producer whose heads contain
its own. With ``k = decode_tp / prefill_tp`` each producer TP rank ``p`` owns the head group of
consumers ``[p*k, (p+1)*k)`` and consumer ``d`` takes its share from producer ``d // k`` at
offset ``(d % k) * E / decode_tp`` of every head-sharded field of extent ``E``. Prefill TP 2,
decode TP 8 (``k = 4``)::

    consumer d       0  1  2  3  4  5  6  7
    producer d // 4  0  0  0  0  1  1  1  1
    d % 2            0  1  0  1  0  1  0  1     <- tp_rank % remote_tp_size: right only for
                                                   replicated KV (the MLA latent)

Ranks are numbered as vLLM orders them, pipeline stage outer and TP rank inner:
``rank = stage * attn_tp + tp_rank`` within the attention-DP replica that serves the request.
DCP groups are consecutive TP ranks (vLLM ``all_ranks.reshape(-1, dcp)``), so a TP rank's DCP
rank is ``tp_rank % dcp``.
"""

from __future__ import annotations

from .._args import expect_args, expect_int
from .._validation import describe
from ..constants import MAX_RANKS
from ..errors import Refusal
from ..limits import check_range
from ..placements import Shard

MAX_LISTED_GROUP = 64
"""A head group of at most this many consumers is listed whole in a refusal's facts."""

_CONSUMER_SHARES = Shard()
"""How the consumer shares are dealt to producer TP ranks: evenly, in order."""


def rank_of(stage: int, tp_rank: int, attn_tp: int) -> int:
    """Rank number of TP rank ``tp_rank`` on pipeline stage ``stage``."""
    return stage * attn_tp + tp_rank


def coords_of(rank: int, attn_tp: int) -> tuple[int, int]:
    """``(stage, tp_rank)`` of ``rank``: the inverse of :func:`rank_of`."""
    return divmod(rank, attn_tp)


RANKS_WHY = "torch.distributed numbers ranks in int32"


def dcp_rank_of(tp_rank: int, dcp: int) -> int:
    """The DCP rank of a TP rank: DCP groups are runs of ``dcp`` consecutive TP ranks.
    Refuses (``invalid_argument``) a ``tp_rank`` below 0 or a ``dcp`` below 1, (``size_limit``)
    either beyond ``MAX_RANKS``."""
    common = type(tp_rank) is int and type(dcp) is int  # the planner's own call: cheap checks
    if not (common and 0 <= tp_rank < MAX_RANKS and 0 < dcp <= MAX_RANKS):
        check_range("tp_rank", tp_rank, 0, MAX_RANKS - 1, why=RANKS_WHY)
        check_range("dcp", dcp, 1, MAX_RANKS, why=RANKS_WHY)
    return tp_rank % dcp


def tp_multiple_refusal(
    prefill_tp: int, decode_tp: int, gathers: bool = False, note: str = ""
) -> Refusal | None:
    """Why ``decode_tp`` cannot be fed from ``prefill_tp`` head-sharded ranks, or ``None``.

    Each consumer's heads must sit on one producer, so ``decode_tp`` must be a multiple of
    ``prefill_tp``. PP8 x TP2 -> TP3: a TP3 rank's 32 heads straddle both TP2 ranks. An
    engine that ``gathers`` (SGLang) also lets a consumer collect its heads from several
    producers when ``prefill_tp`` is a multiple of ``decode_tp``; ``note`` is that engine's
    own account of a pairing it cannot serve.
    """
    invalid = _size_refusal(prefill_tp=prefill_tp, decode_tp=decode_tp)
    if invalid is not None:
        return invalid
    if decode_tp % prefill_tp == 0 or (gathers and prefill_tp % decode_tp == 0):
        return None
    if gathers:
        return Refusal(
            "tp_not_multiple",
            f"prefill attn_tp={prefill_tp} and decode attn_tp={decode_tp}: neither divides the "
            f"other, so the rank mapping names prefill ranks that do not exist or leaves some "
            f"unpaired{': ' + note if note else ''}",
            facts={"prefill_tp": prefill_tp, "decode_tp": decode_tp},
            hint=f"use a decode attn_tp that divides {prefill_tp} or is a multiple of it",
        )
    below = decode_tp // prefill_tp * prefill_tp
    options = [m for m in (below, below + prefill_tp) if m > 0]
    why = (
        f"this engine feeds each decode rank from one prefill rank, and a decode rank's KDA "
        f"heads are those of {prefill_tp // decode_tp} prefill ranks"
        if prefill_tp % decode_tp == 0
        else "a decode rank's KDA heads would straddle two prefill ranks"
    )
    return Refusal(
        "tp_not_multiple",
        f"decode attn_tp={decode_tp} is not a multiple of prefill attn_tp={prefill_tp}: {why}",
        facts={"prefill_tp": prefill_tp, "decode_tp": decode_tp},
        hint=f"use decode attn_tp in {options} (a multiple of {prefill_tp})",
    )


def head_group(
    producer_tp_rank: int, prefill_tp: int, decode_tp: int, gathers: bool = False
) -> range:
    """Consumer TP ranks fed by ``producer_tp_rank``: its :class:`~k3layout.Shard` of the
    ``decode_tp`` consumer shares; where several producers feed one consumer (``gathers``,
    prefill TP a multiple of decode TP), that one consumer. Refuses ``tp_not_multiple``."""
    expect_int("producer_tp_rank", producer_tp_rank)
    refusal = tp_multiple_refusal(prefill_tp, decode_tp, gathers)
    if refusal is not None:
        raise refusal
    if decode_tp % prefill_tp:  # gathering: prefill_tp / decode_tp producers per consumer
        consumer = producer_tp_rank // (prefill_tp // decode_tp)
        return range(consumer, consumer + 1)
    size, offset = _CONSUMER_SHARES.local_size_and_offset(decode_tp, prefill_tp, producer_tp_rank)
    return range(offset, offset + size)


def paired_producer(consumer_tp_rank: int, prefill_tp: int, decode_tp: int) -> int:
    """The producer TP rank that feeds ``consumer_tp_rank``: ``d // (decode_tp / prefill_tp)``.
    Refuses ``tp_not_multiple``, and a consumer rank outside ``decode_tp``."""
    return producers_of(consumer_tp_rank, prefill_tp, decode_tp)[0]


def producers_of(
    consumer_tp_rank: int, prefill_tp: int, decode_tp: int, gathers: bool = False
) -> range:
    """The producer TP ranks that feed ``consumer_tp_rank``, the first of which also sends
    the replicated rows (the MLA latent): ``d // (decode_tp / prefill_tp)`` alone, or, where
    a consumer ``gathers`` (prefill TP ``g`` times decode TP), ``d * g .. d * g + g - 1``
    (SGLang's mapping; prefill TP 8, decode TP 2)::

        consumer d    0           1
        producers     0 1 2 3     4 5 6 7      (producer 4 writes consumer 1's latent rows)

    Refuses ``tp_not_multiple``, and a consumer rank outside ``decode_tp``."""
    refusal = tp_multiple_refusal(prefill_tp, decode_tp, gathers)
    if refusal is not None:
        raise refusal
    _check_tp_rank("consumer_tp_rank", consumer_tp_rank, decode_tp)
    if decode_tp % prefill_tp == 0:
        first = consumer_tp_rank // (decode_tp // prefill_tp)
        return range(first, first + 1)
    share = prefill_tp // decode_tp
    return range(consumer_tp_rank * share, (consumer_tp_rank + 1) * share)


def pairing_refusal(
    producer_tp_rank: int,
    consumer_tp_rank: int,
    prefill_tp: int,
    decode_tp: int,
    gathers: bool = False,
) -> Refusal | None:
    """Why a proposed pairing cannot carry head-sharded state, or ``None`` when it can.

    The check an engine runs on the pairing its connector proposes: ``tp_not_multiple``,
    ``invalid_argument`` for a rank outside its TP group, ``head_group_mismatch`` when the
    consumer is outside the producer's head group.
    """
    expect_args(
        ("producer_tp_rank", producer_tp_rank, int),
        ("consumer_tp_rank", consumer_tp_rank, int),
        ("gathers", gathers, bool),
    )
    refusal = tp_multiple_refusal(prefill_tp, decode_tp, gathers)
    if refusal is not None:
        return refusal
    for name, rank, size in (
        ("producer_tp_rank", producer_tp_rank, prefill_tp),
        ("consumer_tp_rank", consumer_tp_rank, decode_tp),
    ):
        if not 0 <= rank < size:
            return _rank_refusal(name, rank, size)
    group = head_group(producer_tp_rank, prefill_tp, decode_tp, gathers)
    if consumer_tp_rank in group:
        return None
    right = producers_of(consumer_tp_rank, prefill_tp, decode_tp, gathers)[0]
    return Refusal(
        "head_group_mismatch",
        f"consumer tp_rank={consumer_tp_rank} of decode attn_tp={decode_tp} is outside the head "
        f"group of producer tp_rank={producer_tp_rank} of prefill attn_tp={prefill_tp} "
        f"(consumers {group.start}..{group.stop - 1})",
        facts={
            "producer_tp_rank": producer_tp_rank,
            "consumer_tp_rank": consumer_tp_rank,
            "prefill_tp": prefill_tp,
            "decode_tp": decode_tp,
            # every member of a small group; the bounds of a large one
            **(
                {"head_group": tuple(group)}
                if len(group) <= MAX_LISTED_GROUP
                else {"head_group_range": (group.start, group.stop)}
            ),
        },
        hint=f"pair consumer tp_rank={consumer_tp_rank} with producer tp_rank={right}",
    )


def check_pairing(
    producer_tp_rank: int,
    consumer_tp_rank: int,
    prefill_tp: int,
    decode_tp: int,
    gathers: bool = False,
) -> None:
    """Raise :func:`pairing_refusal`'s refusal, if any."""
    expect_args(("gathers", gathers, bool))
    refusal = pairing_refusal(producer_tp_rank, consumer_tp_rank, prefill_tp, decode_tp, gathers)
    if refusal is not None:
        raise refusal


def _size_refusal(**sizes: object) -> Refusal | None:
    """Refuse a TP size of the wrong type (raised) or outside ``1..MAX_RANKS`` (returned)."""
    for name, value in sizes.items():
        size = expect_int(name, value)
        if not 1 <= size <= MAX_RANKS:
            return Refusal(
                "invalid_argument" if size < 1 else "size_limit",
                f"{name}={size if size.bit_length() <= 128 else '<huge>'} must be in "
                f"1..{MAX_RANKS:,} (a TP size)",
                facts={"field": name, "bound": MAX_RANKS},
                hint=f"use 1 <= {name} <= {MAX_RANKS:,}",
            )
    return None


def _rank_refusal(name: str, rank: int, size: int) -> Refusal:
    return Refusal(
        "invalid_argument",
        f"{name}={describe(rank)} is not a rank of attn_tp={size}",
        facts={name: rank, "attn_tp": size},
        hint=f"use 0 <= {name} < {size}",
    )


def _check_tp_rank(name: str, rank: int, size: int) -> None:
    if not 0 <= expect_int(name, rank) < size:
        raise _rank_refusal(name, rank, size)
