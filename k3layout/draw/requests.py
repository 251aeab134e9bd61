"""Requests against context length, one line per engine, for one KV budget per rank: the
operator's answer over every context at once (:func:`~k3layout.sweep.requests_sweep`), both
axes in powers of two where every point holds a request.

Gids: ``line.<engine>`` (an engine's line), ``point.<engine>.<max_model_len>`` (a point's
label, its requests).
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from .._args import expect, expect_sequence
from ..errors import Refusal
from ..sweep import RequestsCell
from .figure import human_bytes, new_figure


def draw_requests(cells: Sequence[RequestsCell], title: str = "") -> Figure:
    """The requests each engine holds at once against the context length (log scale); a
    refused point is left out of its line. Refuses (``invalid_argument``) cells that are not
    a non-empty sequence of :class:`~k3layout.sweep.RequestsCell`."""
    expect("title", title, str)
    if not expect_sequence("cells", cells, RequestsCell):
        raise Refusal(
            "invalid_argument",
            "cells is empty: draw_requests takes the result of k3layout.sweep.requests_sweep",
            facts={"num_cells": 0},
            hint="sweep at least one context length and engine",
        )
    held_cells = [cell for cell in cells if cell.max_requests is not None]
    if not held_cells:  # every point refused: nothing to draw, so say why
        reasons = sorted({f"{cell.engine}: {cell.refusal}" for cell in cells})
        raise Refusal(
            cells[0].refusal or "budget_too_small",
            f"no engine holds a request at any context ({'; '.join(reasons)})",
            facts={"refusals": tuple(reasons)},
            hint="give the KV memory per rank (kv_memory_bytes, --kv-memory-gib) where the "
            "GPU's budget is refused",
        )
    figure = new_figure(7.0, 4.0)
    axes = figure.add_subplot()
    by_engine: dict[str, list[RequestsCell]] = {}
    for cell in cells:
        by_engine.setdefault(cell.engine, [])
        if cell.max_requests is not None:
            by_engine[cell.engine].append(cell)
    for engine, held in by_engine.items():
        xs = [c.max_model_len for c in held]
        ys = [c.max_requests or 0 for c in held]
        (line,) = axes.plot(xs, ys, marker="o", label=engine)
        line.set_gid(f"line.{engine}")
        for x, y in zip(xs, ys, strict=True):
            text = axes.annotate(f"{y:,}", (x, y), textcoords="offset points", xytext=(0, 5))
            text.set_fontsize(7)
            text.set_gid(f"point.{engine}.{x}")
    axes.set_xscale("log", base=2)
    drawn = [c.max_requests for c in cells if c.max_requests is not None]
    if drawn and min(drawn) >= 1:  # requests fall roughly as 1 / context: log on both axes
        axes.set_yscale("log", base=2)
    axes.set_xlabel("context length (tokens per request)")
    axes.set_ylabel("requests held at once")
    memory = human_bytes(held_cells[0].kv_memory_bytes)
    axes.set_title(title or f"requests against context, {memory} of KV memory per rank")
    axes.legend()
    axes.grid(alpha=0.3)
    return figure
