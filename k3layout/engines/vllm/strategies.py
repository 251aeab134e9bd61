"""vLLM's own deployment settings for :func:`k3layout.testing.deployments` (imports
hypothesis: only the testing module loads it)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ...gpus import GPU_NAMES, GPUS
from ...model import HybridModel
from .rules import (
    ATTENTION_BACKENDS,
    default_attention_backend,
    runs_on,
    smallest_kernel_block,
    supports_block,
)

SPARSE_GPUS = tuple(
    g for g in GPU_NAMES if GPUS[g].vendor == "nvidia" and GPUS[g].capability[0] in (9, 10)
)
"""The GPUs vLLM's sparse MLA backends run on (SM90, SM100)."""


def settings(
    draw: st.DrawFn,
    model: HybridModel,
    fields: dict[str, Any],
    layouts: tuple[str, ...],
    plannable: bool,
) -> dict[str, Any]:
    """A GPU, an attention backend that runs on it (or vLLM's own pick), a KV-cache layout it
    serves (``BLHNC`` only on the one backend whose kernel takes a whole block) and the drawn
    block raised onto its kernel blocks; FlashAttention MLA with a bf16 cache."""
    if model.indexer is not None:
        return _indexed_settings(draw, fields, layouts, plannable)
    gpu = draw(st.sampled_from(GPU_NAMES))
    kv_dtype = fields["kv_dtype"]
    chosen = draw(st.sampled_from((None, *ATTENTION_BACKENDS)))
    if chosen is not None:
        gpu = draw(st.sampled_from([g for g in GPU_NAMES if runs_on(chosen, g)]))
        if chosen == "FLASH_ATTN_MLA":
            kv_dtype = "bf16"
    backend = chosen or default_attention_backend(gpu, kv_dtype)
    layout = "LBNHC"
    if backend == "TRITON_MLA":
        layout = draw(st.sampled_from(layouts))
    block = fields.get("block_tokens")
    if block is not None and not supports_block(backend, block):
        kernel = smallest_kernel_block(backend)
        block = kernel * -(-block // kernel)
    return {
        "gpu": gpu,
        "kv_dtype": kv_dtype,
        "attention_backend": chosen,
        "kv_cache_layout": layout,
        "block_tokens": block,
    }


def _indexed_settings(
    draw: st.DrawFn, fields: dict[str, Any], layouts: tuple[str, ...], plannable: bool
) -> dict[str, Any]:
    """An indexed hybrid (GLM-5.3-Flash): vLLM's own sparse backend, the BLHNC layout it
    resolves (or asks for), a block on the sparse kernel's pages; plannable draws keep a GPU
    and cache dtype with a sparse backend (SM90: DCP with bf16 or fp8_ds_mla; SM100: fp8 or
    bf16) and no ReplaySSM records."""
    gpu = draw(st.sampled_from(SPARSE_GPUS))
    kv_dtype = fields["kv_dtype"]
    sm100 = GPUS[gpu].capability[0] == 10
    if plannable and (
        (sm100 and kv_dtype == "fp8_ds_mla")
        or (not sm100 and fields["dcp"] > 1 and kv_dtype == "fp8")
    ):
        kv_dtype = "bf16"
    block = fields.get("block_tokens")
    kernel = 32 if sm100 else 64
    if block is not None:
        block = kernel * -(-block // kernel)
    return {
        "gpu": gpu,
        "kv_dtype": kv_dtype,
        "attention_backend": None,
        "kv_cache_layout": draw(st.sampled_from((None, "BLHNC"))) if "BLHNC" in layouts else None,
        "block_tokens": block,
        "replayssm": False if plannable else fields["replayssm"],
    }
