"""The MLA layer kind: one latent row per token, replicated on every TP rank.

Parts of a page (tokens outermost), for K3 (``kv_lora_rank`` 512, rope 64)::

    part     per-token shape   dtype                  TP          bytes / token
    latent   (576,)            fp8 e4m3 / bf16        Replicate   576 / 1,152
             (656,)            uint8 (fp8_ds_mla)     Replicate   512 fp8 + 4 fp32 + 64 bf16
    index    (132,)            uint8 (DSA only)       Replicate   128 fp8 + one fp32 scale

A DSA index row belongs to the layer that owns it, so it is a part of that layer's page. A
GLM-5.3-Flash layer (NoPE: ``qk_rope_head_dim`` 0, a 512-element latent) has a pooled indexer
instead (:mod:`k3layout.cache.pooled`): its ``index`` part keeps one row per ``index_kpool``
tokens, and the entry still being filled waits in a per-request tail ring beside the page
(:mod:`k3layout.cache.ring`, the layer's side spec).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from .._frozen import Frozen
from ..constants import FLASHMLA_FP8_SCALE_GROUP, FLASHMLA_ROPE_SLOT, MAX_MODEL_DIM
from ..deployment import Deployment
from ..dtypes import DTYPE_BYTES, KV_ELEMENT_DTYPE, KvCacheDtype
from ..errors import Refusal
from ..gpus import GPUS
from ..placements import Interleave, Replicate
from ..registry import facts_of
from .part import CachePart, Dim
from .pooled import DSAIndexer
from .ring import ring_spec
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
    qk_rope_head_dim: Annotated[int, Field(ge=0, le=MAX_MODEL_DIM)] = Field(
        64,
        description="cached rope elements per token, after the latent (64 for K3; 0 for a "
        "NoPE latent, GLM-5.3-Flash)",
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
    indexer: DSAIndexer | None = Field(
        None,
        description="a DSA indexer whose keys are pooled over index_kpool tokens "
        "(GLM-5.3-Flash): its key cache is a pooled part of the page, its tail a ring beside "
        "it; None: none",
    )

    @model_validator(mode="after")
    def _one_index(self) -> MLALayer:
        if self.indexer is not None and self.index_bytes_per_token:
            raise ValueError(
                "indexer: a layer keeps a per-token index row (index_bytes_per_token) or a "
                "pooled indexer, not both"
            )
        return self

    @property
    def latent_dim(self) -> int:
        """Cached elements per token: ``kv_lora_rank + qk_rope_head_dim`` (576 for K3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def cache_spec(self, deployment: Deployment) -> LayerCacheSpec:
        """The latent (and DSA index) rows of one token, replicated over TP, dealt by DCP
        (an indexed layer's fp8 latent in FlashMLA's scaled row where the engine keeps it so
        on the GPU: :attr:`~k3layout.EngineFacts.scaled_fp8_latent_majors`)."""
        scaled = (
            self.indexer is not None
            and deployment.kv_dtype == "fp8"
            and GPUS[deployment.gpu].capability[0]
            in facts_of(deployment.engine).scaled_fp8_latent_majors
        )
        return _mla_spec(self, deployment.kv_dtype, deployment.dcp_placement, scaled)

    def side_specs(self, deployment: Deployment) -> tuple[LayerCacheSpec, ...]:
        """A pooled indexer's tail ring beside the page; nothing otherwise."""
        if self.indexer is None:
            return ()
        return (ring_spec(self.indexer, deployment.spec_tokens),)


@lru_cache(maxsize=1024)
def _mla_spec(
    layer: MLALayer, kv_dtype: KvCacheDtype, dcp: Interleave, scaled: bool = False
) -> LayerCacheSpec:
    """The spec of one MLA geometry under one cache dtype and DCP (a frozen value, shared);
    ``scaled``: an fp8 latent in FlashMLA's scaled row (fp8, one fp32 scale per 128, the
    layer's own rope in bf16: 528 B for GLM-5.3-Flash's NoPE 512)."""
    if scaled or kv_dtype == "fp8_ds_mla":
        if layer.kv_lora_rank % FLASHMLA_FP8_SCALE_GROUP:
            raise Refusal(
                "dtype_unsupported",
                f"kv_dtype=fp8_ds_mla needs kv_lora_rank divisible by "
                f"{FLASHMLA_FP8_SCALE_GROUP} (kv_lora_rank={layer.kv_lora_rank})",
                facts={"kv_dtype": kv_dtype, "kv_lora_rank": layer.kv_lora_rank},
                hint="use kv_dtype=fp8 or bf16",
            )
        # FlashMLA's packed row: fp8 latent, one fp32 scale per 128, bf16 rope (fp8_ds_mla's
        # NoPE latent keeps the rope slot, zeroed; the scaled fp8 row keeps the layer's own).
        scales = layer.kv_lora_rank // FLASHMLA_FP8_SCALE_GROUP * DTYPE_BYTES["float32"]
        rope = layer.qk_rope_head_dim if scaled else layer.qk_rope_head_dim or FLASHMLA_ROPE_SLOT
        row = layer.kv_lora_rank + scales + rope * DTYPE_BYTES["bfloat16"]
        latent = CachePart(name="latent", shape=(row,), dtype="uint8", tp=Replicate())
    else:
        latent = CachePart(
            name="latent",
            shape=(layer.latent_dim,),
            dtype=KV_ELEMENT_DTYPE[kv_dtype],
            tp=Replicate(),
        )
    parts = [latent]
    if layer.indexer is not None:
        parts.append(layer.indexer.index_part())
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
