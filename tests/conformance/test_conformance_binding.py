"""What vLLM 0.33 binds to each layer, allocated on ``meta`` by its own ``allocate_kv_cache``
and ``map_kv_caches_to_kernel_blocks``, against the plan: every layer's page of blocks 0, 1
and N-1 starts, inside the rank's one int8 backing, where ``plan.byte_range`` says; KDA layers
get one raw page view, attention layers views in the backend's kernel blocks; and a
block-outermost layout is refused at binding exactly where the planner refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_required import require_vllm

require_vllm()

from test_conformance_layout import deployment, planner_model  # noqa: E402
from vllm_engine import Case, bind, start  # noqa: E402

from k3layout import Refusal, VllmPlan, plan  # noqa: E402
from k3layout.engines.vllm import layer_of as layer_id  # noqa: E402

CASES = [
    Case(attn_tp=1),
    Case(attn_tp=8),
    Case(attn_tp=4, kv_dtype="bf16"),
    Case(attn_tp=8, pp=2),
    Case(attn_tp=8, dcp=4),
    Case(attn_tp=8, drafter="dspark", spec_tokens=2),
    Case(attn_tp=2, drafter="dspark", spec_tokens=5, pp=2),
    Case("kimi-linear", attn_tp=4, max_model_len=4096),
    *(Case(attn_tp=8, backend=b) for b in ("CUTLASS_MLA", "FLASHINFER_MLA", "TRITON_MLA")),
    *(
        Case(attn_tp=tp, backend="TRITON_MLA", kv_cache_layout="BLHNC", pp=pp)
        for tp in (1, 8)
        for pp in (1, 2)
    ),
]


def page_start(view: object, block: int, spec_block: int) -> int:
    """Byte offset in the backing of a view's page of ``block``: its kernel block ``block *
    r`` (``r`` kernel blocks per block; 1 for a raw page view)."""
    import torch  # noqa: PLC0415

    assert isinstance(view, torch.Tensor)
    per_block = spec_block // view.shape[2] if view.shape[2] > 1 else 1
    return int((view.storage_offset() + block * per_block * view.stride(0)) * view.element_size())


@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_layer_is_bound_where_the_plan_places_it(case: Case, tmp_path: Path) -> None:
    engine = start(case, tmp_path)
    result = plan(planner_model(case, tmp_path), deployment(case))
    assert isinstance(result, VllmPlan)
    for stage, config in enumerate(engine.kv_cache_configs):
        bound = bind(engine, stage)
        n = config.num_blocks
        held = set(result.stage(stage).layers)
        assert {layer_id(name) for name in bound} == held
        for name, view in bound.items():
            layer = layer_id(name)
            if result.sizes.spec_of(layer).paging == "slot":  # one raw int8 page view
                assert tuple(view.shape) == (n, 1, 1, result.sizes.state_bytes)
            else:  # kernel blocks of the backend, 576-byte rows for an fp8 latent
                assert view.shape[2] == result.kernel_block_tokens
            for block in (0, 1, n - 1):
                at = result.page_offset_bytes(layer, block, n, stage)
                assert page_start(view, block, result.block_tokens) == at, (name, block)


@pytest.mark.parametrize("backend", ["FLASHMLA", "CUTLASS_MLA", "FLASHINFER_MLA"])
@pytest.mark.parametrize("tp", [1, 8])
def test_block_outermost_is_refused_at_binding_as_by_the_planner(
    backend: str, tp: int, tmp_path: Path
) -> None:
    case = Case(attn_tp=tp, backend=backend, kv_cache_layout="BLHNC")
    engine = start(case, tmp_path)  # vLLM's start-up accepts it ...
    with pytest.raises(ValueError, match="cannot be split into"):
        bind(engine)  # ... and refuses it when the worker binds the cache
    with pytest.raises(Refusal) as refused:
        plan(planner_model(case, tmp_path), deployment(case))
    assert refused.value.code == "layout_unsupported"
