"""One request's block tables: the block ids each KV-cache group gives it, and where a boundary's
state lives in them.

vLLM keeps one block table per KV-cache group, all drawing from one pool of block ids: since a
block's page on plane ``j`` is shared by layer ``j`` of every group, two groups never hold the
same block. In ``align`` mode a KDA group's row ``p`` holds the state after exactly
``(p + 1) x block`` tokens, so the state of a boundary ``n`` (a block multiple) is in row
``(n - 1) // block``; an attention group holds token ``t`` in row ``t // (block x dcp)``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import SupportsIndex, cast

from pydantic import NonNegativeInt, model_validator

from .._args import expect, expect_args, expect_bounded_int
from .._frozen import Frozen
from .._validation import describe
from ..constants import MAX_PROMPT_TOKENS
from ..errors import Refusal
from ..layouts import EngineLayout, Group, LayoutBase


class BlockTables(Frozen):
    """Block ids per KV-cache group of one request: ``tables`` are ``(group, ids)`` pairs.

    >>> tables = BlockTables.of_groups({"full_attention": [4, 0], "linear_attention_0": [2, 3]})
    >>> tables.table("linear_attention_0")
    (2, 3)
    """

    tables: tuple[tuple[str, tuple[NonNegativeInt, ...]], ...]

    @model_validator(mode="after")
    def _disjoint(self) -> BlockTables:
        seen: dict[int, str] = {}
        for group, ids in self.tables:
            for block in ids:
                if block in seen:
                    raise ValueError(
                        f"block {block} is in the tables of both {seen[block]} and {group}: "
                        "groups share planes, so one block serves one group"
                    )
                seen[block] = group
        return self

    @classmethod
    def of_groups(cls, tables: Mapping[str, Sequence[int]]) -> BlockTables:
        """Build from a mapping of group name to block ids."""
        return cls(tables=tuple((group, tuple(ids)) for group, ids in tables.items()))

    def table(self, group: str) -> tuple[int, ...]:
        """The block ids of ``group``."""
        expect("group", group, str)
        for name, ids in self.tables:
            if name == group:
                return ids
        raise Refusal(
            "invalid_argument",
            f"no block table for group {group!r} (tables for {[n for n, _ in self.tables]})",
            facts={"group": group, "groups": tuple(n for n, _ in self.tables)},
            hint="give every KV-cache group of the stage a block table",
        )

    def block(self, group: str, row: int) -> int:
        """Row ``row`` of ``group``'s table."""
        expect("row", row, int)
        ids = self.table(group)
        if not 0 <= row < len(ids):
            raise Refusal(
                "invalid_argument",
                f"group {group}: row {row} is outside its {len(ids)}-block table",
                facts={"group": group, "row": row, "num_rows": len(ids)},
                hint=f"give {group} at least {row + 1} blocks",
            )
        return ids[row]


def boundary_row(plan: EngineLayout, computed_tokens: int) -> int:
    """The KDA row that holds the state after ``computed_tokens``: ``(n - 1) // block``, refused
    (``invalid_argument``) off the block grid, where ``align`` mode keeps no state."""
    expect_args(("plan", plan, LayoutBase), ("computed_tokens", computed_tokens, int))
    block = plan.state_span_tokens
    if computed_tokens < 1 or computed_tokens % block:
        raise Refusal(
            "invalid_argument",
            f"computed_tokens={computed_tokens} is not a positive multiple of the block "
            f"({block} tokens): align mode keeps the state only at block boundaries",
            facts={"computed_tokens": computed_tokens, "block_tokens": block},
            hint=f"checkpoint at a multiple of {block}",
        )
    return (computed_tokens - 1) // block


def rows_for(plan: EngineLayout, group: Group, num_tokens: int) -> int:
    """Rows ``group``'s table needs for ``num_tokens``: attention ``ceil(n / (block x dcp))``,
    KDA ``ceil(n / block)`` (one state row per block in ``align`` mode)."""
    return -(-num_tokens // plan.span_tokens(group))


def block_tables(
    plan: EngineLayout, num_tokens: int, block_ids: Iterable[int], *, stage: int = 0
) -> BlockTables:
    """Tables for a ``num_tokens`` request, handing out ``block_ids`` in order, group by group.

    >>> from k3layout import Deployment, plan, preset
    >>> p = plan(preset("kimi-k3"), Deployment(attn_tp=8, spec_tokens=2))  # block 1,536
    >>> block_tables(p, 3000, range(9, 0, -1)).tables  # doctest: +NORMALIZE_WHITESPACE
    (('linear_attention_0', (9, 8)), ('linear_attention_1', (7, 6)),
     ('linear_attention_2', (5, 4)), ('full_attention', (3, 2)))
    """
    expect("plan", plan, LayoutBase)
    if expect_bounded_int("num_tokens", num_tokens, MAX_PROMPT_TOKENS) < 1:
        raise Refusal(
            "invalid_argument",
            f"num_tokens={num_tokens} must be at least 1",
            facts={"field": "num_tokens", "num_tokens": num_tokens},
            hint="pass the request's token count (>= 1)",
        )
    held = plan.stage(stage)
    if isinstance(block_ids, (str, bytes, bytearray)) or not isinstance(block_ids, Iterable):
        expect("block_ids", block_ids, (list, tuple, range))  # refuses, naming what it takes
    ids = iter(block_ids)
    tables: dict[str, list[int]] = {}
    for group in held.groups:
        if not group.layers:
            continue
        need = rows_for(plan, group, num_tokens)
        taken = [_block_id(block) for _, block in zip(range(need), ids, strict=False)]
        if len(taken) < need:
            raise Refusal(
                "budget_too_small",
                f"group {group.name} needs {need} blocks for {num_tokens} tokens; the ids ran out",
                facts={"group": group.name, "needed": need, "num_tokens": num_tokens},
                hint="pass more block ids",
            )
        tables[group.name] = taken
    return BlockTables.of_groups(tables)


def _block_id(block: object) -> int:
    """One of ``block_ids``: a block id (an ``int`` >= 0), else refused."""
    if not isinstance(block, bool):
        try:
            index = operator.index(cast(SupportsIndex, block))  # an int, numpy's, ...
        except TypeError:
            index = -1
        if index >= 0:
            return index
    raise Refusal(
        "invalid_argument",
        f"block_ids holds {describe(block)} ({type(block).__name__}), not a block id",
        facts={"field": "block_ids", "block_id": describe(block), "type": type(block).__name__},
        hint="pass block ids as ints >= 0",
    )
