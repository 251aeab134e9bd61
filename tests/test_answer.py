"""The operator's answer, the same fields for every engine: how many requests of a context fit
in a KV budget, the tokens they hold, the KDA state's share, the waste, and the least memory for
N requests (``k3layout.layouts.answer``). Each engine's own figures are checked against that
engine elsewhere (vLLM and SGLang in the conformance suites, tokenspeed against its recorded
answers); here the common fields are held to their one definition on every engine."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import Deployment, Refusal, plan, preset
from k3layout.layouts.answer import RequestCapacity

GIB = 1 << 30
ENGINES = ("vllm", "tokenspeed", "sglang")


def planned(engine: str, model: str = "kimi-k3", **fields: object) -> object:
    return plan(preset(model), Deployment.model_validate({"engine": engine, **fields}))


def payload(result: object, length: int) -> tuple[int, int]:
    """One request's attention rows and KDA state over one rank of every stage, written out."""
    sizes = result.sizes  # type: ignore[attr-defined]
    tp = sizes.attn_tp
    model = result.model  # type: ignore[attr-defined]
    dcp = result.deployment.dcp  # type: ignore[attr-defined]
    attention = sum(
        -(-length // dcp) * sizes.spec_of(i).bytes_per_token(tp) for i in model.attention_layer_ids
    )
    state = len(model.kda_layer_ids) * sizes.state_bytes
    return attention, state


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("attn_tp", "length"), [(8, 131_072), (1, 8192), (24, 8192), (16, 1 << 20)]
)
def test_every_engine_answers_the_same_fields_by_one_definition(
    engine: str, attn_tp: int, length: int
) -> None:
    # tokenspeed main refuses K3 fp8 below attention TP 8 (a state wider than its 12 MLA
    # pages); #1152's head lays one rank out
    one_rank_tokenspeed = (engine, attn_tp) == ("tokenspeed", 1)
    version = {"engine_version": "pr1152"} if one_rank_tokenspeed else {}
    result = planned(engine, attn_tp=attn_tp, **version)
    got = result.capacity(60 * GIB, length)  # type: ignore[attr-defined]
    assert isinstance(got, RequestCapacity)
    assert (got.kv_memory_bytes, got.max_model_len) == (60 * GIB, length)
    assert got.tokens_held == got.max_requests * length
    attention, state = payload(result, length)
    assert got.attention_payload_bytes == got.max_requests * attention
    assert got.kda_state_payload_bytes == got.max_requests * state
    assert got.kda_share == got.max_requests * state / (60 * GIB)
    assert got.waste_fraction == pytest.approx(
        1 - got.max_requests * (attention + state) / (60 * GIB), abs=1e-15
    )
    rows = dict(got.rows())
    assert rows[f"requests of {length:,} tokens held at once"] == f"{got.max_requests:,}"


def test_each_engine_counts_its_requests_by_its_own_limits() -> None:
    vllm = planned("vllm", attn_tp=8, spec_tokens=2, model="kimi-k3-dspark")
    got = vllm.capacity(40 * GIB, 8192)  # type: ignore[attr-defined]
    assert got.max_requests == math.floor(got.max_concurrency) == 79
    sglang = planned("sglang", attn_tp=8).capacity(60 * GIB, 131_072)  # type: ignore[attr-defined]
    assert sglang.max_requests == min(sglang.max_running_requests, sglang.logical_tokens // 131_072)
    tokenspeed = planned("tokenspeed", attn_tp=8)
    held = tokenspeed.capacity(60 * GIB, 131_072)  # type: ignore[attr-defined]
    # sized for its own max_requests: they fit, and one more does not
    assert held.max_live == held.max_requests
    assert held.token_capacity >= held.max_requests * 131_072
    more = tokenspeed.capacity(  # type: ignore[attr-defined]
        60 * GIB, 131_072, max_live=held.max_requests + 1
    )
    assert more.token_capacity < (held.max_requests + 1) * 131_072


def test_the_context_defaults_to_the_models_own() -> None:
    for engine in ENGINES:
        result = planned(engine, attn_tp=8)
        assert result.capacity(100 * GIB).max_model_len == 1 << 20  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(
    engine=st.sampled_from(ENGINES),
    attn_tp=st.sampled_from((1, 2, 4, 8, 16, 32)),
    kv_dtype=st.sampled_from(("fp8", "bf16")),
    requests=st.integers(1, 300),
    length=st.integers(1, 1 << 20),
)
def test_memory_for_is_the_least_memory_that_holds_the_requests(
    engine: str, attn_tp: int, kv_dtype: str, requests: int, length: int
) -> None:
    try:
        result = planned(engine, attn_tp=attn_tp, kv_dtype=kv_dtype)
    except Refusal:
        return  # tokenspeed's bf16 TP 32
    memory = result.memory_for(requests, length)  # type: ignore[attr-defined]
    assert result.capacity(memory, length).max_requests >= requests  # type: ignore[attr-defined]
    try:
        short = result.capacity(memory - 1, length).max_requests  # type: ignore[attr-defined]
    except Refusal as refusal:
        assert refusal.code == "budget_too_small"
        return
    assert short < requests


def test_memory_for_refuses_what_no_memory_holds() -> None:
    result = planned("vllm", attn_tp=8)
    for requests in (0, -1):
        with pytest.raises(Refusal) as caught:
            result.memory_for(requests, 8192)  # type: ignore[attr-defined]
        assert caught.value.code == "invalid_argument"
    with pytest.raises(Refusal) as caught:
        result.memory_for(1, (1 << 20) + 1)  # type: ignore[attr-defined]
    assert caught.value.code == "invalid_argument"  # over the model's context
    with pytest.raises(Refusal) as caught:
        result.memory_for(1 << 62, 1 << 20)  # type: ignore[attr-defined]
    assert caught.value.code == "size_limit"
