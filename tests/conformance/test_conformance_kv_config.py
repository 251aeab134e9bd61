"""``kv_cache_config`` and ``kv_cache_specs`` against vLLM's own start-up, under the installed
release (0.33.0 in the ``tests`` session, 0.34.0 in ``vllm034``): the ``KVCacheConfig`` built
from a plan (a preset planned with the case's flags) is the one vLLM builds for the same model
and flags on every pipeline stage, by vLLM's own dataclass equality (``num_blocks``; every
group's layer names, spec class and every spec field; every tensor's size, layers, strides and
offset), and the specs a worker returns are vLLM's, in its order: Kimi-K3, K3 + DSpark and
Kimi-Linear (``vllm_engine``), GLM-5.3-Flash's packed layout (``vllm_glm``). A plan of other
flags builds another config, and a plan of the other release is refused."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_required import require_vllm, running

require_vllm()

import vllm_engine  # noqa: E402
from test_conformance_layout import deployment, planner_model  # noqa: E402
from vllm.model_executor.layers.mamba import mamba_utils  # noqa: E402
from vllm_engine import Case, Engine, start  # noqa: E402
from vllm_glm import plan_glm  # noqa: E402

from k3layout import (  # noqa: E402
    Deployment,
    HybridModel,
    Refusal,
    VllmPlan,
    model_from_config,
    plan,
    preset,
)
from k3layout.engines.vllm import kv_cache_config, kv_cache_specs  # noqa: E402
from k3layout.engines.vllm.releases import VLLM_VERSIONS  # noqa: E402

PRESETS = {"kimi-k3": "kimi-k3", "kimi-linear": "kimi-linear-48b"}
"""The preset each harness model is (with DSpark: ``kimi-k3-dspark``)."""
GLM_FIXTURE = Path(__file__).parents[1] / "fixtures" / "glm-5.3-flash" / "config.json"
GLM_BUDGET = 40 << 30
GLM_LENGTH = 8192


@dataclasses.dataclass(frozen=True)
class KvCase:
    """A start-up of the harness and the conv state layout it runs with."""

    case: Case
    conv_layout: str = "SD"

    def __str__(self) -> str:
        return f"{self.case}-{self.conv_layout}"


def grid() -> list[KvCase]:
    """Kimi-K3, K3 + DSpark (2 tokens) and Kimi-Linear at attention TP 1, 4 and 8 in fp8 and
    bf16; two pipeline stages, the channel-major conv state; then the other branches a plan
    takes (block-outermost, DCP, prefix caching off, FlashKDA, a stage without attention, a
    requested block, MTP)."""
    models = [
        {"model": "kimi-k3"},
        {"model": "kimi-k3", "drafter": "dspark", "spec_tokens": 2},
        {"model": "kimi-linear", "max_model_len": 4096},
    ]
    cases = [
        KvCase(Case(attn_tp=tp, kv_dtype=dtype, **model))  # type: ignore[arg-type]
        for model in models
        for tp in (1, 4, 8)
        for dtype in ("fp8", "bf16")
    ]
    cases += [
        KvCase(Case(attn_tp=8, pp=2)),
        KvCase(Case(attn_tp=8, pp=2, drafter="dspark", spec_tokens=2)),
        KvCase(Case("kimi-linear", attn_tp=4, pp=2, max_model_len=4096)),
        KvCase(Case(attn_tp=8), conv_layout="DS"),
        KvCase(Case(attn_tp=8, drafter="dspark", spec_tokens=2), conv_layout="DS"),
        KvCase(Case("kimi-linear", attn_tp=8, max_model_len=4096), conv_layout="DS"),
        KvCase(Case(attn_tp=8, backend="TRITON_MLA", kv_cache_layout="BLHNC", pp=2)),
        KvCase(Case(attn_tp=8, dcp=8)),
        KvCase(Case(attn_tp=8, prefix_caching=False, drafter="dspark", spec_tokens=2)),
        KvCase(Case("kimi-linear", attn_tp=1, prefix_caching=False, max_model_len=4096)),
        KvCase(Case(attn_tp=1, kv_dtype="bf16", kda_prefill_backend="flashkda")),
        KvCase(Case(attn_tp=8, pp=2, pp_partition=(3, 90))),
        KvCase(Case(attn_tp=8, backend="FLASHINFER_MLA", block_tokens=256)),
        KvCase(Case(attn_tp=8, backend="CUTLASS_MLA", drafter="dspark", spec_tokens=3, pp=2)),
        KvCase(Case(attn_tp=8, drafter="mtp", mtp_modules=1, spec_tokens=2)),
    ]
    return cases


@pytest.fixture(autouse=True)
def drafts_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's specs with vLLM's model runner's mark on a draft's layers
    (``get_kv_cache_spec`` replaces ``is_draft=True`` on them), which the harness leaves
    out: vLLM's grouping makes an MTP draft's group an EAGLE group from it."""
    specs = vllm_engine.worker_specs

    def marked(config: Any, layers: dict[str, Any]) -> dict[str, Any]:
        return {
            name: dataclasses.replace(spec, is_draft=True)
            if getattr(layers[name], "is_draft_layer", False)
            else spec
            for name, spec in specs(config, layers).items()
        }

    monkeypatch.setattr(vllm_engine, "worker_specs", marked)


@pytest.fixture
def conv_layout(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Sets ``VLLM_SSM_CONV_STATE_LAYOUT`` for vLLM (which caches its reading)."""

    def use(layout: str) -> None:
        monkeypatch.setenv("VLLM_SSM_CONV_STATE_LAYOUT", layout)
        mamba_utils.get_conv_state_layout.cache_clear()

    yield use
    mamba_utils.get_conv_state_layout.cache_clear()


def planned(case: Case, tmp: Path, conv: str = "SD", **changes: Any) -> VllmPlan:
    """The plan of ``case``'s model preset (with MTP modules: its config, which names them)
    and flags (``changes`` to the deployment)."""
    name = "kimi-k3-dspark" if case.drafter == "dspark" else PRESETS[case.model]
    model = planner_model(case, tmp) if case.drafter == "mtp" else preset(name)
    fields = {**deployment(case).model_dump(), "conv_layout": conv, **changes}
    result = plan(model, Deployment.model_validate(fields))
    assert isinstance(result, VllmPlan)
    return result


def first_difference(expected: Any, actual: Any, path: str = "config") -> str:
    """Where two of vLLM's records first differ (field by field), for the failure message."""
    if type(expected) is not type(actual):
        return f"{path}: {type(expected).__name__} != {type(actual).__name__}"
    if dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            if field.compare:
                where = f"{path}.{field.name}"
                a, b = getattr(expected, field.name), getattr(actual, field.name)
                if a != b:
                    return first_difference(a, b, where)
    if isinstance(expected, (list, tuple)) and len(expected) == len(actual):
        for index, (a, b) in enumerate(zip(expected, actual, strict=True)):
            if a != b:
                return first_difference(a, b, f"{path}[{index}]")
    if isinstance(expected, dict) and list(expected) == list(actual):
        for key in expected:
            if expected[key] != actual[key]:
                return first_difference(expected[key], actual[key], f"{path}[{key!r}]")
    return f"{path}: vLLM {expected!r}, plan {actual!r}"


def engine_of(case: KvCase, tmp: Path, conv_layout: Any) -> Engine:
    conv_layout(case.conv_layout)
    return start(case.case, tmp)


@pytest.mark.parametrize("case", grid(), ids=str)
def test_the_plan_builds_the_kv_cache_config_vllm_builds(
    case: KvCase, tmp_path: Path, conv_layout: Any
) -> None:
    engine = engine_of(case, tmp_path, conv_layout)
    result = planned(case.case, tmp_path, case.conv_layout)
    length = case.case.max_model_len
    num_blocks = result.num_blocks(case.case.memory_bytes)
    for stage, config in enumerate(engine.kv_cache_configs):
        built = kv_cache_config(result, num_blocks, stage, max_model_len=length)
        assert built == config, first_difference(config, built)
        specs = kv_cache_specs(result, stage, max_model_len=length)
        assert list(specs) == list(engine.specs[stage])
        assert specs == engine.specs[stage], first_difference(engine.specs[stage], specs, "specs")
        # is_draft is no part of a spec's equality: compared on its own
        assert [s.is_draft for s in specs.values()] == [
            s.is_draft for s in engine.specs[stage].values()
        ]


GLM_CASES = [
    {"gpu": "h200", "kv_dtype": "fp8"},
    {"gpu": "h200", "kv_dtype": "bf16"},
    {"gpu": "h200", "kv_dtype": "fp8_ds_mla", "tp": 4},
    {"gpu": "h200", "kv_dtype": "fp8", "tp": 1},
    {"gpu": "b200", "kv_dtype": "fp8"},
    {"gpu": "h200", "kv_dtype": "fp8", "spec": 2, "mtp": 1},
    {"gpu": "b200", "kv_dtype": "fp8", "spec": 2, "mtp": 1, "tp": 2},
    {"gpu": "h200", "kv_dtype": "bf16", "dcp": 2},
    {"gpu": "h200", "kv_dtype": "fp8", "prefix_caching": False},
    {"gpu": "h200", "kv_dtype": "fp8", "block": 2048},
]
"""GLM-5.3-Flash (the preset; with ``mtp`` MTP layers, its fixture declaring them): each sparse
backend (SM 9x FlashInfer, FlashMLA with ``fp8_ds_mla``, SM 10x FlashInfer), MTP drafts, DCP,
prefix caching off, a requested block. (bf16 is launched as ``--kv-cache-dtype auto``, which
vLLM runs as bf16 on SM 9x.)"""


def glm_id(case: dict[str, Any]) -> str:
    return "-".join(f"{key}{value}" for key, value in case.items())


def glm_model(mtp: int) -> HybridModel:
    """The GLM-5.3-Flash preset, declaring ``mtp`` MTP layers (none: as it ships)."""
    glm = preset("glm-5.3-flash")
    if not mtp:
        return glm
    config = json.loads(GLM_FIXTURE.read_text())
    config["text_config"]["num_nextn_predict_layers"] = mtp
    return model_from_config(config, name=glm.name)


@pytest.mark.parametrize("case", GLM_CASES, ids=glm_id)
def test_the_plan_builds_the_kv_cache_config_vllm_builds_for_glm(case: dict[str, Any]) -> None:
    gpu, dtype = case["gpu"], case["kv_dtype"]
    spec, mtp = case.get("spec", 0), case.get("mtp", 0)
    tp, dcp, block = case.get("tp", 8), case.get("dcp", 1), case.get("block")
    prefix = case.get("prefix_caching", True)
    theirs = plan_glm(
        gpu=gpu.upper(),
        tp=tp,
        kv_dtype=vllm_engine.KV_CACHE_DTYPE[dtype],  # the flag k3layout launches with
        spec_tokens=spec,
        mtp_layers=mtp or None,
        dcp=dcp,
        prefix_caching=prefix,
        block_size=block,
        max_model_len=GLM_LENGTH,
        budget_bytes=GLM_BUDGET,
        objects=True,
    )
    assert "objects" in theirs, theirs
    result = plan(
        glm_model(mtp),
        Deployment(
            engine_version=running(),
            gpu=gpu,
            attn_tp=tp,
            kv_dtype=dtype,
            spec_tokens=spec,
            speculative_method="mtp" if spec else None,
            dcp=dcp,
            prefix_caching=prefix,
            block_tokens=block,
        ),
    )
    assert isinstance(result, VllmPlan) and result.packed
    objects = theirs["objects"]
    num_blocks = result.num_blocks(GLM_BUDGET)
    for stage, config in enumerate(objects["kv_cache_configs"]):
        built = kv_cache_config(result, num_blocks, stage, max_model_len=GLM_LENGTH)
        assert built == config, first_difference(config, built)
        specs = kv_cache_specs(result, stage, max_model_len=GLM_LENGTH)
        worker = objects["specs"][stage]
        assert list(specs) == list(worker)
        assert specs == worker, first_difference(worker, specs, "specs")
        assert [s.is_draft for s in specs.values()] == [s.is_draft for s in worker.values()]


OTHER_FLAGS = [
    ("attn_tp", 4),
    ("kv_dtype", "bf16"),
    ("conv_layout", "DS"),
    ("prefix_caching", False),
    ("kv_cache_layout", "BLHNC"),
]


@pytest.mark.parametrize(("field", "value"), OTHER_FLAGS, ids=[f for f, _ in OTHER_FLAGS])
def test_a_plan_of_other_flags_builds_another_config(
    field: str, value: object, tmp_path: Path, conv_layout: Any
) -> None:
    case = KvCase(Case(attn_tp=8, backend="TRITON_MLA", drafter="dspark", spec_tokens=2))
    config = engine_of(case, tmp_path, conv_layout).kv_cache_configs[0]
    changes: dict[str, Any] = {field: value}
    other = planned(case.case, tmp_path, **changes)
    built = kv_cache_config(other, config.num_blocks, max_model_len=case.case.max_model_len)
    assert built != config
    same = planned(case.case, tmp_path)
    assert config == kv_cache_config(same, config.num_blocks, max_model_len=case.case.max_model_len)


def test_a_plan_of_the_other_release_is_refused(tmp_path: Path) -> None:
    other = next(version for version in VLLM_VERSIONS if version != running())
    result = planned(Case(attn_tp=8), tmp_path, engine_version=other)
    with pytest.raises(Refusal) as refused:
        kv_cache_config(result, 100)
    assert refused.value.code == "version_unsupported"
    assert refused.value.facts["installed"] == running()
    assert refused.value.facts["engine_version"] == other
    assert f"engine_version={running()!r}" in (refused.value.hint or "")
