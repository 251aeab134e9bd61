"""vLLM's own deployment settings for :func:`k3layout.testing.deployments` (imports
hypothesis: only the testing module loads it)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ...model import HybridModel
from .rules import ATTENTION_BACKENDS, smallest_kernel_block, supports_block


def settings(
    draw: st.DrawFn,
    model: HybridModel,
    fields: dict[str, Any],
    layouts: tuple[str, ...],
    plannable: bool,
) -> dict[str, Any]:
    """An attention backend, a KV-cache layout it serves (``BLHNC`` only on the one backend
    whose kernel takes a whole block) and the drawn block raised onto its kernel blocks."""
    backend = draw(st.sampled_from(ATTENTION_BACKENDS))
    layout = "LBNHC"
    if backend == "TRITON_MLA":
        layout = draw(st.sampled_from(layouts))
    block = fields.get("block_tokens")
    if block is not None and not supports_block(backend, block):
        kernel = smallest_kernel_block(backend)
        block = kernel * -(-block // kernel)
    return {"attention_backend": backend, "kv_cache_layout": layout, "block_tokens": block}
