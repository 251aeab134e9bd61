"""A per-request ring: the tail of a token-pooled cache, the pool still being filled.

A pooled key entry (:mod:`k3layout.cache.pooled`) is written once its ``kpool`` tokens are all
known; until then the raw keys of those tokens, and their gate scores, wait in a ring that every
request keeps for its lifetime (vLLM's ``Glm5NextTailCache``, a ``CircularBufferSpec``). The
ring holds the pool being filled plus the speculative tokens in flight, rounded to whole pools
by a power of two::

    ring = kpool * next_pow2(ceil((kpool + s) / kpool))     (kpool 16: s=0 -> 16, s=1..16 -> 32)

    part    per-request shape        dtype   TP          bytes (kpool 16, s 0, head 128)
    k       (ring, index_head_dim)   bf16    Replicate   4,096
    score   (ring, index_head_dim)   bf16    Replicate   4,096

It is one state per request (a slot), not split by DCP (every DCP rank keeps the whole tail),
not prefix-cacheable, and a prefill-to-decode transfer carries it with the request.
"""

from __future__ import annotations

from functools import lru_cache

from .._args import expect, expect_non_negative
from ..constants import MAX_MODEL_DIM
from ..limits import check_bound
from ..placements import Replicate
from .part import CachePart, check_dim
from .pooled import DSAIndexer
from .spec import LayerCacheSpec

RING_PARTS: tuple[str, str] = ("k", "score")
"""The ring's halves, in slot order: raw bf16 keys, then the bf16 gate scores."""


def ring_tokens(kpool: int, spec_tokens: int) -> int:
    """Tokens a request's ring holds: the pool being filled and ``spec_tokens`` in flight,
    in whole pools, rounded up to a power of two of pools. Refuses (``invalid_argument``) a
    ``kpool`` below 1 or a negative ``spec_tokens``; (``size_limit``) values past the model
    bounds."""
    check_dim("kpool", kpool)
    _check_spec_tokens(spec_tokens)
    pools = -(-(kpool + spec_tokens) // kpool)
    return kpool * (1 << (pools - 1).bit_length())


def ring_spec(indexer: DSAIndexer, spec_tokens: int) -> LayerCacheSpec:
    """The tail ring of one indexed MLA layer under ``spec_tokens`` speculative tokens;
    refuses arguments of the wrong type or out of bounds (:func:`ring_tokens`)."""
    expect("indexer", indexer, DSAIndexer)
    _check_spec_tokens(spec_tokens)
    return _ring_spec(indexer, spec_tokens)


def _check_spec_tokens(spec_tokens: object) -> None:
    tokens = expect_non_negative("spec_tokens", spec_tokens)
    check_bound("spec_tokens", tokens, MAX_MODEL_DIM, why="speculative tokens")


@lru_cache(maxsize=256)
def _ring_spec(indexer: DSAIndexer, spec_tokens: int) -> LayerCacheSpec:
    shape = (ring_tokens(indexer.kpool, spec_tokens), indexer.head_dim)
    return LayerCacheSpec(
        kind="tail",
        paging="slot",
        parts=tuple(
            CachePart(name=name, shape=shape, dtype="bfloat16", tp=Replicate())
            for name in RING_PARTS
        ),
    )
