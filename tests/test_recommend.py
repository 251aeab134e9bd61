"""``recommend``: the engine's flags for N requests of L tokens, the capacity they give and the
memory left over, for every engine; a budget that cannot hold the workload is refused naming
the most it holds and the memory needed. The engines' own startup sizing checks the flags in
the conformance suites (``test_conformance_recommend.py``,
``test_conformance_sglang_recommend.py``).

Every answer stands on the GPU's budget (issue 29), so the deployments here are ones whose
weights fit their GPU (:mod:`deployments`); ``test_memory.py`` checks the budget itself."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from deployments import BY_ENGINE, FITTING, Case, model_named, write_k3_mxfp4
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import (
    Deployment,
    HybridModel,
    Recommendation,
    Refusal,
    memory_budget,
    plan,
    preset,
    recommend,
)

LIMITS = {
    "vllm": ("--max-num-seqs", "--max-model-len"),
    "sglang": (
        "--max-running-requests",
        "--max-mamba-cache-size",
        "--max-total-tokens",
        "--context-length",
    ),
    "tokenspeed": ("--max-num-seqs", "--max-total-tokens", "--max-model-len"),
}
"""The workload's limits, after the launch flags and the memory flag."""

MEMORY_FLAG = {
    "vllm": ("--kv-cache-memory-bytes", None),
    "sglang": ("--mem-fraction-static", "mem_fraction_static"),
    "tokenspeed": ("--gpu-memory-utilization", "gpu_memory_utilization"),
}
"""The memory flag each engine's least budget sets, and the deployment field of a fraction."""

REQUESTS_FLAG = {
    "vllm": "--max-num-seqs",
    "sglang": "--max-running-requests",
    "tokenspeed": "--max-num-seqs",
}
"""The flag that counts the requests (over every attention-DP replica in SGLang and
tokenspeed)."""


def ids(case: Case) -> str:
    return case.id


def bare(model: HybridModel) -> HybridModel:
    """``model`` without its architecture: its weights are not modelled, so a KV budget is taken
    as given and only the KV arithmetic decides (:func:`k3layout.layouts.recommend.gpu_budget`)."""
    fields = {name: getattr(model, name) for name in HybridModel.model_fields}
    return HybridModel.model_validate({**fields, "architecture": None})


def one_step_less(value: str) -> float:
    """The fraction one thousandth under ``value`` (the least fraction's step)."""
    return (math.ceil(round(float(value) * 1000, 6)) - 1) / 1000


@pytest.mark.parametrize("case", FITTING, ids=ids)
def test_the_flags_hold_the_workload_in_the_least_memory(case: Case) -> None:
    model, deployment = case.loaded(), case.deployment()
    got = recommend(model, deployment, requests=case.requests, max_model_len=case.max_model_len)
    assert isinstance(got, Recommendation)
    launch = plan(model, deployment).launch_flags()
    assert got.memory is not None
    flag, value = got.memory.memory_flag
    assert flag == MEMORY_FLAG[case.engine][0]
    assert got.flags[: len(launch) + 1] == (*launch, got.memory.memory_flag)
    assert tuple(name for name, _ in got.flags[len(launch) + 1 :]) == LIMITS[case.engine]
    assert got.capacity.max_requests >= case.requests
    assert got.capacity.tokens_held >= case.requests * case.max_model_len
    assert got.kv_memory_bytes == got.memory.kv_memory_bytes >= got.needed_bytes
    assert got.unused_bytes == got.kv_memory_bytes - got.needed_bytes
    field = MEMORY_FLAG[case.engine][1]
    if field is None:  # vLLM takes the KV budget in bytes: exactly the least
        assert value == str(got.needed_bytes) and got.unused_bytes == 0
    else:  # a fraction in thousandths: one thousandth less leaves less KV than needed
        less = {field: one_step_less(value)}
        try:
            assert memory_budget(model, case.deployment(**less)).kv_memory_bytes < got.needed_bytes
        except Refusal as refusal:  # or none at all
            assert refusal.code == "memory_exceeded"
    assert got.command_line.startswith(launch[0][0] + " ")
    assert got.launch_line.endswith(" MODEL " + got.command_line)
    # with the budget of its own answer it recommends the same flags
    again = recommend(
        model,
        deployment,
        requests=case.requests,
        max_model_len=case.max_model_len,
        kv_memory_bytes=got.needed_bytes,
    )
    assert again.flags == got.flags


def _held(case: Case, kv_memory_bytes: int) -> int:
    """What the deployment's own plan holds of the case's context in ``kv_memory_bytes``."""
    try:
        held: int = case.plan().capacity(kv_memory_bytes, case.max_model_len).max_requests
        return held
    except Refusal as refusal:
        assert refusal.code == "budget_too_small"
        return 0


@pytest.mark.parametrize("case", FITTING, ids=ids)
def test_a_budget_too_small_names_the_most_it_holds_and_the_memory_needed(case: Case) -> None:
    model, deployment = case.loaded(), case.deployment()
    workload = {"requests": case.requests, "max_model_len": case.max_model_len}
    least = recommend(model, deployment, **workload).needed_bytes
    small = least * 2 // 3  # under the default flag's KV (which holds least): the GPU holds it
    with pytest.raises(Refusal) as caught:
        recommend(model, deployment, **workload, kv_memory_bytes=small)
    facts = caught.value.facts
    assert caught.value.code == "budget_too_small"
    assert facts["needed_bytes"] == least
    given_kv = facts["kv_memory_bytes"]
    assert isinstance(given_kv, int)
    if case.engine == "vllm":
        assert given_kv == small
    else:  # the least fraction (in thousandths) that gives the budget
        assert small <= given_kv < least
    assert facts["max_requests"] == _held(case, given_kv) < case.requests
    # a bigger budget than needed: the rest is left unused
    roomy = recommend(
        model,
        deployment,
        requests=1,
        max_model_len=case.max_model_len,
        kv_memory_bytes=small,
    )
    assert roomy.kv_memory_bytes >= small
    assert roomy.unused_bytes == roomy.kv_memory_bytes - roomy.needed_bytes > 0


@pytest.mark.parametrize("case", [FITTING[2], FITTING[3]], ids=ids)
def test_sglangs_state_pool_is_sized_for_the_requests_not_the_context(case: Case) -> None:
    # sglang #33004: the default ratio leaves a state pool sized from the context alone
    model, deployment = case.loaded(), case.deployment()
    got = recommend(model, deployment, requests=case.requests, max_model_len=case.max_model_len)
    flags = dict(got.flags)
    running = case.requests * deployment.attn_dp  # SGLang counts over every DP worker
    assert flags["--max-running-requests"] == str(running)
    assert flags["--max-mamba-cache-size"] == str(running * 5)  # 5 slots a request (radix)
    assert got.needed_bytes < plan(model, deployment).memory_for(case.requests, case.max_model_len)


def log_uniform(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers of ``low`` to ``high`` whose binary magnitude is uniform (workloads the GPU holds
    as often as ones it does not)."""
    return st.integers(low.bit_length(), high.bit_length()).flatmap(
        lambda bits: st.integers(max(low, 1 << (bits - 1)), min(high, (1 << bits) - 1))
    )


@settings(max_examples=40, deadline=None)
@given(
    case=st.sampled_from(FITTING),
    kv_dtype=st.sampled_from(("fp8", "bf16")),
    workload=st.tuples(log_uniform(1, 200), log_uniform(1024, 1 << 20)),
)
def test_every_recommendation_holds_what_it_promises_and_no_less_memory_does(
    case: Case, kv_dtype: str, workload: tuple[int, int]
) -> None:
    requests, length = workload
    model, deployment = case.loaded(), case.deployment(kv_dtype=kv_dtype)
    try:
        got = recommend(model, deployment, requests=requests, max_model_len=length)
    except Refusal as refusal:
        if refusal.code == "memory_exceeded":  # more KV than the default flag leaves: said so
            facts = refusal.facts
            assert facts["kv_memory_bytes"] == plan(model, deployment).memory().kv_memory_bytes
            assert isinstance(facts["needed_bytes"], int)
            assert isinstance(facts["kv_memory_bytes"], int)
            assert facts["needed_bytes"] > facts["kv_memory_bytes"]
            return
        allowed = {"padding_limit", "size_limit", "context_too_long"}
        if (case.engine, kv_dtype) == ("tokenspeed", "fp8"):
            allowed.add("layout_unsupported")  # main: 12 fp8 MLA pages hold no TP 4 state
        assert refusal.code in allowed, refusal
        return
    assert got.capacity.max_requests >= requests
    assert got.capacity.tokens_held >= requests * length
    assert got.memory is not None
    assert got.memory.used_bytes <= got.memory.gpu_memory_bytes
    assert got.kv_memory_bytes >= got.needed_bytes
    # no less memory does: one byte under needed_bytes, by the KV arithmetic alone
    with pytest.raises(Refusal) as caught:
        recommend(
            bare(model),
            deployment,
            requests=requests,
            max_model_len=length,
            kv_memory_bytes=got.needed_bytes - 1,
        )
    assert caught.value.code == "budget_too_small"
    assert caught.value.facts["needed_bytes"] == got.needed_bytes


def k3layout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3layout", *args], capture_output=True, text=True, check=False
    )


def test_the_cli_prints_the_flags_and_their_capacity() -> None:
    case = BY_ENGINE["sglang"]  # Kimi-Linear on 8 H200s
    workload = ("--requests", "64", "--max-model-len", "131072")
    table = k3layout("recommend", *case.options(), *workload)
    assert table.returncode == 0, table.stderr
    api = recommend(case.loaded(), case.deployment(), requests=64, max_model_len=131_072)
    assert table.stdout.splitlines()[1] == api.launch_line
    assert " --max-running-requests 64 " in api.launch_line
    data = json.loads(k3layout("recommend", *case.options(), *workload, "--json").stdout)
    assert data["capacity"]["max_requests"] >= 64
    assert data["memory"]["kv_memory_bytes"] == data["kv_memory_bytes"] == api.kv_memory_bytes
    # 20 GiB is under the 33 GiB the workload needs, and the GPU holds it beside the weights
    refused = k3layout("recommend", *case.options(), *workload, "--kv-memory-gib", "20", "--json")
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["refused"]["code"] == "budget_too_small"


SWEEPS = [
    # Kimi-Linear on 8 H200s: tokenspeed has no Kimi-Linear model
    (BY_ENGINE["sglang"], 20, {"tokenspeed": "layout_unsupported"}),
    # Kimi-K3 MXFP4 on 64 H200s: vLLM has no compressed-tensors MXFP4 experts for it
    (BY_ENGINE["tokenspeed"], 12, {"vllm": "quantization_unsupported"}),
]


@pytest.mark.parametrize(("case", "gib", "refused"), SWEEPS, ids=["linear", "k3-mxfp4"])
def test_the_sweep_trades_requests_against_context_with_the_recommended_flags(
    case: Case, gib: int, refused: dict[str, str], tmp_path: Path
) -> None:
    options = [o for o in case.options(write_k3_mxfp4(tmp_path)) if o != "--engine"]
    options.remove(case.engine)  # sweep runs every engine on the deployment
    run = k3layout(
        "sweep", *options, "--kv-memory-gib", str(gib), "--contexts", "8192,131072", "--json"
    )
    assert run.returncode == 0, run.stderr
    rows = {(r["engine"], r["max_model_len"]): r for r in json.loads(run.stdout)}
    engines = ("vllm", "tokenspeed", "sglang")
    assert set(rows) == {(e, n) for e in engines for n in (8192, 131_072)}
    model = model_named(case.model)
    for (engine, length), row in rows.items():
        if engine in refused:
            assert row["max_requests"] is None and row["refusal"] == refused[engine]
            continue
        deployment = case.deployment(engine=engine)
        assert row["kv_memory_bytes"] >= gib << 30  # a fraction's budget: at least the given
        # the most the recommended flags serve: one more does not fit in the budget
        with pytest.raises(Refusal) as caught:
            recommend(
                model,
                deployment,
                requests=row["max_requests"] + 1,
                max_model_len=length,
                kv_memory_bytes=gib << 30,
            )
        assert caught.value.code == "budget_too_small"
        words = row["flags"].split()
        counted = words[words.index(REQUESTS_FLAG[engine]) + 1]
        per_replica = 1 if engine == "vllm" else deployment.attn_dp
        assert counted == str(row["max_requests"] * per_replica)
    # SGLang's state pool sized for the requests serves more than its default split
    sglang = rows[("sglang", 131_072)]
    held = plan(model, case.deployment(engine="sglang")).capacity(
        sglang["kv_memory_bytes"], 131_072
    )
    assert sglang["max_requests"] > held.max_requests


def test_k3_bf16_on_one_node_is_refused_naming_a_deployment_that_fits() -> None:
    # what every recommendation above used to be asked: Kimi-K3 bf16 at attention TP 8 on H200s
    k3, deployment = preset("kimi-k3"), Deployment(attn_tp=8)
    with pytest.raises(Refusal) as caught:
        recommend(k3, deployment, requests=64, max_model_len=131_072)
    refusal = caught.value
    assert refusal.code == "weights_do_not_fit"
    assert refusal.facts["gpu_memory_bytes"] == 150_109_945_856  # H200: 143,156 MiB
    weights = refusal.facts["weights_bytes"]
    assert isinstance(weights, int) and weights > 150_109_945_856
    fits = refusal.facts["fits"]  # test_memory.py checks that its weights fit
    assert isinstance(fits, str) and fits in (refusal.hint or "")
    # the budget an answer stands on refuses the same (memory_budget)
    with pytest.raises(Refusal) as budget:
        memory_budget(k3, deployment)
    assert budget.value.facts == refusal.facts
