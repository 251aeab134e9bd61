"""``pool_arguments`` against SGLang 0.5.23's own pools: for a launch, the arguments SGLang's
``KVCacheConfigurator`` passes to ``HybridReqToTokenPool``, ``MambaPool``,
``HybridLinearKVPool`` and ``MLATokenToKVPool`` on every pipeline stage (recorded as each
constructor is called, the pools built on ``meta`` at the sizes SGLang resolved for the
budget) are the ones built from the plan of the same model and flags, at the sizes the
plan's capacity gives: every argument the plan decides, by SGLang's own equality (its
``KimiLinearCacheParams``, ``torch`` dtypes, lists). A plan of other flags gives other
arguments, and a plan of another release is refused."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
from sglang_engine import require_sglang

require_sglang()

from sglang_engine import GIB, MODEL_FILES, _sgl, sglang_allocate, sglang_case  # noqa: E402

_sgl()  # SGLang imported once, with the stand-ins it needs on CPU

from sglang.srt.mem_cache import memory_pool  # noqa: E402
from test_conformance_sglang import Case  # noqa: E402

from k3layout import Deployment, Refusal, plan  # noqa: E402
from k3layout.engines.sglang import SglangPlan, pool_arguments  # noqa: E402

POOLS = ("HybridReqToTokenPool", "MambaPool", "HybridLinearKVPool", "MLATokenToKVPool")
"""The pools SGLang builds for Kimi-K3 and Kimi-Linear on a rank, whose arguments are read."""

CASES = [
    *(
        Case(model, tp, dtype)
        for model in ("kimi-k3", "kimi-linear")
        for tp in (1, 4, 8)
        for dtype in ("fp8", "bf16")
    ),
    Case(pp=2),
    Case("kimi-linear", 4, pp=2),
    Case(dspark=True),
    Case(tp=4, dspark=True, kv_dtype="bf16"),
    Case("kimi-linear", 8, eagle=3),
    Case(eagle=2, gpu="b200"),
    Case(gpu="b200"),
    Case(dcp=8, gpu="b200"),
    Case(dp=8),
    Case(disable_radix_cache=True),
    Case(pp=2, disable_radix_cache=True),
    Case(max_running_requests=64, max_mamba_cache_size=200),
]


Stages = tuple[dict[str, dict[str, Any]], ...]


@functools.cache
def recorded(case: Case) -> Stages:
    """The arguments SGLang passed each pool, stage by stage, for ``case``'s budget."""
    answers: list[dict[str, Any]] = []
    stages = _recorded(
        lambda: answers.append(sglang_case(MODEL_FILES[case.model], **case.harness_kwargs()))
    )
    assert "refused" not in answers[0], answers[0]["refused"]
    return stages


def _recorded(run: Callable[[], object]) -> Stages:
    """The arguments of every pool ``run`` builds, stage by stage."""
    calls: list[tuple[str, dict[str, Any]]] = []
    with pytest.MonkeyPatch.context() as patch:
        for name in POOLS:
            cls = getattr(memory_pool, name)
            patch.setattr(cls, "__init__", _recording(cls.__init__, name, calls))
        run()
    stages: list[dict[str, dict[str, Any]]] = []
    for name, arguments in calls:  # each stage builds each pool once, stage after stage
        if not stages or name in stages[-1]:
            stages.append({})
        stages[-1][name] = arguments
    return tuple(stages)


def _recording(init: Any, name: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        assert not args, f"{name} built with positional arguments"
        calls.append((name, kwargs))
        init(self, **kwargs)

    return recording


def planned(case: Case, **changes: Any) -> SglangPlan:
    fields = {**case.deployment().model_dump(), **changes}
    result = plan(case.planner_model(), Deployment.model_validate(fields))
    assert isinstance(result, SglangPlan)
    return result


def differences(built: dict[str, dict[str, Any]], sglang: dict[str, dict[str, Any]]) -> list[str]:
    """Every argument the plan gives that SGLang passed otherwise (or not at all)."""
    assert sorted(built) == sorted(sglang), (sorted(built), sorted(sglang))
    return [
        f"{pool}.{name}: SGLang {sglang[pool].get(name, '<none>')!r}, plan {value!r}"
        for pool, arguments in built.items()
        for name, value in arguments.items()
        if name not in sglang[pool] or sglang[pool][name] != value
    ]


def sizes(case: Case) -> tuple[int, int, int]:
    """The pool sizes the plan's capacity gives for ``case``'s budget (SGLang's context)."""
    answer = sglang_case(MODEL_FILES[case.model], pools=False, **case.harness_kwargs())
    capacity = planned(case).capacity(case.budget_gib * GIB, answer["context_len"])
    return (
        capacity.max_total_num_tokens,
        capacity.max_mamba_cache_size,
        capacity.max_running_requests,
    )


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_plan_gives_the_pool_arguments_sglang_passes(case: Case) -> None:
    stages = recorded(case)
    result = planned(case)
    assert len(stages) == len(result.stages)
    for stage, sglang in enumerate(stages):
        built = pool_arguments(result, *sizes(case), stage=stage)
        assert not differences(built, sglang), differences(built, sglang)


@pytest.mark.parametrize("pp_rank", [0, 1])
def test_the_arguments_at_sizes_of_ones_own_are_sglangs(pp_rank: int) -> None:
    """At the small sizes a test allocates real CPU pools with (not the budget's)."""
    stages = _recorded(
        lambda: sglang_allocate(
            MODEL_FILES["kimi-k3"],
            tp=8,
            pp=2,
            pp_rank=pp_rank,
            max_total_num_tokens=64,
            max_running_requests=2,
            max_mamba_cache_size=11,
        )
    )
    built = pool_arguments(planned(Case(pp=2)), 64, 11, 2, stage=pp_rank)
    assert not differences(built, stages[0]), differences(built, stages[0])


OTHER_FLAGS = [
    ("attn_tp", 4),
    ("kv_dtype", "bf16"),
    ("prefix_caching", False),
    ("spec_tokens", 3),
    ("gpu", "b200"),
]


@pytest.mark.parametrize(("field", "value"), OTHER_FLAGS, ids=[f for f, _ in OTHER_FLAGS])
def test_a_plan_of_other_flags_gives_other_arguments(field: str, value: object) -> None:
    case = Case(pp=2)
    (sglang, *_) = recorded(case)
    built = pool_arguments(planned(case, **{field: value}), *sizes(case))
    assert differences(built, sglang)


def test_a_plan_of_another_release_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang  # noqa: PLC0415

    result = planned(Case())
    monkeypatch.setattr(sglang, "__version__", "0.5.22")
    with pytest.raises(Refusal) as refused:
        pool_arguments(result, 64, 11, 2)
    assert refused.value.code == "version_unsupported"
    assert refused.value.facts["installed"] == "0.5.22"
    assert refused.value.facts["engine_version"] == "0.5.23"
