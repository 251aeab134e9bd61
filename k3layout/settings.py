"""The settings a :class:`~k3layout.Deployment` can carry, by the names engines give them.

Each engine decides which of them apply to it and refuses the others
(:attr:`k3layout.registry.EngineRules.check_settings`); their rules live in the engine's own
package (vLLM's in :mod:`k3layout.engines.vllm.rules`).
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

DenseAttentionBackend: TypeAlias = Literal[
    "FLASHMLA", "CUTLASS_MLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASH_ATTN_MLA"
]
"""vLLM's dense MLA attention backends (``--attention-backend``): an MLA layer without an
indexer (Kimi-K3, Kimi-Linear)."""

SparseAttentionBackend: TypeAlias = Literal[
    "FLASHINFER_MLA_SPARSE_SM90", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"
]
"""vLLM's sparse MLA attention backends k3layout plans: an indexed (DSA) MLA layer of NoPE head
512 (GLM-5.3-Flash)."""

AttentionBackend: TypeAlias = Literal[DenseAttentionBackend, SparseAttentionBackend]
"""vLLM's MLA attention backend (``--attention-backend``), dense or sparse."""

DENSE_ATTENTION_BACKENDS: Final[tuple[DenseAttentionBackend, ...]] = (
    "FLASHMLA",
    "CUTLASS_MLA",
    "FLASHINFER_MLA",
    "TRITON_MLA",
    "FLASH_ATTN_MLA",
)

SPARSE_ATTENTION_BACKENDS: Final[tuple[SparseAttentionBackend, ...]] = (
    "FLASHINFER_MLA_SPARSE_SM90",
    "FLASHMLA_SPARSE",
    "FLASHINFER_MLA_SPARSE",
)

ATTENTION_BACKENDS: Final[tuple[AttentionBackend, ...]] = (
    *DENSE_ATTENTION_BACKENDS,
    *SPARSE_ATTENTION_BACKENDS,
)

KvCacheLayout: TypeAlias = Literal["LBNHC", "BLHNC"]
"""vLLM's ``VLLM_KV_CACHE_LAYOUT``: ``LBNHC`` layer-outermost (the default), ``BLHNC``
block-outermost."""

KV_CACHE_LAYOUTS: Final[tuple[KvCacheLayout, ...]] = ("LBNHC", "BLHNC")

KdaPrefillBackend: TypeAlias = Literal["auto", "triton", "flashkda", "flashinfer", "fused"]
"""vLLM's KDA prefill kernel (``additional_config.kda_prefill_backend``): on CUDA ``auto``,
``triton``, ``flashkda`` or ``flashinfer``; on ROCm ``auto``, ``triton`` or ``fused``. ``auto``
resolves by the GPU (:attr:`~k3layout.Deployment.gpu`), as vLLM's own resolver does."""

KDA_PREFILL_BACKENDS: Final[tuple[KdaPrefillBackend, ...]] = (
    "auto",
    "triton",
    "flashkda",
    "flashinfer",
    "fused",
)

SpeculativeMethod: TypeAlias = Literal["mtp", "dspark", "ngram"]
"""vLLM's ``--speculative-config`` ``method`` k3layout plans: ``mtp`` (the checkpoint's
``num_nextn_predict_layers`` modules), ``dspark`` (a DSpark draft model) or ``ngram`` (no draft
model: prompt lookup)."""

SPECULATIVE_METHODS: Final[tuple[SpeculativeMethod, ...]] = ("mtp", "dspark", "ngram")

MambaCacheMode: TypeAlias = Literal["align", "none"]
"""What ``--mamba-cache-mode`` takes in vLLM 0.33 (deprecated there: prefix caching decides)."""

MAMBA_CACHE_MODES: Final[tuple[MambaCacheMode, ...]] = ("align", "none")


def resolved_mamba_cache_mode(prefix_caching: bool) -> MambaCacheMode:
    """The mode vLLM runs: ``align`` with prefix caching (even when ``none`` was asked for),
    ``none`` without (even when ``align`` was)."""
    return "align" if prefix_caching else "none"
