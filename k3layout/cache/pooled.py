"""A token-pooled cache: one compressed entry per ``kpool`` tokens, paged with its layer.

GLM-5.3-Flash's DSA indexer keeps its keys pooled: every ``index_kpool`` (16) tokens of an MLA
layer's context are compressed into one key entry, which the indexer scores to pick the
``index_topk`` tokens the layer attends to. The entry is DeepSeek's fp8 index row, the
``index_head_dim`` fp8 values then one fp32 scale per 128 of them, kept as raw bytes::

    part    per-row shape   dtype    TP          rows in a page of T tokens
    index   (132,)          uint8    Replicate   T / 16     (128 fp8 + 1 fp32 scale)

The key cache shares its layer's block (vLLM gives the key cache the latent's block and block
table, so a block of ``B`` tokens holds ``B / 16`` entries), is dealt by DCP as the latent is,
and is the same whatever the latent's cache dtype. The entry still being filled lives in the
layer's tail ring (:mod:`k3layout.cache.ring`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .._frozen import Frozen
from ..constants import FLASHMLA_FP8_SCALE_GROUP, MAX_MODEL_DIM
from ..dtypes import DTYPE_BYTES
from ..placements import Replicate
from .part import CachePart, Dim

IndexerType = Literal["full", "shared"]
"""``indexer_types``: a ``full`` layer runs its own indexer; a ``shared`` one reuses the
previous full layer's selection (the engines still keep its key cache: vLLM 0.33 builds an
indexer, key cache and tail ring on every indexed layer)."""


class DSAIndexer(Frozen):
    """A DSA (DeepSeek sparse attention) indexer whose keys are pooled over ``kpool`` tokens
    (GLM-5.3-Flash: ``index_head_dim`` 128, ``index_n_heads`` 32, ``index_topk`` 2048,
    ``index_kpool`` 16). Only the keys are cached; the query heads are not."""

    head_dim: Dim = Field(description="index_head_dim: fp8 values of one key entry")
    num_heads: Dim = Field(description="index_n_heads: the indexer's query heads (not cached)")
    topk: Dim = Field(description="index_topk: tokens each query attends to")
    kpool: Annotated[int, Field(ge=1, le=MAX_MODEL_DIM)] = Field(
        description="index_kpool: tokens pooled into one cached key entry"
    )
    always_select_tail: bool = Field(
        True,
        description="index_kpool_always_select_tail: the pool still being filled is always "
        "attended (vLLM's GLM indexer requires it)",
    )
    kind: IndexerType = Field(
        "full", description="indexer_types of the layer: full, or shared with the previous one"
    )

    @property
    def entry_bytes(self) -> int:
        """Bytes of one key entry: the fp8 values and one fp32 scale per whole 128 of them
        (132 for 128), as vLLM sizes its ``Glm5NextIndexerCache``."""
        scales = self.head_dim // FLASHMLA_FP8_SCALE_GROUP * DTYPE_BYTES["float32"]
        return self.head_dim + scales

    def index_part(self) -> CachePart:
        """The key cache as a part of its layer's page: a row per ``kpool`` tokens."""
        return CachePart(
            name="index",
            shape=(self.entry_bytes,),
            dtype="uint8",
            tp=Replicate(),
            tokens_per_row=self.kpool,
        )
