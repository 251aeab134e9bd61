"""The tokens each vLLM KV-cache group's block covers, and the scheduler's block over them.

vLLM gives every group a block of its own (``KVCacheSpec.block_size``):

- an attention group: its page's tokens, times DCP (the tokens of a block are dealt to the
  DCP ranks);
- a KDA group: ``mamba_block_size``, the stage's block in ``align`` mode (a state checkpoint
  per block) or ``max_model_len`` in ``none`` mode (prefix caching off: one state per
  request). A pipeline stage holding KDA layers and no attention layer never aligns its block
  to an attention page: in ``align`` mode its KDA layers keep the requested block, else the
  release's default (16 in 0.33, 64 in 0.34;
  :func:`~k3layout.engines.vllm.rules.unaligned_block_tokens`), a spec of their own.

The scheduler steps tokens on the lcm of the groups' blocks (``resolve_kv_cache_block_sizes``):
K3 TP 1 fp8 with DSpark at 2 tokens and prefix caching off, ``max_model_len`` 8,192: blocks
11,648 (attention) and 8,192 (KDA), scheduler block 745,472.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Protocol

from ...deployment import Deployment
from ...layouts.groups import Group
from ...layouts.protocol import EngineLayout
from ...model import HybridModel
from ...placements import pp_stage_bounds
from .releases import release_of
from .rules import DEFAULT_MAX_MODEL_LEN, mamba_block_tokens, unaligned_block_tokens


class SpanPlan(EngineLayout, Protocol):
    """What the spans read of a vLLM plan."""

    @property
    def block_tokens(self) -> int: ...

    def tokens_per_page(self, group: Group) -> int: ...


def stages_without_attention(model: HybridModel, deployment: Deployment) -> tuple[int, ...]:
    """The pipeline stages (vLLM's split; drafts on the last) holding a state layer and no
    attention layer: their workers find no attention backend to align the block to."""
    bounds = pp_stage_bounds(model.num_layers, deployment.pp, deployment.pp_partition)
    attention = model.attention_layer_ids  # sorted: count each stage's by bisection
    draft_pagings = {layer.paging for layer in model.draft_layers}
    last = len(bounds) - 1
    found = []
    for stage, (start, end) in enumerate(bounds):
        held = bisect_left(attention, end) - bisect_left(attention, start)
        has_attention = held > 0 or (stage == last and "token" in draft_pagings)
        has_state = held < end - start or (stage == last and "slot" in draft_pagings)
        if has_state and not has_attention:
            found.append(stage)
    return tuple(found)


def unaligned_state_layers(
    model: HybridModel, deployment: Deployment, aligned_block: int
) -> frozenset[int]:
    """The state layers whose KDA block differs from the aligned one: those of a stage
    without attention, in ``align`` mode, unless the requested block is already aligned.
    vLLM buckets them apart (their spec's block differs)."""
    if deployment.mamba_cache_mode_run != "align":
        return frozenset()  # every KDA block is max_model_len: one spec
    if unaligned_block_tokens(deployment.block_tokens, release_of(deployment)) == aligned_block:
        return frozenset()
    bounds = pp_stage_bounds(model.num_layers, deployment.pp, deployment.pp_partition)
    state = set(model.kda_layer_ids)
    return frozenset(
        layer
        for stage in stages_without_attention(model, deployment)
        for layer in range(*bounds[stage])
        if layer in state
    )


def default_max_model_len(model: HybridModel) -> int:
    """vLLM's ``max_model_len`` when none is given: the checkpoint's context, else 2048."""
    return model.context_tokens or DEFAULT_MAX_MODEL_LEN


def group_block_tokens(plan: SpanPlan, group: Group, max_model_len: int | None = None) -> int:
    """Tokens one block of ``group`` covers (its spec's ``block_size``, times DCP for
    attention); ``max_model_len`` (default: vLLM's) sizes a KDA block in ``none`` mode."""
    deployment = plan.deployment
    if plan.group_spec(group).paging == "token":
        return plan.tokens_per_page(group) * deployment.dcp
    length = default_max_model_len(plan.model) if max_model_len is None else max_model_len
    unaligned = unaligned_state_layers(plan.model, deployment, plan.block_tokens)
    block = plan.block_tokens
    if group.layers and set(group.layers) <= unaligned:
        block = unaligned_block_tokens(deployment.block_tokens, release_of(deployment))
    return mamba_block_tokens(deployment.mamba_cache_mode_run, block, length)


def scheduler_block_tokens(plan: SpanPlan, max_model_len: int | None = None) -> int:
    """The scheduler's block: the lcm of every group's block (one group: its own)."""
    return math.lcm(*(group_block_tokens(plan, g, max_model_len) for g in plan.groups))
