"""How many requests a vLLM plan serves: blocks per request by group, ``num_blocks`` for a
budget and the maximum concurrency, counted the way vLLM 0.33 counts them.

Every KV-cache group draws its blocks from one shared pool, so a request of ``max_model_len``
tokens costs the sum over groups of:

- an attention group: ``ceil(ceil(L / dcp) / tokens_per_page)`` blocks (DCP deals the tokens);
- a KDA group: ``2 + spec + checkpoint`` blocks in ``align`` mode (the running state, the last
  block boundary's checkpoint, one per draft token, FlashKDA's prefill checkpoint), ``1 +
  spec`` in ``none`` mode. The state is pinned whatever the context length;
- a tail ring group (an indexed hybrid's packed layout): one block for the request's life
  (vLLM's ``CircularBufferSpec``), a whole packed block although the ring is small.

``max_concurrency = num_blocks / blocks_per_request`` (vLLM's
``get_max_concurrency_for_kv_cache_config``, over pipeline stage 0's groups as its scheduler
counts). vLLM refuses to start when a stage's budget, less the one null block its pool holds
back, cannot hold one request of ``max_model_len`` (``budget_too_small``).
"""

from __future__ import annotations

import math
from typing import Protocol

from pydantic import Field, NonNegativeInt, PositiveInt

from ..._frozen import Frozen
from ...errors import Refusal
from ...layouts.answer import RequestCapacity, answer, check_budget, check_context
from .rules import (
    MambaCacheMode,
    mamba_block_tokens,
    prefill_checkpoint_blocks,
    resolved_kda_prefill_backend,
    state_blocks_per_request,
)
from .spans import SpanPlan, scheduler_block_tokens


class BlockPlan(SpanPlan, Protocol):
    """What capacity reads of a vLLM plan (:class:`~k3layout.engines.vllm.VllmPlan`)."""

    def num_blocks(self, budget_bytes: int, stage: int | None = None) -> int: ...


class GroupBlocks(Frozen):
    """Blocks one request of ``max_model_len`` holds in one KV-cache group."""

    group: str = Field(
        description="the KV-cache group's name (full_attention, linear_attention_0, ...)"
    )
    blocks: PositiveInt = Field(
        description="blocks one request of max_model_len tokens holds in the group"
    )


class VllmCapacity(RequestCapacity):
    """What a per-rank ``kv_memory_bytes`` serves under a vLLM plan at ``max_model_len``:
    vLLM's own figures, and the answer every engine gives (``max_requests`` is
    ``floor(max_concurrency)``)."""

    num_blocks: NonNegativeInt = Field(
        description="blocks kv_memory_bytes buys per rank in the pool every KV-cache group "
        "draws from (stage 0)"
    )
    mamba_cache_mode: MambaCacheMode = Field(
        description="the KDA cache mode vLLM runs: align with prefix caching, none without"
    )
    kda_prefill_backend: str | None = Field(
        description="the KDA prefill kernel vLLM runs, auto resolved (triton, flashkda, "
        "fused on ROCm); None: no KDA layers"
    )
    blocks_per_request: tuple[GroupBlocks, ...] = Field(
        description="blocks one request of max_model_len tokens holds, per KV-cache group of "
        "stage 0"
    )
    max_concurrency: float = Field(
        description="vLLM's max concurrency: num_blocks / the blocks one request holds over "
        "all groups"
    )
    kda_span_tokens: PositiveInt = Field(
        description="tokens one KDA state block covers: the block in align mode, "
        "max_model_len in none mode (vLLM's mamba_block_size)"
    )
    scheduler_block_tokens: PositiveInt = Field(
        description="the scheduler's block: the lcm of every KV-cache group's block "
        "(attention: block x dcp; KDA: kda_span_tokens, or the unaligned block of a "
        "pipeline stage without attention)"
    )
    """Tokens one KDA state block covers: the block in ``align`` mode (a checkpoint per
    block), the whole request (``max_model_len``) in ``none`` mode, as vLLM sizes the KDA
    groups' blocks (``mamba_block_size``)."""

    @property
    def total_blocks_per_request(self) -> int:
        """Blocks one request holds over all groups."""
        return sum(entry.blocks for entry in self.blocks_per_request)

    def rows(self) -> list[tuple[str, str]]:
        """vLLM's figures and the common answer as (label, value) rows, each saying what it
        counts (blocks are pipeline stage 0's, as vLLM's scheduler counts them)."""
        return [
            ("num_blocks (stage 0, every group's pool)", f"{self.num_blocks:,}"),
            (
                f"blocks / request of {self.max_model_len:,} tokens (attention + KDA groups)",
                " + ".join(str(g.blocks) for g in self.blocks_per_request)
                + f" = {self.total_blocks_per_request}",
            ),
            (
                "KDA cache mode / prefill kernel",
                f"{self.mamba_cache_mode} / {self.kda_prefill_backend or '-'}",
            ),
            (
                "max_concurrency (vLLM's, blocks / blocks per request)",
                f"{self.max_concurrency:,.2f}",
            ),
            *self.answer_rows(),
        ]


def kda_prefill_backend_of(plan: BlockPlan) -> str | None:
    """The KDA prefill kernel vLLM runs for ``plan`` (``None`` without KDA layers)."""
    layers = plan.model.kda_layers
    if not layers:
        return None
    layer = layers[0]
    return resolved_kda_prefill_backend(
        plan.deployment.kda_prefill_backend,
        full_rank_gate=layer.full_rank_gate,
        safe_gate=layer.safe_gate,
        gate_lower_bound=layer.gate_lower_bound,
        head_dim=layer.head_dim,
        gpu=plan.deployment.gpu,
    )


def group_blocks(plan: BlockPlan, max_model_len: int, stage: int = 0) -> tuple[GroupBlocks, ...]:
    """Blocks one request of ``max_model_len`` tokens holds in each group of ``stage``."""
    deployment = plan.deployment
    mode = deployment.mamba_cache_mode_run
    # ReplaySSM (ATOM's, or vLLM's RecoverSSM) verifies off one checkpoint: no per-draft blocks
    replay = deployment.replayssm or deployment.use_replayssm
    spec_blocks = 0 if replay else deployment.spec_tokens
    backend = kda_prefill_backend_of(plan)
    checkpoint = prefill_checkpoint_blocks(backend) if backend else 0
    entries = []
    for group in plan.stage(stage).groups:
        spec = plan.group_spec(group)
        if group.kind == "ring":
            blocks = 1
        elif spec.paging == "slot":
            blocks = state_blocks_per_request(mode, spec_blocks, checkpoint)
        else:
            ranks = spec.dcp.num_ranks if spec.dcp is not None else 1
            tokens = -(-max_model_len // ranks)
            blocks = -(-tokens // plan.tokens_per_page(group))
        entries.append(GroupBlocks(group=group.name, blocks=blocks))
    return tuple(entries)


def vllm_capacity(
    plan: BlockPlan, budget_bytes: int, max_model_len: int | None = None
) -> VllmCapacity:
    """The capacity of ``budget_bytes`` per rank at ``max_model_len`` tokens per request (the
    model's context where ``None``, vLLM's default); refuses (``budget_too_small``) a budget
    in which some stage cannot hold one request."""
    check_budget("budget_bytes", budget_bytes)
    max_model_len = check_context(plan, max_model_len)
    num_blocks = plan.num_blocks(budget_bytes)
    by_stage = [group_blocks(plan, max_model_len, stage) for stage in range(len(plan.stages))]
    for stage, entries in enumerate(by_stage):
        per_request = sum(entry.blocks for entry in entries)
        block = plan.stage_block_bytes(stage)
        if (per_request + 1) * block > budget_bytes:
            raise Refusal(
                "budget_too_small",
                f"stage {stage}: one request of max_model_len={max_model_len} needs "
                f"{per_request} blocks of {block:,} B plus the null block, "
                f"{(per_request + 1) * block:,} B, over the budget of {budget_bytes:,} B "
                "(vLLM refuses to start)",
                facts={
                    "stage": stage,
                    "max_model_len": max_model_len,
                    "blocks_per_request": per_request,
                    "block_bytes": block,
                    "budget_bytes": budget_bytes,
                },
                hint=f"give at least {(per_request + 1) * block:,} B per rank, or lower "
                "max_model_len",
            )
    entries = by_stage[0]  # vLLM's scheduler counts stage 0's groups
    total = sum(entry.blocks for entry in entries)
    concurrency = num_blocks / total
    return VllmCapacity(
        **answer(plan, budget_bytes, max_model_len, math.floor(concurrency)),
        num_blocks=num_blocks,
        mamba_cache_mode=plan.deployment.mamba_cache_mode_run,
        kda_prefill_backend=kda_prefill_backend_of(plan),
        blocks_per_request=entries,
        max_concurrency=concurrency,
        kda_span_tokens=mamba_block_tokens(
            plan.deployment.mamba_cache_mode_run, plan.block_tokens, max_model_len
        ),
        scheduler_block_tokens=scheduler_block_tokens(plan, max_model_len),
    )
