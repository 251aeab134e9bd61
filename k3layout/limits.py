"""Upper bounds on sizes: a value too big for the planner or the engines is refused.

Every bound is a named constant in :mod:`k3layout.constants`; beyond it the planner raises
:class:`~k3layout.Refusal` with ``code="size_limit"`` naming the field and the bound.
"""

from __future__ import annotations

from typing import TypeVar

from ._args import expect_int
from ._validation import describe
from .constants import INT64_MAX
from .errors import Refusal


def check_bound(name: str, value: int, bound: int, *, why: str = "") -> int:
    """``value`` when ``value <= bound``; else refuse (``size_limit``) naming ``name``."""
    if value > bound:
        raise Refusal(
            "size_limit",
            f"{name}={_show(value)} is above the bound {bound:,}{f' ({why})' if why else ''}",
            facts={"field": name, "bound": bound},
            hint=f"use {name} <= {bound:,}",
        )
    return value


def check_range(name: str, value: object, low: int, high: int, *, why: str = "") -> int:
    """``value`` when it is an ``int`` in ``low..high``; else refuse: a wrong type or a value
    below ``low`` (``invalid_argument``), one above ``high`` (``size_limit``)."""
    number = expect_int(name, value)
    if number < low:
        raise Refusal(
            "invalid_argument",
            f"{name}={describe(number)} must be >= {low}",
            facts={"field": name},
            hint=f"use {low} <= {name} <= {high:,}",
        )
    return check_bound(name, number, high, why=why)


def check_int64(name: str, value: int) -> int:
    """``value`` when it fits an int64 (what engines index caches with); else refuse
    (``size_limit``) naming ``name``.

    >>> check_int64("page_bytes", 884_736)
    884736
    """
    return check_bound(name, value, INT64_MAX, why="byte counts must fit int64")


def _show(value: int) -> str:
    # str() of an int above 4,300 digits raises ValueError; name its size instead.
    if value.bit_length() > 128:
        return f"<an integer of {value.bit_length():,} bits>"
    return f"{value:,}"


RecordT = TypeVar("RecordT")


def checked_bytes(record: RecordT, *names: str) -> RecordT:
    """``record`` once each byte count ``names`` (attributes of it; absent ones are skipped)
    fits an int64; else refuse (``size_limit``). A plan's largest byte count bounds the rest."""
    for name in names:
        value = getattr(record, name, None)
        if isinstance(value, int):
            check_int64(name, value)
    return record
