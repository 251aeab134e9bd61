"""How long planning takes, against the bare byte arithmetic it wraps (same run, same machine).

Run by hand: ``python benchmarks/bench_plan.py``. Prints medians and ratios; the aim is one plan
well under a millisecond, so planning is never why an engine starts slowly.
"""

from __future__ import annotations

import itertools
import math
import sys

from timing import median_seconds

from k3layout import Deployment, HybridModel, Refusal, plan, plan_transfer, preset


def bare_vllm(tp: int, spec: int, elem: int, planes: int) -> int:
    """The vLLM numbers by hand, as engines compute them today: S, block raise, block bytes."""
    state = (3 * 96 * 128 // tp) * (3 + spec) * 2 + (96 // tp) * 128 * 128 * 4
    per_token = 576 * elem
    block = 128 * math.ceil(state / (128 * per_token))
    return planes * block * per_token


def bare_parent(tp: int, elem: int) -> int:
    """The #1152 formula by hand: S, p_m = ceil(S / page), parent bytes."""
    state = (3 * 96 * 128 // tp) * 3 * 2 + (96 // tp) * 128 * 128 * 4
    page = 128 * 576 * elem
    return 24 * -(-state // page) * page


def sweep_configs(model: HybridModel) -> list[Deployment]:
    """1,000 deployments: both engines, 10 TPs (some refused), 2 dtypes, spec 0-7, 1-4 stages."""
    grid = itertools.product(
        ("vllm", "parent"), (1, 2, 3, 4, 5, 6, 8, 16, 32, 64), ("fp8", "bf16"), range(8), (1, 2)
    )
    configs = [
        Deployment.model_validate(
            {"engine": e, "attn_tp": tp, "kv_dtype": d, "spec_tokens": s, "pp": pp}
        )
        for e, tp, d, s, pp in grid
    ]
    return (configs * 2)[:1000]


def plan_or_refuse(model: HybridModel, deployment: Deployment) -> str:
    """Plan, or the refusal's code: a sweep counts both."""
    try:
        return plan(model, deployment).engine
    except Refusal as refusal:
        return refusal.code


def main() -> int:
    k3 = preset("kimi-k3")
    dspark = preset("kimi-k3-dspark")
    vllm = Deployment(attn_tp=8, spec_tokens=2)
    parent = Deployment(engine="parent", attn_tp=8)
    parent_tp1 = Deployment(engine="parent", attn_tp=1)

    rows = [
        (
            "vllm plan, K3+DSpark tp8 s2",
            median_seconds(lambda: plan(dspark, vllm), number=500),
            median_seconds(lambda: bare_vllm(8, 2, 1, 29), number=20000),
        ),
        (
            "parent plan, K3 tp8",
            median_seconds(lambda: plan(k3, parent), number=500),
            median_seconds(lambda: bare_parent(8, 1), number=20000),
        ),
        (
            "parent plan, K3 tp1 (89-page search)",
            median_seconds(lambda: plan(k3, parent_tp1), number=200),
            median_seconds(lambda: bare_parent(1, 1), number=20000),
        ),
    ]
    prefill, decode = Deployment(pp=8), Deployment(attn_tp=8, dcp=8)
    transfer = median_seconds(
        lambda: plan_transfer(k3, prefill, decode, prompt_tokens=4096), number=20
    )
    configs = sweep_configs(k3)
    sweep = median_seconds(lambda: [plan_or_refuse(k3, d) for d in configs], number=1)
    print(f"{'case':40} {'median':>12} {'bare':>10} {'plan / bare':>12}")
    for name, planned, bare in rows:
        print(f"{name:40} {planned * 1e6:9.1f} us {bare * 1e6:7.2f} us {planned / bare:11.0f}x")
    per_plan = sweep / len(configs)
    print(
        f"{'1,000-configuration sweep':40} {sweep * 1e3:9.1f} ms   ({per_plan * 1e6:.1f} us each)"
    )
    vllm_plan = rows[0][1]
    print(
        f"{'transfer PP8xTP1 -> TP8xDCP8, 4,096 tok':40} {transfer * 1e3:9.2f} ms"
        f"   ({transfer / vllm_plan:.0f}x one vllm plan)"
    )
    slowest = max(planned for _, planned, _ in rows)
    print(f"slowest plan {slowest * 1e3:.3f} ms ({'under' if slowest < 1e-3 else 'OVER'} 1 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
