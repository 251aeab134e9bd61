"""A sweep as a heatmap: padding or bytes per token against attention TP and cache dtype.

One row per (engine, cache dtype), one column per attention TP; each cell is coloured by its
value and prints it, a refused point is grey and prints its refusal code. Padding is the
``vllm`` KDA page padding over ``S`` and the ``tokenspeed`` layout's largest group padding (see
:func:`~k3layout.sweep.sweep`); bytes per token are per rank per cached attention token.

Gids: ``heatmap`` (the image), ``cell.<engine>.<dtype>.<attn_tp>`` (a cell's text).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, TypeAlias

from matplotlib import colormaps
from matplotlib.figure import Figure
from numpy import ma

from .._args import expect, expect_sequence
from .._validation import describe
from ..errors import Refusal
from ..sweep import SweepCell
from .figure import new_figure

SweepQuantity: TypeAlias = Literal["padding", "bytes_per_token"]
"""What a sweep heatmap shows."""

QUANTITIES: tuple[SweepQuantity, ...] = ("padding", "bytes_per_token")

_REFUSED = "#d0d0d0"


def sweep_grid(
    cells: Sequence[SweepCell], quantity: SweepQuantity = "padding"
) -> tuple[tuple[tuple[str, str], ...], tuple[int, ...], tuple[tuple[float, ...], ...]]:
    """``(rows, attn_tps, values)``: rows are the (engine, dtype) pairs in order of first
    appearance, columns the attention TPs in increasing order, ``values[r][c]`` the quantity
    (NaN where refused or not swept). Refuses (``invalid_argument``) another ``quantity``, and
    ``cells`` that are not a non-empty sequence of :class:`~k3layout.sweep.SweepCell`."""
    expect("quantity", quantity, str)
    if quantity not in QUANTITIES:
        raise Refusal(
            "invalid_argument",
            f"quantity={describe(quantity)} is not one of {', '.join(QUANTITIES)}",
            facts={"quantity": quantity},
            hint="use quantity='padding' or 'bytes_per_token'",
        )
    if not expect_sequence("cells", cells, SweepCell):
        raise Refusal(
            "invalid_argument",
            "cells is empty: draw_sweep takes the non-empty result of k3layout.sweep.sweep(...)",
            facts={"num_cells": 0},
            hint="sweep at least one attention TP, dtype and engine",
        )
    rows: tuple[tuple[str, str], ...] = tuple(
        dict.fromkeys((cell.engine, cell.kv_dtype) for cell in cells)
    )
    tps = tuple(sorted({cell.attn_tp for cell in cells}))
    by_key = _by_key(cells)
    values: list[tuple[float, ...]] = []
    for engine, dtype in rows:
        row: list[float] = []
        for tp in tps:
            cell = by_key.get((engine, dtype, tp))
            value = None if cell is None else getattr(cell, quantity)
            row.append(math.nan if value is None else float(value))
        values.append(tuple(row))
    return rows, tps, tuple(values)


def _by_key(cells: Sequence[SweepCell]) -> dict[tuple[str, str, int], SweepCell]:
    return {(cell.engine, cell.kv_dtype, cell.attn_tp): cell for cell in cells}


def _text(cell: SweepCell | None, value: float, quantity: SweepQuantity) -> str:
    if cell is None:
        return ""
    if cell.refusal is not None:
        return cell.refusal.replace("_", "\n", 1)
    return f"{value:.3f}" if quantity == "padding" else f"{value:,.0f}"


def draw_sweep(
    cells: Sequence[SweepCell], *, quantity: SweepQuantity = "padding", title: str | None = None
) -> Figure:
    """A heatmap of ``quantity`` over (engine, dtype) rows and attention TP columns, refused
    points grey with their code."""
    expect("title", title, (str, type(None)))
    rows, tps, values = sweep_grid(cells, quantity)
    by_key = _by_key(cells)
    figure = new_figure(max(6.0, 2.4 + 0.62 * len(tps)), 1.6 + 0.5 * len(rows))
    ax = figure.add_subplot()
    cmap = colormaps["viridis_r" if quantity == "padding" else "magma_r"].with_extremes(
        bad=_REFUSED
    )
    image = ax.imshow(ma.masked_invalid(values), cmap=cmap, aspect="auto", gid="heatmap")
    finite = [v for row in values for v in row if not math.isnan(v)]
    middle = (min(finite) + max(finite)) / 2 if finite else 0.0
    for r, (engine, dtype) in enumerate(rows):
        for c, tp in enumerate(tps):
            cell = by_key.get((engine, dtype, tp))
            value = values[r][c]
            dark = not math.isnan(value) and value > middle
            ax.text(
                c,
                r,
                _text(cell, value, quantity),
                ha="center",
                va="center",
                fontsize=5.5 if cell is not None and cell.refusal else 6.5,
                color="white" if dark else "black",
                gid=f"cell.{engine}.{dtype}.{tp}",
            )
    ax.set_xticks(range(len(tps)), [str(tp) for tp in tps], fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{e} {d}" for e, d in rows], fontsize=7)
    ax.set_xlabel("attention TP", fontsize=8)
    label = "padding fraction" if quantity == "padding" else "bytes per token per rank"
    ax.set_title(title or f"{label} against attention TP and cache dtype", fontsize=9)
    figure.colorbar(image, ax=ax, shrink=0.9, label=label)
    return figure
