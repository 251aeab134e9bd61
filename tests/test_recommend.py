"""``recommend``: the engine's flags for N requests of L tokens, the capacity they give and the
memory left over, for every engine; a budget that cannot hold the workload is refused naming
the most it holds and the memory needed. The engines' own startup sizing checks the flags in
the conformance suites (``test_conformance_recommend.py``,
``test_conformance_sglang_recommend.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import Deployment, Recommendation, Refusal, plan, preset, recommend

ENGINES = ("vllm", "tokenspeed", "sglang")
FLAGS = {
    "vllm": ("--max-num-seqs", "--max-model-len", "--kv-cache-memory-bytes"),
    "sglang": (
        "--max-running-requests",
        "--max-mamba-cache-size",
        "--max-total-tokens",
        "--context-length",
    ),
    "tokenspeed": ("--max-num-seqs", "--max-total-tokens", "--max-model-len"),
}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_flags_hold_the_workload_in_the_least_memory(engine: str) -> None:
    k3 = preset("kimi-k3")
    got = recommend(k3, Deployment(engine=engine, attn_tp=8), requests=64, max_model_len=131_072)
    assert isinstance(got, Recommendation)
    assert tuple(flag for flag, _ in got.flags) == FLAGS[engine]
    assert got.capacity.max_requests >= 64
    assert got.capacity.tokens_held >= 64 * 131_072
    assert got.kv_memory_bytes == got.needed_bytes and got.unused_bytes == 0
    assert got.command_line.startswith(FLAGS[engine][0] + " ")
    # with the budget of its own answer it recommends the same flags
    again = recommend(
        k3,
        Deployment(engine=engine, attn_tp=8),
        requests=64,
        max_model_len=131_072,
        kv_memory_bytes=got.needed_bytes,
    )
    assert again.flags == got.flags


@pytest.mark.parametrize("engine", ENGINES)
def test_a_budget_too_small_names_the_most_it_holds_and_the_memory_needed(engine: str) -> None:
    k3 = preset("kimi-k3")
    deployment = Deployment(engine=engine, attn_tp=8)
    least = recommend(k3, deployment, requests=64, max_model_len=131_072).needed_bytes
    with pytest.raises(Refusal) as caught:
        recommend(k3, deployment, requests=64, max_model_len=131_072, kv_memory_bytes=60 << 30)
    facts = caught.value.facts
    assert caught.value.code == "budget_too_small"
    assert facts["needed_bytes"] == least
    held = plan(k3, deployment).capacity(60 << 30, 131_072).max_requests
    assert facts["max_requests"] == held < 64
    # a bigger budget than needed: the rest is left unused
    roomy = recommend(k3, deployment, requests=8, max_model_len=131_072, kv_memory_bytes=60 << 30)
    assert roomy.unused_bytes == (60 << 30) - roomy.needed_bytes > 0


def test_sglangs_state_pool_is_sized_for_the_requests_not_the_context() -> None:
    # sglang #33004: the default ratio leaves a state pool sized from the context alone
    k3 = preset("kimi-k3")
    deployment = Deployment(engine="sglang", attn_tp=8)
    got = recommend(k3, deployment, requests=64, max_model_len=131_072)
    flags = dict(got.flags)
    assert flags["--max-mamba-cache-size"] == str(64 * 5)  # 5 slots a request under the radix
    assert got.needed_bytes < plan(k3, deployment).memory_for(64, 131_072)


@settings(max_examples=40, deadline=None)
@given(
    engine=st.sampled_from(ENGINES),
    attn_tp=st.sampled_from((1, 2, 4, 8, 16)),
    kv_dtype=st.sampled_from(("fp8", "bf16")),
    gpu=st.sampled_from(("h100", "h200", "b200")),
    workload=st.tuples(st.integers(1, 200), st.integers(1024, 1 << 20)),
)
def test_every_recommendation_holds_what_it_promises_and_no_less_memory_does(
    engine: str, attn_tp: int, kv_dtype: str, gpu: str, workload: tuple[int, int]
) -> None:
    requests, length = workload
    deployment = Deployment.model_validate(
        {"engine": engine, "attn_tp": attn_tp, "kv_dtype": kv_dtype, "gpu": gpu}
    )
    try:
        got = recommend(preset("kimi-k3"), deployment, requests=requests, max_model_len=length)
    except Refusal as refusal:
        assert refusal.code in {"padding_limit", "size_limit"}  # tokenspeed bf16 TP 32
        return
    assert got.capacity.max_requests >= requests
    assert got.capacity.tokens_held >= requests * length
    with pytest.raises(Refusal) as caught:
        recommend(
            preset("kimi-k3"),
            deployment,
            requests=requests,
            max_model_len=length,
            kv_memory_bytes=got.needed_bytes - 1,
        )
    assert caught.value.code == "budget_too_small"


def test_the_cli_prints_the_flags_and_their_capacity() -> None:
    def k3layout(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "k3layout", "recommend", *args],
            capture_output=True,
            text=True,
            check=False,
        )

    base = ("--engine", "sglang", "--attn-tp", "8", "--requests", "64", "--max-model-len", "131072")
    table = k3layout(*base)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[1].startswith("--max-running-requests 64 ")
    data = json.loads(k3layout(*base, "--json").stdout)
    assert data["capacity"]["max_requests"] >= 64
    refused = k3layout(*base, "--kv-memory-gib", "60", "--json")
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["refused"]["code"] == "budget_too_small"


def test_the_sweep_trades_requests_against_context_with_the_recommended_flags() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "k3layout",
            "sweep",
            "--attn-tp",
            "8",
            "--kv-memory-gib",
            "60",
            "--contexts",
            "8192,131072",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    rows = {(r["engine"], r["max_model_len"]): r for r in json.loads(run.stdout)}
    assert set(rows) == {(e, n) for e in ENGINES for n in (8192, 131_072)}
    for (engine, length), row in rows.items():
        # the most the recommended flags serve: one more does not fit in 60 GiB
        deployment = Deployment(engine=engine, attn_tp=8)
        with pytest.raises(Refusal):
            recommend(
                preset("kimi-k3"),
                deployment,
                requests=row["max_requests"] + 1,
                max_model_len=length,
                kv_memory_bytes=60 << 30,
            )
        assert row["flags"].split()[1] == str(row["max_requests"])
    # SGLang's state pool sized for the requests serves more than its default split
    held = plan(preset("kimi-k3"), Deployment(engine="sglang", attn_tp=8))
    assert rows[("sglang", 131_072)]["max_requests"] > held.capacity(60 << 30, 131_072).max_requests
