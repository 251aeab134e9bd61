"""SGLang 0.5.23's GPU budget (``k3layout.engines.sglang.budget``): its default
``--mem-fraction-static``, the KV budget of a fraction, and the least fraction that holds a KV
budget. The goldens are SGLang's own resolved values (``tests/conformance/
test_conformance_sglang_budget.py`` runs SGLang on them and ~320 more), written as their
derivation: ``reserved = 512 + 1.5 x max(chunked_prefill, 2048) + tp x pp / 8 x 1024 +
graphs`` MiB, ``round((smi - reserved) / smi, 3)``, times ``0.95 x 0.9875`` for K3's ViT."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k3layout import Deployment, HybridModel, Refusal, preset
from k3layout.engines.sglang.budget import (
    SGLANG_BUDGET,
    default_mem_fraction_static,
    sglang_budget,
    sglang_least,
)
from k3layout.gpus import GPUS, GpuName
from k3layout.layouts.seams import rules_for
from k3layout.memory import GIB
from k3layout.memory.estimates import startup

H100, H200, B200, GB200 = 81_559, 143_771, 183_359, 189_471  # nvidia-smi's total, MiB
K3_VIT = 0.95 * (1 - 0.1 * (27 * 1024**2 / (24 * 1024**2) - 1))  # 0.95 x 0.9875


def sglang(**fields: object) -> Deployment:
    return Deployment.model_validate({"engine": "sglang", **fields})


@pytest.fixture(scope="module")
def k3() -> HybridModel:
    return preset("kimi-k3")


@pytest.fixture(scope="module")
def kl() -> HybridModel:
    return preset("kimi-linear-48b")


def test_the_tables_nvidia_smi_totals_are_the_ones_sglang_reads() -> None:
    totals: dict[GpuName, int] = {"h100": H100, "h200": H200, "b200": B200, "gb200": GB200}
    assert {name: GPUS[name].smi_memory_mib for name in totals} == totals


def test_k3_at_tp8_on_an_h200_is_sglangs_0_841498125(k3: HybridModel) -> None:
    # 512 base + 1.5 x 8,192 chunked prefill + 8 x 1 / 8 x 1,024 + 2 x 512 decode graphs
    reserved = 512 + 1.5 * 8192 + 8 * 1 / 8 * 1024 + 2 * 512
    assert reserved == 14_848
    assert round((H200 - reserved) / H200, 3) == 0.897
    assert K3_VIT == 0.938125
    assert default_mem_fraction_static(k3, sglang(attn_tp=8)) == 0.897 * K3_VIT == 0.841498125


@pytest.mark.parametrize(
    ("fields", "reserved", "smi", "golden"),
    [
        # H100's tier: the same 8,192 and 512; the float SGLang resolves, not 0.76738625
        (
            {"attn_tp": 8, "gpu": "h100"},
            512 + 1.5 * 8192 + 1024 + 2 * 512,
            H100,
            0.7673862499999999,
        ),
        # B200's tier: chunked prefill 16,384
        ({"attn_tp": 8, "gpu": "b200"}, 512 + 1.5 * 16384 + 1024 + 2 * 512, B200, 0.7992825),
        ({"attn_tp": 8, "gpu": "gb200"}, 512 + 1.5 * 16384 + 1024 + 2 * 512, GB200, 0.803973125),
        # TP 16 or PP 2: 2,048 for the parallel size
        ({"attn_tp": 16}, 512 + 1.5 * 8192 + 2048 + 2 * 512, H200, 0.83493125),
        ({"attn_tp": 8, "pp": 2}, 512 + 1.5 * 8192 + 2048 + 2 * 512, H200, 0.83493125),
        # TP 1 under 4: decode graphs to 256; --max-running-requests 8 caps them to 8
        ({"attn_tp": 1}, 512 + 1.5 * 8192 + 128 + 2 * 256, H200, 0.850879375),
        (
            {"attn_tp": 1, "max_running_requests": 8},
            512 + 1.5 * 8192 + 128 + 2 * 8,
            H200,
            0.85369375,
        ),
        # DP attention over 8 (--tp-size 8): 3 x 512 x 8, and 1.5 x 512 x 8 more past 300;
        # the chunked prefill SGLang divides by DP later does not enter
        (
            {"attn_tp": 1, "attn_dp": 8},
            512 + 1.5 * 8192 + 1024 + (2 + 3 * 8 + 1.5 * 8) * 512,
            H200,
            0.721418125,
        ),
        (
            {"attn_tp": 1, "attn_dp": 16, "gpu": "b200"},
            512 + 1.5 * 16384 + 2048 + (2 + 3 * 16 + 1.5 * 16) * 512,
            B200,
            0.605090625,
        ),
        (
            {"attn_tp": 2, "attn_dp": 4, "max_running_requests": 320},
            512 + 1.5 * 8192 + 1024 + (2 + 3 * 4 + 1.5 * 4) * 320,
            H200,
            0.805849375,
        ),
    ],
)
def test_k3s_default_follows_the_tier_the_parallel_sizes_and_the_graphs(
    k3: HybridModel, fields: dict[str, object], reserved: float, smi: int, golden: float
) -> None:
    assert round((smi - reserved) / smi, 3) * K3_VIT == golden
    assert default_mem_fraction_static(k3, sglang(**fields)) == golden


@pytest.mark.parametrize(
    ("fields", "golden"),
    [
        ({"attn_tp": 1}, 0.907),  # round((143,771 - 13,440) / 143,771, 3): not multimodal
        ({"attn_tp": 2}, 0.906),
        ({"attn_tp": 8}, 0.897),
        ({"attn_tp": 4, "attn_dp": 2}, 0.865),  # + 3 x 512 x 2 MiB
        ({"attn_tp": 2, "attn_dp": 4, "max_running_requests": 320}, 0.859),
        ({"attn_tp": 8, "gpu": "gb200"}, 0.857),
    ],
)
def test_kimi_linears_default_is_not_scaled_for_a_vit(
    kl: HybridModel, fields: dict[str, object], golden: float
) -> None:
    assert default_mem_fraction_static(kl, sglang(**fields)) == golden


def test_dspark_expert_parallelism_and_the_cache_flags_leave_the_default(k3: HybridModel) -> None:
    base = default_mem_fraction_static(k3, sglang(attn_tp=8))
    for fields in (
        {"spec_tokens": 7},
        {"expert_parallel": True},
        {"kv_dtype": "bf16", "prefix_caching": False},
        {"max_total_tokens": 4096, "mamba_full_memory_ratio": 0.5},
    ):
        assert default_mem_fraction_static(k3, sglang(attn_tp=8, **fields)) == base


@pytest.mark.parametrize("gpu", ["a100", "mi300x", "mi355x"])
def test_a_gpu_sglangs_resolution_was_not_read_on_is_refused_naming_the_flag(
    k3: HybridModel, gpu: str
) -> None:
    with pytest.raises(Refusal) as caught:
        default_mem_fraction_static(k3, sglang(attn_tp=8, gpu=gpu))
    assert caught.value.code == "engine_setting"
    assert caught.value.facts["field"] == "mem_fraction_static"
    assert "mem_fraction_static" in (caught.value.hint or "")


def test_another_gpu_total_refuses_the_default_but_not_a_given_fraction(kl: HybridModel) -> None:
    table = GPUS["h200"].memory_bytes
    same = sglang(attn_tp=8, gpu_memory_bytes=table)
    assert default_mem_fraction_static(kl, same) == 0.897
    other = sglang(attn_tp=8, gpu_memory_bytes=table + GIB)
    with pytest.raises(Refusal) as caught:
        default_mem_fraction_static(kl, other)
    assert (caught.value.code, caught.value.facts["field"]) == (
        "engine_setting",
        "mem_fraction_static",
    )
    given = sglang(attn_tp=8, gpu_memory_bytes=table + GIB, mem_fraction_static=0.8)
    assert sglang_budget(kl, given, 10 * GIB).memory_flag == ("--mem-fraction-static", "0.8")


def test_a_hand_built_k3_has_no_known_vit_and_is_refused(k3: HybridModel) -> None:
    bare = HybridModel(name="k3-by-hand", model_type="kimi_k3", layers=k3.layers)
    with pytest.raises(Refusal) as caught:
        default_mem_fraction_static(bare, sglang(attn_tp=8))
    assert caught.value.code == "engine_setting"
    text_only = HybridModel(name="kl-by-hand", model_type="kimi_linear", layers=k3.layers)
    assert default_mem_fraction_static(text_only, sglang(attn_tp=8)) == 0.897


def _float32(value: int) -> float:
    return float(struct.unpack("<f", struct.pack("<f", float(value)))[0])


def test_the_budget_is_sglangs_profile_of_the_free_memory(k3: HybridModel) -> None:
    weights = 72 * GIB + 123_456_789
    deployment = sglang(attn_tp=8)
    budget = sglang_budget(k3, deployment, weights)
    total = GPUS["h200"].memory_bytes
    free_before = total - startup(deployment).bytes  # 0.5 GiB context + 1 GiB NCCL
    assert startup(deployment).bytes == 3 * GIB // 2
    fraction = 0.841498125
    # more than one rank: each probe is the MIN over ranks through a float32 tensor
    before, after = _float32(free_before) / GIB, _float32(free_before - weights) / GIB
    assert budget.kv_memory_bytes == int((after - before * (1 - fraction)) * GIB)
    assert budget.memory_flag == ("--mem-fraction-static", "0.841498125")
    assert [term.name for term in budget.reserve] == ["startup", "headroom"]
    headroom = budget.reserve[1].bytes
    assert headroom == free_before - weights - budget.kv_memory_bytes
    assert abs(headroom - free_before * (1 - fraction)) < 1 << 16  # the float32 rounding
    assert budget.used_bytes == total


def test_one_rank_probes_without_float32(kl: HybridModel) -> None:
    weights, reserve = 90 * GIB + 17, 700 << 20
    deployment = sglang(attn_tp=1, reserve_bytes=reserve)
    budget = sglang_budget(kl, deployment, weights)
    free_before = GPUS["h200"].memory_bytes - reserve
    before, after = free_before / GIB, (free_before - weights) / GIB
    assert budget.kv_memory_bytes == int((after - before * (1 - 0.907)) * GIB)
    assert budget.reserve[0].derivation == "given"


def test_a_given_fraction_is_used_as_given(kl: HybridModel) -> None:
    budget = sglang_budget(kl, sglang(attn_tp=8, mem_fraction_static=0.8), 10 * GIB)
    assert (budget.memory_flag, budget.flag_source) == (("--mem-fraction-static", "0.8"), "given")


def test_weights_past_the_fraction_leave_no_kv_and_are_refused(kl: HybridModel) -> None:
    with pytest.raises(Refusal) as caught:
        sglang_budget(kl, sglang(attn_tp=1, mem_fraction_static=0.5), 80 * GIB)
    assert caught.value.code == "memory_exceeded"
    with pytest.raises(Refusal) as caught:
        sglang_budget(kl, sglang(attn_tp=1), 200 * GIB)
    assert caught.value.code == "weights_do_not_fit"


def _kv(model: HybridModel, deployment: Deployment, weights: int, fraction: float) -> int:
    """The KV budget at ``fraction`` (0 where it leaves none, which the rule refuses)."""
    fields = {**dict(deployment), "mem_fraction_static": fraction, "kv_memory_bytes": None}
    try:
        return sglang_budget(model, Deployment.model_validate(fields), weights).kv_memory_bytes
    except Refusal as refusal:
        assert refusal.code == "memory_exceeded"
        return 0


@given(
    attn_tp=st.sampled_from((1, 2, 4, 8)),
    gpu=st.sampled_from(("h100", "h200", "b200")),
    weights_gib=st.integers(1, 40),
    share=st.floats(0.001, 1.0),
)
def test_the_least_fraction_holds_the_kv_and_one_thousandth_less_does_not(
    kl: HybridModel, attn_tp: int, gpu: str, weights_gib: int, share: float
) -> None:
    deployment = sglang(attn_tp=attn_tp, gpu=gpu)
    weights = weights_gib * GIB + 12_345
    default = sglang_budget(kl, deployment, weights)
    wanted = max(1, int(default.kv_memory_bytes * share))
    least = sglang_least(kl, deployment, weights, wanted)
    fraction = float(least.memory_flag[1])
    assert least.kv_memory_bytes >= wanted
    assert least.kv_memory_bytes == _kv(kl, deployment, weights, fraction)
    assert fraction <= default_mem_fraction_static(kl, deployment)
    assert least.flag_source == "the least that holds the workload"
    if fraction > 0.001:
        assert _kv(kl, deployment, weights, round(fraction - 0.001, 3)) < wanted


def test_the_least_fraction_is_in_thousandths_or_the_default(k3: HybridModel) -> None:
    deployment, weights = sglang(attn_tp=8), 72 * GIB
    default = sglang_budget(k3, deployment, weights)
    assert sglang_least(k3, deployment, weights, default.kv_memory_bytes).memory_flag[1] == (
        "0.841498125"  # 0.842 would be past the default
    )
    least = sglang_least(k3, deployment, weights, default.kv_memory_bytes // 2)
    assert len(least.memory_flag[1]) <= len("0.xxx")


def test_kv_past_what_the_default_leaves_is_refused(k3: HybridModel) -> None:
    deployment, weights = sglang(attn_tp=8), 72 * GIB
    default = sglang_budget(k3, deployment, weights)
    with pytest.raises(Refusal) as caught:
        sglang_least(k3, deployment, weights, default.kv_memory_bytes + 1)
    assert caught.value.code == "memory_exceeded"
    assert caught.value.facts["needed_bytes"] == default.kv_memory_bytes + 1


def test_a_given_kv_budget_is_the_least_fraction_that_gives_it(kl: HybridModel) -> None:
    budget = sglang_budget(kl, sglang(attn_tp=8, kv_memory_bytes=20 * GIB), 10 * GIB)
    assert budget.kv_memory_bytes >= 20 * GIB
    assert budget == sglang_least(kl, sglang(attn_tp=8), 10 * GIB, 20 * GIB)


def test_sglang_registers_the_rule() -> None:
    assert rules_for("sglang").budget is SGLANG_BUDGET
