"""The sweep heatmap shows every swept point: its value, or grey with its refusal code."""

from __future__ import annotations

import math

import pytest

from k3layout import HybridModel, Refusal
from k3layout.sweep import sweep

pytest.importorskip("matplotlib")

from figures import image_mask, image_values, texts

from k3layout.draw import draw_sweep, sweep_grid

TPS = (1, 5, 8, 32)


def test_each_cell_holds_its_points_value_and_a_refused_point_is_masked(k3: HybridModel) -> None:
    cells = sweep(k3, TPS)
    figure = draw_sweep(cells)
    drawn = image_values(figure, "heatmap")
    blank = image_mask(figure, "heatmap")
    rows, tps, _ = sweep_grid(cells)
    assert tps == TPS
    assert rows == (
        ("vllm", "fp8"),
        ("vllm", "bf16"),
        ("tokenspeed", "fp8"),
        ("tokenspeed", "bf16"),
        ("sglang", "fp8"),
        ("sglang", "bf16"),
    )
    for cell in cells:
        r, c = rows.index((cell.engine, cell.kv_dtype)), tps.index(cell.attn_tp)
        if cell.refusal is None:
            assert drawn[r][c] == pytest.approx(cell.padding)
        assert blank[r][c] == (cell.refusal is not None)


def test_refused_points_print_their_code_and_planned_points_their_padding(
    k3: HybridModel,
) -> None:
    labels = texts(draw_sweep(sweep(k3, TPS)), "cell")
    # 96 heads do not split over 5 ranks, on either engine and dtype.
    assert labels["vllm.fp8.5"] == labels["tokenspeed.bf16.5"] == "heads\nnot_divisible"
    # attention TP 1: one KDA state is wider than the 12 MLA pages tokenspeed main pins per plane.
    assert labels["tokenspeed.fp8.1"] == labels["tokenspeed.bf16.1"] == "layout\nunsupported"
    # bf16 at attention TP 32: main packs 12 MLA pages with 8 state pages, padding 0.134.
    assert labels["tokenspeed.bf16.32"] == "0.134"


def test_bytes_per_token_is_drawn_when_asked(k3: HybridModel) -> None:
    cells = sweep(k3, (8,), ("fp8",), ("tokenspeed",))
    labels = texts(draw_sweep(cells, quantity="bytes_per_token"), "cell")
    # A parent of 24 planes of 12 fp8 pages holds 12 x 128 tokens: 24 x 12 x 73,728 / 1,536.
    assert labels["tokenspeed.fp8.8"] == f"{24 * 12 * 73_728 / (12 * 128):,.0f}"
    assert cells[0].bytes_per_token == 24 * 12 * 73_728 / (12 * 128)


def test_an_empty_sweep_or_an_unknown_quantity_is_refused(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as caught:
        draw_sweep(())
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts == {"num_cells": 0}
    with pytest.raises(Refusal) as caught:
        draw_sweep(sweep(k3, (8,)), quantity="utilization")  # type: ignore[arg-type]
    assert caught.value.facts == {"quantity": "utilization"}
    assert math.isnan(sweep_grid(sweep(k3, (5,)))[2][0][0])
