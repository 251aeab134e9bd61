"""What a tokenspeed rank serves from its KV budget, counted as its K3 recipe counts it (#1152
head ``a6ee91b3``).

The budget buys ``budget // parent`` parents, one of them the null parent; a
``max_total_tokens`` cap first limits them to ``limit // (p_m * 128)``. Overlap scheduling
protects ``max_live * ceil(depth * decode_input_tokens / 128)`` MLA pages; each state group
holds two pages per live request. K3 TP 8 fp8, 1 GiB, one live request, depth 1: 49 usable
parents, ``(49 - 6) * 12 - 1`` MLA pages, 65,920 tokens.
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
    """What ``budget_bytes`` per rank serves under a parent plan: usable parents, the arena,
    the token capacity at ``max_live`` live requests and each group's page count (page 0 of
    every group is the null page)."""

    budget_bytes: NonNegativeInt
    max_live: PositiveInt
    overlap_depth: NonNegativeInt
    max_total_tokens: PositiveInt | None
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

    def token_capacity(
        self,
        num_parents: int,
        max_live: int = 1,
        protected_pages: int = 0,
        stage: int | None = None,
    ) -> int: ...


def parent_capacity(
    plan: ParentPlanLike,
    budget_bytes: int,
    max_live: int = 1,
    overlap_depth: int = 1,
    max_total_tokens: int | None = None,
) -> ParentCapacity:
    """tokenspeed's capacity of ``budget_bytes`` (see the module); refuses
    (``budget_too_small``) a budget without one usable parent or one that cannot admit a
    token, and (``engine_setting``) speculative decoding, whose verify workspace tokenspeed
    reserves and the planner does not model yet."""
    for name, value, low in (
        ("budget_bytes", budget_bytes, 0),
        ("max_live", max_live, 1),
        ("overlap_depth", overlap_depth, 0),
    ):
        if expect_int(name, value) < low:
            raise Refusal(
                "invalid_argument",
                f"{name}={value} must be >= {low}",
                facts={"field": name},
                hint=f"pass {name} >= {low}",
            )
    if max_total_tokens is not None and expect_int("max_total_tokens", max_total_tokens) < 1:
        raise Refusal(
            "invalid_argument",
            f"max_total_tokens={max_total_tokens} must be >= 1",
            facts={"field": "max_total_tokens"},
            hint="pass max_total_tokens >= 1, or None for no cap",
        )
    if plan.deployment.spec_tokens:
        raise Refusal(
            "engine_setting",
            f"spec_tokens={plan.deployment.spec_tokens}: tokenspeed reserves a verify workspace "
            "for speculative decoding before it sizes the arena, which the planner does not "
            "model yet",
            facts={"engine": plan.engine, "field": "spec_tokens"},
            hint="ask the capacity without speculative tokens",
        )
    parent = plan.parent_bytes
    num_parents = budget_bytes // parent - 1
    if num_parents < 1:
        raise Refusal(
            "budget_too_small",
            f"budget_bytes={budget_bytes:,} holds {budget_bytes // parent} parents of "
            f"{parent:,} B: tokenspeed needs a null parent and one usable parent",
            facts={"budget_bytes": budget_bytes, "parent_bytes": parent},
            hint=f"give at least {2 * parent:,} B per rank",
        )
    attention = [g for g in plan.groups if g.kind == "attention" and g.layers]
    if max_total_tokens is not None and attention:
        per_parent = plan.pages_per_parent(attention[0]) * PARENT_PAGE_TOKENS
        num_parents = max(1, min(num_parents, max_total_tokens // per_parent))
    decode_input_tokens = 1
    protected = max_live * -(-overlap_depth * decode_input_tokens // PARENT_PAGE_TOKENS)
    tokens = plan.token_capacity(num_parents, max_live, protected)
    return ParentCapacity(
        budget_bytes=budget_bytes,
        max_live=max_live,
        overlap_depth=overlap_depth,
        max_total_tokens=max_total_tokens,
        protected_pages=protected,
        num_parents=num_parents,
        parent_bytes=parent,
        arena_bytes=(num_parents + 1) * parent,
        token_capacity=tokens,
        page_counts={
            g.name: 1 + num_parents * plan.pages_per_parent(g) for g in plan.groups if g.layers
        },
    )
