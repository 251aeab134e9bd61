"""``k3layout.engines.vllm`` against vLLM's own objects: the plan read from a ``VllmConfig``
is the planner's plan of the same model and flags, and each rank's ``KVCacheConfig`` passes
``check_kv_cache_config``; a corrupted one is refused naming the difference and the layer."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from vllm_required import require_vllm

require_vllm()

from test_conformance_layout import deployment, planner_model  # noqa: E402
from vllm_engine import Case, start  # noqa: E402

from k3layout import Refusal, VllmPlan, plan  # noqa: E402
from k3layout.engines.vllm import check_kv_cache_config, plan_from_vllm  # noqa: E402

CASES = [
    Case(attn_tp=1),
    Case(attn_tp=8),
    Case(attn_tp=4, kv_dtype="bf16"),
    Case(attn_tp=8, pp=2),
    Case(attn_tp=8, dcp=8),
    Case(attn_tp=8, block_tokens=2048, backend="CUTLASS_MLA"),
    Case(attn_tp=8, drafter="dspark", spec_tokens=2),
    Case(attn_tp=8, drafter="dspark", spec_tokens=3, pp=4),
    Case(attn_tp=8, backend="TRITON_MLA", kv_cache_layout="BLHNC"),
    Case(attn_tp=8, prefix_caching=False),
    Case("kimi-linear", attn_tp=4, max_model_len=4096),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_bridge_plans_what_the_planner_plans_and_vllm_builds(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", case.kv_cache_layout)
    engine = start(case, tmp_path)
    bridged = plan_from_vllm(engine.config)
    planned = plan(planner_model(case, tmp_path), deployment(case))
    assert isinstance(planned, VllmPlan)
    for field in ("block_tokens", "page_bytes", "groups", "stages"):
        assert getattr(bridged, field) == getattr(planned, field), field
    for stage, config in enumerate(engine.kv_cache_configs):
        assert check_kv_cache_config(engine.config, config, stage).page_bytes == planned.page_bytes


def test_a_corrupted_kv_cache_config_is_refused_naming_the_layer(tmp_path: Path) -> None:
    engine = start(Case(attn_tp=8), tmp_path)
    config = engine.kv_cache_configs[0]

    swapped = copy.deepcopy(config)
    names = swapped.kv_cache_groups[3].layer_names
    names[0], names[1] = names[1], names[0]
    with pytest.raises(Refusal) as refused:
        check_kv_cache_config(engine.config, swapped)
    assert refused.value.code == "plan_mismatch" and "group 3" in str(refused.value)

    shifted = copy.deepcopy(config)
    shifted.kv_cache_tensors[3].offset += shifted.kv_cache_tensors[3].block_stride
    with pytest.raises(Refusal) as refused:
        check_kv_cache_config(engine.config, shifted)
    assert refused.value.facts["layer"] == 3 and refused.value.facts["field"] == "offset_bytes"
    assert refused.value.facts["block"] == 0 and "page of block 0" in str(refused.value)

    wrong_page = copy.deepcopy(config)
    wrong_page.kv_cache_tensors[0].block_stride += 64
    with pytest.raises(Refusal) as refused:
        check_kv_cache_config(engine.config, wrong_page)
    assert refused.value.facts["layer"] == 0 and refused.value.facts["field"] == "offset_bytes"
    assert refused.value.facts["block"] == 1 and "page of block 1" in str(refused.value)
