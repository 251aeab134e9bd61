"""Capacity the way vLLM 0.33 counts it: blocks per request by group, ``num_blocks`` for a
budget and the maximum concurrency (``tests/conformance`` checks the same against vLLM)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from k3layout import Deployment, HybridModel, Refusal, plan_vllm

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
    args = ["plan", "--model", "kimi-k3-dspark", "--attn-tp", "8", "--spec-tokens", "2"]
    args += ["--kv-memory-gib", "40", "--max-model-len", "8192"]
    run = k3layout(*args, "--json")
    assert run.returncode == 0, run.stderr
    capacity = json.loads(run.stdout)["capacity"]
    assert capacity["num_blocks"] == 1673 and capacity["max_concurrency"] == 1673 / 21
    assert [g["blocks"] for g in capacity["blocks_per_request"]] == [5, 5, 5, 6]
    table = k3layout(*args, "--kda-prefill-backend", "triton")
    assert "4 + 4 + 4 + 6 = 18" in table.stdout and "92.94" in table.stdout


def test_the_cli_refuses_a_request_length_without_a_budget_and_mode_all() -> None:
    run = k3layout("plan", "--max-model-len", "8192")
    assert run.returncode == 2 and "--kv-memory-gib" in run.stdout + run.stderr
    assert k3layout("plan", "--mamba-cache-mode", "all").returncode == 2


@pytest.mark.parametrize("engine", ["vllm", "tokenspeed", "sglang"])
def test_the_cli_answers_how_many_requests_fit_and_the_memory_for_n(engine: str) -> None:
    base = ["plan", "--engine", engine, "--attn-tp", "8", "--max-model-len", "131072"]
    run = k3layout(*base, "--kv-memory-gib", "60", "--json")
    assert run.returncode == 0, run.stderr
    capacity = json.loads(run.stdout)["capacity"]
    assert capacity["kv_memory_bytes"] == 60 << 30
    assert capacity["max_requests"] >= 1
    assert capacity["tokens_held"] == capacity["max_requests"] * 131_072
    asked = k3layout(*base, "--requests", "64", "--json")
    assert asked.returncode == 0, asked.stderr
    least = json.loads(asked.stdout)["capacity"]
    assert least["max_requests"] >= 64
    fewer = k3layout(*base, "--kv-memory-gib", str((least["kv_memory_bytes"] - 1) / (1 << 30)))
    table = k3layout(*base, "--requests", "64")
    assert "KV memory per rank for 64 requests (least)" in table.stdout
    assert "requests of 131,072 tokens held at once" in table.stdout
    assert "waste" in table.stdout and "KDA state share" in table.stdout
    assert fewer.returncode in (0, 2)


def test_options_that_do_not_apply_to_the_engine_are_refused_with_the_reason() -> None:
    run = k3layout("plan", "--engine", "vllm", "--kv-memory-gib", "60", "--max-live", "4")
    assert run.returncode == 2 and "--max-live sizes tokenspeed's arena" in run.stderr
    run = k3layout("plan", "--engine", "vllm", "--max-padding", "0.3")
    assert run.returncode == 2 and "max_padding" in run.stderr
    run = k3layout("plan", "--engine", "sglang", "--max-padding", "0.3")
    assert run.returncode == 2 and "max_padding" in run.stderr
    run = k3layout("plan", "--kv-memory-gib", "60", "--requests", "4")
    assert run.returncode == 2 and "give one" in run.stderr
    # tokenspeed takes both, and its capacity with a budget (once refused)
    run = k3layout(
        "plan", "--engine", "tokenspeed", "--kv-memory-gib", "60", "--max-model-len", "8192"
    )
    assert run.returncode == 0, run.stderr


def test_under_pp_the_table_says_which_rows_are_the_whole_models_and_which_a_stages() -> None:
    run = k3layout("plan", "--attn-tp", "8", "--pp", "2", "--kv-memory-gib", "60")
    assert run.returncode == 0, run.stderr
    assert "planes (group_size) (whole model)" in run.stdout
    assert "bytes / token (attention cache) (whole model)" in run.stdout
    assert "num_blocks (stage 0, every group's pool)" in run.stdout
    assert "pipeline stages" in run.stdout  # each stage's own planes and block bytes
    single = k3layout("plan", "--attn-tp", "8")
    assert "whole model" not in single.stdout
