"""Capacity the way vLLM 0.33 counts it: blocks per request by group, ``num_blocks`` for a
budget and the maximum concurrency (``tests/conformance`` checks the same against vLLM)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from deployments import BY_ENGINE, write_k3_mxfp4

from k3layout import Deployment, HybridModel, Refusal, plan, plan_vllm, preset

GIB = 1 << 30


def blocks(model: HybridModel, length: int = 8192, **fields: object) -> list[int]:
    p = plan_vllm(model, Deployment.model_validate({"attn_tp": 8, **fields}))
    return [g.blocks for g in p.capacity(40 * GIB, length).blocks_per_request]


def test_flashkdas_checkpoint_block_takes_k3_dspark_from_18_to_21(k3_dspark: HybridModel) -> None:
    # vLLM #54458: 3 KDA groups x (2 + 2 spec) + 6 attention blocks, plus one checkpoint each
    assert blocks(k3_dspark, spec_tokens=2, kda_prefill_backend="triton") == [4, 4, 4, 6]
    assert blocks(k3_dspark, spec_tokens=2) == [5, 5, 5, 6]  # auto: FlashKDA for K3
    p = plan_vllm(k3_dspark, Deployment(attn_tp=8, spec_tokens=2))
    capacity = p.capacity(40 * GIB, 8192)
    assert capacity.num_blocks == 40 * GIB // (29 * 884_736) == 1673
    assert capacity.total_blocks_per_request == 21
    assert capacity.max_concurrency == 1673 / 21
    assert capacity.kda_prefill_backend == "flashkda" and capacity.mamba_cache_mode == "align"


def test_state_blocks_do_not_grow_with_the_context(k3: HybridModel) -> None:
    assert blocks(k3, 8192) == [3, 3, 3, 6]
    assert blocks(k3, 1_000_000) == [3, 3, 3, 652]  # ceil(1e6 / 1536)


def test_without_prefix_caching_a_request_holds_one_state_block(k3: HybridModel) -> None:
    # "none" mode: 1 + spec blocks, and no checkpoint (there is no internal checkpoint)
    assert blocks(k3, prefix_caching=False, spec_tokens=3) == [4, 4, 4, 6]
    p = plan_vllm(k3, Deployment(attn_tp=8, prefix_caching=False))
    assert p.capacity(40 * GIB, 8192).kda_span_tokens == 8192  # one state spans the request
    assert plan_vllm(k3, Deployment(attn_tp=8)).capacity(40 * GIB, 8192).kda_span_tokens == 1536
    # vLLM 0.33 resolves the deprecated flag by prefix caching, whatever was asked for
    asked = Deployment(mamba_cache_mode="none")
    assert asked.mamba_cache_mode_run == "align"
    assert Deployment(prefix_caching=False, mamba_cache_mode="align").mamba_cache_mode_run == "none"


def test_dcp_deals_the_tokens_of_a_request(k3: HybridModel) -> None:
    assert blocks(k3, 100_000, dcp=8)[-1] == -(-(100_000 // 8) // 1536) == 9


def test_replayssm_keeps_no_per_draft_token_state_blocks(k3: HybridModel) -> None:
    assert blocks(k3, spec_tokens=3, replayssm=True, kda_prefill_backend="triton")[:3] == [2] * 3


def test_a_budget_short_of_one_full_request_is_refused_as_vllm_refuses_to_start(
    k3: HybridModel,
) -> None:
    p = plan_vllm(k3, Deployment(attn_tp=8))
    block = p.block_bytes
    per_request = 3 * 3 + 66  # 3 KDA groups x 3, ceil(100,000 / 1536) attention blocks
    enough = (per_request + 1) * block
    assert p.capacity(enough, 100_000).total_blocks_per_request == per_request
    with pytest.raises(Refusal) as refused:
        p.capacity(enough - 1, 100_000)
    assert refused.value.code == "budget_too_small"
    assert refused.value.facts["blocks_per_request"] == per_request
    assert f"{enough:,}" in (refused.value.hint or "")


def test_kimi_linear_has_one_prefill_path(kimi_linear: HybridModel) -> None:
    p = plan_vllm(kimi_linear, Deployment(attn_tp=4))
    assert p.capacity(8 * GIB, 4096).kda_prefill_backend == "triton"
    with pytest.raises(Refusal) as refused:
        plan_vllm(kimi_linear, Deployment(attn_tp=4, kda_prefill_backend="flashkda")).capacity(
            8 * GIB, 4096
        )
    assert refused.value.code == "kernel_unsupported"


@pytest.mark.parametrize("length", [0, -5, 1 << 40])
def test_request_lengths_out_of_range_are_refused(k3: HybridModel, length: int) -> None:
    with pytest.raises(Refusal) as refused:
        plan_vllm(k3, Deployment(attn_tp=8)).capacity(40 * GIB, length)
    assert refused.value.code in ("invalid_argument", "size_limit")


def k3layout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3layout", *args], capture_output=True, text=True, check=False
    )


def test_the_cli_reports_capacity_in_json_and_in_the_table() -> None:
    # Kimi-K3 with its draft at attention TP 8 x DP 16 with expert parallelism on B200s, whose
    # weights fit: a rank's cache is the attention-TP-8 rank's of the test above, so the same
    # 40 GiB gives the same 1,673 blocks of 29 x 884,736 B
    args = ["plan", "--model", "kimi-k3-dspark", "--gpu", "b200", "--attn-tp", "8"]
    args += ["--attn-dp", "16", "--expert-parallel", "--spec-tokens", "2"]
    args += ["--kv-memory-gib", "40", "--max-model-len", "8192"]
    run = k3layout(*args, "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    capacity = report["capacity"]
    assert capacity["num_blocks"] == 1673 and capacity["max_concurrency"] == 1673 / 21
    assert [g["blocks"] for g in capacity["blocks_per_request"]] == [5, 5, 5, 6]
    # the budget the capacity stands on: the KV as given, beside the weights and reserve
    memory = report["memory"]
    assert memory["memory_flag"] == ["--kv-cache-memory-bytes", str(40 * GIB)]
    assert memory["kv_memory_bytes"] == capacity["kv_memory_bytes"] == 40 * GIB
    reserve = sum(term["bytes"] for term in memory["reserve"])
    assert memory["weights_bytes"] + reserve + 40 * GIB <= memory["gpu_memory_bytes"]
    table = k3layout(*args, "--kda-prefill-backend", "triton")
    assert "4 + 4 + 4 + 6 = 18" in table.stdout and "92.94" in table.stdout  # 1673 / 18


def test_a_request_length_without_a_budget_takes_the_gpus_and_mode_all_is_refused(
    kimi_linear: HybridModel,
) -> None:
    # no memory option: the engine's default flag on the GPU gives the KV budget
    run = k3layout("plan", "--model", "kimi-linear-48b", "--max-model-len", "8192", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    budget = plan(kimi_linear, Deployment()).memory()
    # vLLM 0.34's default: all of the GPU, the extensible KV cache shrinking after warm-up
    assert report["memory"]["memory_flag"] == ["--gpu-memory-utilization", "1"]
    assert report["capacity"]["kv_memory_bytes"] == budget.kv_memory_bytes > 0
    # Kimi-K3 bf16 on one H200 (the defaults): its weights do not fit, so there is no budget
    refused = k3layout("plan", "--max-model-len", "8192")
    assert refused.returncode == 2 and "weights_do_not_fit" in refused.stderr
    with pytest.raises(Refusal) as caught:
        plan(preset("kimi-k3"), Deployment()).memory()
    assert caught.value.code == "weights_do_not_fit"
    assert k3layout("plan", "--mamba-cache-mode", "all").returncode == 2


@pytest.mark.parametrize("engine", ["vllm", "tokenspeed", "sglang"])
def test_the_cli_answers_how_many_requests_fit_and_the_memory_for_n(
    engine: str, tmp_path: Path
) -> None:
    # a deployment whose weights fit, a KV budget its GPU holds and a workload its default
    # flag holds: Kimi-K3 on 128 B200s (vLLM), Kimi-K3 MXFP4 on 64 H200s (tokenspeed),
    # Kimi-Linear on 8 H200s (SGLang)
    case = BY_ENGINE[engine]
    gib, requests = {"vllm": (40, 8), "tokenspeed": (40, 8), "sglang": (60, 64)}[engine]
    base = ["plan", *case.options(write_k3_mxfp4(tmp_path)), "--max-model-len", "131072"]
    run = k3layout(*base, "--kv-memory-gib", str(gib), "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    capacity = report["capacity"]
    if engine == "vllm":
        assert capacity["kv_memory_bytes"] == gib << 30
    else:  # the least fraction (in thousandths) that gives the budget: at least as much
        assert capacity["kv_memory_bytes"] >= gib << 30
    assert capacity["kv_memory_bytes"] == report["memory"]["kv_memory_bytes"]
    assert capacity["max_requests"] >= 1
    assert capacity["tokens_held"] == capacity["max_requests"] * 131_072
    asked = k3layout(*base, "--requests", str(requests), "--json")
    assert asked.returncode == 0, asked.stderr
    least = json.loads(asked.stdout)["capacity"]
    assert least["max_requests"] >= requests
    assert least["kv_memory_bytes"] == case.plan().memory_for(requests, 131_072)
    fewer = k3layout(*base, "--kv-memory-gib", str((least["kv_memory_bytes"] - 1) / (1 << 30)))
    table = k3layout(*base, "--requests", str(requests))
    assert f"KV memory per rank for {requests} requests (least)" in table.stdout
    assert "requests of 131,072 tokens held at once" in table.stdout
    assert "waste" in table.stdout and "KDA state share" in table.stdout
    assert "GPU memory per rank (the least flag that holds them)" in table.stdout
    assert fewer.returncode in (0, 2)


def test_options_that_do_not_apply_to_the_engine_are_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    run = k3layout("plan", "--engine", "vllm", "--kv-memory-gib", "60", "--max-live", "4")
    assert run.returncode == 2 and "--max-live sizes tokenspeed's arena" in run.stderr
    run = k3layout("plan", "--engine", "vllm", "--max-padding", "0.3")
    assert run.returncode == 2 and "max_padding" in run.stderr
    run = k3layout("plan", "--engine", "sglang", "--max-padding", "0.3")
    assert run.returncode == 2 and "max_padding" in run.stderr
    run = k3layout("plan", "--kv-memory-gib", "60", "--requests", "4")
    assert run.returncode == 2 and "give one" in run.stderr
    # tokenspeed takes both, and its capacity with a budget (once refused), on a deployment
    # whose weights fit (Kimi-K3 MXFP4 on 64 H200s)
    options = BY_ENGINE["tokenspeed"].options(write_k3_mxfp4(tmp_path))
    run = k3layout("plan", *options, "--kv-memory-gib", "40", "--max-model-len", "8192")
    assert run.returncode == 0, run.stderr
    run = k3layout("plan", *options, "--kv-memory-gib", "40", "--max-live", "4")
    assert run.returncode == 0, run.stderr


def test_under_pp_the_table_says_which_rows_are_the_whole_models_and_which_a_stages() -> None:
    # Kimi-K3 over 2 stages of 128 B200s (its weights fit)
    options = ["--gpu", "b200", "--attn-tp", "8", "--attn-dp", "16", "--expert-parallel"]
    run = k3layout("plan", *options, "--pp", "2", "--kv-memory-gib", "60")
    assert run.returncode == 0, run.stderr
    assert "planes (group_size) (whole model)" in run.stdout
    assert "bytes / token (attention cache) (whole model)" in run.stdout
    assert "num_blocks (stage 0, every group's pool)" in run.stdout
    assert "pipeline stages" in run.stdout  # each stage's own planes and block bytes
    single = k3layout("plan", "--attn-tp", "8")
    assert "whole model" not in single.stdout
