"""The GQA full-attention layer kind: K and V rows per token, KV heads split over TP.

A new layer kind is this one module: the layer's record and its cache spec. Parts of a page
(tokens outermost, K rows then V rows, as vLLM's block-outermost hybrid layout keeps them)::

    part   per-token shape          dtype             TP
    k      (num_kv_heads, head_dim) fp8 e4m3 / bf16   ReplicaShard(0)
    v      (num_kv_heads, head_dim) fp8 e4m3 / bf16   ReplicaShard(0)

Attention TP shards the KV heads when it divides them; when it exceeds them each KV head is
replicated on ``tp / num_kv_heads`` ranks, as vLLM does. A DSpark-style draft of 8 KV heads
of 128 at fp8 keeps ``2 * 8 * 128 = 2,048`` B per token at TP 1, 256 at TP 8.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from .._frozen import Frozen
from ..deployment import Deployment
from ..dtypes import KV_ELEMENT_DTYPE
from ..errors import Refusal
from ..placements import ReplicaShard
from .part import CachePart, Dim
from .spec import LayerCacheSpec, Paging


class GQALayer(Frozen):
    """A grouped-query full-attention layer: ``num_heads`` query heads (split by TP) over
    ``num_kv_heads`` cached K and V heads of ``head_dim``."""

    kind: Literal["gqa"] = Field("gqa", description="the layer kind tag: gqa")
    paging: ClassVar[Paging] = "token"
    num_heads: Dim = Field(description="query heads (split by attention TP)")
    num_kv_heads: Dim = Field(
        description="cached K and V heads, sharded by attention TP (replicated past it)"
    )
    head_dim: Dim = Field(128, description="elements per K or V head per token")

    def cache_spec(self, deployment: Deployment) -> LayerCacheSpec:
        """K then V rows of one token, KV heads sharded (or replicated) over TP."""
        if deployment.kv_dtype == "fp8_ds_mla":
            raise Refusal(
                "dtype_unsupported",
                "kv_dtype=fp8_ds_mla is FlashMLA's latent row; a GQA layer has no latent",
                facts={"kv_dtype": deployment.kv_dtype, "kind": self.kind},
                hint="use kv_dtype=fp8 or bf16",
            )
        dtype = KV_ELEMENT_DTYPE[deployment.kv_dtype]
        shape = (self.num_kv_heads, self.head_dim)
        return LayerCacheSpec(
            kind=self.kind,
            paging="token",
            parts=tuple(
                CachePart(name=name, shape=shape, dtype=dtype, tp=ReplicaShard(dim=0))
                for name in ("k", "v")
            ),
            dcp=deployment.dcp_placement,
        )

    def side_specs(self, deployment: Deployment) -> tuple[LayerCacheSpec, ...]:
        """Nothing beside the page."""
        return ()
