"""The one search the capacity answers share: the last integer a monotone test holds for.

Engines size pools by formulas with floors, caps and per-request terms, so "the most requests
a budget holds" and "the least budget that holds N" are found by asking the engine's own
capacity: probe doubling from a start, then bisect. ``fits`` turns an engine's refusal of a
budget as too small into a plain "no".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import overload

from .errors import Refusal


@overload
def last_holding(holds: Callable[[int], bool], low: int, first: int) -> int: ...
@overload
def last_holding(holds: Callable[[int], bool], low: int, first: int, limit: int) -> int | None: ...


def last_holding(
    holds: Callable[[int], bool], low: int, first: int, limit: int | None = None
) -> int | None:
    """The largest ``n >= low`` for which ``holds`` is true, given ``holds(low)`` is and that
    ``holds`` is true up to a point and false after it. Probes ``first``, then doubles, then
    bisects. ``None`` where ``holds`` is still true at a probe past ``limit``."""
    probe = first
    while holds(probe):
        if limit is not None and probe > limit:
            return None
        low, probe = probe, 2 * probe
    high = probe  # holds(low), not holds(high)
    while high - low > 1:
        middle = (low + high) // 2
        if holds(middle):
            low = middle
        else:
            high = middle
    return low


def fits(call: Callable[[], bool]) -> bool:
    """``call()``, with the engine refusing the budget as too small (``budget_too_small``)
    read as ``False``; any other refusal propagates."""
    try:
        return call()
    except Refusal as refusal:
        if refusal.code == "budget_too_small":
            return False
        raise
