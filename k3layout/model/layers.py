"""The two layer kinds of a hybrid model and their cache-relevant dimensions."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import Field

from .._frozen import Frozen
from ..constants import MAX_CONV_KERNEL, MAX_MODEL_DIM

Dim: TypeAlias = Annotated[int, Field(gt=0, le=MAX_MODEL_DIM)]
"""A head count or dimension: positive, at most ``MAX_MODEL_DIM`` (beyond it: ``size_limit``)."""


class MLALayer(Frozen):
    """An MLA attention layer: one latent head (``kv_lora_rank + qk_rope_head_dim`` elements
    per token) cached and replicated on every TP rank; ``num_heads`` query heads are split by TP.

    ``index_bytes_per_token`` is a DSA indexer's ``index_cache`` row (132 for DeepSeek-V3.2 and
    GLM-5.x), 0 for none. The planner folds it into the layer that owns it.
    """

    kind: Literal["mla"] = "mla"
    num_heads: Dim
    kv_lora_rank: Dim = 512
    qk_rope_head_dim: Dim = 64
    qk_nope_head_dim: Dim = 128
    v_head_dim: Dim = 128
    q_lora_rank: Dim | None = None
    index_bytes_per_token: Annotated[int, Field(ge=0, le=MAX_MODEL_DIM)] = 0

    @property
    def latent_dim(self) -> int:
        """Cached elements per token: ``kv_lora_rank + qk_rope_head_dim`` (576 for K3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def cache_geometry(self) -> tuple[int, int, int]:
        """What decides the layer's cache bytes: (kv_lora_rank, rope dim, index bytes)."""
        return (self.kv_lora_rank, self.qk_rope_head_dim, self.index_bytes_per_token)


class KDALayer(Frozen):
    """A KDA (Kimi Delta Attention) layer: a fixed-size per-request state, head-sharded by TP.

    The state is three causal short convolutions (q|k|v, ``num_heads * head_dim`` channels each,
    ``conv_kernel - 1`` rows of history) and a ``(num_heads, head_dim, head_dim)`` recurrence.
    """

    kind: Literal["kda"] = "kda"
    num_heads: Dim
    head_dim: Dim
    conv_kernel: Annotated[int, Field(ge=2, le=MAX_CONV_KERNEL)] = 4

    @property
    def cache_geometry(self) -> tuple[int, int, int]:
        """What decides the layer's state bytes: (num_heads, head_dim, conv_kernel)."""
        return (self.num_heads, self.head_dim, self.conv_kernel)


Layer: TypeAlias = Annotated[MLALayer | KDALayer, Field(discriminator="kind")]
"""One layer of a hybrid model, tagged by ``kind`` (``"mla"`` or ``"kda"``)."""
