"""Divisors for refusal hints, in O(sqrt n) time and bounded work, never O(n).

A hint such as ``attn_tp=4 or attn_tp=6 would divide the heads`` needs the divisors of a
number near a value; listing ``range(1, n + 1)`` takes minutes for a prime of 10**9+7.
Divisors come in pairs ``(i, n // i)`` with ``i <= isqrt(n)``, so trying ``i`` up to
``isqrt(n)`` finds them all. For an ``n`` above ``MAX_TRIALS**2`` only the pairs with
``i <= MAX_TRIALS`` are found: every value returned still divides ``n``, the hint is just
less complete.
"""

from __future__ import annotations

from math import isqrt

from .constants import MAX_DIVISOR_HINTS

MAX_TRIALS = 1 << 20
"""Most trial divisions one hint may cost (about 0.1 s); exact for ``n <= 2**40``."""


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` (>= 1) in increasing order; see the module note for huge ``n``.

    >>> divisors(96)
    [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    """
    if n < 1:
        return []
    small: list[int] = []
    large: list[int] = []
    for i in range(1, min(isqrt(n), MAX_TRIALS) + 1):
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
    return small + large[::-1]


def nearest_divisors(n: int, x: int) -> tuple[int | None, int | None]:
    """The largest divisor of ``n`` below ``x`` and the smallest above it (``None`` if none).

    >>> nearest_divisors(96, 5)
    (4, 6)
    >>> nearest_divisors(10**9 + 7, 8)
    (1, 1000000007)
    """
    found = divisors(n)
    below = max((d for d in found if d < x), default=None)
    above = min((d for d in found if d > x), default=None)
    return below, above


def divisors_near(n: int, x: int, count: int = MAX_DIVISOR_HINTS) -> list[int]:
    """At most ``count`` divisors of ``n``, those nearest ``x``, in increasing order.

    >>> divisors_near(8, 3)
    [1, 2, 4, 8]
    >>> divisors_near(720720, 7, count=4)
    [5, 6, 7, 8]
    """
    found = divisors(n)
    return sorted(sorted(found, key=lambda d: (abs(d - x), d))[:count])
