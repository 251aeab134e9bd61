"""The KDA layer kind: a fixed-size state per request, head-sharded by attention TP.

Parts of a slot, back to back from its start (vLLM slices a KDA page into conv then
recurrent, and pads at the end). K3 (H 96, D 128, K 4), ``s`` speculative tokens::

    part       logical TP1 shape       TP        engine tensor on a rank      dtype
    conv  SD   (K-1+s, 3, H, D)        Shard(2)  (K-1+s, 3*H/tp*D)            bf16
          DS   (3, H, D, K-1+s)        Shard(1)  (3*H/tp*D, K-1+s)            bf16
    recurrent  (H, D, D)               Shard(0)  (H/tp, D, D)                 fp32

The conv state is ONE tensor (vLLM #44539): q, k and v channels side by side, each split by
heads, so rank ``r`` holds its q, k and v shares together. In SD at TP 1 the k channels of
row 0 start at byte ``H*D*2 = 24,576``, after the q channels.

``S(tp, s) = 3*H/tp*D*(K-1+s)*2 + H/tp*D*D*4``: 832,512 B at TP 8, s 2.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from .._args import expect_args
from .._frozen import Frozen
from ..constants import MAX_CONV_KERNEL
from ..deployment import ConvLayout, Deployment
from ..errors import Refusal
from ..placements import Shard
from ..registry import facts_of
from .part import CachePart, Dim
from .replay import replay_spec
from .spec import LayerCacheSpec, Paging

CONV_CHANNEL_GROUPS: tuple[str, str, str] = ("q", "k", "v")
"""The conv state's channel groups, side by side along its channel axis."""


class KDALayer(Frozen):
    """A KDA (Kimi Delta Attention) layer: a fixed-size per-request state, head-sharded by TP.

    The state is three causal short convolutions (q|k|v, ``num_heads * head_dim`` channels each,
    ``conv_kernel - 1`` rows of history) held as one tensor, and a
    ``(num_heads, head_dim, head_dim)`` recurrence.

    ``full_rank_gate`` and ``gate_lower_bound`` (``linear_attn_config``'s ``use_full_rank_gate``
    and ``gate_lower_bound``) and ``safe_gate`` do not change the cache; they decide which
    kernels an engine runs: vLLM serves a full-rank-gate layer (Kimi-K3) and a safe-gate one
    (GLM-5.3-Flash) with KDA paths whose FlashKDA prefill needs a bounded gate and exports a
    state checkpoint per request.
    """

    kind: Literal["kda"] = Field("kda", description="the layer kind tag: kda")
    paging: ClassVar[Paging] = "slot"
    num_heads: Dim = Field(description="KDA heads, sharded by attention TP (96 for K3)")
    head_dim: Dim = Field(
        description="per-head dim: conv channels per head and each side of the "
        "(head_dim, head_dim) recurrent state (128 for K3)"
    )
    conv_kernel: Annotated[int, Field(ge=2, le=MAX_CONV_KERNEL)] = Field(
        4, description="short convolution kernel K; the conv state keeps K - 1 rows of history"
    )
    full_rank_gate: bool = Field(
        False,
        description="linear_attn_config's use_full_rank_gate; picks vLLM's KDA kernels, "
        "not the cache",
    )
    gate_lower_bound: Annotated[float, Field(lt=0.0, allow_inf_nan=False)] | None = Field(
        None,
        description="linear_attn_config's gate_lower_bound (negative); FlashKDA prefill "
        "needs one; None: unbounded",
    )
    safe_gate: bool = Field(
        False,
        description="GLM-5.3-Flash's bounded sigmoid gate (linear_lower_bound): like a "
        "full-rank gate, it picks vLLM's KDA layer with a FlashKDA prefill path; not the cache",
    )

    def conv_rows(self, deployment: Deployment) -> int:
        """Rows of conv history: ``K - 1``, plus ``spec_tokens`` where the engine keeps a row
        per speculative token (vLLM; SGLang verifies in a scratch buffer instead)."""
        extra = deployment.spec_tokens if facts_of(deployment.engine).spec_conv_rows else 0
        return self.conv_kernel - 1 + extra

    def cache_spec(self, deployment: Deployment) -> LayerCacheSpec:
        """The conv state (one tensor, ``deployment.conv_layout_run``) then the recurrent state."""
        return _kda_spec(
            self.num_heads, self.head_dim, self.conv_rows(deployment), deployment.conv_layout_run
        )

    def side_specs(self, deployment: Deployment) -> tuple[LayerCacheSpec, ...]:
        """ATOM's ReplaySSM records beside the state slot, when the deployment keeps them."""
        if not deployment.replayssm:
            return ()
        return (replay_spec(self.num_heads, self.head_dim, deployment),)


def conv_channel_offset(spec: LayerCacheSpec, group: str, tp: int, row: int = 0) -> int:
    """Byte offset, inside a rank's conv tensor, of the first channel of ``group`` (q, k or v)
    in history row ``row``, derived from the conv part's shape and layout."""
    expect_args(("spec", spec, LayerCacheSpec), ("group", group, str), ("row", row, int))
    conv = spec.part("conv")
    if group not in CONV_CHANNEL_GROUPS:
        raise Refusal(
            "invalid_argument",
            f"group={group!r} is not a channel group of the conv state",
            facts={"field": "group", "group": group, "allowed": CONV_CHANNEL_GROUPS},
            hint=f"use one of {', '.join(CONV_CHANNEL_GROUPS)}",
        )
    which = CONV_CHANNEL_GROUPS.index(group)
    if conv.view == (1, 3):  # SD: (rows, 3, H, D)
        return conv.local_offset((row, which, 0, 0), tp)
    return conv.local_offset((which, 0, 0, row), tp)  # DS: (3, H, D, rows)


@lru_cache(maxsize=1024)
def _kda_spec(heads: int, dim: int, rows: int, layout: ConvLayout) -> LayerCacheSpec:
    """The spec of one KDA geometry (a frozen value, shared between plans)."""
    groups = len(CONV_CHANNEL_GROUPS)
    # SD: (rows, q|k|v, heads, dim), heads on axis 2; DS: (q|k|v, heads, dim, rows), axis 1.
    shape, axis, view = (
        ((rows, groups, heads, dim), 2, (1, 3))
        if layout == "SD"
        else ((groups, heads, dim, rows), 1, (3, 1))
    )
    conv = CachePart(name="conv", shape=shape, dtype="bfloat16", tp=Shard(dim=axis), view=view)
    recurrent = CachePart(
        name="recurrent", shape=(heads, dim, dim), dtype="float32", tp=Shard(dim=0)
    )
    return LayerCacheSpec(kind="kda", paging="slot", parts=(conv, recurrent))
