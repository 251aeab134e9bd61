"""vLLM's own plan invariants: the block raise, kernel blocks, page and block bytes
(:func:`k3layout.layouts.invariants.plan_invariant_violations` adds the common ones)."""

from __future__ import annotations

import math

from ...constants import MLA_KERNEL_BLOCK_TOKENS
from .layout import VllmPlan, block_tokens_for
from .releases import release_of
from .replay import aligned_state_bytes, state_alignment
from .rules import backend_of, smallest_kernel_block
from .sparse import SPARSE_KERNEL_BLOCK, indexer_alignment_tokens


def vllm_violations(result: VllmPlan) -> list[str]:
    if result.packed:
        return packed_violations(result)
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
    raised = block_tokens_for(
        sizes,
        deployment.block_tokens,
        backend_of(deployment),
        engine_version=release_of(deployment).version,
        state_alignment=state_alignment(deployment),
    )
    if result.block_tokens != raised:
        problems.append("block is not the raise of the requested block")
    if result.page_bytes != result.block_tokens * sizes.attention_bytes_per_token:
        problems.append("page is not block x attention bytes per token")
    state = sizes.kda_state_bytes
    if state > result.page_bytes:
        problems.append(f"KDA state {state} does not fit the page {result.page_bytes}")
    raised_state = aligned_state_bytes(sizes, state_alignment(deployment))  # what vLLM raises for
    if state and (result.block_tokens - align) * sizes.attention_bytes_per_token >= raised_state:
        problems.append("a smaller block would hold the state: the raise is not minimal")
    if result.block_bytes != result.num_planes * result.page_bytes:
        problems.append("block bytes are not planes x page")
    if result.block_tokens % result.deployment.dcp_interleave:
        problems.append("DCP interleave does not divide the block")
    return problems


def packed_violations(result: VllmPlan) -> list[str]:
    """The packed layout's rules: the block on every backend's kernel pages and minimal for
    the KDA state, the KDA page the latent's bytes at the block, a block that holds its
    widest group, aligned, and DCP's interleave dividing the block."""
    problems: list[str] = []
    indexer = result.model.indexer
    backend = result.sparse_backend
    assert indexer is not None and backend is not None
    unit = math.lcm(indexer_alignment_tokens(indexer), SPARSE_KERNEL_BLOCK[backend])
    block = result.block_tokens
    requested = result.deployment.block_tokens or 0
    if block % unit or block < requested:
        problems.append(f"block {block} is not on {unit}-token kernel pages above {requested}")
    if result.page_bytes % block:
        problems.append("the KDA page is not the latent's bytes at the block")
    per_token = result.page_bytes // block
    state = result.sizes.state_bytes
    if state > result.page_bytes:
        problems.append(f"KDA state {state} does not fit the page {result.page_bytes}")
    align = max(indexer_alignment_tokens(indexer), requested, MLA_KERNEL_BLOCK_TOKENS)
    if state and block > unit and -(-(block - align) // unit) * unit * per_token >= state:
        problems.append("a smaller block would hold the state: the raise is not minimal")
    for stage in result.stages:
        stride = result.stage_block_bytes(stage.index)
        for group in stage.groups:
            used = sum(len(run.layers) * run.page for run in result.runs(group))
            if used > stride:
                problems.append(f"group {group.name} overflows the block on stage {stage.index}")
        if stride % result.packed_alignment_bytes:
            problems.append(f"stage {stage.index}'s block is not aligned")
    if block % result.deployment.dcp_interleave:
        problems.append("DCP interleave does not divide the block")
    return problems
