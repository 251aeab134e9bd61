"""The operator's answer against SGLang 0.5.23's own sizing: the least memory the planner gives
for N requests of L tokens is where SGLang's ``KVCacheConfigurator`` first admits them
(``max_running_requests >= N`` and a token pool of ``N x L``), and one byte less it does not.
The planner's ``max_requests`` is within both of SGLang's limits.
"""

from __future__ import annotations

from typing import Any

import pytest
from sglang_engine import require_sglang

require_sglang()

from sglang_engine import MODEL_FILES, sglang_case  # noqa: E402

from k3layout import Deployment, load_config, plan  # noqa: E402
from k3layout.engines.sglang import SglangPlan  # noqa: E402

MODELS = {name: load_config(path) for name, path in MODEL_FILES.items()}

WORKLOADS: list[tuple[str, dict[str, Any], int, int]] = [
    # (model, flags, context, requests)
    ("kimi-k3", {"tp": 8}, 131_072, 64),
    ("kimi-k3", {"tp": 8, "kv_dtype": "bf16"}, 8192, 200),
    ("kimi-k3", {"tp": 1}, 32_768, 4),
    ("kimi-k3", {"tp": 8, "gpu": "b200"}, 1 << 20, 3),
    ("kimi-k3", {"tp": 16, "mamba_full_memory_ratio": 0.5}, 65_536, 32),
    ("kimi-k3", {"tp": 8, "max_running_requests": 16}, 131_072, 16),
    ("kimi-k3", {"tp": 8, "pp": 2}, 65_536, 24),
    ("kimi-linear", {"tp": 4}, 4096, 50),
]


def sglang_admits(model: str, flags: dict[str, Any], context: int, memory: int) -> tuple[int, int]:
    """SGLang's ``(max_running_requests, logical token pool)`` for ``memory``, or ``(0, 0)``
    where it refuses to start."""
    answer = sglang_case(
        MODEL_FILES[model],
        budget_bytes=memory,
        pools=False,
        server_args={"context_length": context},
        **flags,
    )
    if "refused" in answer:
        return 0, 0
    return answer["max_running_requests"], answer["logical_max_total_num_tokens"]


@pytest.mark.parametrize(("model", "flags", "context", "requests"), WORKLOADS, ids=str)
def test_the_least_memory_is_where_sglang_first_admits_the_requests(
    model: str, flags: dict[str, Any], context: int, requests: int
) -> None:
    deployment = Deployment(
        engine="sglang",
        attn_tp=flags["tp"],
        pp=flags.get("pp", 1),
        kv_dtype=flags.get("kv_dtype", "fp8"),
        gpu=flags.get("gpu", "h200"),
        mamba_full_memory_ratio=flags.get("mamba_full_memory_ratio"),
        max_running_requests=flags.get("max_running_requests"),
    )
    result = plan(MODELS[model], deployment)
    assert isinstance(result, SglangPlan)
    memory = result.memory_for(requests, context)
    running, tokens = sglang_admits(model, flags, context, memory)
    assert running >= requests and tokens >= requests * context, (memory, running, tokens)
    held = result.capacity(memory, context)
    assert held.max_requests == min(running, tokens // context)
    running, tokens = sglang_admits(model, flags, context, memory - 1)
    assert running < requests or tokens < requests * context, (memory - 1, running, tokens)
