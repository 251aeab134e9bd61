"""Every SGLang recommendation starts in SGLang 0.5.23's own sizing and holds what it promises:
with ``--max-running-requests``, ``--max-mamba-cache-size`` and ``--context-length`` as
recommended, in the recommended memory, SGLang's ``KVCacheConfigurator`` gives
``max_running_requests >= N`` (not the silent cap of sglang #38846) and a token pool of
``N x L``. Includes K3 + DSpark at TP 16 fp8 (sglang #33004)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sglang_engine import require_sglang

require_sglang()

from sglang_engine import MODEL_FILES, sglang_case  # noqa: E402
from test_conformance_sglang import k3_with_gqa_draft  # noqa: E402

from k3layout import Deployment, load_config, plan  # noqa: E402
from k3layout.engines.sglang import SglangCapacity, SglangPlan  # noqa: E402

MODELS = {name: load_config(path) for name, path in MODEL_FILES.items()}
DSPARK_DRAFT = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-dspark-draft"

WORKLOADS: list[tuple[str, dict[str, Any], int, int]] = [
    ("kimi-k3", {"tp": 8}, 131_072, 64),
    ("kimi-k3", {"tp": 8}, 8192, 300),
    ("kimi-k3", {"tp": 8, "kv_dtype": "bf16"}, 32_768, 32),
    ("kimi-k3", {"tp": 1}, 65_536, 2),
    ("kimi-k3", {"tp": 8, "gpu": "b200"}, 1 << 20, 4),
    ("kimi-k3", {"tp": 16}, 131_072, 32),
    ("kimi-k3", {"tp": 8, "pp": 2}, 65_536, 24),
    ("kimi-k3", {"tp": 16, "dspark": True}, 131_072, 32),
    ("kimi-k3", {"tp": 8, "radix_off": True}, 32_768, 64),
    ("kimi-linear", {"tp": 4}, 4096, 200),
]


def _deployment(flags: dict[str, Any], spec_tokens: int) -> Deployment:
    return Deployment(
        engine="sglang",
        attn_tp=flags["tp"],
        pp=flags.get("pp", 1),
        kv_dtype=flags.get("kv_dtype", "fp8"),
        gpu=flags.get("gpu", "h200"),
        spec_tokens=spec_tokens,
        prefix_caching=not flags.get("radix_off", False),
    )


@pytest.mark.parametrize(("model", "flags", "context", "requests"), WORKLOADS, ids=str)
def test_the_recommended_flags_start_and_hold_the_workload(
    model: str, flags: dict[str, Any], context: int, requests: int
) -> None:
    launch = {k: v for k, v in flags.items() if k not in ("dspark", "radix_off")}
    spec_tokens = 0
    planner_model = MODELS[model]
    if flags.get("dspark"):
        import json  # noqa: PLC0415

        spec_tokens = int(json.loads((DSPARK_DRAFT / "config.json").read_text())["block_size"])
        launch["spec"] = {"algorithm": "DSPARK", "draft_model_path": DSPARK_DRAFT}
        planner_model = k3_with_gqa_draft()
    result = plan(planner_model, _deployment(flags, spec_tokens))
    assert isinstance(result, SglangPlan)
    got = result.recommend(requests, context)
    recommended = dict(got.flags)
    server_args: dict[str, Any] = {
        "context_length": context,
        "max_total_tokens": int(recommended["--max-total-tokens"]),
    }
    if flags.get("radix_off"):
        server_args["disable_radix_cache"] = True
    answer = sglang_case(
        MODEL_FILES[model],
        budget_bytes=got.kv_memory_bytes,
        pools=False,
        server_args=server_args,
        max_running_requests=int(recommended["--max-running-requests"]),
        max_mamba_cache_size=int(recommended["--max-mamba-cache-size"]),
        **launch,
    )
    assert "refused" not in answer, answer.get("refused")
    assert answer["max_running_requests"] >= requests
    assert answer["logical_max_total_num_tokens"] >= requests * context
    assert got.capacity.max_requests == min(
        answer["max_running_requests"], answer["logical_max_total_num_tokens"] // context
    )
    assert answer["max_total_num_tokens"] == int(recommended["--max-total-tokens"])
    # in a larger budget the same workload's flags cap the pool, and SGLang keeps the cap
    roomy = result.recommend(requests, context, got.needed_bytes + (8 << 30))
    again = sglang_case(
        MODEL_FILES[model],
        budget_bytes=roomy.kv_memory_bytes,
        pools=False,
        server_args=server_args,
        max_running_requests=int(recommended["--max-running-requests"]),
        max_mamba_cache_size=int(recommended["--max-mamba-cache-size"]),
        **launch,
    )
    pools = roomy.capacity
    assert isinstance(pools, SglangCapacity)
    assert again["max_total_num_tokens"] == pools.max_total_num_tokens
    assert again["max_running_requests"] == pools.max_running_requests
