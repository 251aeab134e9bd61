"""What a tokenspeed rank serves from its KV budget, counted as its K3 recipe counts it
(``CacheRecipe.setup``, the same at #1152's head and ``main`` but for the verify workspace).

- With speculative decoding the recipe first reserves a verify workspace
  (``KimiK3Recipe.workspace_bytes``; ``T`` is ``spec_tokens``, tokenspeed's
  ``--speculative-num-draft-tokens``, ``L`` the KDA layers):

  - dense state rows: ``max_live x (T + 1)`` rows of every KDA layer's state, ``L x max_live
    x (T + 1) x S`` (#1152; ``main`` where tokenspeed-kernel has no replay kernels);
  - the replay commit (``main``, tokenspeed #1156, on a GPU whose vendor has the replay
    kernels, NVIDIA, with bf16 or fp16 activations; :func:`replays_verify`): one conv
    checkpoint row per live request and layer and ``max_live x T`` compact replay rows per
    layer, ``max_live x sum(conv) + L x max_live x T x (2 C + 2 d + 2 h + 4 h d)`` (``C`` the
    conv channels, ``h`` the heads and ``d`` the head dim of one rank: a bf16 qkv row, a bf16
    ``f_a`` row, a bf16 beta row and an fp32 gate row). Not modelled: at ``spec_tokens=1``
    ``main``'s replay backend allocates no replay rows (``hybrid_kda.py``), so its start-up
    check would find the planned workspace and the allocation apart (read, not run).

- The rest buys ``usable // parent`` parents, one of them the null parent.
- A ``--max-total-tokens`` cap first limits them to ``cap // (p_max * 128)``, and to the
  parents that cap needs at the live requests.
- Overlap scheduling protects ``max_live * ceil(depth * decode_tokens / 128)`` MLA pages
  (``decode_tokens``: 1, or the speculative tokens); each state group holds two pages per
  live request.

K3 TP 8 fp8, 1 GiB, one live request, depth 1: 49 usable parents, ``(49 - 6) * 12 - 1`` MLA
pages, 65,920 tokens (both revisions lay out the same parent there).
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import Field, NonNegativeInt, PositiveInt

from ..._args import expect_non_negative, expect_positive
from ..._search import last_holding, unless_too_small
from ...constants import PARENT_PAGE_TOKENS
from ...errors import Refusal
from ...gpus import GPUS
from ...layouts.answer import (
    RequestCapacity,
    answer,
    check_budget,
    check_context,
    check_requests,
)
from ...layouts.groups import Group
from ...layouts.protocol import EngineLayout
from ...model import HybridModel
from .recipe import field_offsets
from .releases import revision_of


class ParentCapacity(RequestCapacity):
    """What ``kv_memory_bytes`` per rank serves under a tokenspeed plan, sized for
    ``max_live`` live requests (tokenspeed's ``max_bs``): the verify workspace, usable
    parents, the arena, the token capacity and each group's page count (page 0 of every group
    is the null page), and the answer every engine gives (``max_requests``: requests of
    ``max_model_len`` tokens the token capacity holds, at most ``max_live``)."""

    max_live: PositiveInt = Field(
        description="live requests the figures are sized for (tokenspeed's max_bs)"
    )
    overlap_depth: NonNegativeInt = Field(
        description="overlap scheduling depth, 0 or 1: decode steps in flight whose MLA pages "
        "are protected"
    )
    max_total_tokens: PositiveInt | None = Field(
        description="tokenspeed's --max-total-tokens cap, in tokens; None: no cap"
    )
    workspace_bytes: NonNegativeInt = Field(
        description="the verify workspace per rank (0 without speculative tokens): under "
        "replay_commit a conv checkpoint row per live request and max_live x spec_tokens "
        "compact replay rows of every KDA layer, else every KDA layer's state for max_live x "
        "(spec_tokens + 1) rows"
    )
    replay_commit: bool = Field(
        description="whether the verify workspace is the replay commit's (tokenspeed main on "
        "an NVIDIA GPU with bf16/fp16 activations, speculative decoding only) rather than "
        "dense KDA state rows"
    )
    protected_pages: NonNegativeInt = Field(
        description="MLA pages overlap scheduling keeps from the allocator: max_live x the "
        "pages of overlap_depth decode steps"
    )
    num_parents: PositiveInt = Field(
        description="usable parent blocks per rank, the null parent not counted"
    )
    parent_bytes: PositiveInt = Field(description="bytes of one parent block per rank")
    arena_bytes: PositiveInt = Field(
        description="the parent arena per rank: (num_parents + 1) x parent_bytes"
    )
    token_capacity: NonNegativeInt = Field(
        description="the most tokens the usable parents hold, after the live requests' state "
        "pages and the protected pages (at most max_total_tokens)"
    )
    page_counts: dict[str, PositiveInt] = Field(
        description="pages per KV-cache group name, null page 0 included: 1 + num_parents x "
        "the group's pages per parent"
    )

    def rows(self) -> list[tuple[str, str]]:
        """tokenspeed's figures and the common answer as (label, value) rows, each saying what
        it counts."""
        rows = [
            ("max_live (tokenspeed's max_bs, the sizing)", f"{self.max_live:,}"),
            (
                "verify workspace (replay commit)"
                if self.replay_commit
                else "verify workspace (KDA state rows)",
                f"{self.workspace_bytes:,}",
            ),
            ("usable parents (+1 null)", f"{self.num_parents:,}"),
            ("arena bytes", f"{self.arena_bytes:,}"),
            ("token_capacity (MLA pages x 128)", f"{self.token_capacity:,}"),
        ]
        return [*rows, *self.answer_rows()]


class ParentPlanLike(EngineLayout, Protocol):
    """What capacity reads of a parent plan (:class:`~k3layout.ParentPlan`)."""

    @property
    def parent_bytes(self) -> int: ...

    def pages_per_parent(self, group: Group) -> int: ...

    def parents_for(
        self, tokens: int, max_live: int = 1, protected_pages: int = 0, stage: int | None = None
    ) -> int: ...

    def token_capacity(
        self,
        num_parents: int,
        max_live: int = 1,
        protected_pages: int = 0,
        stage: int | None = None,
        upper_bound: int | None = None,
    ) -> int: ...


BF16_BYTES, FP32_BYTES = 2, 4
"""The replay row's element sizes: bf16 qkv, ``f_a`` and beta rows, an fp32 gate row."""


def activation_dtype(model: HybridModel) -> str:
    """The dtype tokenspeed runs the model's activations in (``--dtype auto``,
    ``_get_and_verify_dtype``): the checkpoint's ``torch_dtype``, float16 for a float32
    checkpoint, bfloat16 where the config gives none (a model built by hand)."""
    arch = model.architecture
    if arch is None:
        return "bfloat16"
    return "float16" if arch.torch_dtype == "float32" else arch.torch_dtype


def replays_verify(plan: EngineLayout) -> bool:
    """Whether the plan's speculative verify commits by replay (``KimiK3Recipe.replay_kda``):
    speculative tokens, and a revision whose replay kernels the GPU's vendor has for the
    model's activation dtype (:meth:`TokenspeedRevision.replays_verify`)."""
    deployment = plan.deployment
    if not deployment.spec_tokens:
        return False
    vendor = GPUS[deployment.gpu].vendor
    return revision_of(deployment).replays_verify(vendor, activation_dtype(plan.model))


def replay_row_parts(plan: EngineLayout) -> dict[str, int]:
    """The bytes of the four tensors of one compact replay row of one KDA layer on one rank
    (``hybrid_kda.py``'s replay payloads): a bf16 qkv row of the ``C`` conv channels, a bf16
    ``f_a`` row of the head dim ``d``, a bf16 beta row of the ``h`` heads and an fp32 gate row
    of ``h x d``, read off the first KDA layer as the recipe reads its shapes."""
    layer = plan.model.kda_layers[0]
    heads = layer.num_heads // plan.deployment.attn_tp
    return {
        "qkv_bf16": BF16_BYTES * 3 * heads * layer.head_dim,
        "f_a_bf16": BF16_BYTES * layer.head_dim,
        "beta_bf16": BF16_BYTES * heads,
        "gate_fp32": FP32_BYTES * heads * layer.head_dim,
    }


def replay_row_bytes(plan: EngineLayout) -> int:
    """One compact replay row of one KDA layer on one rank: ``2 C + 2 d + 2 h + 4 h d``
    (:func:`replay_row_parts`)."""
    return sum(replay_row_parts(plan).values())


def workspace_bytes(plan: ParentPlanLike, max_live: int) -> int:
    """The verify workspace tokenspeed reserves for speculative decoding (0 without
    speculative tokens): the replay commit's conv checkpoint and replay rows where
    :func:`replays_verify`, else every KDA layer's state for ``max_live * (spec_tokens + 1)``
    rows (see the module)."""
    spec_tokens = plan.deployment.spec_tokens
    if not spec_tokens:
        return 0
    kda = plan.model.kda_layer_ids
    if not replays_verify(plan):
        return max_live * (spec_tokens + 1) * len(kda) * plan.sizes.state_bytes
    conv = sum(
        size
        for layer in kda
        for part, _, size in field_offsets(plan.sizes, layer)
        if part == "conv"
    )
    return max_live * conv + len(kda) * max_live * spec_tokens * replay_row_bytes(plan)


def protected_pages(plan: ParentPlanLike, max_live: int, overlap_depth: int) -> int:
    """MLA pages overlap scheduling keeps from the allocator: ``max_live`` times the pages of
    ``depth`` decode steps in flight."""
    decode_tokens = max(1, plan.deployment.spec_tokens)
    return max_live * -(-overlap_depth * decode_tokens // PARENT_PAGE_TOKENS)


def parent_capacity(
    plan: ParentPlanLike,
    budget_bytes: int,
    max_model_len: int | None = None,
    *,
    max_live: int | None = None,
    overlap_depth: int = 1,
    max_total_tokens: int | None = None,
) -> ParentCapacity:
    """tokenspeed's capacity of ``budget_bytes`` (see the module) sized for ``max_live``
    live requests, or, where ``None``, for the most requests of ``max_model_len`` tokens
    (default: the model's context) it holds at once. Refuses (``budget_too_small``) a budget
    without a null parent and one usable parent, a token cap below one parent, parents that
    cannot admit a token, or (``max_live=None``) a budget that holds no such request."""
    check_budget("budget_bytes", budget_bytes)
    context = check_context(plan, max_model_len)
    expect_non_negative("overlap_depth", overlap_depth)
    if overlap_depth > 1:
        raise Refusal(
            "invalid_argument",
            f"overlap_depth={overlap_depth}: tokenspeed schedules at depth 0 or 1",
            facts={"field": "overlap_depth"},
            hint="pass overlap_depth 0 or 1",
        )
    if max_total_tokens is not None:
        expect_positive("max_total_tokens", max_total_tokens)
    if max_live is None:
        live = most_live(plan, budget_bytes, context, overlap_depth, max_total_tokens)
    else:
        live = max_live
        check_requests("max_live", live)
    figures = _figures(plan, budget_bytes, live, overlap_depth, max_total_tokens)
    held = min(live, int(figures["token_capacity"]) // context)
    return ParentCapacity(**answer(plan, budget_bytes, context, held), **figures)


def most_live(
    plan: ParentPlanLike,
    budget_bytes: int,
    max_model_len: int,
    overlap_depth: int,
    max_total_tokens: int | None,
) -> int:
    """The most live requests ``n`` whose sizing (workspace, state pages, protected pages)
    leaves ``budget_bytes`` a token capacity of ``n x max_model_len``: what tokenspeed's
    ``--max-num-seqs`` may be for requests of that length. Refuses (``budget_too_small``)
    a budget that holds not one."""

    def holds(live: int) -> bool:
        def enough() -> bool:
            figures = _figures(plan, budget_bytes, live, overlap_depth, max_total_tokens)
            return int(figures["token_capacity"]) >= live * max_model_len

        return unless_too_small(enough, False)

    if not holds(1):
        raise Refusal(
            "budget_too_small",
            f"budget_bytes={budget_bytes:,} does not hold one request of {max_model_len:,} "
            "tokens under tokenspeed's sizing",
            facts={"budget_bytes": budget_bytes, "max_model_len": max_model_len},
            hint="give the cache more memory or ask a shorter context",
        )
    return last_holding(holds, 1, 2)  # each live request takes its state pages: this ends


def _figures(
    plan: ParentPlanLike,
    budget_bytes: int,
    max_live: int,
    overlap_depth: int,
    max_total_tokens: int | None,
) -> dict[str, Any]:
    """tokenspeed's own figures of ``budget_bytes`` sized for ``max_live`` live requests."""
    workspace = workspace_bytes(plan, max_live)
    parent = plan.parent_bytes
    num_parents = (budget_bytes - workspace) // parent - 1
    if num_parents < 1:
        raise Refusal(
            "budget_too_small",
            f"budget_bytes={budget_bytes:,} less a verify workspace of {workspace:,} B holds "
            f"{max(num_parents + 1, 0)} parents of {parent:,} B: tokenspeed needs a null "
            "parent and one usable parent (tokenspeed: kimi_k3 cache budget must hold a null "
            "parent and one usable LCM parent)",
            facts={"budget_bytes": budget_bytes, "parent_bytes": parent, "workspace": workspace},
            hint=f"give at least {workspace + 2 * parent:,} B per rank",
        )
    protected = protected_pages(plan, max_live, overlap_depth)
    if max_total_tokens is not None:
        most = max(plan.pages_per_parent(g) for g in plan.groups if g.layers)
        requested = max_total_tokens // (most * PARENT_PAGE_TOKENS)
        if requested < 1:
            raise Refusal(
                "budget_too_small",
                f"max_total_tokens={max_total_tokens:,} is under one parent of "
                f"{most * PARENT_PAGE_TOKENS:,} tokens",
                facts={"max_total_tokens": max_total_tokens},
                hint=f"cap at least {most * PARENT_PAGE_TOKENS:,} tokens",
            )
        needed = plan.parents_for(max_total_tokens, max_live, protected)
        num_parents = min(num_parents, requested, needed)
    tokens = plan.token_capacity(num_parents, max_live, protected, upper_bound=max_total_tokens)
    return {
        "max_live": max_live,
        "overlap_depth": overlap_depth,
        "max_total_tokens": max_total_tokens,
        "workspace_bytes": workspace,
        "replay_commit": replays_verify(plan),
        "protected_pages": protected,
        "num_parents": num_parents,
        "parent_bytes": parent,
        "arena_bytes": (num_parents + 1) * parent,
        "token_capacity": tokens,
        "page_counts": {
            g.name: 1 + num_parents * plan.pages_per_parent(g) for g in plan.groups if g.layers
        },
    }
