"""Sweeps over the whole configuration space: a plan whose invariants hold, or a refusal."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import (
    Deployment,
    HybridModel,
    ParentPlan,
    Refusal,
    VllmPlan,
    load_plan,
    plan,
    preset,
)
from k3layout.engines.vllm.rules import KV_CACHE_LAYOUTS
from k3layout.layouts.report import REPORT_ADAPTER, report
from k3layout.layouts.seams import rules_for
from k3layout.testing import (
    deployments,
    hybrid_models,
    plan_invariant_violations,
    plannable_inputs,
    refused_inputs,
)

K3_HEADS = 96
ALL_TPS = st.integers(1, 128)  # every TP dividing 96 and many that do not
# tokenspeed main (the default revision) pins 12 MLA pages per plane: where the heads divide the
# TP it refuses K3 where a KDA state is wider than the 12 pages or the state pages break the
# plane's alignment (layout_unsupported), and pads one state page per 12 MLA pages past the
# limit where no draft lifts it (padding_limit, fp8 TP 12 and bf16 TP 6)
TOKENSPEED_MAIN_REFUSES = {
    **{("fp8", tp): "layout_unsupported" for tp in (1, 2, 3, 4, 6, 96)},
    **{("bf16", tp): "layout_unsupported" for tp in (1, 2, 3, 48, 96)},
    ("fp8", 12): "padding_limit",
    ("bf16", 6): "padding_limit",
}


@settings(max_examples=300)
@given(
    model=st.sampled_from(("kimi-k3", "kimi-k3-dspark")).map(preset),
    engine=st.sampled_from(("vllm", "tokenspeed")),
    attn_tp=ALL_TPS,
    kv_dtype=st.sampled_from(("fp8", "bf16")),
    spec_tokens=st.integers(0, 7),
)
def test_k3_plans_or_refuses_with_a_code_for_every_tp_dtype_and_spec_depth(
    model: HybridModel, engine: str, attn_tp: int, kv_dtype: str, spec_tokens: int
) -> None:
    deployment = Deployment.model_validate(
        {"engine": engine, "attn_tp": attn_tp, "kv_dtype": kv_dtype, "spec_tokens": spec_tokens}
    )
    # the DSpark draft's 64 query heads must divide the attention TP too, where it is built
    built = rules_for(engine).built_model(model, deployment)
    heads = math.gcd(K3_HEADS, *(layer.num_heads for layer in built.draft_layers))
    refuses = TOKENSPEED_MAIN_REFUSES.get((kv_dtype, attn_tp)) if engine == "tokenspeed" else None
    try:
        result = plan(model, deployment)
    except Refusal as refusal:
        if heads % attn_tp == 0:
            assert refusal.code == refuses, refusal
            return
        assert refusal.code == "heads_not_divisible"
        return
    assert heads % attn_tp == 0, "an attention TP that does not divide the heads planned"
    assert refuses is None, f"tokenspeed main planned what it refuses ({refuses})"
    assert plan_invariant_violations(result) == []


@given(plannable_inputs(layouts=KV_CACHE_LAYOUTS))
def test_every_plannable_input_gives_a_consistent_plan(
    inputs: tuple[HybridModel, Deployment],
) -> None:
    # every input drawn plans (tokenspeed's packings included): a refusal fails the test
    model, deployment = inputs
    assert plan_invariant_violations(plan(model, deployment)) == []


@given(plannable_inputs(layouts=KV_CACHE_LAYOUTS))
def test_plans_round_trip_through_json_and_are_deterministic(
    inputs: tuple[HybridModel, Deployment],
) -> None:
    model, deployment = inputs
    first = plan(model, deployment)
    again = plan(model, deployment)
    assert again == first and hash(again) == hash(first)
    assert load_plan(first.model_dump_json()) == first
    data = report(first)
    assert REPORT_ADAPTER.validate_json(data.model_dump_json()) == data


@given(refused_inputs())
def test_near_misses_are_refused_with_their_code(
    inputs: tuple[HybridModel, Deployment, str],
) -> None:
    model, deployment, code = inputs
    with pytest.raises(Refusal) as refused:
        plan(model, deployment)
    assert refused.value.code == code
    assert refused.value.facts


@given(
    model=hybrid_models(),
    data=st.data(),
)
def test_no_input_escapes_as_anything_but_a_refusal(
    model: HybridModel, data: st.DataObject
) -> None:
    deployment = data.draw(deployments(model, plannable=False))
    try:
        result = plan(model, deployment)
    except Refusal:
        return
    assert plan_invariant_violations(result) == []


@given(plannable_inputs(engine="tokenspeed"), st.integers(1, 2_000_000), st.integers(1, 8))
def test_parent_capacity_inverts_parents_for(
    inputs: tuple[HybridModel, Deployment], tokens: int, max_live: int
) -> None:
    model, deployment = inputs
    result = plan(model, deployment)
    assert isinstance(result, ParentPlan)
    needed = result.parents_for(tokens, max_live)
    capacity = result.token_capacity(needed, max_live)
    assert capacity >= tokens
    assert (
        result.parents_for(capacity, max_live)
        <= needed
        < result.parents_for(capacity + 1, max_live)
    )


@given(plannable_inputs(engine="vllm"), st.integers(0, 1 << 40))
def test_vllm_blocks_fill_but_never_exceed_the_budget(
    inputs: tuple[HybridModel, Deployment], budget: int
) -> None:
    model, deployment = inputs
    result = plan(model, deployment)
    assert isinstance(result, VllmPlan)
    for stage in result.stages:
        blocks = result.num_blocks(budget, stage.index)
        cost = result.stage_block_bytes(stage.index)
        assert blocks * cost <= budget < (blocks + 1) * cost
