"""The strategies engine teams sweep with: every deployment :func:`deployments` and
:func:`plannable_inputs` draw plans, for every engine, preset and synthetic hybrid, and none is
filtered or retried (hypothesis' own observations say so); any field can be pinned to a value or
a strategy, and pins that leave nothing to draw are refused when the strategy is built, naming
the field and the values it could take."""

from __future__ import annotations

import contextlib
import doctest
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.internal import observability

from k3layout import (
    PRESETS,
    Deployment,
    HybridModel,
    Refusal,
    _deployment_space,
    _deployment_witness,
    plan,
    preset,
)
from k3layout.engines.vllm.rules import KV_CACHE_LAYOUTS
from k3layout.layouts.invariants import plan_invariant_violations
from k3layout.testing import (
    deployments,
    hybrid_models,
    plannable_inputs,
    refused_inputs,
    served_models,
)

ENGINES = ("vllm", "tokenspeed", "sglang")
EXAMPLES = 200
PRESET_EXAMPLES = 60

NOT_PLANNED = {
    # 27 layers, 7 MLA: its 20 KDA layers do not split into tokenspeed's 3 state groups
    ("tokenspeed", "kimi-linear-48b"): "layout_unsupported",
    # a pooled DSA indexer and a tail ring: tokenspeed has no recipe for that hybrid
    ("tokenspeed", "glm-5.3-flash"): "layout_unsupported",
}
"""The (engine, preset) pairs with no deployment that plans, and the planner's code for why."""


def sweep_settings(examples: int) -> settings:
    """Generation alone, no example database, and every health check on (the profile of
    conftest.py suppresses too_slow)."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=(),
    )


@contextlib.contextmanager
def observed() -> Iterator[list[Any]]:
    """Hypothesis' own record of every test case run inside (its observability callbacks,
    without the line coverage it would otherwise trace)."""
    adding = getattr(observability, "add_observability_callback", None)
    if adding is None:
        pytest.skip("this hypothesis has no observability callbacks")
    cases: list[Any] = []
    covering = observability.OBSERVABILITY_COLLECT_COVERAGE
    observability.OBSERVABILITY_COLLECT_COVERAGE = False
    adding(cases.append)
    try:
        yield cases
    finally:
        observability.remove_observability_callback(cases.append)
        observability.OBSERVABILITY_COLLECT_COVERAGE = covering


SIZE_CAP = "exceeded maximum test case size"
"""Why hypothesis itself gives up a case while it first grows its test cases (a size cap on
the choices, ten times those of the smallest case): no rule of the strategy's."""


def assert_nothing_filtered(cases: list[Any], drawn: int) -> None:
    """Every case the strategies drew ran: none gave up but on hypothesis' own size cap (no
    filter or ``assume`` failed), none retried a draw to satisfy a filter."""
    tests = [case for case in cases if case.type == "test_case"]
    assert len([case for case in tests if case.status == "passed"]) == drawn > 0
    rejected = [case.status_reason for case in tests if case.status != "passed"]
    assert [reason for reason in rejected if reason != SIZE_CAP] == []
    notes = {key for case in tests for key in case.features if "filter" in key or "Retried" in key}
    assert notes == set()


def sweep(strategy: st.SearchStrategy[Any], check: Callable[[Any], None], examples: int) -> None:
    """Run ``check`` on ``examples`` draws of ``strategy`` (observed: nothing filtered)."""
    drawn: list[Any] = []

    @sweep_settings(examples)
    @given(strategy)
    def run(value: Any) -> None:
        check(value)
        drawn.append(value)

    with observed() as cases:
        run()
    assert len(drawn) == examples
    assert_nothing_filtered(cases, len(drawn))


def planned(model: HybridModel, deployment: Deployment) -> None:
    """The deployment plans, and the plan's invariants hold."""
    assert plan_invariant_violations(plan(model, deployment)) == []


@pytest.mark.parametrize("engine", ENGINES)
def test_every_plannable_input_of_every_engine_plans_and_none_is_filtered(engine: str) -> None:
    def check(inputs: tuple[HybridModel, Deployment]) -> None:
        model, deployment = inputs
        assert deployment.engine == engine
        planned(model, deployment)

    sweep(plannable_inputs(engine, layouts=KV_CACHE_LAYOUTS), check, EXAMPLES)


@pytest.mark.parametrize(("engine", "name"), [(e, n) for e in ENGINES for n in PRESETS])
def test_every_deployment_drawn_for_a_preset_plans(engine: str, name: str) -> None:
    model = preset(name)
    if (engine, name) in NOT_PLANNED:
        # what the planner says of the engine's own start, the strategy says when it is built
        with pytest.raises(Refusal) as start:
            plan(model, Deployment(engine=engine))
        assert start.value.code == NOT_PLANNED[engine, name]
        with pytest.raises(Refusal) as caught:
            deployments(model, engine, layouts=KV_CACHE_LAYOUTS)
        assert caught.value.code == "invalid_argument"
        assert caught.value.facts["field"] == "engine"
        assert caught.value.facts["refusal"] == NOT_PLANNED[engine, name]
        assert engine not in caught.value.facts["allowed"]  # type: ignore[operator]
        return

    def check(deployment: Deployment) -> None:
        assert deployment.engine == engine
        planned(model, deployment)

    sweep(deployments(model, engine, layouts=KV_CACHE_LAYOUTS), check, PRESET_EXAMPLES)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_deployment_of_a_synthetic_hybrid_plans_or_the_strategy_is_refused(
    engine: str,
) -> None:
    drawn: list[Deployment] = []
    module = _deployment_space.engine_module(engine)
    assert module is not None
    shapes = module.model_shapes(KV_CACHE_LAYOUTS)  # the models the engine's recipe groups

    @sweep_settings(40)
    @given(st.one_of(*(hybrid_models(**shape) for shape in shapes)), st.data())
    def run(model: HybridModel, data: st.DataObject) -> None:
        try:
            strategy = deployments(model, engine, layouts=KV_CACHE_LAYOUTS)
        except Refusal as refusal:  # no deployment of it plans: said when built
            assert refusal.code == "invalid_argument"
            assert refusal.facts["field"] == "engine"
            assert refusal.facts["refusal"]
            return
        for _ in range(3):
            deployment = data.draw(strategy)
            planned(model, deployment)
            drawn.append(deployment)

    with observed() as cases:
        run()
    assert_nothing_filtered(cases, 40)
    assert drawn


@pytest.mark.parametrize("engine", ENGINES)
def test_served_models_have_a_deployment_that_plans(engine: str) -> None:
    def check(model: HybridModel) -> None:
        assert _deployment_witness.find_witness(model, engine, {}, ("LBNHC",)) is not None
        # LBNHC alone: no model with pooled indexers (laid out block by block)
        assert model.indexer is None

    sweep(served_models(engine), check, 60)


def test_the_observations_catch_a_filtered_strategy() -> None:
    # the check above can fail: a strategy that filters a third of its draws away passes
    # hypothesis' health checks, and its retried draws are caught
    with pytest.raises(AssertionError):
        sweep(st.integers(0, 1000).filter(lambda n: n % 3 != 0), lambda n: None, 40)


def test_the_near_misses_are_drawn_without_a_filter() -> None:
    def check(inputs: tuple[HybridModel, Deployment, str]) -> None:
        model, deployment, code = inputs
        with pytest.raises(Refusal) as caught:
            plan(model, deployment)
        assert caught.value.code == code

    sweep(refused_inputs(), check, 100)


# -- pins ----------------------------------------------------------------------------------------


def test_pinned_values_hold_in_every_draw_and_the_rest_is_drawn() -> None:
    model = preset("kimi-k3-dspark")
    seen: set[tuple[object, ...]] = set()

    def check(deployment: Deployment) -> None:
        assert (deployment.engine, deployment.attn_tp, deployment.kv_dtype) == ("vllm", 8, "bf16")
        planned(model, deployment)
        seen.add((deployment.spec_tokens, deployment.gpu, deployment.pp))

    sweep(deployments(model, "vllm", attn_tp=8, kv_dtype="bf16"), check, 60)
    assert len(seen) > 10  # the fields not pinned vary


def test_a_pinned_strategy_is_drawn_from() -> None:
    model = preset("kimi-k3")
    strategy = deployments(model, "vllm", attn_tp=st.sampled_from([4, 8]), spec_tokens=2)
    tps: set[int] = set()

    def check(deployment: Deployment) -> None:
        assert deployment.attn_tp in (4, 8) and deployment.spec_tokens == 2
        planned(model, deployment)
        tps.add(deployment.attn_tp)

    sweep(strategy, check, 40)
    assert tps == {4, 8}


def test_an_engine_strategy_draws_among_the_engines_that_plan_the_model() -> None:
    model = preset("kimi-linear-48b")  # tokenspeed plans none of it

    def check(deployment: Deployment) -> None:
        assert deployment.engine in ("vllm", "sglang")
        planned(model, deployment)

    sweep(deployments(model), check, 40)
    sweep(deployments(model, st.sampled_from(["vllm", "sglang"])), check, 20)


DIVISORS_OF_96 = tuple(d for d in range(1, 97) if 96 % d == 0)

REFUSED_PINS = [
    # (model, engine, pins, field, allowed, the planner's code for the start)
    # K3's 96 KDA heads: the TPs that divide them
    ("kimi-k3", "vllm", {"attn_tp": 5}, "attn_tp", DIVISORS_OF_96, "heads_not_divisible"),
    # vLLM's dense MLA backends take no FlashMLA packed row
    ("kimi-k3", "vllm", {"kv_dtype": "fp8_ds_mla"}, "kv_dtype", ("fp8", "bf16"),
     "dtype_unsupported"),
    # tokenspeed has no pipeline stages
    ("kimi-k3", "tokenspeed", {"pp": 2}, "pp", (1,), "engine_setting"),
    # a vLLM setting SGLang does not take: its unset value alone
    ("kimi-k3", "sglang", {"attention_backend": "FLASHMLA"}, "attention_backend", ("None",),
     "engine_setting"),
    # SGLang builds no MLA draft: speculative tokens with K3's DSpark draft are refused
    ("kimi-k3-dspark", "sglang", {"spec_tokens": 2}, "spec_tokens", (0,), "draft_unsupported"),
    # pp_partition gives two stages: pp=3 cannot hold it
    ("kimi-k3", "vllm", {"pp_partition": (46, 47), "pp": 3}, "pp", (2,), "invalid_argument"),
]


@pytest.mark.parametrize("case", REFUSED_PINS, ids=[f"{c[1]}-{c[3]}" for c in REFUSED_PINS])
def test_pins_that_leave_nothing_to_draw_are_refused_naming_the_field_and_its_values(
    case: tuple[str, str, dict[str, Any], str, tuple[object, ...], str],
) -> None:
    name, engine, pins, field, allowed, code = case
    with pytest.raises(Refusal) as caught:
        deployments(preset(name), engine, **pins)
    refusal = caught.value
    assert refusal.code == "invalid_argument"
    assert refusal.facts["field"] == field
    assert refusal.facts["value"] == pins[field]
    assert refusal.facts["allowed"] == allowed
    assert refusal.facts["refusal"] == code
    assert (refusal.facts["engine"], refusal.facts["model"]) == (engine, name)
    assert refusal.hint and "leave it to be drawn" in refusal.hint


def test_the_pin_refused_is_the_first_the_others_leave_values_for() -> None:
    # tokenspeed main pins 12 MLA pages of 73,728 B per plane (884,736 B); at TP 12 one K3
    # state of 6,512,640 / 12 = 542,720 B rides each plane, so a state group of 23 pads
    # (24 x 884,736 - 23 x 542,720) / (23 x 542,720) = 0.70 past the 0.25 limit. With the
    # release, dtype and TP pinned, the pin to change is the padding limit, which could be 1.
    padding = (24 * 884_736 - 23 * 542_720) / (23 * 542_720)
    pins: dict[str, Any] = {
        "engine_version": "main",
        "kv_dtype": "fp8",
        "attn_tp": 12,
        "max_padding": None,
    }
    model = preset("kimi-k3")
    with pytest.raises(Refusal) as caught:
        deployments(model, "tokenspeed", **pins)
    assert caught.value.facts["field"] == "max_padding"
    assert caught.value.facts["refusal"] == "padding_limit"
    assert caught.value.facts["allowed"] == (str(4 * 0.25),)  # the drawn limits above 0.70
    unpinned = {k: v for k, v in pins.items() if k != "max_padding"}

    def check(deployment: Deployment) -> None:
        assert deployment.max_padding is not None and deployment.max_padding > padding
        planned(model, deployment)

    sweep(deployments(model, "tokenspeed", **unpinned), check, 20)


def test_a_pinned_sampled_from_is_checked_value_by_value_when_built() -> None:
    with pytest.raises(Refusal) as caught:
        deployments(preset("kimi-k3"), "vllm", attn_tp=st.sampled_from([8, 5]))
    assert (caught.value.facts["field"], caught.value.facts["value"]) == ("attn_tp", 5)


def test_a_value_another_pinned_strategy_draws_is_refused_when_drawn() -> None:
    strategy = deployments(preset("kimi-k3"), "vllm", attn_tp=st.integers(5, 5))

    @sweep_settings(5)
    @given(strategy)
    def run(deployment: Deployment) -> None:
        raise AssertionError("drew a deployment with attn_tp=5")  # pragma: no cover

    with pytest.raises(Refusal) as caught:
        run()
    assert caught.value.facts["field"] == "attn_tp"


def test_a_field_deployment_does_not_have_is_refused() -> None:
    with pytest.raises(Refusal) as caught:
        deployments(preset("kimi-k3"), "vllm", atn_tp=8)
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts["field"] == "atn_tp"
    assert "attn_tp" in caught.value.facts["allowed"]  # type: ignore[operator]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"model": "kimi-k3"}, "model"),
        ({"engine": 3}, "engine"),
        ({"engine": "trtllm"}, "engine"),
        ({"plannable": 1}, "plannable"),
        ({"layouts": ["LBNHC"]}, "layouts"),
        ({"layouts": ("NHD",)}, "layouts"),
        ({"kv_memory_bytes": [[1]]}, "kv_memory_bytes"),
    ],
)
def test_bad_arguments_are_refused_when_the_strategy_is_built(
    arguments: dict[str, Any], field: str
) -> None:
    call: dict[str, Any] = {"model": preset("kimi-k3"), "engine": "vllm", **arguments}
    with pytest.raises(Refusal) as caught:
        deployments(**call)
    assert caught.value.code == "invalid_argument"
    assert field in {caught.value.facts.get("field"), *caught.value.facts}


# -- what the strategies draw from ---------------------------------------------------------------


def test_the_release_dtype_and_tp_drawn_are_exactly_those_that_plan() -> None:
    """For K3 on tokenspeed, the first joint step offers exactly the (release, dtype, TP)
    combinations the planner takes, every TP from 1 to 96 tried: ``main``'s fixed 12 MLA pages
    of 73,728 B (884,736 B) hold no TP 1 fp8 state of 6,512,640 B, #1152's search does."""
    model = preset("kimi-k3")
    engine = "tokenspeed"
    pins = {"max_padding": None}
    domains = _deployment_space.space(model, engine, ("LBNHC",), pins)
    start = _deployment_witness.find_witness(model, engine, pins, ("LBNHC",))
    assert start is not None
    names = ("engine_version", "kv_dtype", "attn_tp")
    offered = set(_deployment_space.step_choices(model, domains, start, names))

    def plans(version: str | None, dtype: str, tp: int) -> bool:
        fields = {**start, "engine_version": version, "kv_dtype": dtype, "attn_tp": tp}
        return _deployment_space.refusal_of(model, fields) is None

    expected = {
        (version, dtype, tp)
        for version in (None, "pr1152", "main")
        for dtype in ("fp8", "bf16")
        for tp in range(1, 97)
        if plans(version, dtype, tp)
    }
    assert offered == expected
    assert ("pr1152", "fp8", 1) in offered and ("main", "fp8", 1) not in offered
    assert 12 * 128 * 576 < 6_512_640  # main's plane of 12 fp8 pages, K3's TP 1 state


def test_drawn_tps_divide_the_heads_and_dcp_divides_the_tp() -> None:
    model = preset("kimi-k3-dspark")

    def check(deployment: Deployment) -> None:
        built = deployment.spec_tokens > 0  # the draft's 64 heads count where it is built
        heads = math.gcd(96, 64) if built else 96
        assert heads % deployment.attn_tp == 0
        assert deployment.attn_tp % deployment.dcp == 0

    sweep(deployments(model, "vllm"), check, 40)


def test_the_refusals_doctest_holds() -> None:
    failures, attempted = doctest.testmod(_deployment_witness)
    assert (failures, attempted > 0) == (0, True)


def test_every_field_an_engine_draws_has_a_step() -> None:
    stepped = {name for step in _deployment_space.DRAW_ORDER for name in step}
    for engine in ENGINES:
        for name in PRESETS:
            domains = _deployment_space.space(preset(name), engine, KV_CACHE_LAYOUTS)
            assert set(domains) <= stepped, engine
            assert set(domains) <= set(Deployment.model_fields)
