"""The MLA layer kind: one latent row per token, replicated on every TP rank.

Parts of a page (tokens outermost), for K3 (``kv_lora_rank`` 512, rope 64)::

    part     per-token shape   dtype                  TP          bytes / token
    latent   (576,)            fp8 e4m3 / bf16        Replicate   576 / 1,152
             (656,)            uint8 (fp8_ds_mla)     Replicate   512 fp8 + 4 fp32 + 64 bf16
    index    (132,)            uint8 (DSA only)       Replicate   128 fp8 + one fp32 scale

A DSA index row belongs to the layer that owns it, so it is a part of that layer's page.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from .._frozen import Frozen
from ..constants import FLASHMLA_FP8_SCALE_GROUP, MAX_MODEL_DIM
from ..deployment import Deployment
from ..dtypes import DTYPE_BYTES, KV_ELEMENT_DTYPE, KvCacheDtype
from ..errors import Refusal
from ..placements import Interleave, Replicate
from .part import CachePart, Dim
from .spec import LayerCacheSpec, Paging


class MLALayer(Frozen):
    """An MLA attention layer: one latent head (``kv_lora_rank + qk_rope_head_dim`` elements
    per token) cached and replicated on every TP rank; ``num_heads`` query heads are split by TP.

    ``index_bytes_per_token`` is a DSA indexer's ``index_cache`` row (132 for DeepSeek-V3.2 and
    GLM-5.x), 0 for none. The planner folds it into the layer that owns it.
    """

    kind: Literal["mla"] = Field("mla", description="the layer kind tag: mla")
    paging: ClassVar[Paging] = "token"
    num_heads: Dim = Field(
        description="query heads (split by attention TP); the cache keeps one latent head"
    )
    kv_lora_rank: Dim = Field(
        512, description="cached latent (compressed KV) elements per token (512 for K3)"
    )
    qk_rope_head_dim: Dim = Field(
        64, description="cached rope elements per token, after the latent (64 for K3)"
    )
    qk_nope_head_dim: Dim = Field(
        128, description="per-head query/key dim without rope (not cached)"
    )
    v_head_dim: Dim = Field(128, description="per-head value dim (not cached)")
    q_lora_rank: Dim | None = Field(
        None, description="query low-rank dim (not cached); None: no query compression"
    )
    index_bytes_per_token: Annotated[int, Field(ge=0, le=MAX_MODEL_DIM)] = Field(
        0,
        description="a DSA indexer's index_cache row, bytes per token (132 for DeepSeek-V3.2 "
        "and GLM-5.x), part of this layer's page; 0: none",
    )

    @property
    def latent_dim(self) -> int:
        """Cached elements per token: ``kv_lora_rank + qk_rope_head_dim`` (576 for K3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def cache_spec(self, deployment: Deployment) -> LayerCacheSpec:
        """The latent (and DSA index) rows of one token, replicated over TP, dealt by DCP."""
        return _mla_spec(self, deployment.kv_dtype, deployment.dcp_placement)

    def side_specs(self, deployment: Deployment) -> tuple[LayerCacheSpec, ...]:
        """Nothing beside the page."""
        return ()


@lru_cache(maxsize=1024)
def _mla_spec(layer: MLALayer, kv_dtype: KvCacheDtype, dcp: Interleave) -> LayerCacheSpec:
    """The spec of one MLA geometry under one cache dtype and DCP (a frozen value, shared)."""
    if kv_dtype == "fp8_ds_mla":
        if layer.kv_lora_rank % FLASHMLA_FP8_SCALE_GROUP:
            raise Refusal(
                "dtype_unsupported",
                f"kv_dtype=fp8_ds_mla needs kv_lora_rank divisible by "
                f"{FLASHMLA_FP8_SCALE_GROUP} (kv_lora_rank={layer.kv_lora_rank})",
                facts={"kv_dtype": kv_dtype, "kv_lora_rank": layer.kv_lora_rank},
                hint="use kv_dtype=fp8 or bf16",
            )
        # FlashMLA's packed row: fp8 latent, one fp32 scale per 128, bf16 rope.
        scales = layer.kv_lora_rank // FLASHMLA_FP8_SCALE_GROUP * DTYPE_BYTES["float32"]
        row = layer.kv_lora_rank + scales + layer.qk_rope_head_dim * DTYPE_BYTES["bfloat16"]
        latent = CachePart(name="latent", shape=(row,), dtype="uint8", tp=Replicate())
    else:
        latent = CachePart(
            name="latent",
            shape=(layer.latent_dim,),
            dtype=KV_ELEMENT_DTYPE[kv_dtype],
            tp=Replicate(),
        )
    parts = [latent]
    if layer.index_bytes_per_token:
        parts.append(
            CachePart(
                name="index",
                shape=(layer.index_bytes_per_token,),
                dtype="uint8",
                tp=Replicate(),
            )
        )
    return LayerCacheSpec(
        kind=layer.kind,
        paging="token",
        parts=tuple(parts),
        dcp=dcp,
    )
