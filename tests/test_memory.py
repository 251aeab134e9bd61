"""The GPU's budget (issue 29): weights per rank + the engine's reserve + KV fit in the GPU, by
each engine's own rule (``memory_budget``); the least memory flag that holds a KV budget
(``least_budget``); weights or budgets the GPU cannot hold refused naming what would fit or
every term; the command line's memory options; and no answer over the GPU.

The rules' figures are derived here from the rules' formulas (module docstrings of
``k3layout/engines/*/budget.py``); the engines' own code runs on the same figures in the
conformance suites (``test_conformance_budget.py``, ``test_conformance_sglang_budget.py``)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from deployments import (
    BY_ENGINE,
    FITTING,
    K3_EP,
    K3_MXFP4,
    TOKENSPEED_EP,
    Case,
    k3_mxfp4,
    model_named,
    write_k3_mxfp4,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import (
    GPUS,
    Deployment,
    MemoryBudget,
    Refusal,
    least_budget,
    memory_budget,
    preset,
    recommend,
    weights_per_rank,
)
from k3layout.cli import main, parser
from k3layout.cli.common import deployment_from_args
from k3layout.memory import gib

GIB = 1 << 30
MIB = 1 << 20


def ids(case: Case) -> str:
    return case.id


def float32(value: float) -> float:
    """``value`` through a float32, as SGLang all-reduces its free-memory probes."""
    rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return rounded


def one_step_less(value: str) -> float:
    """The fraction one thousandth under ``value`` (the least fraction's step)."""
    return (math.ceil(round(float(value) * 1000, 6)) - 1) / 1000


# --- each engine's rule, term by term -------------------------------------------------------


@pytest.mark.parametrize("case", [FITTING[0], FITTING[1]], ids=ids)
def test_vllms_budget_is_the_utilization_of_the_gpu_less_weights_and_reserve(case: Case) -> None:
    model, deployment = case.loaded(), case.deployment(engine_version="0.33.0")
    total = GPUS[deployment.gpu].memory_bytes
    weights = weights_per_rank(model, deployment).max_bytes
    budget = memory_budget(model, deployment)
    assert budget.gpu_memory_bytes == total and budget.weights_bytes == weights
    assert [term.name for term in budget.reserve] == ["activation_peak", "cuda_graphs", "non_torch"]
    assert budget.memory_flag == ("--gpu-memory-utilization", "0.92")  # vLLM 0.33's default
    # Worker.determine_available_memory: ceil(total x util) - weights - reserve
    assert budget.kv_memory_bytes == math.ceil(total * 0.92) - weights - budget.reserve_bytes
    assert budget.used_bytes == weights + budget.reserve_bytes + budget.kv_memory_bytes
    assert budget.kv_memory_bytes > 0 and budget.used_bytes <= total
    assert budget.free_bytes == total - budget.used_bytes
    given_util = memory_budget(
        model, case.deployment(gpu_memory_utilization=0.85, engine_version="0.33.0")
    )
    assert given_util.memory_flag == ("--gpu-memory-utilization", "0.85")
    assert given_util.flag_source == "given"
    assert given_util.kv_memory_bytes == (
        math.ceil(total * 0.85) - weights - given_util.reserve_bytes
    )
    # --kv-cache-memory-bytes: the KV as given, still checked against the GPU
    as_given = memory_budget(model, case.deployment(kv_memory_bytes=10 * GIB))  # either release
    assert as_given.memory_flag == ("--kv-cache-memory-bytes", str(10 * GIB))
    assert as_given.kv_memory_bytes == 10 * GIB
    assert as_given.reserve == budget.reserve


def test_vllms_activation_peak_is_the_moe_workspace_and_the_sampler() -> None:
    # Kimi-K3 under expert parallelism: each rank computes whole experts (3,072 wide)
    budget = memory_budget(preset("kimi-k3"), Deployment(engine="vllm", **K3_EP))
    peak, graphs, non_torch, _ = budget.reserve  # and vLLM 0.34's warm-up margin
    # 2,048 tokens x top 16 x (3 x 3,072 + 7,168) x 2 B + 128 sequences x 163,840 x 4 B x 2
    assert peak.bytes == 2048 * 16 * (3 * 3072 + 7168) * 2 + 128 * 163_840 * 4 * 2
    assert peak.bytes == 1_241_513_984
    assert graphs.bytes == GIB and non_torch.bytes == 256 * MIB  # the named estimates


def test_tokenspeeds_budget_is_the_utilization_of_the_free_memory_less_the_weights() -> None:
    model, deployment = k3_mxfp4(), Deployment(engine="tokenspeed", **TOKENSPEED_EP)
    total = GPUS["h200"].memory_bytes
    weights = weights_per_rank(model, deployment).max_bytes
    budget = memory_budget(model, deployment)
    startup, headroom = budget.reserve
    assert startup.name == "startup" and startup.bytes == 512 * MIB + GIB  # context + NCCL
    free = total - startup.bytes
    # 64 ranks: tokenspeed's default utilization for 16 ranks and more is 0.79
    assert budget.memory_flag == ("--gpu-memory-utilization", "0.79")
    assert budget.kv_memory_bytes == math.floor(free * 0.79) - weights
    assert headroom.name == "headroom" and headroom.bytes == free - math.floor(free * 0.79)
    assert budget.used_bytes == total  # the headroom is what the fraction leaves of the GPU
    given_util = memory_budget(model, deployment.model_copy(update={"gpu_memory_utilization": 0.6}))
    assert given_util.kv_memory_bytes == math.floor(free * 0.6) - weights


SGLANG_DEFAULTS = [
    # Kimi-K3 on 128 B200s (tier >= 160 GiB: chunked prefill 16,384, decode graphs to 512):
    # 512 + 1.5 x 16,384 + 128 / 8 x 1,024 + 2 x 512 + 3 x 512 x 16 + 1.5 x 512 x 16
    # = 79,360 MiB; round((183,359 - 79,360) / 183,359, 3) = 0.567, x 0.95 x (1 - 0.1 x
    # (27 x 1,024^2 / (24 x 1,024^2) - 1)) for its ViT
    (FITTING[2], 0.567 * (0.95 * (1.0 - 0.1 * (27 / 24 - 1.0)))),
    # Kimi-Linear on 8 H200s (tier < 160 GiB: 8,192, 512): 512 + 1.5 x 8,192 + 8 / 8 x 1,024
    # + 2 x 512 = 14,848 MiB; round((143,771 - 14,848) / 143,771, 3) = 0.897, no ViT
    (FITTING[3], 0.897),
]


@pytest.mark.parametrize(("case", "fraction"), SGLANG_DEFAULTS, ids=["k3", "linear"])
def test_sglangs_budget_is_its_fraction_of_the_free_memory_less_the_weights(
    case: Case, fraction: float
) -> None:
    model, deployment = case.loaded(), case.deployment()
    total = GPUS[deployment.gpu].memory_bytes
    weights = weights_per_rank(model, deployment).max_bytes
    budget = memory_budget(model, deployment)
    flag, value = budget.memory_flag
    assert flag == "--mem-fraction-static"
    assert float(value) == pytest.approx(fraction, rel=1e-12, abs=0)
    startup, headroom = budget.reserve
    assert startup.bytes == 512 * MIB + GIB  # more than one rank: context + NCCL
    before = total - startup.bytes  # F0; F1 = F0 - weights, each in GiB through float32
    kv = int((float32(before - weights) / GIB - float32(before) / GIB * (1 - float(value))) * GIB)
    assert budget.kv_memory_bytes == kv
    assert headroom.bytes == total - startup.bytes - weights - kv
    assert budget.used_bytes == total
    given_fraction = memory_budget(model, case.deployment(mem_fraction_static=0.6))
    assert given_fraction.memory_flag == ("--mem-fraction-static", "0.6")
    assert given_fraction.kv_memory_bytes == int(
        (float32(before - weights) / GIB - float32(before) / GIB * (1 - 0.6)) * GIB
    )


@pytest.mark.parametrize("case", [BY_ENGINE[e] for e in ("vllm", "sglang", "tokenspeed")], ids=ids)
def test_a_given_gpu_total_and_reserve_replace_the_tables_and_the_estimates(case: Case) -> None:
    model = case.loaded()
    # SGLang's default fraction follows nvidia-smi's total: with another total it is given
    fraction = {"mem_fraction_static": 0.8} if case.engine == "sglang" else {}
    given = case.deployment(gpu_memory_bytes=200 * GIB, reserve_bytes=GIB, **fraction)
    budget = memory_budget(model, given)
    assert budget.gpu_memory_bytes == 200 * GIB
    assert budget.reserve[0].bytes == GIB and budget.reserve[0].derivation == "given"
    assert budget.used_bytes <= 200 * GIB


def test_sglangs_default_needs_the_gpus_own_total() -> None:
    # SGLang picks its tier and default fraction by nvidia-smi's total: another total leaves it
    # unknown, so the fraction must be given
    case = BY_ENGINE["sglang"]
    with pytest.raises(Refusal) as caught:
        memory_budget(case.loaded(), case.deployment(gpu_memory_bytes=100 * GIB))
    assert caught.value.code == "engine_setting"
    assert caught.value.facts["field"] == "mem_fraction_static"
    given = case.deployment(gpu_memory_bytes=100 * GIB, mem_fraction_static=0.8)
    assert memory_budget(case.loaded(), given).gpu_memory_bytes == 100 * GIB


# --- the least flag -------------------------------------------------------------------------

FRACTION_FIELD = {"sglang": "mem_fraction_static", "tokenspeed": "gpu_memory_utilization"}


@pytest.mark.parametrize("case", FITTING, ids=ids)
def test_the_least_budget_holds_the_kv_and_one_step_less_does_not(case: Case) -> None:
    model, deployment = case.loaded(), case.deployment()
    default = memory_budget(model, deployment)
    for kv in (GIB // 2, default.kv_memory_bytes // 2, default.kv_memory_bytes):
        least = least_budget(model, deployment, kv)
        assert least.kv_memory_bytes >= kv
        assert least.used_bytes <= least.gpu_memory_bytes
        flag, value = least.memory_flag
        if case.engine == "vllm":  # the budget in bytes: exactly the KV
            assert (flag, value) == ("--kv-cache-memory-bytes", str(kv))
            assert least.kv_memory_bytes == kv
            continue
        assert flag == default.memory_flag[0]
        assert float(value) <= float(default.memory_flag[1])
        less = {FRACTION_FIELD[case.engine]: one_step_less(value)}
        try:
            assert memory_budget(model, case.deployment(**less)).kv_memory_bytes < kv
        except Refusal as refusal:  # a fraction that leaves no KV at all
            assert refusal.code == "memory_exceeded"
    # more than the default flag leaves: refused, naming what it leaves and what is needed
    with pytest.raises(Refusal) as caught:
        least_budget(model, deployment, default.kv_memory_bytes + 1)
    assert caught.value.code == "memory_exceeded"
    assert caught.value.facts["needed_bytes"] == default.kv_memory_bytes + 1
    assert caught.value.facts["kv_memory_bytes"] == default.kv_memory_bytes
    assert caught.value.facts["weights_bytes"] == default.weights_bytes


@pytest.mark.parametrize("kv_bytes", [True, "1", 1.5, None, 0, -1], ids=repr)
def test_least_budget_refuses_a_kv_budget_that_is_not_a_byte_count(kv_bytes: Any) -> None:
    case = BY_ENGINE["vllm"]
    with pytest.raises(Refusal) as caught:
        least_budget(case.loaded(), case.deployment(), kv_bytes)
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts["field"] == "kv_bytes"


# --- refusals -------------------------------------------------------------------------------


def _parsed(label: str) -> dict[str, Any]:
    """``expert_parallel=True, attn_dp=16`` as deployment fields."""
    fields: dict[str, Any] = {}
    for part in label.split(", "):
        name, value = part.split("=")
        fields[name] = True if value == "True" else int(value)
    return fields


K3_BF16_OVER = [
    ("vllm", "h200", 8),
    ("vllm", "b200", 8),
    ("sglang", "h200", 8),
    ("sglang", "b200", 8),
]


@pytest.mark.parametrize(("engine", "gpu", "attn_tp"), K3_BF16_OVER)
def test_weights_over_the_gpu_name_a_deployment_whose_weights_fit(
    engine: str, gpu: str, attn_tp: int
) -> None:
    k3 = preset("kimi-k3")
    deployment = Deployment.model_validate({"engine": engine, "gpu": gpu, "attn_tp": attn_tp})
    with pytest.raises(Refusal) as caught:
        memory_budget(k3, deployment)
    refusal = caught.value
    total = GPUS[deployment.gpu].memory_bytes
    assert refusal.code == "weights_do_not_fit"
    assert refusal.facts["gpu_memory_bytes"] == total
    weights = refusal.facts["weights_bytes"]
    assert weights == weights_per_rank(k3, deployment).max_bytes
    assert isinstance(weights, int) and weights > total
    named = refusal.facts["fits"]
    labels = named if isinstance(named, list) else [named]
    assert labels and all(isinstance(label, str) for label in labels)
    for label in labels:
        assert isinstance(label, str) and label in (refusal.hint or "")
        other = Deployment.model_validate({**dict(deployment), **_parsed(label)})
        assert weights_per_rank(k3, other).max_bytes <= total, label


NONE_FITS = [
    # tokenspeed runs bf16 experts without expert parallelism only: none of the deployments
    # that spread the weights further builds, and Kimi-K3 bf16 at attention TP 4 is 1.3 TiB
    ("tokenspeed", "h200", 4),
    # an H100's 79 GiB hold Kimi-K3 bf16's attention and dense weights on no spread tried
    ("vllm", "h100", 8),
]


@pytest.mark.parametrize(("engine", "gpu", "attn_tp"), NONE_FITS)
def test_weights_no_deployment_fits_are_refused_saying_so(
    engine: str, gpu: str, attn_tp: int
) -> None:
    deployment = Deployment.model_validate({"engine": engine, "gpu": gpu, "attn_tp": attn_tp})
    with pytest.raises(Refusal) as caught:
        memory_budget(preset("kimi-k3"), deployment)
    assert caught.value.code == "weights_do_not_fit"
    assert caught.value.facts.get("fits") is None
    assert "4-bit" in (caught.value.hint or "")


def _every_term(refusal: Refusal) -> None:
    facts = refusal.facts
    for name in ("gpu_memory_bytes", "weights_bytes", "reserve_bytes", "kv_memory_bytes"):
        value = facts[name]
        assert isinstance(value, int)
        assert gib(max(0, value)) in str(refusal) or name == "kv_memory_bytes", name


def test_a_kv_budget_over_what_the_gpu_holds_beside_the_weights_names_every_term() -> None:
    case = BY_ENGINE["vllm"]  # Kimi-K3 on 128 B200s: 114 GiB of weights of 178 GiB
    with pytest.raises(Refusal) as caught:
        memory_budget(case.loaded(), case.deployment(kv_memory_bytes=100 * GIB))
    refusal = caught.value
    assert refusal.code == "memory_exceeded"
    _every_term(refusal)
    facts = refusal.facts
    assert facts["kv_memory_bytes"] == 100 * GIB
    assert gib(100 * GIB) in str(refusal) and "--kv-cache-memory-bytes" in str(refusal)
    used = sum(int(str(facts[n])) for n in ("weights_bytes", "reserve_bytes", "kv_memory_bytes"))
    assert used > int(str(facts["gpu_memory_bytes"]))
    # the same through recommend's budget argument
    with pytest.raises(Refusal) as again:
        recommend(
            case.loaded(),
            case.deployment(),
            requests=1,
            max_model_len=8192,
            kv_memory_bytes=100 * GIB,
        )
    assert again.value.code == "memory_exceeded" and again.value.facts == facts


def test_a_fraction_that_leaves_no_kv_names_every_term() -> None:
    # Kimi-K3 on 128 H200s under SGLang: its default fraction (DP attention's CUDA graphs
    # reserve much) leaves less than the weights
    deployment = Deployment(
        engine="sglang", gpu="h200", attn_tp=8, attn_dp=16, expert_parallel=True
    )
    with pytest.raises(Refusal) as caught:
        memory_budget(preset("kimi-k3"), deployment)
    refusal = caught.value
    assert refusal.code == "memory_exceeded"
    _every_term(refusal)
    kv = refusal.facts["kv_memory_bytes"]
    assert isinstance(kv, int) and kv <= 0
    assert "--mem-fraction-static" in str(refusal)


# --- plan.capacity() stands on the GPU's budget ---------------------------------------------


@pytest.mark.parametrize("case", FITTING, ids=ids)
def test_capacity_without_a_budget_is_the_capacity_of_the_gpus(case: Case) -> None:
    result = case.plan()
    kv = result.memory().kv_memory_bytes
    length = case.max_model_len
    assert result.capacity(max_model_len=length) == result.capacity(kv, length)
    assert result.capacity(None, length).kv_memory_bytes == kv
    if case.model == "kimi-linear-48b":  # its config gives no context: the length is asked
        with pytest.raises(Refusal) as caught:
            result.capacity()
        assert caught.value.facts == {"field": "max_model_len"} or "max_model_len" in str(
            caught.value
        )
    else:
        assert result.capacity() == result.capacity(kv)


# --- the command line -----------------------------------------------------------------------

SUBCOMMANDS = [
    ["plan"],
    ["recommend", "--requests", "1"],
    ["sweep"],
    ["draw", "requests", "--output", "requests.svg"],
]


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=lambda c: " ".join(c[:2]))
def test_the_memory_options_fill_the_deployment(command: list[str]) -> None:
    options = ["--gpu-memory-gib", "150", "--reserve-gib", "2.5", "--kv-memory-gib", "10"]
    deployment = deployment_from_args(parser().parse_args([*command, *options]))
    assert deployment.gpu_memory_bytes == 150 * GIB
    assert deployment.reserve_bytes == 5 * GIB // 2
    assert deployment.kv_memory_bytes == 10 * GIB
    assert deployment.expert_parallel is False
    fraction = ["--gpu-memory-utilization", "0.85", "--expert-parallel"]
    deployment = deployment_from_args(parser().parse_args([*command, *fraction]))
    assert deployment.gpu_memory_utilization == 0.85 and deployment.expert_parallel is True
    assert deployment.kv_memory_bytes is None
    sglang = ["--mem-fraction-static", "0.8"]
    assert deployment_from_args(parser().parse_args([*command, *sglang])).mem_fraction_static == 0.8


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0, capsys.readouterr().err
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_the_cli_plans_on_the_budget_its_options_give(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    linear = ["plan", "--model", "kimi-linear-48b", "--max-model-len", "8192", "--json"]
    options = [
        "--gpu-memory-utilization",
        "0.85",
        "--gpu-memory-gib",
        "150",
        "--reserve-gib",
        "2.5",
    ]
    report = _json(capsys, *linear, *options)
    expected = Deployment(
        engine_version="0.34.0",  # the plan says the release it planned for
        gpu_memory_utilization=0.85,
        gpu_memory_bytes=150 * GIB,
        reserve_bytes=5 * GIB // 2,
    )
    assert report["deployment"] == expected.model_dump(mode="json")
    memory = MemoryBudget.model_validate(report["memory"])
    assert memory == memory_budget(preset("kimi-linear-48b"), expected)
    assert memory.memory_flag == ("--gpu-memory-utilization", "0.85")
    assert memory.gpu_memory_bytes == 150 * GIB
    # the reserve given replaces every estimate, the extensible cache's margin too
    assert memory.kv_memory_bytes == (
        math.ceil(150 * GIB * 0.85) - memory.weights_bytes - 5 * GIB // 2
    )
    assert report["capacity"]["kv_memory_bytes"] == memory.kv_memory_bytes
    sglang = _json(
        capsys, *linear, "--engine", "sglang", "--attn-tp", "8", "--mem-fraction-static", "0.8"
    )
    assert sglang["deployment"]["mem_fraction_static"] == 0.8
    assert sglang["memory"]["memory_flag"] == ["--mem-fraction-static", "0.8"]
    case = BY_ENGINE["tokenspeed"]
    tokenspeed = _json(
        capsys,
        "plan",
        *case.options(write_k3_mxfp4(tmp_path)),
        "--gpu-memory-utilization",
        "0.7",
        "--max-model-len",
        "8192",
        "--json",
    )
    planned_for = case.deployment(gpu_memory_utilization=0.7, engine_version="main")
    assert tokenspeed["deployment"] == planned_for.model_dump(mode="json")
    assert tokenspeed["memory"]["memory_flag"] == ["--gpu-memory-utilization", "0.7"]
    # recommend takes the same options: the GPU's total bounds its budget
    answer = _json(
        capsys,
        "recommend",
        "--model",
        "kimi-linear-48b",
        "--gpu-memory-gib",
        "150",
        "--requests",
        "4",
        "--max-model-len",
        "8192",
        "--json",
    )
    assert answer["memory"]["gpu_memory_bytes"] == 150 * GIB


BAD_VALUES = [
    ("--kv-memory-gib", "nan"),
    ("--kv-memory-gib", "-1"),
    ("--kv-memory-gib", "inf"),
    ("--kv-memory-gib", "1e300"),
    ("--gpu-memory-gib", "nan"),
    ("--gpu-memory-gib", "-1"),
    ("--gpu-memory-gib", "0"),
    ("--gpu-memory-gib", "1e300"),
    ("--reserve-gib", "nan"),
    ("--reserve-gib", "-1"),
    ("--reserve-gib", "1e300"),
    ("--gpu-memory-utilization", "nan"),
    ("--gpu-memory-utilization", "-0.5"),
    ("--gpu-memory-utilization", "0"),
    ("--gpu-memory-utilization", "1e300"),
    ("--mem-fraction-static", "nan"),
    ("--mem-fraction-static", "-0.5"),
    ("--mem-fraction-static", "1"),
    ("--mem-fraction-static", "1e300"),
]


@pytest.mark.parametrize(("option", "value"), BAD_VALUES, ids=str)
def test_a_memory_option_out_of_range_is_refused_naming_it(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = "sglang" if option == "--mem-fraction-static" else "vllm"
    argv = ["plan", "--model", "kimi-linear-48b", "--engine", engine, option, value, "--json"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    refused = json.loads(out)["refused"]
    assert refused["code"] in {"invalid_argument", "size_limit"}
    assert refused["facts"]["option"] == option
    assert option in err


WRONG_ENGINE = [
    ("sglang", "--gpu-memory-utilization", "gpu_memory_utilization"),
    ("vllm", "--mem-fraction-static", "mem_fraction_static"),
    ("tokenspeed", "--mem-fraction-static", "mem_fraction_static"),
]


def _wrong_engine(engine: str, option: str, capsys: pytest.CaptureFixture[str]) -> Any:
    argv = ["plan", "--model", "kimi-k3", "--engine", engine, "--attn-tp", "4", option, "0.8"]
    assert main([*argv, "--json"]) == 2
    out, err = capsys.readouterr()
    return json.loads(out)["refused"], err


@pytest.mark.parametrize(("engine", "option", "field"), WRONG_ENGINE)
def test_a_memory_flag_of_another_engine_is_refused(
    engine: str, option: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    refused, err = _wrong_engine(engine, option, capsys)
    assert refused["code"] == "engine_setting"
    assert refused["facts"]["field"] == field and field in err


@pytest.mark.parametrize(("engine", "option", "field"), WRONG_ENGINE)
def test_a_memory_flag_of_another_engine_is_refused_naming_the_option(
    engine: str, option: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    refused, err = _wrong_engine(engine, option, capsys)
    assert option in err and refused["facts"].get("option") == option


# --- the Python API's input types -----------------------------------------------------------


@pytest.mark.parametrize("field", ["gpu_memory_utilization", "mem_fraction_static"])
@pytest.mark.parametrize(
    "value", [True, "0.9", b"0.9", math.nan, math.inf, 0.0, -0.1, 1.5], ids=repr
)
def test_a_memory_fraction_is_a_finite_float_in_range(field: str, value: object) -> None:
    with pytest.raises(Refusal) as caught:
        Deployment.model_validate({field: value})
    assert caught.value.code in {"invalid_argument", "size_limit"}
    assert caught.value.facts["field"] == field


def test_the_fractions_bounds() -> None:
    assert Deployment(gpu_memory_utilization=1.0).gpu_memory_utilization == 1.0
    assert Deployment(gpu_memory_utilization=1).gpu_memory_utilization == 1.0  # an int is a float
    with pytest.raises(Refusal):
        Deployment(engine="sglang", mem_fraction_static=1.0)  # SGLang takes it under 1


@pytest.mark.parametrize("field", ["kv_memory_bytes", "gpu_memory_bytes", "reserve_bytes"])
@pytest.mark.parametrize("value", [True, "1", 1.5, 2.0, -1, (1 << 62) + 1], ids=repr)
def test_a_memory_size_is_an_int_of_bytes_in_range(field: str, value: object) -> None:
    with pytest.raises(Refusal) as caught:
        Deployment.model_validate({field: value})
    assert caught.value.code in {"invalid_argument", "size_limit"}
    assert caught.value.facts["field"] == field


def test_a_zero_budget_or_gpu_is_refused_and_a_zero_reserve_is_taken() -> None:
    for field in ("kv_memory_bytes", "gpu_memory_bytes"):
        with pytest.raises(Refusal):
            Deployment.model_validate({field: 0})
    assert Deployment(reserve_bytes=0).reserve_bytes == 0


@pytest.mark.parametrize("value", [1, 0, "true", 1.0], ids=repr)
def test_expert_parallel_is_a_bool(value: object) -> None:
    with pytest.raises(Refusal) as caught:
        Deployment.model_validate({"expert_parallel": value})
    assert caught.value.facts["field"] == "expert_parallel"


@pytest.mark.parametrize("fraction", ["gpu_memory_utilization", "mem_fraction_static"])
def test_a_kv_budget_and_a_fraction_are_not_both_given(fraction: str) -> None:
    with pytest.raises(Refusal) as caught:
        Deployment.model_validate({"kv_memory_bytes": GIB, fraction: 0.5})
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts["field"] == "kv_memory_bytes"
    assert caught.value.facts["other"] == fraction


@pytest.mark.parametrize("model", ["kimi-k3", 3, None], ids=repr)
def test_the_functions_refuse_what_is_not_a_model_or_a_deployment(model: object) -> None:
    for function in (memory_budget, weights_per_rank):
        with pytest.raises(Refusal) as caught:
            function(model, Deployment())  # type: ignore[arg-type]
        assert caught.value.code == "invalid_argument"
    with pytest.raises(Refusal):
        memory_budget(preset("kimi-linear-48b"), {"attn_tp": 8})  # type: ignore[arg-type]


# --- no answer over the GPU -----------------------------------------------------------------

MODELS = ("kimi-linear-48b", "kimi-k3", K3_MXFP4)
PARALLEL = [
    {"attn_tp": 1},
    {"attn_tp": 2},
    {"attn_tp": 4},
    {"attn_tp": 8},
    {"attn_tp": 8, "expert_parallel": True},
    {"attn_tp": 8, "attn_dp": 16, "expert_parallel": True},
    {"attn_tp": 4, "attn_dp": 16, "expert_parallel": True},
    {"attn_tp": 4, "attn_dp": 8, "expert_parallel": True},
]


@st.composite
def deployments(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A model and deployment fields: half the time a fitting case's (on its GPU or any other),
    else any engine, GPU, model and parallel layout."""
    gpus = st.sampled_from(sorted(GPUS))
    if draw(st.booleans()):
        case = draw(st.sampled_from(FITTING))
        gpu = draw(st.just(case.fields["gpu"]) | gpus)
        return case.model, {**case.fields, "gpu": gpu}
    engine = draw(st.sampled_from(("vllm", "sglang", "tokenspeed")))
    fields = {"engine": engine, "gpu": draw(gpus), **draw(st.sampled_from(PARALLEL))}
    return draw(st.sampled_from(MODELS)), fields


@settings(max_examples=80, deadline=None)
@given(
    drawn=deployments(),
    requests=st.integers(0, 8).map(lambda bits: 1 << bits),
    length=st.integers(10, 20).map(lambda bits: 1 << bits),
    budget=st.none() | st.integers(1, 160).map(lambda g: g * GIB),
)
def test_an_answer_never_exceeds_the_gpu(
    drawn: tuple[str, dict[str, Any]], requests: int, length: int, budget: int | None
) -> None:
    model, fields = drawn
    try:
        deployment = Deployment.model_validate(fields)
        got = recommend(
            model_named(model),
            deployment,
            requests=requests,
            max_model_len=length,
            kv_memory_bytes=budget,
        )
    except Refusal:
        return
    if got.memory is None:  # weights not modelled (tokenspeed off Hopper): the budget as given
        assert budget is not None and got.kv_memory_bytes == budget
        assert budget <= GPUS[deployment.gpu].memory_bytes
        with pytest.raises(Refusal) as caught:
            weights_per_rank(model_named(model), deployment)
        assert caught.value.code == "weights_unknown"
        return
    assert got.memory.gpu == deployment.gpu
    assert got.memory.gpu_memory_bytes == GPUS[deployment.gpu].memory_bytes
    assert got.memory.used_bytes <= got.memory.gpu_memory_bytes
    assert got.memory.kv_memory_bytes == got.kv_memory_bytes >= got.needed_bytes
    if budget is not None:
        assert got.kv_memory_bytes >= budget
