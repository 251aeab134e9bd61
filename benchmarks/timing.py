"""The one timing rule every benchmark here uses, so their ratios compare like with like."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(action: Callable[[], object], *, repeats: int = 9, number: int = 1) -> float:
    """Median over ``repeats`` runs of the mean time of ``number`` calls, after one warm-up."""
    action()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            action()
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)
