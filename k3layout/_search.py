"""The one search the capacity answers share: the last integer a monotone test holds for.

Engines size pools by formulas with floors, caps and per-request terms, so "the most requests
a budget holds" and "the least budget that holds N" are found by asking the engine's own
capacity: probe doubling from a start, then bisect. ``unless_too_small`` turns an engine's
refusal of a budget as too small into a plain answer ("no", "none held").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, overload

from .errors import Refusal

T = TypeVar("T")


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


def unless_too_small(call: Callable[[], T], otherwise: T) -> T:
    """``call()``, or ``otherwise`` where the engine refuses the budget as too small
    (``budget_too_small``); any other refusal propagates."""
    try:
        return call()
    except Refusal as refusal:
        if refusal.code == "budget_too_small":
            return otherwise
        raise
