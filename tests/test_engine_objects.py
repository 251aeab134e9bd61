"""Building an engine's own objects from a plan (vLLM's ``KVCacheConfig`` and specs, SGLang's
pool arguments) without the engine: ``import k3layout`` and the engine packages import
neither engine; a call refuses (``version_unsupported``) where the engine is missing or runs
another release than the plan's, before building anything, and refuses bad arguments and the
plans whose objects are not built (``engine_setting``) without importing the engine. What they
build is checked against the engines' own in ``tests/conformance``
(``test_conformance_kv_config.py``, ``test_conformance_sglang_pool_args.py``)."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from k3layout import Deployment, Refusal, plan, preset
from k3layout.engines.sglang import SGLANG_VERSION, SglangPlan, pool_arguments
from k3layout.engines.vllm import VllmPlan, kv_cache_config, kv_cache_specs

Build = Callable[[Any], object]


def vllm_plan(**fields: Any) -> VllmPlan:
    result = plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2, **fields))
    assert isinstance(result, VllmPlan)
    return result


def sglang_plan(model: str = "kimi-k3") -> SglangPlan:
    result = plan(preset(model), Deployment(engine="sglang", attn_tp=8))
    assert isinstance(result, SglangPlan)
    return result


BUILDS: dict[str, tuple[str, Callable[[], Any], Build]] = {
    "kv_cache_config": ("vllm", vllm_plan, lambda p: kv_cache_config(p, 100)),
    "kv_cache_specs": ("vllm", vllm_plan, kv_cache_specs),
    "pool_arguments": ("sglang", sglang_plan, lambda p: pool_arguments(p, 64, 11, 2)),
}


def refusal(build: Build, result: object) -> Refusal:
    with pytest.raises(Refusal) as refused:
        build(result)
    return refused.value


def test_the_engine_packages_import_neither_engine() -> None:
    code = (
        "import sys, k3layout\n"
        "from k3layout.engines.vllm import kv_cache_config, kv_cache_specs\n"
        "from k3layout.engines.sglang import pool_arguments\n"
        "print(sorted({'vllm', 'sglang', 'torch'} & set(sys.modules)))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("name", BUILDS)
def test_a_missing_engine_is_refused_naming_the_release_to_install(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, make, build = BUILDS[name]
    monkeypatch.setitem(sys.modules, engine, None)  # import fails: not installed
    result = make()
    refused = refusal(build, result)
    assert refused.code == "version_unsupported"
    planned = result.deployment.version_run
    assert refused.facts == {
        "engine": engine,
        "field": "engine_version",
        "engine_version": planned,
        "installed": None,
    }
    assert f"install {engine}=={planned}" in (refused.hint or "")


@pytest.mark.parametrize("name", BUILDS)
@pytest.mark.parametrize("installed", ["0.0.1", None])
def test_another_release_of_the_engine_is_refused(
    name: str, installed: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, make, build = BUILDS[name]
    fake = types.ModuleType(engine)
    if installed is not None:
        fake.__version__ = installed  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, engine, fake)
    result = make()
    refused = refusal(build, result)
    assert refused.code == "version_unsupported"
    assert refused.facts["installed"] == (installed or "unknown")
    assert refused.facts["engine_version"] == result.deployment.version_run
    # a release k3layout does not follow: install one it does, or the plan's
    assert "a release k3layout follows" in (refused.hint or "")


def test_a_followed_release_other_than_the_plans_is_named_to_plan_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.34.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    refused = refusal(lambda p: kv_cache_config(p, 100), vllm_plan(engine_version="0.33.0"))
    assert refused.facts["installed"] == "0.34.0"
    assert refused.facts["engine_version"] == "0.33.0"
    assert "Deployment(engine_version='0.34.0')" in (refused.hint or "")


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda p: kv_cache_config(p, 0), "num_blocks"),
        (lambda p: kv_cache_config(p, True), "num_blocks"),
        (lambda p: kv_cache_config(p, 100, stage=1), "stage"),
        (lambda p: kv_cache_specs(p, stage="0"), "stage"),  # type: ignore[arg-type]
        (lambda p: kv_cache_config(p, 100, max_model_len=0), "max_model_len"),
    ],
    ids=["no-blocks", "bool-blocks", "no-such-stage", "str-stage", "no-length"],
)
def test_bad_arguments_are_refused_before_vllm_is_imported(
    build: Build, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    refused = refusal(build, vllm_plan())
    assert refused.code == "invalid_argument"
    assert field in str(refused)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda p: pool_arguments(p, 0, 11, 2), "num_tokens"),
        (lambda p: pool_arguments(p, 64, 0, 2), "num_slots"),
        (lambda p: pool_arguments(p, 64, 11, -1), "max_running_requests"),
        (lambda p: pool_arguments(p, 64, 11, 2, stage=1), "stage"),
    ],
    ids=["no-tokens", "no-slots", "no-requests", "no-such-stage"],
)
def test_bad_pool_sizes_are_refused_before_sglang_is_imported(
    build: Build, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sglang", None)
    refused = refusal(build, sglang_plan())
    assert refused.code == "invalid_argument"
    assert field in str(refused)


@pytest.mark.parametrize("build", [BUILDS[name][2] for name in BUILDS], ids=list(BUILDS))
def test_a_plan_of_another_engine_is_refused(build: Build) -> None:
    other = plan(preset("kimi-k3"), Deployment(engine="tokenspeed", attn_tp=8))
    refused = refusal(build, other)
    assert refused.code == "invalid_argument"
    assert refused.facts["field"] == "plan"


UNBUILT: dict[str, tuple[str, Callable[[], object], str]] = {
    "atom-replayssm": (
        "vllm",
        lambda: vllm_plan(replayssm=True),
        "replayssm",
    ),
    "rocm-kda-checkpoint": (
        "vllm",
        lambda: plan(preset("kimi-k3"), Deployment(attn_tp=8, gpu="mi355x")),
        "kda_prefill_backend",
    ),
    "sglang-dsa-pool": (
        "sglang",
        lambda: plan(preset("glm-5.3-flash"), Deployment(engine="sglang", attn_tp=8)),
        "indexer",
    ),
}
"""Plans whose engine objects are not built: the engine, the plan, the field refused."""


@pytest.mark.parametrize("name", UNBUILT)
def test_a_plan_whose_objects_are_not_built_is_refused_naming_the_check_that_serves_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, make, field = UNBUILT[name]
    monkeypatch.setitem(sys.modules, engine, None)  # refused before the engine is imported
    build = BUILDS["kv_cache_config" if engine == "vllm" else "pool_arguments"][2]
    refused = refusal(build, make())
    assert refused.code == "engine_setting"
    assert (refused.facts["engine"], refused.facts["field"]) == (engine, field)
    check = "check_kv_cache_config" if engine == "vllm" else "check_pools"
    assert check in (refused.hint or "")


def test_the_sglang_release_followed_is_the_one_refused_for() -> None:
    assert sglang_plan().deployment.version_run == SGLANG_VERSION
