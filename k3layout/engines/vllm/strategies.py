"""vLLM's own deployment settings for :func:`k3layout.testing.deployments` (imports
hypothesis: only the testing module loads it)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ...gpus import GPU_NAMES
from ...model import HybridModel
from .rules import (
    ATTENTION_BACKENDS,
    default_attention_backend,
    runs_on,
    smallest_kernel_block,
    supports_block,
)


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
