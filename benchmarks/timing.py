"""The one timing rule every benchmark here uses, so their ratios compare like with like."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(action: Callable[[], object], *, repeats: int = 9, number: int = 1) -> float:
    """Median over ``repeats`` runs of the mean time of ``number`` calls, after one warm-up."""
    return statistics.median(run_seconds(action, repeats=repeats, number=number))


def run_seconds(action: Callable[[], object], *, repeats: int = 9, number: int = 1) -> list[float]:
    """The mean time of ``number`` calls, for each of ``repeats`` runs, after one warm-up.

    Ratios use the median of these. An absolute target (a time in ms) is read on the fastest
    run as well, as ``timeit`` advises: on a shared machine the slower runs measure the
    neighbours (these 2-core machines swing about 1.6x between runs of one process)."""
    action()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            action()
        runs.append((time.perf_counter() - start) / number)
    return runs


def interleaved_seconds(
    actions: dict[str, Callable[[], object]], *, repeats: int = 9
) -> dict[str, list[float]]:
    """The time of one call of each action, ``repeats`` rounds, the actions taking turns in
    every round, after one warm-up of each.

    For ratios against a baseline on a shared machine: a neighbour's burst then slows every
    action of the round it falls in, instead of all the runs of whichever action it met."""
    for action in actions.values():
        action()
    runs: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(repeats):
        for name, action in actions.items():
            start = time.perf_counter()
            action()
            runs[name].append(time.perf_counter() - start)
    return runs
