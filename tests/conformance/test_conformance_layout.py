"""The planner's ``vllm`` layout against vLLM 0.33's own start-up, run on CPU.

For every configuration of the grid, vLLM resolves its block, groups its layers and sizes its
KV cache; the planner, given the same model (loaded from the same ``config.json``) and the same
flags, must answer the same: the block, the page, each group's kind, layers and order, the
planes of every pipeline stage, the bytes of a block, ``num_blocks`` for a memory budget and
where every layer's page of blocks 0, 1 and N-1 lies in the rank's one backing allocation; and
the caches vLLM binds pass ``check_kv_caches``. A configuration vLLM refuses, the planner
refuses too.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from vllm_required import require_vllm, running

require_vllm()
RELEASE = running()
"""The vLLM release installed, which k3layout plans for."""

from vllm_engine import (  # noqa: E402
    CAPABILITY,
    Case,
    Engine,
    bind,
    blocks_per_request,
    group_block_sizes,
    max_concurrency,
    scheduler_block_size,
    start,
    target_config,
)

from k3layout import Deployment, HybridModel, Refusal, VllmPlan, load_config, plan  # noqa: E402
from k3layout.engines.vllm import check_kv_caches  # noqa: E402
from k3layout.engines.vllm import layer_of as layer_id  # noqa: E402
from k3layout.engines.vllm.spans import group_block_tokens  # noqa: E402
from k3layout.model.presets import DSPARK_DRAFT_LAYERS  # noqa: E402

HEADS = {"kimi-k3": 96, "kimi-linear": 32}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


BACKENDS = ("FLASHMLA", "CUTLASS_MLA", "FLASHINFER_MLA", "TRITON_MLA")
REQUESTED = (None, 16, 64, 128, 200, 256, 1000, 2048, 4096)


def grid() -> list[Case]:
    """Models x every attention TP x dtype, PP and DCP; then requested blocks x backends, and
    the block-outermost layout where vLLM's start-up serves it (``TRITON_MLA``; the other
    backends refuse it only when the cache is bound)."""
    cases = []
    for model, heads in HEADS.items():
        max_len = 8192 if model == "kimi-k3" else 4096
        for tp in divisors(heads):
            for dtype in ("fp8", "bf16"):
                cases.append(Case(model, tp, dtype, max_model_len=max_len))
            for pp in (2, 4):
                cases.append(Case(model, tp, "fp8", pp=pp, max_model_len=max_len))
            for dcp in (2, 4, 8):
                cases.append(Case(model, tp, "fp8", dcp=dcp, max_model_len=max_len))
        for tp in (1, 4, 8):
            for backend in BACKENDS:  # fp8_ds_mla: the sparse backends' row, refused by all four
                cases.append(Case(model, tp, "fp8_ds_mla", backend=backend, max_model_len=max_len))
                for block in REQUESTED:
                    cases.append(
                        Case(model, tp, backend=backend, block_tokens=block, max_model_len=max_len)
                    )
            for block in (None, 2048):
                for pp in (1, 2):
                    cases.append(
                        Case(
                            model,
                            tp,
                            pp=pp,
                            backend="TRITON_MLA",
                            block_tokens=block,
                            kv_cache_layout="BLHNC",
                            max_model_len=max_len,
                        )
                    )
        # capacity: prefix caching off (the "none" mode), FlashKDA's checkpoint block (K3's
        # KDA path only), long requests, and budgets too small for one request
        for tp in (1, 8):
            for length in (max_len, 1024, 100_000 if model == "kimi-k3" else 3000):
                for memory in (40 << 30, 1 << 30, 200 << 20):
                    cases.append(Case(model, tp, max_model_len=length, memory_bytes=memory))
            cases.append(Case(model, tp, prefix_caching=False, max_model_len=max_len))
            cases.append(Case(model, tp, dcp=tp, max_model_len=max_len))
            if model == "kimi-k3":
                cases.append(Case(model, tp, kda_prefill_backend="flashkda"))
                cases.append(Case(model, tp, pp=2, kda_prefill_backend="flashkda"))
    # speculative decoding: K3's DSpark draft (no drafter at 0 tokens) and MTP modules
    for tp in (1, 2, 4, 8, 16, 32):
        for spec in range(8):
            for dtype in ("fp8", "bf16"):
                cases.append(Case(attn_tp=tp, kv_dtype=dtype, drafter="dspark", spec_tokens=spec))
    for spec in (0, 2, 5):
        for pp in (2, 4):
            cases.append(Case(attn_tp=8, pp=pp, drafter="dspark", spec_tokens=spec))
        cases.append(Case(attn_tp=8, dcp=8, drafter="dspark", spec_tokens=spec))
        cases.append(Case(attn_tp=8, drafter="dspark", spec_tokens=spec, prefix_caching=False))
        cases.append(
            Case(attn_tp=8, drafter="dspark", spec_tokens=spec, kda_prefill_backend="flashkda")
        )
    for modules in (1, 2, 3):
        for spec in range(1, 8):
            cases.append(Case(attn_tp=8, drafter="mtp", mtp_modules=modules, spec_tokens=spec))
    return cases


_MODELS: dict[tuple[str, str | None, int], HybridModel] = {}


def planner_model(case: Case, tmp: Path) -> HybridModel:
    """The planner's model of ``case``, loaded from the config vLLM reads: with DSpark, the
    5-layer draft (``num_draft_layers``); with MTP, the config's own MTP modules."""
    key = (case.model, case.drafter, case.mtp_modules)
    if key not in _MODELS:
        path = tmp / "planner-config.json"
        path.write_text(json.dumps(target_config(case)))
        drafts = DSPARK_DRAFT_LAYERS if case.drafter == "dspark" else None
        _MODELS[key] = load_config(path, num_draft_layers=drafts)
    return _MODELS[key]


def deployment(case: Case) -> Deployment:
    # the GPU the harness selects the backend on (vllm_engine.CAPABILITY)
    gpu = "b200" if CAPABILITY.get(case.backend, (9, 0))[0] == 10 else "h200"
    return Deployment(
        engine_version=RELEASE,
        engine="vllm",
        gpu=gpu,
        attn_tp=case.attn_tp,
        pp=case.pp,
        pp_partition=case.pp_partition,
        dcp=case.dcp,
        kv_dtype=case.kv_dtype,
        block_tokens=case.block_tokens,
        attention_backend=case.backend,
        kv_cache_layout=case.kv_cache_layout,
        prefix_caching=case.prefix_caching,
        kda_prefill_backend=case.kda_prefill_backend,
        spec_tokens=case.spec_tokens,
    )


def both(case: Case, tmp: Path) -> tuple[Engine | Exception, VllmPlan | Refusal]:
    """vLLM's start-up and the planner's plan of ``case`` (with its capacity, which vLLM
    checks at start-up), or what each refused with."""
    engine: Engine | Exception
    try:
        engine = start(case, tmp)
    except (ValueError, AssertionError, RuntimeError) as error:
        engine = error
    planned: VllmPlan | Refusal
    try:
        result = plan(planner_model(case, tmp), deployment(case))
        assert isinstance(result, VllmPlan)
        result.capacity(case.memory_bytes, case.max_model_len)
        planned = result
    except Refusal as refusal:
        planned = refusal
    return engine, planned


def groups_of(engine: Engine) -> list[tuple[str, tuple[int, ...]]]:
    """vLLM's global groups as (kind, module layers), in its order."""
    kinds = {"MambaSpec": "kda", "MLAAttentionSpec": "full_attention"}
    found: dict[int, tuple[str, list[int]]] = {}
    for config in engine.kv_cache_configs:
        for index, group in enumerate(config.kv_cache_groups):
            kind = kinds[type(group.kv_cache_spec).__name__]
            found.setdefault(index, (kind, []))[1].extend(layer_id(n) for n in group.layer_names)
    return [(kind, tuple(sorted(layers))) for kind, layers in found.values()]


def planned_groups(result: VllmPlan) -> list[tuple[str, tuple[int, ...]]]:
    return [
        ("kda" if group.kind == "kda" else "full_attention", group.layers)
        for group in result.groups
    ]


def page_offsets(engine: Engine, stage: int) -> dict[tuple[int, int], int]:
    """Each layer's page of blocks 0, 1 and N-1 in stage ``stage``'s backing, by
    ``(layer, block)``: ``offset + l * layer_stride + b * block_stride``."""
    config = engine.kv_cache_configs[stage]
    last = config.num_blocks - 1
    offsets: dict[tuple[int, int], int] = {}
    for tensor in config.kv_cache_tensors:
        for position, name in enumerate(tensor.layers):
            for block in (0, 1, last):
                offsets[(layer_id(name), block)] = (
                    tensor.offset + position * tensor.layer_stride + block * tensor.block_stride
                )
    return offsets


def planned_offsets(result: VllmPlan, stage: int, num_blocks: int) -> dict[tuple[int, int], int]:
    return {
        (layer, block): result.page_offset_bytes(layer, block, num_blocks, stage)
        for layer in result.stage(stage).layers
        for block in (0, 1, num_blocks - 1)
    }


def binds(case: Case) -> bool:
    """Whether vLLM binds the caches it planned (a block-outermost block is bound only
    whole: by TRITON_MLA)."""
    return case.kv_cache_layout != "BLHNC" or case.backend == "TRITON_MLA"


def describe(value: Any) -> str:
    shown = str(value) if isinstance(value, Exception) else "a plan"
    return f"{type(value).__name__}: {shown[:300]}"


@pytest.mark.parametrize("case", grid(), ids=str)
def test_planner_answers_what_vllm_resolves(case: Case, tmp_path: Path, live: bool = True) -> None:
    """``live``: also check what vLLM binds with ``check_kv_caches`` (which reads each
    worker's own config)."""
    engine, result = both(case, tmp_path)
    if isinstance(engine, Exception) or isinstance(result, Refusal):
        assert isinstance(engine, Exception) and isinstance(result, Refusal), (
            f"only one side refused: vLLM {describe(engine)}; planner {describe(result)}"
        )
        return
    assert result.block_tokens == engine.block_size
    pages = {c.kv_cache_groups[0].kv_cache_spec.page_size_bytes for c in engine.kv_cache_configs}
    assert pages == {result.page_bytes}
    assert planned_groups(result) == groups_of(engine)
    for stage, config in enumerate(engine.kv_cache_configs):
        backing = {tensor.size for tensor in config.kv_cache_tensors}
        num_blocks = config.num_blocks
        assert result.num_blocks(case.memory_bytes) == num_blocks
        assert backing == {result.blocks_bytes(num_blocks, stage)}
        assert result.stage_block_bytes(stage) * num_blocks in backing
        assert planned_offsets(result, stage, num_blocks) == page_offsets(engine, stage)
        if binds(case) and live:  # the caches vLLM binds pass the live check
            bound = bind(engine, stage)
            with pytest.MonkeyPatch.context() as env:  # as the engine process has it
                if case.pp_partition is not None:
                    env.setenv("VLLM_PP_LAYER_PARTITION", ",".join(map(str, case.pp_partition)))
                checked = check_kv_caches(engine.workers[stage], config, bound, stage)
            assert (checked.stages, checked.page_bytes) == (result.stages, result.page_bytes)
    capacity = result.capacity(case.memory_bytes, case.max_model_len)
    assert capacity.num_blocks == engine.kv_cache_configs[0].num_blocks
    assert [g.blocks for g in capacity.blocks_per_request] == blocks_per_request(engine)
    assert capacity.max_concurrency == max_concurrency(engine)
    assert capacity.max_requests == math.floor(max_concurrency(engine))
    assert capacity.mamba_cache_mode == engine.config.cache_config.mamba_cache_mode
    # each group's block (KDA: one state per block in align mode, per request in none; a
    # stage without attention keeps its own) and the scheduler's lcm of them
    spans = [group_block_tokens(result, g, case.max_model_len) for g in result.groups]
    assert spans == group_block_sizes(engine)
    assert capacity.scheduler_block_tokens == scheduler_block_size(engine)
    if result.model.kda_layers and not case.pp_partition:
        assert capacity.kda_span_tokens == engine.state_block_size


def memory_cases() -> list[tuple[Case, int]]:
    """Workloads (a deployment, its context, a request count) whose least memory is asked."""
    cases = []
    for model, drafter, spec in (("kimi-k3", None, 0), ("kimi-k3", "dspark", 2)):
        for tp, dtype in ((8, "fp8"), (1, "bf16"), (16, "fp8")):
            for length, requests in ((131_072, 64), (8192, 1), (1_000_000, 3)):
                case = Case(
                    model,
                    tp,
                    kv_dtype=dtype,
                    drafter=drafter,
                    spec_tokens=spec,
                    max_model_len=length,
                )
                cases.append((case, requests))
    cases.append((Case(attn_tp=8, pp=2, max_model_len=65_536), 32))
    cases.append((Case(attn_tp=8, dcp=8, max_model_len=131_072), 16))
    cases.append((Case(attn_tp=8, prefix_caching=False, max_model_len=32_768), 100))
    return cases


@pytest.mark.parametrize(("case", "requests"), memory_cases(), ids=str)
def test_the_least_memory_is_where_vllms_own_concurrency_first_holds_the_requests(
    case: Case, requests: int, tmp_path: Path
) -> None:
    result = plan(planner_model(case, tmp_path), deployment(case))
    assert isinstance(result, VllmPlan)
    memory = result.memory_for(requests, case.max_model_len)
    served = start(replace(case, memory_bytes=memory), tmp_path)
    assert math.floor(max_concurrency(served)) >= requests
    try:
        short = start(replace(case, memory_bytes=memory - 1), tmp_path)
    except ValueError:  # vLLM refuses to start: not one request fits
        return
    assert math.floor(max_concurrency(short)) < requests
