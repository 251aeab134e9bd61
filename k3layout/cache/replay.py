"""ATOM's ReplaySSM records: per KDA layer and state slot, k, u (bf16) and g (fp32), each
``(L, H, D)`` sharded by heads, ``L = max(cache_len, 2*(s+1))``; and ONE int32 write cursor
per slot shared by all layers, replicated on every TP rank.

K3 at TP 8, L 16: ``16*12*128*(2+2+4) = 196,608`` B per layer per slot.
"""

from __future__ import annotations

from .._args import expect
from ..deployment import Deployment
from ..dtypes import DTypeName
from ..placements import Replicate, Shard
from .part import CachePart, check_dim
from .spec import LayerCacheSpec

RECORDS: tuple[tuple[str, DTypeName], ...] = (
    ("replay_k", "bfloat16"),
    ("replay_u", "bfloat16"),
    ("replay_g", "float32"),
)


def record_len(deployment: Deployment) -> int:
    """``L``: records kept per slot."""
    expect("deployment", deployment, Deployment)
    return _record_len(deployment)


def _record_len(deployment: Deployment) -> int:
    return max(deployment.replayssm_cache_len, 2 * (deployment.spec_tokens + 1))


def replay_spec(num_heads: int, head_dim: int, deployment: Deployment) -> LayerCacheSpec:
    """The k, u and g records of one KDA layer's slot; refuses (``invalid_argument``) a
    ``num_heads`` or ``head_dim`` below 1, (``size_limit``) one above ``MAX_MODEL_DIM``."""
    expect("deployment", deployment, Deployment)
    for name, value in (("num_heads", num_heads), ("head_dim", head_dim)):
        check_dim(name, value)
    shape = (_record_len(deployment), num_heads, head_dim)
    return LayerCacheSpec(
        kind="replay",
        paging="slot",
        parts=tuple(
            CachePart(name=name, shape=shape, dtype=dtype, tp=Shard(dim=1))
            for name, dtype in RECORDS
        ),
    )


def cursor_spec() -> LayerCacheSpec:
    """The slot's write cursor: one int32, replicated, written whole."""
    return LayerCacheSpec(
        kind="replay_cursor",
        paging="slot",
        parts=(CachePart(name="cursor", shape=(1,), dtype="int32", tp=Replicate()),),
    )
