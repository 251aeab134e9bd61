"""Configurations no grid names: hypothesis draws deployments of both models and SGLang 0.5.23
sizes each one with its own code; the planner must answer what SGLang answers, or refuse where
SGLang refuses.

Drawn: attention TP (dividing the heads, and a few that do not), attention DP, PP, DCP, cache
dtype, GPU, a budget of any size, EAGLE-style speculative steps, the memory ratio, a
running-request cap, the radix cache off, and a context length within the model's.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_engine import require_sglang

require_sglang()

from sglang_engine import MODEL_FILES, sglang_case  # noqa: E402

from k3layout import Deployment, Refusal, load_config, plan_sglang  # noqa: E402

GIB = 1 << 30
MODELS = {name: load_config(path) for name, path in MODEL_FILES.items()}
HEADS = {"kimi-k3": 96, "kimi-linear": 32}
DERIVED_CONTEXT = {"kimi-k3": 1 << 20, "kimi-linear": 4096}
"""SGLang's context length of each fixture (Kimi-Linear's config names none: SGLang's 4096)."""


@st.composite
def launches(draw: st.DrawFn) -> dict[str, Any]:
    """One SGLang launch: the model and the flags the harness passes to SGLang."""
    model = draw(st.sampled_from(sorted(MODEL_FILES)))
    heads = HEADS[model]
    tp = draw(st.sampled_from([d for d in range(1, 33) if heads % d == 0] + [5, 7]))
    dp = draw(st.sampled_from([d for d in (1, 1, 2, 4) if tp % d == 0]))
    dcp = draw(st.sampled_from([d for d in (1, 1, 2, 4) if (tp // dp) % d == 0]))
    pp = draw(st.sampled_from((1, 1, 2, 3, 4)))
    steps = draw(st.sampled_from((0, 0, 1, 2, 3, 5))) if pp == 1 else 0
    return {
        "model": model,
        "tp": tp,
        "dp": dp,
        "pp": pp,
        "dcp": dcp,
        "kv_dtype": draw(st.sampled_from(("fp8", "bf16"))),
        "gpu": draw(st.sampled_from(("h100", "h200", "b200"))),
        "budget_bytes": draw(st.integers(1 * GIB, 140 * GIB)),
        "steps": steps,
        "ratio": draw(st.sampled_from((None, None, 0.3, 0.9, 1.7))),
        "requests": draw(st.sampled_from((None, None, 16, 100, 700))),
        "radix_off": draw(st.booleans()),
        "context": draw(st.integers(1024, DERIVED_CONTEXT[model])),
    }


def sglangs_answer(launch: dict[str, Any]) -> tuple[Any, ...]:
    spec = None
    if launch["steps"]:
        steps = launch["steps"]
        spec = {
            "algorithm": "EAGLE",
            "num_steps": steps,
            "eagle_topk": 1,
            "num_draft_tokens": steps + 1,
        }
    extra: dict[str, Any] = {"context_length": launch["context"]}
    if launch["radix_off"]:
        extra["disable_radix_cache"] = True
    answer = sglang_case(
        MODEL_FILES[launch["model"]],
        tp=launch["tp"],
        dp=launch["dp"],
        enable_dp_attention=launch["dp"] > 1,
        pp=launch["pp"],
        dcp=launch["dcp"],
        kv_dtype=launch["kv_dtype"],
        gpu=launch["gpu"],
        budget_bytes=launch["budget_bytes"],
        spec=spec,
        max_running_requests=launch["requests"],
        mamba_full_memory_ratio=launch["ratio"],
        pools=False,
        server_args=extra,
    )
    if "refused" in answer:
        return ("refused",)
    stage = answer["stages"][0]
    return (
        answer["decode_attention_backend"],
        answer["page_size"],
        stage["max_total_num_tokens"],
        stage["logical_max_total_num_tokens"],
        stage["max_mamba_cache_size"],
        stage["max_running_requests"],
    )


def planners_answer(launch: dict[str, Any]) -> tuple[Any, ...]:
    try:
        deployment = Deployment(
            engine="sglang",
            attn_tp=launch["tp"] // launch["dp"],
            attn_dp=launch["dp"],
            pp=launch["pp"],
            dcp=launch["dcp"],
            kv_dtype=launch["kv_dtype"],
            gpu=launch["gpu"],
            spec_tokens=launch["steps"],
            mamba_full_memory_ratio=launch["ratio"],
            max_running_requests=launch["requests"],
            prefix_caching=not launch["radix_off"],
        )
        result = plan_sglang(MODELS[launch["model"]], deployment)
        capacity = result.capacity(launch["budget_bytes"], launch["context"])
    except Refusal:
        return ("refused",)
    return (
        result.attention_backend,
        result.page_tokens,
        capacity.max_total_num_tokens,
        capacity.logical_tokens,
        capacity.max_mamba_cache_size,
        capacity.max_running_requests,
    )


@settings(max_examples=120, deadline=None, database=None)
@given(launches())
def test_any_launch_sizes_as_sglang_sizes_it_or_is_refused_where_sglang_refuses(
    launch: dict[str, Any],
) -> None:
    assert planners_answer(launch) == sglangs_answer(launch), launch
