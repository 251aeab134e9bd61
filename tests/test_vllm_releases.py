"""What vLLM 0.34.0 plans otherwise than 0.33.0, each rule chosen by ``engine_version``
(``k3layout.engines.vllm.releases``; the conformance suites run each release's own code, and
``tests/fixtures/vllm-0.34-notes.md`` says where each difference lives in 0.34)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from test_glm import DECLARED, config

from k3layout import (
    GPUS,
    Deployment,
    Refusal,
    load_config,
    memory_budget,
    model_from_config,
    plan,
    plan_vllm,
    preset,
    weights_per_rank,
)
from k3layout.engines.vllm.budget import vllm_budget
from k3layout.engines.vllm.launch import vllm_flags
from k3layout.engines.vllm.releases import RELEASES, VLLM_VERSIONS, release_of

GIB = 1 << 30
FIXTURES = Path(__file__).parent / "fixtures"


def test_the_releases_are_followed_oldest_first_and_the_newest_is_the_default() -> None:
    assert VLLM_VERSIONS == ("0.33.0", "0.34.0")
    assert release_of(Deployment()).version == "0.34.0"
    assert release_of(Deployment(engine_version="0.33.0")) is RELEASES["0.33.0"]
    # a vLLM rule asked with another engine's deployment follows the newest vLLM
    assert release_of(Deployment(engine="sglang")).version == "0.34.0"


# --- the budget: 0.34's extensible KV cache -------------------------------------------------


def linear_h200(**fields: Any) -> Deployment:
    return Deployment.model_validate({"attn_tp": 8, "gpu": "h200", **fields})


def test_033_takes_092_of_the_gpu_less_weights_and_every_reserve_term() -> None:
    budget = vllm_budget(preset("kimi-linear-48b"), linear_h200(engine_version="0.33.0"), 12 * GIB)
    assert budget.memory_flag == ("--gpu-memory-utilization", "0.92")
    # the notes' 0.33 row: 115.13 GiB
    assert budget.kv_memory_bytes == 123_618_218_476 and budget.kv_reserved_bytes is None


def test_034_sizes_the_extensible_cache_on_all_of_the_gpu_then_shrinks_it() -> None:
    budget = vllm_budget(preset("kimi-linear-48b"), linear_h200(), 12 * GIB)
    total = GPUS["h200"].memory_bytes
    peak, graphs, non_torch, margin = budget.reserve
    assert budget.memory_flag == ("--gpu-memory-utilization", "1")
    assert "extensible" in budget.flag_source
    # before warm-up: no CUDA-graph estimate (the notes' cap, 127.31 GiB)
    assert budget.kv_reserved_bytes == total - 12 * GIB - peak.bytes - non_torch.bytes
    assert budget.kv_reserved_bytes == 136_700_755_968
    # after: the graphs, and max(1 GiB, 0.75 x peak) beyond the 1.5 GiB in use at start-up
    assert margin.name == "warmup_margin" and margin.bytes == GIB + 3 * GIB // 2
    assert budget.kv_memory_bytes == budget.kv_reserved_bytes - graphs.bytes - margin.bytes
    assert budget.used_bytes == total


def test_034_without_the_extensible_cache_is_033s_budget() -> None:
    off = vllm_budget(preset("kimi-linear-48b"), linear_h200(extensible_kv_cache=False), 12 * GIB)
    old = vllm_budget(preset("kimi-linear-48b"), linear_h200(engine_version="0.33.0"), 12 * GIB)
    assert (off.kv_memory_bytes, off.reserve) == (old.kv_memory_bytes, old.reserve)
    assert off.flag_source == "vLLM 0.34.0's default"


def test_a_given_utilization_caps_the_extensible_cache() -> None:
    total = GPUS["h200"].memory_bytes
    budget = vllm_budget(
        preset("kimi-linear-48b"), linear_h200(gpu_memory_utilization=0.8), 12 * GIB
    )
    # the share leaves more than the margin and start-up need: no margin is taken
    assert budget.reserve[-1].bytes == 0
    assert budget.kv_memory_bytes == math.ceil(total * 0.8) - 12 * GIB - budget.reserve_bytes


def test_a_given_kv_budget_turns_the_extensible_cache_off_in_034() -> None:
    budget = memory_budget(preset("kimi-linear-48b"), linear_h200(kv_memory_bytes=40 * GIB))
    assert budget.kv_memory_bytes == 40 * GIB and budget.kv_reserved_bytes is None
    assert [term.name for term in budget.reserve] == ["activation_peak", "cuda_graphs", "non_torch"]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"engine_version": "0.33.0", "extensible_kv_cache": True}, "0.33.0"),
        ({"engine_version": "0.33.0", "extensible_kv_cache": False}, "0.33.0"),
        ({"extensible_kv_cache": True, "kv_memory_bytes": 40 * GIB}, "kv_memory_bytes"),
    ],
)
def test_a_switch_the_release_refuses_is_refused(fields: dict[str, Any], named: str) -> None:
    for ask in (
        lambda: plan(preset("kimi-linear-48b"), linear_h200(**fields)),
        lambda: vllm_budget(preset("kimi-linear-48b"), linear_h200(**fields), 12 * GIB),
    ):
        with pytest.raises(Refusal) as caught:
            ask()
        assert caught.value.code == "invalid_argument"
        assert caught.value.facts["field"] == "extensible_kv_cache"
        assert named in caught.value.message


def test_the_switch_is_vllms_alone() -> None:
    with pytest.raises(Refusal) as caught:
        plan(preset("kimi-linear-48b"), Deployment(engine="sglang", extensible_kv_cache=False))
    assert "extensible_kv_cache" in caught.value.message


@pytest.mark.parametrize(
    ("switch", "flag"),
    [(True, "--enable-extensible-kv-cache"), (False, "--no-enable-extensible-kv-cache")],
)
def test_the_switch_is_a_serve_flag(switch: bool, flag: str) -> None:
    flags = dict(vllm_flags(linear_h200(extensible_kv_cache=switch), preset("kimi-linear-48b")))
    assert flags[flag] == ""
    assert not any("extensible" in name for name, _ in vllm_flags(linear_h200(), preset("kimi-k3")))


# --- the default block of a stage without attention -----------------------------------------


@pytest.mark.parametrize(("release", "block"), [("0.33.0", 16), ("0.34.0", 64)])
def test_a_kda_only_stage_keeps_the_releases_default_block(release: str, block: int) -> None:
    linear = preset("kimi-linear-48b")
    p = plan_vllm(linear, Deployment(pp=2, pp_partition=(3, 24), engine_version=release))
    stage0 = [g for g in p.groups if set(g.layers) <= {0, 1, 2}]
    assert stage0 and {p.span_tokens(g) for g in stage0} == {block}
    # the page and the groups do not change (the notes: 10 groups, block 3,840)
    other = plan_vllm(linear, Deployment(pp=2, pp_partition=(3, 24)))
    assert (p.page_bytes, len(p.groups), p.block_tokens) == (
        other.page_bytes,
        len(other.groups),
        3840,
    )


# --- MTP on Kimi-Linear: refused by both, for each release's reason -------------------------


@pytest.mark.parametrize(
    ("release", "why"),
    [("0.33.0", "NotImplementedError"), ("0.34.0", "duplicate layer name")],
)
def test_kimi_linear_mtp_is_refused_with_the_releases_reason(
    tmp_path: Path, release: str, why: str
) -> None:
    data = json.loads((FIXTURES / "kimi-linear-48b-a3b.config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**data, "num_nextn_predict_layers": 1}))
    linear = load_config(tmp_path / "config.json")
    assert linear.drafter == "mtp"
    with pytest.raises(Refusal) as caught:
        plan(linear, Deployment(spec_tokens=1, engine_version=release))
    assert caught.value.code == "draft_unsupported" and why in caught.value.message
    assert caught.value.facts["engine_version"] == release
    ngram = Deployment(spec_tokens=1, speculative_method="ngram")
    assert plan_vllm(linear, ngram).block_tokens > 0


# --- GLM-5.3-Flash's KDA short convolutions --------------------------------------------------


def test_034_fuses_glms_three_kda_convolutions_into_one_weight() -> None:
    glm = model_from_config(config(**DECLARED))
    shapes = {}
    for release in VLLM_VERSIONS:
        weights = weights_per_rank(glm, Deployment(attn_tp=8, engine_version=release))
        shapes[release] = {
            t.name.rsplit(".", 2)[-2]: t.shape
            for g in weights.stages[0].groups
            for t in g.tensors
            if t.name.endswith("conv1d.weight")
        }
        totals = weights.max_bytes
        assert totals == 79_115_999_720  # the same bytes (the notes: 79,115,999,720)
    assert shapes["0.33.0"] == {f"{x}_conv1d": (1024, 1, 4) for x in "qkv"}
    assert shapes["0.34.0"] == {"conv1d": (3072, 1, 4)}
