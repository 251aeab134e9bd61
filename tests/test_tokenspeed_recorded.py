"""The ``parent`` engine against tokenspeed's own Kimi-K3 recipe at #1152's head (a6ee91b3).

tokenspeed cannot be installed here; its recipe was run on CPU and its answers recorded in
``tests/fixtures/tokenspeed-1152/`` (``tests/tools/record_tokenspeed.py``, the revision in each
file). These tests hold the planner to them where they already agree and where this release
changed the planner to agree: packing, planes, parent bytes, padding, utilization, the PR's
own rule, the state size (no speculative conv rows), and capacity with and without overlap
scheduling. What still differs (arena addresses, the draft's cache dtype and heads,
the #1152 rule's refusal at TP 32 bf16, Kimi-Linear's 20 KDA layers, ``fp8_ds_mla``, which
tokenspeed does not take) is issue 19's open work.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from k3layout import Deployment, ParentPlan, Refusal, plan, preset

RECORDED = Path(__file__).parent / "fixtures" / "tokenspeed-1152"
REVISION = "a6ee91b3e612d111b0ad6361607f221419d139f7"
DTYPES = {"bfloat16": "bf16", "float8_e4m3fn": "fp8"}
"""tokenspeed's resolved MLA cache dtype -> the planner's (``auto`` is bf16, ``mxfp8`` fp8)."""

STILL_DIFFERENT = {(32, "bf16")}
"""(attention TP, dtype) cells where tokenspeed's #1152 rule refuses (padding 0.512) and the
planner's packing search plans 3/2: issue 19 makes the engine follow the recipe."""


@cache
def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / name).read_text())
    assert data["source"]["commit"] == REVISION
    return data


def cells() -> list[dict[str, Any]]:
    return [c for c in recorded("sweep-kimi-k3.json")["cells"] if c.get("resolved_kv_cache_dtype")]


def planned(attn_tp: int, attn_dp: int, dtype: str, spec_tokens: int = 0) -> ParentPlan | Refusal:
    try:
        result = plan(
            preset("kimi-k3"),
            Deployment(
                engine="parent",
                attn_tp=attn_tp,
                attn_dp=attn_dp,
                kv_dtype=dtype,
                spec_tokens=spec_tokens,
            ),
        )
    except Refusal as refusal:
        return refusal
    assert isinstance(result, ParentPlan)
    return result


def ids(cell: dict[str, Any]) -> str:
    return f"tp{cell['attn_tp']}-dp{cell['attn_dp']}-{cell['kv_cache_dtype']}"


@pytest.mark.parametrize("cell", cells(), ids=ids)
def test_every_recorded_k3_cell_packs_as_tokenspeeds_recipe_packs_it(cell: dict[str, Any]) -> None:
    dtype = DTYPES[cell["resolved_kv_cache_dtype"]]
    result = planned(cell["attn_tp"], cell["attn_dp"], dtype)
    if (cell["attn_tp"], dtype) in STILL_DIFFERENT:
        pytest.skip("issue 19: the engine is to follow #1152's rule here (tokenspeed refuses)")
    if cell["status"] != "ok":
        assert isinstance(result, Refusal), (ids(cell), cell["error"])
        return
    assert isinstance(result, ParentPlan), (ids(cell), result)
    packing = cell["packing"]
    assert (result.packing.mla_pages, result.packing.state_pages) == (
        packing["full_attention"],
        packing["linear_attention_0"],
    )
    assert result.parent_bytes == cell["parent_bytes"]
    assert result.num_planes == cell["num_planes"]
    assert result.mla_page_bytes == cell["sizes"]["mla_page_bytes"]
    assert result.sizes.state_bytes == cell["sizes"]["kda_state_bytes_per_layer"]
    for group, recorded_padding in cell["padding"].items():
        assert result.padding_fraction[group] == pytest.approx(
            recorded_padding["padding_fraction"], abs=1e-12
        )
        assert result.utilization[group] == pytest.approx(cell["utilization"][group], abs=1e-12)
    rule = cell["rule_1152"]
    assert result.rule_1152 is not None
    assert (result.rule_1152.mla_pages, result.rule_1152.state_pages) == (
        rule["mla_packing"],
        rule["linear_packing"],
    )


def test_tokenspeeds_conv_state_keeps_k_minus_1_rows_whatever_the_speculative_depth() -> None:
    cell = next(c for c in cells() if (c["attn_tp"], c["kv_cache_dtype"]) == (8, "fp8"))
    assert cell["sizes"]["conv_rows"] == 3
    for spec_tokens in (0, 2, 7):
        result = planned(8, 1, "fp8", spec_tokens)
        assert isinstance(result, ParentPlan)
        assert result.sizes.state_bytes == cell["sizes"]["kda_state_bytes_per_layer"] == 814_080


def capacity_cells() -> list[dict[str, Any]]:
    return [c for c in recorded("capacity.json")["cells"] if c["model"] == "kimi-k3"]


def capacity_ids(cell: dict[str, Any]) -> str:
    return f"tp{cell['attn_tp']}-{cell['kv_cache_dtype']}"


def plan_of(cell: dict[str, Any]) -> ParentPlan:
    """The planner's plan of a recorded capacity cell."""
    result = planned(cell["attn_tp"], 1, DTYPES.get(cell["kv_cache_dtype"], cell["kv_cache_dtype"]))
    assert isinstance(result, ParentPlan), result
    return result


@pytest.mark.parametrize("cell", capacity_cells(), ids=capacity_ids)
def test_capacity_with_and_without_overlap_scheduling_is_tokenspeeds(
    cell: dict[str, Any],
) -> None:
    result = plan_of(cell)
    for probe in cell["probes"]:
        live, protected = probe["max_live"], probe["protected_pages"]
        for tokens, parents in probe["parents_needed"].items():
            assert result.parents_for(int(tokens), live, protected) == parents, (probe, tokens)
        for parents, tokens in probe["token_capacity"].items():
            if isinstance(tokens, dict):  # tokenspeed refuses: not one token fits
                with pytest.raises(Refusal) as caught:
                    result.token_capacity(int(parents), live, protected)
                assert caught.value.code == "budget_too_small"
            else:
                assert result.token_capacity(int(parents), live, protected) == tokens, (
                    probe,
                    parents,
                )


def test_the_issues_overlap_probe_needs_108_parents_as_tokenspeed_does() -> None:
    result = planned(1, 1, "fp8")
    assert isinstance(result, ParentPlan)
    # 16 live requests, depth 1: 16 protected MLA pages, none in the state groups
    pages = 131_072 // 128 + 16 - 1 + 16
    assert result.parents_for(131_072, 16, 16) == -(-pages // 89) + 3 * 2 * 16 == 108


@pytest.mark.parametrize("cell", capacity_cells(), ids=capacity_ids)
def test_a_memory_budget_buys_the_parents_and_tokens_tokenspeeds_setup_gives(
    cell: dict[str, Any],
) -> None:
    result = plan_of(cell)
    for budget in cell["budgets"]:
        ask = (budget["budget_bytes"], budget["max_bs"])
        if "refused" in budget:
            with pytest.raises(Refusal) as caught:
                result.capacity(*ask, max_total_tokens=budget["max_total_tokens"])
            assert caught.value.code == "budget_too_small", budget
            continue
        got = result.capacity(*ask, max_total_tokens=budget["max_total_tokens"])
        assert (got.num_parents, got.arena_bytes, got.token_capacity, got.page_counts) == (
            budget["num_lcm_blocks"],
            budget["arena_bytes"],
            budget["token_capacity"],
            budget["page_counts"],
        ), budget


def test_the_capacity_of_a_budget_refuses_what_it_does_not_model() -> None:
    result = planned(8, 1, "fp8", spec_tokens=2)
    assert isinstance(result, ParentPlan)
    with pytest.raises(Refusal) as caught:
        result.capacity(100 << 30)
    assert (caught.value.code, caught.value.facts["field"]) == ("engine_setting", "spec_tokens")
    plain = planned(8, 1, "fp8")
    assert isinstance(plain, ParentPlan)
    with pytest.raises(Refusal):
        plain.capacity(100 << 30, max_live=0)
