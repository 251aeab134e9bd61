"""How much an SGLang 0.5.23 rank serves from its KV budget, counted as SGLang counts it.

The budget is the memory SGLang's ``KVCacheConfigurator`` divides: after the weights, less
the static-fraction slack, before its own multimodal reservation (100 MiB for a multimodal
model such as K3). SGLang then works in GiB floats, and so does this module, to the byte:

1. ``rest = budget - reservation``; the state pool gets ``rest * r / (1 + r)``
   (``r = mamba_full_memory_ratio``, 0.9) and holds ``max_mamba_cache_size`` slots plus one
   padding slot of ``S_stage`` bytes (every stage charges its largest KDA share, so all agree
   without a collective). With speculative decoding (``D = spec_tokens + 1`` draft tokens)
   the state pool is solved jointly with the verify scratch, ``S * D`` per running request.
2. ``max_total_num_tokens = (rest - state pool) // cell // page * page`` per stage; the
   scheduler keeps the MIN over pipeline stages; DCP multiplies it into logical tokens.
3. ``max_running_requests = min(clamp(tokens / context * 512, 2048, 4096), tokens // 2,
   slots // ratio)`` (the given ``max_running_requests`` in place of the estimate).

K3 on H200 at attention TP 8, fp8, 60 GiB per rank: 2,450,425 tokens, 541 slots, 108
requests; at TP 1 the state pool limits it to 66 slots and 13 requests.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import Field, NonNegativeInt, PositiveInt

from ..._frozen import Frozen
from ...constants import MAX_PROMPT_TOKENS
from ...errors import Refusal
from ...layouts.answer import RequestCapacity, answer, check_budget
from ...layouts.protocol import EngineLayout
from ...limits import check_range
from .rules import (
    MAMBA_FULL_MEMORY_RATIO,
    MULTIMODAL_MODEL_TYPES,
    MULTIMODAL_RESERVATION_BYTES,
    SPEC_MAX_RUNNING_REQUESTS,
    estimated_requests,
    state_slots_per_request,
)

GIB = 1 << 30


class PoolPlan(EngineLayout, Protocol):
    """What capacity reads of an SGLang plan (:class:`~k3layout.engines.sglang.SglangPlan`)."""

    @property
    def page_tokens(self) -> int: ...

    def cell_bytes(self, stage: int = 0) -> int: ...

    def state_slot_bytes(self, stage: int | None = None) -> int: ...


class SglangStageCapacity(Frozen):
    """One pipeline stage's own answer, before the scheduler's MIN over stages."""

    stage: NonNegativeInt = Field(description="the pipeline stage's index")
    layers: tuple[NonNegativeInt, ...] = Field(
        description="module ids of the layers the stage holds"
    )
    cell_bytes: PositiveInt = Field(
        description="SGLang's cell: bytes per token per rank of the stage's attention layers "
        "(a draft's K/V rows included)"
    )
    state_slot_bytes: NonNegativeInt = Field(
        description="bytes of one KDA state slot per rank over the stage's KDA layers (0 without)"
    )
    max_total_num_tokens: NonNegativeInt = Field(
        description="the stage's own token pool per rank, in whole pages, before the MIN "
        "over stages"
    )


class SglangCapacity(RequestCapacity):
    """What a per-rank ``kv_memory_bytes`` serves under an SGLang plan, in SGLang's own names,
    and the answer every engine gives.

    ``max_total_num_tokens`` is per rank (the MIN over stages); ``logical_tokens`` the
    scheduler's token capacity (``x dcp``); ``max_mamba_cache_size`` the state slots and
    ``max_running_requests`` the running requests per attention-DP worker. ``max_requests``
    is within both: ``min(max_running_requests, logical_tokens // max_model_len)``.
    """

    multimodal_reservation_bytes: NonNegativeInt = Field(
        description="bytes SGLang holds back from a multimodal model's budget "
        "(SGLANG_VLM_CACHE_SIZE_MB, 100 MiB for K3); 0 otherwise"
    )
    mamba_full_memory_ratio: float = Field(
        description="the --mamba-full-memory-ratio run: state pool over token pool (0.9 by default)"
    )
    state_slots_per_request: PositiveInt = Field(
        description="KDA state slots one running request holds: 5 with the radix cache, 4 "
        "without the overlap scheduler (PP), 1 without the radix cache"
    )
    max_total_num_tokens: NonNegativeInt = Field(
        description="the token pool per rank, in whole pages: the MIN over pipeline stages"
    )
    logical_tokens: NonNegativeInt = Field(
        description="the scheduler's token capacity: max_total_num_tokens x dcp"
    )
    max_mamba_cache_size: NonNegativeInt = Field(
        description="KDA state slots per attention-DP worker (the padding slot not counted)"
    )
    max_running_requests: PositiveInt = Field(
        description="running requests per attention-DP worker, as SGLang caps them"
    )
    state_pool_bytes: NonNegativeInt = Field(
        description="the KDA state pool per rank: (max_mamba_cache_size + 1) x the charged "
        "slot bytes"
    )
    """The state pool: (slots + 1) x the charged slot bytes."""
    verify_scratch_bytes: NonNegativeInt = Field(
        description="speculative decoding's per-draft-token KDA state scratch per rank (0 without)"
    )
    """Speculative decoding's per-draft-token state scratch (0 without)."""
    draft_bytes_per_token: NonNegativeInt = Field(
        description="a draft's K/V rows, bytes per token per rank, inside each stage's cell "
        "(0 without a draft)"
    )
    """A draft's K/V rows per token, inside each stage's cell (0 without a draft)."""
    stages: tuple[SglangStageCapacity, ...] = Field(
        description="each pipeline stage's own figures, before the MIN over stages"
    )

    def rows(self) -> list[tuple[str, str]]:
        """The capacity as (label, value) rows, each saying what it counts."""
        rows = [
            ("max_total_num_tokens (token pool, per rank)", f"{self.max_total_num_tokens:,}"),
            ("max_mamba_cache_size (KDA state slots)", f"{self.max_mamba_cache_size:,}"),
            ("max_running_requests", f"{self.max_running_requests:,}"),
            ("state slots per request", f"{self.state_slots_per_request}"),
            ("state pool bytes (KDA state)", f"{self.state_pool_bytes:,}"),
        ]
        if self.logical_tokens != self.max_total_num_tokens:
            rows.append(("logical tokens (x dcp)", f"{self.logical_tokens:,}"))
        if self.verify_scratch_bytes:
            rows.append(("verify scratch bytes", f"{self.verify_scratch_bytes:,}"))
        if len(self.stages) > 1:
            for stage in self.stages:
                rows.append(
                    (
                        f"stage {stage.stage} tokens (its own, before the MIN)",
                        f"{stage.max_total_num_tokens:,}",
                    )
                )
        return [
            ("context (--context-length)", f"{self.max_model_len:,}"),
            *rows,
            *self.answer_rows(),
        ]


def _budget_too_small(why: str, **facts: int | float) -> Refusal:
    return Refusal(
        "budget_too_small",
        f"{why} (SGLang refuses to start)",
        facts=dict(facts),
        hint="give more KV memory per rank, a larger attention TP, or fewer running requests",
    )


def _token_pool(plan: PoolPlan, available: int) -> tuple[list[SglangStageCapacity], int]:
    """Each stage's own token pool of ``available`` bytes (whole pages of cells) and the
    pool every stage keeps: their MIN, under ``--max-total-tokens`` (aligned to the page)."""
    page = plan.page_tokens
    stages = []
    for stage in plan.stages:
        cell = plan.cell_bytes(stage.index)
        stages.append(
            SglangStageCapacity(
                stage=stage.index,
                layers=stage.layers,
                cell_bytes=cell,
                state_slot_bytes=plan.state_slot_bytes(stage.index),
                max_total_num_tokens=available // cell // page * page,
            )
        )
    tokens = min(stage.max_total_num_tokens for stage in stages)
    cap = plan.deployment.max_total_tokens
    if cap is not None:
        tokens = min(tokens, cap // page * page)
    return stages, tokens


def sglang_capacity(plan: PoolPlan, budget_bytes: int, max_model_len: int) -> SglangCapacity:
    """SGLang's pool sizes for ``budget_bytes`` per rank at a context of ``max_model_len``
    tokens (its ``context_len``); refuses (``budget_too_small``) where SGLang refuses to
    start: no state slot fits, or too few to serve one request."""
    check_budget("budget_bytes", budget_bytes)
    check_range("max_model_len", max_model_len, 1, MAX_PROMPT_TOKENS, why="tokens of a request")
    deployment = plan.deployment
    dp = deployment.attn_dp
    ratio = state_slots_per_request(deployment.prefix_caching, overlap=deployment.pp == 1)
    r = deployment.mamba_full_memory_ratio
    if r is None:
        r = MAMBA_FULL_MEMORY_RATIO
    draft_tokens = deployment.spec_tokens + 1 if deployment.spec_tokens else 0
    requested = deployment.max_running_requests
    if requested is None and draft_tokens:
        requested = SPEC_MAX_RUNNING_REQUESTS
    reservation = (
        MULTIMODAL_RESERVATION_BYTES if plan.model.model_type in MULTIMODAL_MODEL_TYPES else 0
    )
    rest = budget_bytes / GIB - reservation / GIB
    # every stage charges the largest stage's share of the state slot
    kda_total = len(plan.model.kda_layer_ids)
    per_slot = 0
    slots = 0
    scratch = 0
    if kda_total:
        largest = max(
            sum(len(g.layers) for g in plan.groups_of("kda", stage.index)) for stage in plan.stages
        )
        scale = largest / kda_total if deployment.pp > 1 else 1.0
        per_slot = int(plan.state_slot_bytes() * scale)
        slots, scratch = _state_slots(
            rest, r, per_slot, draft_tokens, requested, ratio, dp, deployment.max_mamba_cache_size
        )
        if slots <= 0:
            raise _budget_too_small(
                f"not enough memory for the hybrid state cache: {slots} slots of "
                f"{per_slot:,} B in a budget of {budget_bytes:,} B",
                budget_bytes=budget_bytes,
                state_slot_bytes=per_slot,
            )
        rest = rest - scratch / GIB
        rest = rest - ((slots + 1) * per_slot) / GIB
    if rest <= 0:
        raise _budget_too_small(
            f"the state pool leaves no memory for the token pool in {budget_bytes:,} B",
            budget_bytes=budget_bytes,
        )
    stages, tokens = _token_pool(plan, int(rest * GIB))
    if requested is not None:
        running = min(max(1, requested // dp), tokens // 2)
    else:
        running = min(estimated_requests(tokens, max_model_len), tokens // 2)
    if kda_total:
        running = min(running, slots // ratio)
    if running <= 0:
        raise _budget_too_small(
            f"the hybrid state cache is too small to serve any request: {slots} slots, "
            f"{ratio} per request, {tokens:,} tokens",
            max_mamba_cache_size=slots,
            state_slots_per_request=ratio,
            max_total_num_tokens=tokens,
        )
    draft = sum(
        plan.sizes.spec_of(layer).bytes_per_token(deployment.attn_tp)
        for group in plan.groups
        if group.name == "draft"
        for layer in group.layers
    )
    held = min(running, tokens * deployment.dcp // max_model_len)
    return SglangCapacity(
        **answer(plan, budget_bytes, max_model_len, held),
        multimodal_reservation_bytes=reservation,
        mamba_full_memory_ratio=r,
        state_slots_per_request=ratio,
        max_total_num_tokens=tokens,
        logical_tokens=tokens * deployment.dcp,
        max_mamba_cache_size=slots,
        max_running_requests=running,
        state_pool_bytes=(slots + 1) * per_slot if kda_total else 0,
        verify_scratch_bytes=scratch,
        draft_bytes_per_token=draft,
        stages=tuple(stages),
    )


def _state_slots(  # noqa: PLR0917 - SGLang's own inputs, in its order
    rest_gib: float,
    ratio_r: float,
    per_slot: int,
    draft_tokens: int,
    requested: int | None,
    ratio: int,
    dp: int,
    given: int | None,
) -> tuple[int, int]:
    """State slots and the verify scratch bytes, as SGLang's ``_handle_max_mamba_cache``
    solves them (GiB floats, its own expression order)."""
    # speculative decoding always runs with a request cap (SGLang sets one)
    cap = max(1, (SPEC_MAX_RUNNING_REQUESTS if requested is None else requested) // dp)
    d = draft_tokens
    if given is not None:  # --max-mamba-cache-size
        slots = given // dp
        return slots, per_slot * (min(cap, slots // ratio) + 1) * d
    if ratio == 1 and requested is not None:  # no radix cache: a slot per running request
        slots = max(1, requested // dp)
        return slots, per_slot * (slots + 1) * d
    budget = rest_gib * ratio_r / (1 + ratio_r) * GIB
    if not d:
        return int((budget - per_slot) // per_slot), 0
    slots = int((budget - per_slot * (1 + d)) // (per_slot * (1 + d / ratio)))
    return slots, per_slot * (min(cap, slots // ratio) + 1) * d
