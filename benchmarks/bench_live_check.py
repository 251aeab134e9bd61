"""The startup check on the caches vLLM 0.33 binds: ``check_kv_caches`` for Kimi-K3 + DSpark at
attention TP 8, fp8, 2 spec tokens, with 2,000 blocks (98 layers), against its parts measured
in the same run.

Needs vLLM 0.33.0 (see tests/conformance): vLLM's own start-up runs on CPU through the
conformance harness, and ``allocate_kv_cache`` binds the caches on ``meta``. Run by hand:
``python benchmarks/bench_live_check.py``. Target: the check under 50 ms, on its first call in
the process (what an engine's startup pays) and warm.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from timing import median_seconds

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "conformance"))

from vllm_engine import Case, bind, start

from k3layout.engines.vllm import (
    check_kv_cache_config,
    check_kv_caches,
    plan_from_vllm,
)

NUM_BLOCKS = 2000
TARGET_S = 0.050


def read_every_view(caches: dict[str, Any]) -> int:
    """The bare reads the check cannot avoid: every view's dtype, shape, strides and offset."""
    total = 0
    for view in caches.values():
        total += hash((str(view.dtype), tuple(view.shape), view.stride(), view.storage_offset()))
    return total


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        probe = start(Case(attn_tp=8, drafter="dspark", spec_tokens=2), Path(tmp))
        block_bytes = plan_from_vllm(probe.workers[0]).stage_block_bytes(0)
        case = Case(
            attn_tp=8, drafter="dspark", spec_tokens=2, memory_bytes=NUM_BLOCKS * block_bytes
        )
        engine = start(case, Path(tmp))
    worker, config = engine.workers[0], engine.kv_cache_configs[0]
    assert config.num_blocks == NUM_BLOCKS, config.num_blocks
    caches = bind(engine)
    started = time.perf_counter()
    check_kv_caches(worker, config, caches)
    first = time.perf_counter() - started
    warm = median_seconds(lambda: check_kv_caches(worker, config, caches), number=5)
    parts = [
        ("plan_from_vllm", median_seconds(lambda: plan_from_vllm(worker), number=5)),
        (
            "check_kv_cache_config",
            median_seconds(lambda: check_kv_cache_config(worker, config), number=5),
        ),
        ("reading every view (bare)", median_seconds(lambda: read_every_view(caches), number=20)),
    ]
    print(f"K3+DSpark TP 8, {NUM_BLOCKS:,} blocks, {len(caches)} layers bound by vLLM on meta")
    for name, seconds in (("check_kv_caches, first call", first), ("check_kv_caches, warm", warm)):
        verdict = "ok" if seconds < TARGET_S else "OVER"
        print(f"{name:32} {seconds * 1e3:8.2f} ms   ({verdict}: under {TARGET_S * 1e3:.0f} ms)")
    for name, seconds in parts:
        print(f"{name:32} {seconds * 1e3:8.2f} ms   ({seconds / warm:.2f}x of the warm check)")
    return 0 if max(first, warm) < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
