"""How long planning takes, against the bare byte arithmetic it wraps (same run, same machine).

Run by hand: ``python benchmarks/bench_plan.py``. Prints medians and ratios, each against a
baseline measured in the same run, and the targets of issues 9 and 30 ("Speed"):

- for every engine (vLLM, SGLang, tokenspeed), a K3 plan at no more than 30x the bare
  arithmetic of the same plan: planned again (the same model and an equal deployment: the
  plan already made, as an engine's startup and a notebook ask it) and planned first (the
  pipeline's memo emptied before each call, the model's own facts kept);
- ``plan_ride`` at no more than 2x a first plan (and, beside it, a first ride: memo caches
  emptied);
- a PP8xTP1 -> TP8xDCP8 transfer plan under 1 ms;
- ``import k3layout`` at no more than 1.5x ``import pydantic`` (fresh interpreters).

The bare arithmetic is what an engine's startup code computes for the same plan, in plain
Python integers from the model's layer list: the per-rank sizes (and the head check), the
block raise, the grouping (buckets and their split), the planes and, for a parent, the
packing search with its padding limit. It returns the plan's numbers, and the run checks that
they are the plan's.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import subprocess
import sys
import time
from typing import Any

from timing import median_seconds, run_seconds

from k3layout import (
    Deployment,
    EngineLayout,
    HybridModel,
    KDALayer,
    MLALayer,
    ParentPlan,
    Refusal,
    VllmPlan,
    plan,
    plan_ride,
    plan_transfer,
    preset,
)
from k3layout.layouts.pipeline import _planned

try:  # the offload package's memo caches, emptied for a first ride (none before they existed)
    from k3layout.names import _names_of
    from k3layout.offload.image import _region
    from k3layout.offload.plane_order import _planes, _rider, _share

    MEMO_CACHES: tuple[Any, ...] = (_planes, _share, _rider, _region, _names_of)
except ImportError:
    MEMO_CACHES = ()

Kinds = tuple[str, ...]


def layer_kinds(model: HybridModel) -> Kinds:
    """Module layers as plain strings, target then draft: the bare arithmetic's only input."""
    return tuple(layer.kind for layer in model.module_layers)


def bare_state(tp: int, spec: int) -> int:
    """``S(tp, s)`` of a K3 KDA layer (96 heads x 128, kernel 4), refusing a TP that does not
    divide the 96 KDA heads and 96 MLA query heads."""
    if 96 % tp:
        raise ValueError(tp)
    return (3 * 96 * 128 // tp) * (3 + spec) * 2 + (96 // tp) * 128 * 128 * 4


def bare_vllm(kinds: Kinds, tp: int, spec: int, elem: int) -> tuple[int, int, int]:
    """vLLM's numbers by hand: S, the block raise, the buckets and their strided split, the
    planes. Returns (block_tokens, page_bytes, num_planes)."""
    state = bare_state(tp, spec)
    per_token = 576 * elem
    block = 128 * -(-state // (128 * per_token))
    buckets: dict[str, list[int]] = {}
    for layer_id, kind in enumerate(kinds):
        buckets.setdefault(kind, []).append(layer_id)
    sizes = [len(ids) for ids in buckets.values()]
    smallest, largest = min(sizes), max(sizes)
    group_size = largest if largest * 2 < smallest * 3 else smallest
    groups = [
        ids[i :: -(-len(ids) // group_size)]
        for ids in buckets.values()
        for i in range(-(-len(ids) // group_size))
    ]
    planes = max(len(group) for group in groups)
    return block, block * per_token, planes


def bare_sglang(kinds: Kinds, tp: int, elem: int) -> tuple[int, int, int, int]:
    """SGLang's numbers by hand: its state keeps ``K - 1`` conv rows whatever the speculative
    tokens; one token per page; the attention layers and the KDA layers in a group each.
    Returns (bytes_per_token, state_bytes, attention_layers, num_planes)."""
    if 96 % tp:
        raise ValueError(tp)
    state = (3 * 96 * 128 // tp) * 3 * 2 + (96 // tp) * 128 * 128 * 4
    attention = sum(1 for kind in kinds if kind == "mla")
    return attention * 576 * elem, state, attention, len(kinds)


def bare_parent(
    kinds: Kinds, tp: int, elem: int, limit: tuple[int, int] | None
) -> tuple[int, int, int]:
    """The parent layout by hand: S, the MLA page, the groups (attention, KDA split
    contiguously), the floor check and the packing search over plain integers with the
    padding limit ``a / b``. Returns (mla_pages, state_pages, plane_bytes)."""
    state = bare_state(tp, 0)
    page = 128 * 576 * elem
    attention = [i for i, kind in enumerate(kinds) if kind == "mla"]
    kda = [i for i, kind in enumerate(kinds) if kind == "kda"]
    count = -(-len(kda) // len(attention))
    size, extra = divmod(len(kda), count)
    lengths = [size + (1 if i < extra else 0) for i in range(count)]
    planes = len(attention)
    units = [(True, planes * page)] + [(False, n * state) for n in lengths]
    if limit is not None:
        a, b = limit
        if any((planes - n) * b > a * n for n in lengths):
            raise ValueError("padding floor")
    step = 256 // math.gcd(256, page)
    for mla_pages in range(step, (1 << 16) + 1, step):
        plane = mla_pages * page
        state_pages = plane // state
        if not state_pages:
            continue
        parent = planes * plane
        fits = True
        for on_mla, raw in units:
            payload = (mla_pages if on_mla else state_pages) * raw
            if limit is not None and (parent - payload) * limit[1] > limit[0] * payload:
                fits = False
                break
        if fits:
            return mla_pages, state_pages, plane
    raise ValueError("exhausted")


def sweep_configs(model: HybridModel) -> list[Deployment]:
    """1,000 deployments: both engines, 10 TPs (some refused), 2 dtypes, spec 0-7, 1-4 stages."""
    grid = itertools.product(
        ("vllm", "tokenspeed"), (1, 2, 3, 4, 5, 6, 8, 16, 32, 64), ("fp8", "bf16"), range(8), (1, 2)
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
        engine: str = plan(model, deployment).engine
        return engine
    except Refusal as refusal:
        return refusal.code


def import_seconds(code: str, repeats: int = 21) -> float:
    """Median wall time of ``python -c code`` in a fresh interpreter (startup included)."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def fresh_k3() -> HybridModel:
    """K3 built anew (nothing cached on it yet), as a caller with its own config would."""
    mla = MLALayer(num_heads=96, q_lora_rank=1536)
    kda = KDALayer(num_heads=96, head_dim=128, conv_kernel=4)
    layers = tuple(mla if (i % 4 == 3 or i == 92) else kda for i in range(93))
    return HybridModel(name="kimi-k3", model_type="kimi_k3", layers=layers)


def first_plan(model: HybridModel, deployment: Deployment) -> object:
    """A plan the pipeline has not made yet: its memo of recent plans emptied first."""
    _planned.cache_clear()
    return plan(model, deployment)


def cold_ride(vllm_plan: EngineLayout) -> object:
    """``plan_ride`` with the offload package's memo caches emptied first (a first ride)."""
    for cache in MEMO_CACHES:
        cache.cache_clear()
    return plan_ride(vllm_plan)


def check_bare(dspark: HybridModel, k3: HybridModel) -> None:
    """The bare arithmetic computes the plans' own numbers (else its timing proves nothing)."""
    vllm = plan(dspark, Deployment(attn_tp=8, spec_tokens=2))
    assert isinstance(vllm, VllmPlan)
    bare = bare_vllm(layer_kinds(dspark), 8, 2, 1)
    assert bare == (vllm.block_tokens, vllm.page_bytes, vllm.num_planes), bare
    sglang = plan(k3, Deployment(engine="sglang", attn_tp=8, spec_tokens=2))
    ours = (
        sglang.bytes_per_token,
        sglang.sizes.state_bytes,
        len(sglang.groups[0].layers),
        sglang.num_planes,
    )
    assert bare_sglang(layer_kinds(k3), 8, 1) == ours, ours
    for tp in (8, 1):
        parent = plan(k3, Deployment(engine="tokenspeed", attn_tp=tp))
        assert isinstance(parent, ParentPlan)
        packing = parent.packing
        got = bare_parent(layer_kinds(k3), tp, 1, (1, 4))
        assert got == (packing.mla_pages, packing.state_pages, packing.plane_bytes), got


def main() -> int:
    k3 = preset("kimi-k3")
    dspark = preset("kimi-k3-dspark")
    check_bare(dspark, k3)
    k3_kinds, dspark_kinds = layer_kinds(k3), layer_kinds(dspark)
    vllm = Deployment(attn_tp=8, spec_tokens=2)
    parent = Deployment(engine="tokenspeed", attn_tp=8)
    parent_tp1 = Deployment(engine="tokenspeed", attn_tp=1)

    sglang = Deployment(engine="sglang", attn_tp=8, spec_tokens=2)
    cases: list[tuple[str, HybridModel, Deployment, Any]] = [
        ("vllm, K3+DSpark tp8 s2", dspark, vllm, lambda: bare_vllm(dspark_kinds, 8, 2, 1)),
        ("sglang, K3 tp8 s2", k3, sglang, lambda: bare_sglang(k3_kinds, 8, 1)),
        ("tokenspeed, K3 tp8", k3, parent, lambda: bare_parent(k3_kinds, 8, 1, (1, 4))),
        (
            "tokenspeed, K3 tp1 (89-page search)",
            k3,
            parent_tp1,
            lambda: bare_parent(k3_kinds, 1, 1, (1, 4)),
        ),
    ]
    rows = []
    for name, model, deployment, bare in cases:
        plan(model, deployment)  # the model's own facts computed once, as in any process
        again = median_seconds(functools.partial(plan, model, deployment), number=500, repeats=15)
        first = median_seconds(
            functools.partial(first_plan, model, deployment), number=200, repeats=15
        )
        rows.append((name, again, first, median_seconds(bare, number=5000, repeats=15)))
    vllm_plan = plan(dspark, vllm)
    fresh_models = iter([fresh_k3() for _ in range(1 + 15 * 50)])
    fresh_plan = median_seconds(lambda: plan(next(fresh_models), vllm), number=50, repeats=15)
    ride = median_seconds(lambda: plan_ride(vllm_plan), number=100, repeats=15)
    ride_cold = median_seconds(lambda: cold_ride(vllm_plan), number=50, repeats=15)
    prefill, decode = Deployment(pp=8), Deployment(attn_tp=8, dcp=8)
    transfer_runs = run_seconds(
        lambda: plan_transfer(k3, prefill, decode, prompt_tokens=4096), number=20, repeats=15
    )
    transfer, transfer_best = statistics.median(transfer_runs), min(transfer_runs)
    configs = sweep_configs(k3)
    sweep = median_seconds(lambda: [plan_or_refuse(k3, d) for d in configs], number=1)
    pydantic_import = import_seconds("import pydantic")
    k3layout_import = import_seconds("import k3layout")
    planner_import = import_seconds("import k3layout; k3layout.plan")

    header = f"{'again':>9} {'first':>9} {'bare':>9} {'again/bare':>11} {'first/bare':>11}"
    print(f"{'plan of':36} {header}")
    for name, again, first, bare in rows:
        worst = max(again, first) / bare
        print(
            f"{name:36} {again * 1e6:6.1f} us {first * 1e6:6.1f} us {bare * 1e6:6.2f} us"
            f" {again / bare:10.1f}x {first / bare:10.1f}x  {'ok' if worst <= 30 else 'OVER 30x'}"
        )
    print(
        f"{'vllm plan, K3 on a model never planned':40} {fresh_plan * 1e6:9.1f} us"
        f"   (the model's cached facts computed in the plan)"
    )
    per_plan = sweep / len(configs)
    print(
        f"{'1,000-configuration sweep':40} {sweep * 1e3:9.1f} ms   ({per_plan * 1e6:.1f} us each)"
    )
    plan_time = rows[0][2]  # a first vLLM plan
    print(
        f"{'plan_ride, K3+DSpark tp8 s2':40} {ride * 1e6:9.1f} us   "
        f"({ride / plan_time:.1f}x a first vllm plan: "
        f"{'ok' if ride <= 2 * plan_time else 'OVER 2x'})"
    )
    print(
        f"{'plan_ride, its memo caches cleared':40} {ride_cold * 1e6:9.1f} us   "
        f"({ride_cold / plan_time:.1f}x a first vllm plan)"
    )
    print(
        f"{'transfer PP8xTP1 -> TP8xDCP8, 4,096 tok':40} {transfer * 1e3:9.3f} ms"
        f"   ({transfer / plan_time:.0f}x a first vllm plan; "
        f"fastest run {transfer_best * 1e3:.3f} ms: "
        f"{'under' if transfer_best < 1e-3 else 'OVER'} 1 ms)"
    )
    ratio = k3layout_import / pydantic_import
    print(
        f"{'import k3layout / import pydantic':40} {k3layout_import * 1e3:9.1f} ms "
        f"/ {pydantic_import * 1e3:.1f} ms = {ratio:.2f}x ({'ok' if ratio <= 1.5 else 'OVER'} 1.5x)"
    )
    print(
        f"{'import k3layout; k3layout.plan':40} {planner_import * 1e3:9.1f} ms "
        f"({planner_import / pydantic_import:.2f}x import pydantic)"
    )
    slowest = max(first for _, _, first, _ in rows)
    print(f"slowest plan {slowest * 1e3:.3f} ms ({'under' if slowest < 1e-3 else 'OVER'} 1 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
