"""Which engine release a plan is for: ``Deployment.engine_version``, refused outside the
releases k3layout follows (from the API, the CLI and the bridges), written into every plan."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
from test_cli import k3layout
from test_engines_vllm import vllm_config

from k3layout import Deployment, Refusal, load_plan, plan, preset
from k3layout.engines.vllm.bridge import deployment_from_vllm
from k3layout.layouts.pipeline import with_engine
from k3layout.registry import engine_names, facts_of

NEWEST = {"vllm": "0.34.0", "sglang": "0.5.23", "tokenspeed": "main"}
# tokenspeed main refuses K3 fp8 below attention TP 8 (its fixed 12:1 packing)
TP = {"vllm": 1, "sglang": 1, "tokenspeed": 8}


@pytest.mark.parametrize("engine", sorted(NEWEST))
def test_a_plan_says_the_release_it_planned_for(engine: str) -> None:
    assert facts_of(engine).versions[-1] == NEWEST[engine]
    deployment = Deployment(engine=engine, attn_tp=TP[engine])
    assert deployment.engine_version is None and deployment.version_run == NEWEST[engine]
    result = plan(preset("kimi-k3"), deployment)
    assert result.deployment.engine_version == NEWEST[engine]
    assert load_plan(result.model_dump_json()) == result
    named = plan(
        preset("kimi-k3"),
        Deployment(engine=engine, engine_version=NEWEST[engine], attn_tp=TP[engine]),
    )
    assert named == result


@pytest.mark.parametrize("engine", sorted(NEWEST))
@pytest.mark.parametrize("version", ["0.35.0", "0.32.0", "main", "0.33", ""])
def test_a_release_k3layout_does_not_follow_is_refused_with_the_list(
    engine: str, version: str
) -> None:
    if version in facts_of(engine).versions:
        return
    with pytest.raises(Refusal) as caught:
        Deployment(engine=engine, engine_version=version)
    assert caught.value.code in {"version_unsupported", "invalid_argument"}
    if version:
        assert caught.value.code == "version_unsupported"
        assert caught.value.facts["allowed"] == facts_of(engine).versions
        assert caught.value.facts["field"] == "engine_version"


def test_every_engine_names_its_releases() -> None:
    assert all(facts_of(engine).versions for engine in engine_names())


def test_another_engine_plans_for_its_own_release() -> None:
    vllm = Deployment(engine="vllm", engine_version="0.33.0", attn_tp=8)
    assert with_engine(vllm, "sglang").engine_version is None
    assert plan(preset("kimi-k3"), with_engine(vllm, "sglang")).deployment.engine_version == (
        "0.5.23"
    )


def test_the_cli_takes_and_refuses_a_release() -> None:
    done = k3layout("plan", "--engine-version", "0.33.0", "--attn-tp", "8")
    assert done.returncode == 0 and "engine vllm 0.33.0" in done.stdout
    done = k3layout("plan", "--engine-version", "0.34.0", "--attn-tp", "8")
    assert done.returncode == 0 and "engine vllm 0.34.0" in done.stdout
    done = k3layout("plan", "--engine-version", "0.35.0", "--attn-tp", "8")
    said = done.stdout + done.stderr
    assert done.returncode == 2 and "version_unsupported" in said and "0.34.0" in said


@pytest.fixture
def running_vllm() -> Iterator[types.ModuleType]:
    """A stand-in ``vllm`` module in ``sys.modules`` (the bridge reads its ``__version__``)."""
    saved = sys.modules.get("vllm")
    module = types.ModuleType("vllm")
    sys.modules["vllm"] = module
    yield module
    if saved is None:
        del sys.modules["vllm"]
    else:
        sys.modules["vllm"] = saved


def test_the_bridge_plans_for_the_running_release(running_vllm: types.ModuleType) -> None:
    running_vllm.__version__ = "0.33.0"  # type: ignore[attr-defined]
    assert deployment_from_vllm(vllm_config()).engine_version == "0.33.0"
    running_vllm.__version__ = "0.35.1"  # type: ignore[attr-defined]
    with pytest.raises(Refusal) as caught:
        deployment_from_vllm(vllm_config())
    assert caught.value.code == "version_unsupported"
    assert caught.value.facts["engine_version"] == "0.35.1"


def test_a_stored_plan_naming_a_release_of_another_engine_is_refused() -> None:
    stored = plan(preset("kimi-k3"), Deployment(engine="tokenspeed", attn_tp=8)).model_dump_json()
    with pytest.raises(Refusal) as caught:
        load_plan(stored.replace('"engine":"tokenspeed"', '"engine":"vllm"'))
    assert caught.value.code == "version_unsupported"
    assert caught.value.facts["engine_version"] == NEWEST["tokenspeed"]


def test_every_answer_names_the_release_it_is_for() -> None:
    from k3layout import plan_ride  # noqa: PLC0415
    from k3layout.offload.report import ride_report  # noqa: PLC0415
    from k3layout.sweep import requests_sweep, sweep  # noqa: PLC0415

    k3 = preset("kimi-k3")
    older = Deployment(engine="vllm", engine_version="0.33.0", attn_tp=8)
    # a sweep keeps the base's release for its engine; the others plan for their newest
    cells = sweep(k3, (8,), ("fp8",), engines=("vllm", "sglang"), base=older)
    assert {(c.engine, c.engine_version) for c in cells} == {
        ("vllm", "0.33.0"),
        ("sglang", NEWEST["sglang"]),
    }
    held = requests_sweep(preset("kimi-linear-48b"), 40 << 30, (8192,), base=older)
    assert {(c.engine, c.engine_version) for c in held} == {
        (engine, "0.33.0" if engine == "vllm" else NEWEST[engine]) for engine in NEWEST
    }
    linear = plan(preset("kimi-linear-48b"), Deployment(attn_tp=8, gpu="h200"))
    assert linear.recommend(16, 8192).engine_version == NEWEST["vllm"]
    report = ride_report(plan_ride(plan(k3, older)))
    assert (report.engine, report.engine_version) == ("vllm", "0.33.0")
