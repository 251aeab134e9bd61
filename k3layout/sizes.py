"""Per-rank byte sizes of one layer of each kind: the arithmetic every layout is built from.

MLA caches one latent head per token, replicated on every TP rank. KDA keeps a per-request
state, head-sharded by attention TP::

    S(tp, s) = (3*H*D/tp) * (K-1+s) * 2   +   (H/tp) * D * D * 4
               conv q|k|v, bf16, K-1+s rows     recurrent state, fp32

K3 (H = 96, D = 128, K = 4) at tp 8, s 2: 46,080 + 786,432 = 832,512 bytes.
"""

from __future__ import annotations

import math
from functools import reduce
from typing import Literal, TypeAlias

from pydantic import NonNegativeInt, PositiveInt

from ._args import expect_args
from ._divisors import nearest_divisors
from ._frozen import Frozen
from .constants import FLASHMLA_FP8_SCALE_GROUP, PARENT_PAGE_TOKENS
from .deployment import Deployment
from .dtypes import DTYPE_BYTES, KV_ELEMENT_DTYPE, DTypeName, KvCacheDtype
from .errors import Refusal
from .model import HybridModel, KDALayer, MLALayer

ConvLayout: TypeAlias = Literal["channel_major", "time_major"]
"""``channel_major``: ``(channels, K-1+s)``; ``time_major``: ``(K-1+s, channels)`` (vLLM "DS")."""

CONV_PARTS: tuple[str, str, str] = ("q", "k", "v")


class MlaCacheSizes(Frozen):
    """Cache bytes of one MLA layer per token, on every rank (the latent is replicated)."""

    kv_lora_rank: PositiveInt
    qk_rope_head_dim: PositiveInt
    index_bytes_per_token: NonNegativeInt
    kv_dtype: KvCacheDtype

    @property
    def element_dtype(self) -> DTypeName:
        """Element dtype of the latent cache tensor."""
        return KV_ELEMENT_DTYPE[self.kv_dtype]

    @property
    def latent_dim(self) -> int:
        """Latent elements per token (576 for K3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def latent_bytes_per_token(self) -> int:
        """576 x elem (576 fp8 / 1,152 bf16); FlashMLA's fp8 row packs 512 fp8 + 4 fp32 scales
        + 64 bf16 rope = 656."""
        if self.kv_dtype == "fp8_ds_mla":
            scales = self.kv_lora_rank // FLASHMLA_FP8_SCALE_GROUP * DTYPE_BYTES["float32"]
            return self.kv_lora_rank + scales + self.qk_rope_head_dim * DTYPE_BYTES["bfloat16"]
        return self.latent_dim * DTYPE_BYTES[self.element_dtype]

    @property
    def bytes_per_token(self) -> int:
        """Movable bytes per token: the latent plus a DSA index row folded into its layer."""
        return self.latent_bytes_per_token + self.index_bytes_per_token

    def page_bytes(self, tokens: int = PARENT_PAGE_TOKENS) -> int:
        """Bytes of one page of ``tokens`` tokens (a 128-token page by default)."""
        return tokens * self.bytes_per_token


class KdaStateSizes(Frozen):
    """One KDA layer's state per request on one rank (heads sharded by attention TP)."""

    num_heads: PositiveInt
    head_dim: PositiveInt
    conv_kernel: PositiveInt
    attn_tp: PositiveInt
    spec_tokens: NonNegativeInt

    conv_dtype: Literal["bfloat16"] = "bfloat16"
    recurrent_dtype: Literal["float32"] = "float32"

    @property
    def local_heads(self) -> int:
        """Heads on this rank: ``num_heads / attn_tp``."""
        return self.num_heads // self.attn_tp

    @property
    def conv_rows(self) -> int:
        """Rows of conv history: ``K - 1 + spec_tokens``."""
        return self.conv_kernel - 1 + self.spec_tokens

    @property
    def conv_part_channels(self) -> int:
        """Channels of one conv part (q, k or v) on this rank: ``local_heads * head_dim``."""
        return self.local_heads * self.head_dim

    def conv_part_shape(self, layout: ConvLayout = "channel_major") -> tuple[int, int]:
        """Shape of one of the three conv states (q, k, v) in ``layout``."""
        if layout == "channel_major":
            return (self.conv_part_channels, self.conv_rows)
        return (self.conv_rows, self.conv_part_channels)

    def conv_shape(self, layout: ConvLayout = "channel_major") -> tuple[int, int]:
        """Shape of the three parts as one tensor (q|k|v along the channels)."""
        if layout == "channel_major":
            return (len(CONV_PARTS) * self.conv_part_channels, self.conv_rows)
        return (self.conv_rows, len(CONV_PARTS) * self.conv_part_channels)

    @property
    def conv_part_bytes(self) -> int:
        """Bytes of one conv part (equal in both layouts)."""
        return self.conv_part_channels * self.conv_rows * DTYPE_BYTES[self.conv_dtype]

    @property
    def conv_bytes(self) -> int:
        """Bytes of the three conv parts."""
        return len(CONV_PARTS) * self.conv_part_bytes

    @property
    def recurrent_shape(self) -> tuple[int, int, int]:
        """``(local_heads, head_dim, head_dim)``."""
        return (self.local_heads, self.head_dim, self.head_dim)

    @property
    def recurrent_bytes(self) -> int:
        """Bytes of the fp32 recurrent state."""
        return math.prod(self.recurrent_shape) * DTYPE_BYTES[self.recurrent_dtype]

    @property
    def state_bytes(self) -> int:
        """``S(tp, s)``: conv + recurrent bytes of one layer for one request."""
        return self.conv_bytes + self.recurrent_bytes


class ReplayRecordSizes(Frozen):
    """ATOM ReplaySSM records kept per KDA layer per state slot: k, u (bf16) and g (fp32), each
    ``(L, local_heads, head_dim)`` with ``L = max(cache_len, 2 * (spec_tokens + 1))``; plus one
    int32 write cursor per slot shared by all layers."""

    local_heads: PositiveInt
    head_dim: PositiveInt
    spec_tokens: NonNegativeInt
    cache_len: PositiveInt

    k_dtype: Literal["bfloat16"] = "bfloat16"
    u_dtype: Literal["bfloat16"] = "bfloat16"
    g_dtype: Literal["float32"] = "float32"
    cursor_dtype: Literal["int32"] = "int32"

    @property
    def record_len(self) -> int:
        """``L``: records kept per slot."""
        return max(self.cache_len, 2 * (self.spec_tokens + 1))

    @property
    def record_shape(self) -> tuple[int, int, int]:
        """``(L, local_heads, head_dim)`` of each of k, u and g."""
        return (self.record_len, self.local_heads, self.head_dim)

    @property
    def k_bytes(self) -> int:
        """bf16 k records."""
        return math.prod(self.record_shape) * DTYPE_BYTES[self.k_dtype]

    @property
    def u_bytes(self) -> int:
        """bf16 u records."""
        return math.prod(self.record_shape) * DTYPE_BYTES[self.u_dtype]

    @property
    def g_bytes(self) -> int:
        """fp32 g (log decay) records."""
        return math.prod(self.record_shape) * DTYPE_BYTES[self.g_dtype]

    @property
    def layer_bytes(self) -> int:
        """k + u + g of one layer for one slot (196,608 at K3 tp 8, L 16)."""
        return self.k_bytes + self.u_bytes + self.g_bytes

    @property
    def cursor_bytes(self) -> int:
        """The slot's int32 write cursor (replicated, shared by all layers)."""
        return DTYPE_BYTES[self.cursor_dtype]


class RankSizes(Frozen):
    """Per-rank sizes of each layer kind of a model under one deployment."""

    attention: MlaCacheSizes
    kda: KdaStateSizes | None
    replay: ReplayRecordSizes | None

    @property
    def kda_state_bytes(self) -> int:
        """``S(tp, s)`` per KDA layer per rank; 0 for a model without KDA layers."""
        return 0 if self.kda is None else self.kda.state_bytes


def check_uniform_layers(model: HybridModel) -> tuple[MLALayer, KDALayer | None]:
    """One MLA and one KDA cache geometry per model; refuses (``mixed_layer_specs``) otherwise.

    The engines group layers by identical specs; a model mixing geometries needs one bucket per
    geometry, which neither layout here plans.
    """
    mla = model.mla_layers
    kda = model.kda_layers
    for kind, layers in (("MLA", mla), ("KDA", kda)):
        geometries = sorted({layer.cache_geometry for layer in layers})
        if len(geometries) > 1:
            raise Refusal(
                "mixed_layer_specs",
                f"model {model.name}: {kind} layers have {len(geometries)} cache geometries "
                f"({', '.join(map(str, geometries))}); one per kind is planned",
                facts={"model": model.name, "kind": kind, "geometries": len(geometries)},
                hint=f"give every {kind} layer the same cache dimensions",
            )
    return mla[0], (kda[0] if kda else None)


def check_heads(model: HybridModel, attn_tp: int) -> None:
    """Refuse (``heads_not_divisible``) an attention TP that does not divide every head count.

    KDA heads are sharded by attention TP, and so are MLA query heads; the hint names the
    nearest attention TP sizes that divide them all.
    """
    counts = {("KDA", layer.num_heads) for layer in model.kda_layers}
    counts |= {("MLA", layer.num_heads) for layer in model.mla_layers}
    for kind, heads in sorted(counts):
        if heads % attn_tp:
            common = reduce(math.gcd, (h for _, h in counts))
            below, above = nearest_divisors(common, attn_tp)
            nearest = " or ".join(f"attn_tp={d}" for d in (below, above) if d is not None)
            raise Refusal(
                "heads_not_divisible",
                f"{kind} num_heads={heads} must be divisible by attn_tp={attn_tp}",
                facts={"kind": kind, "num_heads": heads, "attn_tp": attn_tp},
                hint=f"{nearest} would divide the heads",
            )


def rank_sizes(model: HybridModel, deployment: Deployment) -> RankSizes:
    """Per-rank sizes of ``model``'s layers under ``deployment`` (refuses what cannot shard)."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    mla, kda = check_uniform_layers(model)
    check_heads(model, deployment.attn_tp)
    if deployment.kv_dtype == "fp8_ds_mla" and mla.kv_lora_rank % FLASHMLA_FP8_SCALE_GROUP:
        raise Refusal(
            "dtype_unsupported",
            f"kv_dtype=fp8_ds_mla needs kv_lora_rank divisible by {FLASHMLA_FP8_SCALE_GROUP} "
            f"(kv_lora_rank={mla.kv_lora_rank})",
            facts={"kv_dtype": deployment.kv_dtype, "kv_lora_rank": mla.kv_lora_rank},
            hint="use kv_dtype=fp8 or bf16",
        )
    attention = MlaCacheSizes(
        kv_lora_rank=mla.kv_lora_rank,
        qk_rope_head_dim=mla.qk_rope_head_dim,
        index_bytes_per_token=mla.index_bytes_per_token,
        kv_dtype=deployment.kv_dtype,
    )
    if kda is None:
        return RankSizes(attention=attention, kda=None, replay=None)
    state = KdaStateSizes(
        num_heads=kda.num_heads,
        head_dim=kda.head_dim,
        conv_kernel=kda.conv_kernel,
        attn_tp=deployment.attn_tp,
        spec_tokens=deployment.spec_tokens,
    )
    replay = ReplayRecordSizes(
        local_heads=state.local_heads,
        head_dim=kda.head_dim,
        spec_tokens=deployment.spec_tokens,
        cache_len=deployment.replayssm_cache_len,
    )
    return RankSizes(attention=attention, kda=state, replay=replay)
