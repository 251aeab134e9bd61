"""Every vLLM recommendation starts in vLLM 0.33's own sizing and holds what it promises: with
``--kv-cache-memory-bytes`` and ``--max-model-len`` as recommended, vLLM builds its KV-cache
config, ``--max-num-seqs`` is within its blocks (vLLM refuses a Mamba model's full CUDA
graphs otherwise, vllm #49064), and its max concurrency covers N requests of L tokens."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from vllm_required import require_vllm

require_vllm()

from test_conformance_layout import deployment, planner_model  # noqa: E402
from vllm_engine import Case, max_concurrency, start  # noqa: E402

from k3layout import Refusal, VllmPlan, plan  # noqa: E402


def grid() -> list[tuple[Case, int]]:
    """N x L x TP x dtype x GPU (by backend) x speculative depth, and the issue's cases."""
    cases: list[tuple[Case, int]] = []
    for requests, length in ((64, 131_072), (1, 1 << 20), (300, 8192), (16, 65_536)):
        for tp, dtype in ((8, "fp8"), (1, "bf16"), (16, "fp8")):
            cases.append((Case(attn_tp=tp, kv_dtype=dtype, max_model_len=length), requests))
        cases.append((Case(attn_tp=8, backend="FLASHINFER_MLA", max_model_len=length), requests))
        cases.append(
            (
                Case(attn_tp=8, drafter="dspark", spec_tokens=2, max_model_len=length),
                requests,
            )
        )
    # vllm #49064: many short requests, where a guessed max_num_seqs overshoots the blocks
    cases.append((Case(attn_tp=8, max_model_len=4096), 1024))
    cases.append((Case(attn_tp=8, pp=2, max_model_len=32_768), 48))
    cases.append((Case(attn_tp=8, kda_prefill_backend="flashkda", max_model_len=131_072), 64))
    return cases


@pytest.mark.parametrize(("case", "requests"), grid(), ids=str)
def test_the_recommended_flags_start_and_hold_the_workload(
    case: Case, requests: int, tmp_path: Path
) -> None:
    result = plan(planner_model(case, tmp_path), deployment(case))
    assert isinstance(result, VllmPlan)
    got = result.recommend(requests, case.max_model_len)
    flags = dict(got.flags)
    assert flags["--max-model-len"] == str(case.max_model_len)
    memory = int(flags["--kv-cache-memory-bytes"])
    engine = start(replace(case, memory_bytes=memory), tmp_path)
    num_blocks = engine.kv_cache_configs[0].num_blocks
    assert int(flags["--max-num-seqs"]) <= num_blocks  # vLLM's check for full CUDA graphs
    assert math.floor(max_concurrency(engine)) >= requests
    assert got.capacity.max_requests == math.floor(max_concurrency(engine))
    with pytest.raises(Refusal) as caught:
        result.recommend(requests, case.max_model_len, memory - 1)
    assert caught.value.code == "budget_too_small"
