"""vLLM's own plan invariants: the block raise, kernel blocks, page and block bytes
(:func:`k3layout.layouts.invariants.plan_invariant_violations` adds the common ones)."""

from __future__ import annotations

from ...constants import MLA_KERNEL_BLOCK_TOKENS
from .layout import VllmPlan, block_tokens_for
from .rules import backend_of, smallest_kernel_block


def vllm_violations(result: VllmPlan) -> list[str]:
    problems: list[str] = []
    sizes = result.sizes
    deployment = result.deployment
    kernel = smallest_kernel_block(backend_of(deployment))
    requested = deployment.block_tokens or 0
    align = max(MLA_KERNEL_BLOCK_TOKENS, requested, kernel)
    if result.block_tokens % kernel:
        problems.append(f"block {result.block_tokens} is not on {kernel}-token kernel blocks")
    if result.block_tokens < requested:
        problems.append(f"block {result.block_tokens} is below the requested {requested}")
    if result.block_tokens % result.kernel_block_tokens:
        problems.append("the kernel block does not divide the block")
    raised = block_tokens_for(sizes, deployment.block_tokens, backend_of(deployment))
    if result.block_tokens != raised:
        problems.append("block is not the raise of the requested block")
    if result.page_bytes != result.block_tokens * sizes.attention_bytes_per_token:
        problems.append("page is not block x attention bytes per token")
    state = sizes.kda_state_bytes
    if state > result.page_bytes:
        problems.append(f"KDA state {state} does not fit the page {result.page_bytes}")
    if state and (result.block_tokens - align) * sizes.attention_bytes_per_token >= state:
        problems.append("a smaller block would hold the state: the raise is not minimal")
    if result.block_bytes != result.num_planes * result.page_bytes:
        problems.append("block bytes are not planes x page")
    if result.block_tokens % result.deployment.dcp_interleave:
        problems.append("DCP interleave does not divide the block")
    return problems
