"""Probe: vLLM's command-line parsing (0.33 and 0.34, whichever is installed) and per-worker
KV-cache budget, run on CPU through ``vllm_budget`` (vLLM's parser, ``create_engine_config`` and
``determine_available_memory`` with the device's memory faked). Each test states one rule the
planner is to follow and lets vLLM's own code decide it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from vllm_required import AT_LEAST_034, require_vllm, running

require_vllm()

from vllm_budget import Facts, budget, engine_args, engine_config, moe_parallel  # noqa: E402
from vllm_engine import DSPARK_DRAFT, FIXTURES  # noqa: E402

from k3layout import Deployment, Refusal, plan, preset  # noqa: E402
from k3layout.engines.vllm.releases import RELEASES  # noqa: E402

RELEASE = RELEASES[running()]
"""k3layout's record of the installed release."""
FIXED = ["--no-enable-extensible-kv-cache"] if RELEASE.extensible_kv_cache else []
"""The flags that give 0.33's budget rule (a share fixed before warm-up) in either release."""

GiB = 1 << 30
H200 = 150_754_820_096  # 143,771 MiB: nvidia-smi's "Total" on an H200 (vllm_budget.md)
FACTS = Facts(
    total=H200,
    in_use_at_start=GiB,
    weights=70 * GiB,
    activation_peak=6 * GiB,
    non_torch_increase=GiB // 2,
    cudagraph=3 * GiB,
)


@pytest.fixture(scope="module")
def k3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory holding the K3 fixture's ``config.json``."""
    directory = tmp_path_factory.mktemp("kimi-k3")
    (directory / "config.json").write_text((FIXTURES / "kimi-k3.config.json").read_text())
    return directory


@pytest.fixture(scope="module")
def k3_mtp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The K3 fixture with one MTP module (``num_nextn_predict_layers`` 1)."""
    directory = tmp_path_factory.mktemp("kimi-k3-mtp")
    config = json.loads((FIXTURES / "kimi-k3.config.json").read_text())
    config["text_config"]["num_nextn_predict_layers"] = 1
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def serve(model: Path, *flags: str) -> list[str]:
    """A ``vllm serve`` command line for ``model`` (no tokenizer in the fixture)."""
    return ["--model", str(model), "--skip-tokenizer-init", *flags]


def test_the_default_utilization_is_vllms(k3: Path) -> None:
    assert engine_args(serve(k3)).gpu_memory_utilization == RELEASE.utilization_flag_default
    assert engine_args(serve(k3)).kv_cache_memory_bytes is None
    if AT_LEAST_034:  # resolved by whether the extensible KV cache is on
        on = engine_config(serve(k3, "-tp", "8")).cache_config
        off = engine_config(serve(k3, "-tp", "8", *FIXED)).cache_config
        given = engine_config(serve(k3, "-tp", "8", "--kv-cache-memory-bytes", "40G"))
        assert on.enable_extensible_kv_cache is RELEASE.extensible_kv_cache is True
        assert not off.enable_extensible_kv_cache
        assert not given.cache_config.enable_extensible_kv_cache
        assert on.resolved_gpu_memory_utilization == RELEASE.extensible_utilization
        assert off.resolved_gpu_memory_utilization == RELEASE.default_utilization


def test_a_k3_command_line_becomes_vllms_config(k3: Path) -> None:
    config = engine_config(
        serve(
            k3,
            *("-tp", "8", "-dcp", "8", "--kv-cache-dtype", "fp8", "--block-size", "64"),
            *("--max-model-len", "131072", "--max-num-seqs", "96"),
            *("--gpu-memory-utilization", "0.85", "--attention-backend", "FLASHMLA"),
        )
    )
    parallel, cache = config.parallel_config, config.cache_config
    assert (parallel.tensor_parallel_size, parallel.decode_context_parallel_size) == (8, 8)
    assert (parallel.world_size, parallel.data_parallel_size) == (8, 1)
    assert (cache.cache_dtype, cache.block_size, cache.gpu_memory_utilization) == ("fp8", 64, 0.85)
    assert (cache.enable_prefix_caching, cache.mamba_cache_mode) == (True, "align")
    assert config.model_config.max_model_len == 131072
    assert config.scheduler_config.max_num_seqs == 96
    assert config.attention_config.backend.name == "FLASHMLA"


def test_prefix_caching_off_sets_the_kda_cache_mode_to_none(k3: Path) -> None:
    config = engine_config(serve(k3, "-tp", "8", "--no-enable-prefix-caching"))
    assert (config.cache_config.enable_prefix_caching, config.cache_config.mamba_cache_mode) == (
        False,
        "none",
    )


def test_dspark_and_mtp_drafters_parse(k3: Path, k3_mtp: Path) -> None:
    dspark = {"method": "dspark", "model": str(DSPARK_DRAFT), "num_speculative_tokens": 3}
    spec = engine_config(
        serve(k3, "-tp", "8", "--speculative-config", json.dumps(dspark))
    ).speculative_config
    assert (spec.method, spec.num_speculative_tokens) == ("dspark", 3)
    assert spec.draft_model_config.architectures == ["K3DSparkModel"]
    mtp = {"method": "mtp", "num_speculative_tokens": 1}
    spec = engine_config(
        serve(k3_mtp, "-tp", "8", "--speculative-config", json.dumps(mtp))
    ).speculative_config
    assert (spec.method, spec.num_speculative_tokens) == ("mtp", 1)
    assert spec.draft_model_config.hf_config.model_type == "kimi_k3_mtp"


@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("utilization", [0.5, 0.85, 0.92, 0.95])
def test_the_budget_is_the_requested_share_less_what_the_worker_measured(
    k3: Path, utilization: float, fixed: bool
) -> None:
    flags = ("-tp", "8", "--gpu-memory-utilization", str(utilization), *(FIXED if fixed else []))
    config = engine_config(serve(k3, *flags))
    measured = FACTS.weights + FACTS.activation_peak + FACTS.non_torch_increase
    # the CUDA graphs are measured before the cache is sized, unless it is extensible
    if fixed or not RELEASE.extensible_kv_cache:
        measured += FACTS.cudagraph
    assert budget(config, FACTS) == math.ceil(H200 * utilization) - measured


@pytest.mark.parametrize("fixed", [False, True])
def test_memory_in_use_at_start_does_not_shrink_the_budget(k3: Path, fixed: bool) -> None:
    config = engine_config(serve(k3, "-tp", "8", *(FIXED if fixed else [])))
    busy = Facts(**{**FACTS.__dict__, "in_use_at_start": 8 * GiB})
    assert budget(config, busy) == budget(config, FACTS)


def test_a_worker_without_the_requested_share_free_refuses_to_start(k3: Path) -> None:
    flags = ("-tp", "8", "--gpu-memory-utilization", "0.95")
    crowded = Facts(**{**FACTS.__dict__, "in_use_at_start": H200 // 20 + 1})
    with pytest.raises(ValueError, match="less than desired GPU memory utilization"):
        budget(engine_config(serve(k3, *flags, *FIXED)), crowded)
    if RELEASE.extensible_kv_cache:  # the share is only a cap: it starts
        assert budget(engine_config(serve(k3, *flags)), crowded) > 0


def test_eager_mode_measures_no_cuda_graphs(k3: Path) -> None:
    config = engine_config(serve(k3, "-tp", "8", "--enforce-eager", *FIXED))
    assert budget(config, FACTS) == budget(engine_config(serve(k3, "-tp", "8", *FIXED)), FACTS) + (
        FACTS.cudagraph
    )


def test_the_extensible_cache_measures_no_cuda_graphs_before_warm_up(k3: Path) -> None:
    if not RELEASE.extensible_kv_cache:  # 0.33's parser has no such flag; k3layout refuses it
        with pytest.raises(SystemExit):
            engine_args(serve(k3, "--enable-extensible-kv-cache"))
        with pytest.raises(Refusal) as caught:
            plan(
                preset("kimi-k3"),
                Deployment(engine_version=RELEASE.version, extensible_kv_cache=True),
            )
        assert caught.value.facts["field"] == "extensible_kv_cache"
        return
    config = engine_config(serve(k3, "-tp", "8"))
    measured = FACTS.weights + FACTS.activation_peak + FACTS.non_torch_increase
    assert budget(config, FACTS) == math.ceil(H200 * RELEASE.extensible_utilization) - measured


def test_the_cuda_graph_estimate_can_be_switched_off(
    k3: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = engine_config(serve(k3, "-tp", "8", *FIXED))
    with_graphs = budget(config, FACTS)
    monkeypatch.setenv("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "0")
    assert budget(config, FACTS) == with_graphs + FACTS.cudagraph


@pytest.mark.parametrize(
    ("flag", "size"), [("40G", 40 * GiB), ("42949672960", 40 * GiB), ("40g", 40 * 10**9)]
)
def test_kv_cache_memory_bytes_is_the_budget_as_given(k3: Path, flag: str, size: int) -> None:
    config = engine_config(serve(k3, "-tp", "8", "--kv-cache-memory-bytes", flag))
    assert budget(config, FACTS) == size
    # even where the device could not hold it: vLLM measures nothing against it
    assert budget(config, Facts(total=16 * GiB, weights=15 * GiB)) == size


@pytest.mark.parametrize(("dp", "tp"), [(1, 8), (8, 1), (4, 2), (2, 4)])
def test_expert_parallel_spans_every_rank_of_every_engine(k3: Path, dp: int, tp: int) -> None:
    config = engine_config(serve(k3, "-tp", str(tp), "-dp", str(dp), "--enable-expert-parallel"))
    ranks = [moe_parallel(config, d, t) for d in range(dp) for t in range(tp)]
    assert {(m.ep_size, m.tp_size, m.use_ep) for m in ranks} == {(dp * tp, 1, True)}
    assert [m.ep_rank for m in ranks] == list(range(dp * tp))


def test_without_expert_parallel_experts_are_tensor_parallel_over_every_rank(k3: Path) -> None:
    config = engine_config(serve(k3, "-tp", "2", "-dp", "4"))
    moe = moe_parallel(config, 3, 1)
    assert (moe.ep_size, moe.tp_size, moe.tp_rank, moe.use_ep) == (1, 8, 7, False)
