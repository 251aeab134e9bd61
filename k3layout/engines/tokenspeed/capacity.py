"""What a tokenspeed rank serves from its KV budget, counted as its K3 recipe counts it (#1152
head ``a6ee91b3``, ``CacheRecipe.setup``).

- With speculative decoding the recipe first reserves a verify workspace: dense KDA state rows
  for ``max_live * (spec_tokens + 1)`` verify tokens, every KDA layer's state each
  (``spec_tokens`` is tokenspeed's ``--speculative-num-draft-tokens``).
- The rest buys ``usable // parent`` parents, one of them the null parent.
- A ``--max-total-tokens`` cap first limits them to ``cap // (p_max * 128)``, and to the
  parents that cap needs at the live requests.
- Overlap scheduling protects ``max_live * ceil(depth * decode_tokens / 128)`` MLA pages
  (``decode_tokens``: 1, or the speculative tokens); each state group holds two pages per
  live request.

K3 TP 8 fp8, 1 GiB, one live request, depth 1: 49 usable parents, ``(49 - 6) * 12 - 1`` MLA
pages, 65,920 tokens.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import NonNegativeInt, PositiveInt

from ..._args import expect_int
from ..._frozen import Frozen
from ...constants import PARENT_PAGE_TOKENS
from ...errors import Refusal
from ...layouts.groups import Group
from ...layouts.protocol import EngineLayout


class ParentCapacity(Frozen):
    """What ``budget_bytes`` per rank serves under a tokenspeed plan: the verify workspace,
    usable parents, the arena, the token capacity at ``max_live`` live requests and each
    group's page count (page 0 of every group is the null page)."""

    budget_bytes: NonNegativeInt
    max_live: PositiveInt
    overlap_depth: NonNegativeInt
    max_total_tokens: PositiveInt | None
    workspace_bytes: NonNegativeInt
    protected_pages: NonNegativeInt
    num_parents: PositiveInt
    parent_bytes: PositiveInt
    arena_bytes: PositiveInt
    token_capacity: NonNegativeInt
    page_counts: dict[str, PositiveInt]


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


def _at_least(name: str, value: int, low: int) -> None:
    if expect_int(name, value) < low:
        raise Refusal(
            "invalid_argument",
            f"{name}={value} must be >= {low}",
            facts={"field": name},
            hint=f"pass {name} >= {low}",
        )


def workspace_bytes(plan: ParentPlanLike, max_live: int) -> int:
    """The verify workspace tokenspeed reserves for speculative decoding: every KDA layer's
    state for ``max_live * (spec_tokens + 1)`` rows (0 without speculative tokens)."""
    spec_tokens = plan.deployment.spec_tokens
    if not spec_tokens:
        return 0
    return max_live * (spec_tokens + 1) * len(plan.model.kda_layer_ids) * plan.sizes.state_bytes


def protected_pages(plan: ParentPlanLike, max_live: int, overlap_depth: int) -> int:
    """MLA pages overlap scheduling keeps from the allocator: ``max_live`` times the pages of
    ``depth`` decode steps in flight."""
    decode_tokens = max(1, plan.deployment.spec_tokens)
    return max_live * -(-overlap_depth * decode_tokens // PARENT_PAGE_TOKENS)


def parent_capacity(
    plan: ParentPlanLike,
    budget_bytes: int,
    max_live: int = 1,
    overlap_depth: int = 1,
    max_total_tokens: int | None = None,
) -> ParentCapacity:
    """tokenspeed's capacity of ``budget_bytes`` (see the module); refuses
    (``budget_too_small``) a budget without a null parent and one usable parent, a token cap
    below one parent, or parents that cannot admit a token."""
    _at_least("budget_bytes", budget_bytes, 0)
    _at_least("max_live", max_live, 1)
    _at_least("overlap_depth", overlap_depth, 0)
    if overlap_depth > 1:
        raise Refusal(
            "invalid_argument",
            f"overlap_depth={overlap_depth}: tokenspeed schedules at depth 0 or 1",
            facts={"field": "overlap_depth"},
            hint="pass overlap_depth 0 or 1",
        )
    if max_total_tokens is not None:
        _at_least("max_total_tokens", max_total_tokens, 1)
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
    return ParentCapacity(
        budget_bytes=budget_bytes,
        max_live=max_live,
        overlap_depth=overlap_depth,
        max_total_tokens=max_total_tokens,
        workspace_bytes=workspace,
        protected_pages=protected,
        num_parents=num_parents,
        parent_bytes=parent,
        arena_bytes=(num_parents + 1) * parent,
        token_capacity=tokens,
        page_counts={
            g.name: 1 + num_parents * plan.pages_per_parent(g) for g in plan.groups if g.layers
        },
    )
