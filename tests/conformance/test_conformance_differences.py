"""Four places where vLLM 0.33's own start-up and the planner once disagreed (issue 30), each
run through vLLM's code on CPU:

1. prefix caching off: a KDA group's block is ``max_model_len`` and the scheduler steps on
   the lcm of every group's block;
2. ``VLLM_KV_CACHE_LAYOUT=BLHNC`` with a backend of smaller kernel blocks: vLLM plans the
   cache, then refuses to bind it, and the planner refuses it;
3. a pipeline stage holding KDA layers and no MLA layer: its KDA layers keep an unaligned
   block and vLLM buckets them apart;
4. MTP asked of a checkpoint without MTP modules: vLLM fails at start-up, the planner refuses.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from vllm_required import require_vllm, running

require_vllm()

import test_conformance_layout as layout  # noqa: E402
from vllm_engine import (  # noqa: E402
    Case,
    bind,
    group_block_sizes,
    scheduler_block_size,
    start,
    target_config,
    vllm_config,
)

from k3layout import Deployment, Refusal, VllmPlan, plan  # noqa: E402
from k3layout.engines.vllm import layer_of  # noqa: E402
from k3layout.engines.vllm.releases import RELEASES  # noqa: E402

# 1. prefix caching off


def prefix_off_cases() -> list[Case]:
    cases = []
    for tp in (1, 2, 4, 8, 16):
        for dtype in ("fp8", "bf16"):
            for spec in (0, 2, 4):
                cases.append(
                    Case(
                        attn_tp=tp,
                        kv_dtype=dtype,
                        drafter="dspark",
                        spec_tokens=spec,
                        prefix_caching=False,
                    )
                )
    for dcp in (2, 8):
        for prefix in (True, False):
            cases.append(
                Case(attn_tp=8, dcp=dcp, drafter="dspark", spec_tokens=2, prefix_caching=prefix)
            )
    cases.append(Case(attn_tp=8, prefix_caching=False, max_model_len=100_000))
    cases.append(Case("kimi-linear", 4, prefix_caching=False, max_model_len=3000))
    return cases


@pytest.mark.parametrize("case", prefix_off_cases(), ids=str)
def test_prefix_caching_off_spans_are_vllms(case: Case, tmp_path: Path) -> None:
    layout.test_planner_answers_what_vllm_resolves(case, tmp_path)


def test_the_reported_cell(tmp_path: Path) -> None:
    """K3 TP 1 fp8, DSpark at 2 tokens, prefix caching off, max_model_len 8,192: the KDA
    block is the request (8,192), the attention block 11,648, the scheduler's their lcm."""
    case = Case(attn_tp=1, drafter="dspark", spec_tokens=2, prefix_caching=False)
    engine = start(case, tmp_path)
    assert sorted(set(group_block_sizes(engine))) == [8192, 11_648]
    assert scheduler_block_size(engine) == 745_472
    result = plan(layout.planner_model(case, tmp_path), layout.deployment(case))
    assert isinstance(result, VllmPlan)
    capacity = result.capacity(case.memory_bytes, case.max_model_len)
    assert (result.block_tokens, capacity.kda_span_tokens) == (11_648, 8192)
    assert capacity.scheduler_block_tokens == 745_472


# 2. block-outermost with kernel blocks smaller than the block


@pytest.mark.parametrize("dcp", [1, 8])
def test_block_outermost_is_planned_by_vllm_and_refused_at_binding(
    dcp: int, tmp_path: Path
) -> None:
    """vLLM plans K3's FlashMLA cache block-outermost exactly as the planner lays out a
    whole-block kernel's (same page, layer and block strides), then its worker refuses to
    split the 1,536-token blocks into 64-token kernel blocks; the planner refuses it."""
    case = Case(attn_tp=8, dcp=dcp, backend="FLASHMLA", kv_cache_layout="BLHNC")
    engine = start(case, tmp_path)
    whole = plan(
        layout.planner_model(case, tmp_path), layout.deployment(replace(case, backend="TRITON_MLA"))
    )
    assert isinstance(whole, VllmPlan)
    config = engine.kv_cache_configs[0]
    n = config.num_blocks
    assert n == whole.num_blocks(case.memory_bytes)
    for tensor in config.kv_cache_tensors:
        assert (tensor.layer_stride, tensor.block_stride) == (
            whole.layer_stride_bytes(n),
            whole.block_stride_bytes(),
        )
        for position, name in enumerate(tensor.layers):
            at = tensor.offset + position * tensor.layer_stride + (n - 1) * tensor.block_stride
            assert at == whole.page_offset_bytes(layer_of(name), n - 1, n)
    with pytest.raises(ValueError, match="cannot be split into"):
        bind(engine)
    with pytest.raises(Refusal) as refused:
        plan(layout.planner_model(case, tmp_path), layout.deployment(case))
    assert refused.value.code == "layout_unsupported"
    assert refused.value.facts["kernel_block_tokens"] == 64


# 3. a pipeline stage without attention


STAGE_CASES = [
    Case(attn_tp=8, pp=2, pp_partition=(3, 90)),
    Case(attn_tp=8, pp=2, pp_partition=(3, 90), block_tokens=256),
    Case(attn_tp=8, pp=2, pp_partition=(3, 90), block_tokens=1536),
    Case(attn_tp=8, pp=2, pp_partition=(3, 90), prefix_caching=False),
    Case(attn_tp=8, pp=3, pp_partition=(3, 87, 3)),
    Case(attn_tp=8, pp=5, pp_partition=(3, 1, 3, 1, 85)),
    Case(attn_tp=8, pp=2, pp_partition=(3, 90), drafter="dspark", spec_tokens=2),
    Case(attn_tp=1, kv_dtype="bf16", pp=2, pp_partition=(3, 90), kda_prefill_backend="flashkda"),
    Case(attn_tp=8, dcp=8, pp=2, pp_partition=(3, 90)),
    Case("kimi-linear", 1, pp=2, pp_partition=(3, 24), max_model_len=4096),
]


@pytest.mark.parametrize("case", STAGE_CASES, ids=str)
def test_a_stage_without_attention_is_planned_as_vllm_plans_it(case: Case, tmp_path: Path) -> None:
    # A later stage's worker overwrites a requested block with the aligned one, so
    # check_kv_caches, which reads the worker's config, cannot tell the request: no live
    # check when a block is requested.
    layout.test_planner_answers_what_vllm_resolves(case, tmp_path, live=case.block_tokens is None)


def test_a_stage_without_attention_keeps_vllms_default_block(tmp_path: Path) -> None:
    """3 + 90 layers: stage 0 holds KDA layers 0-2 only; they keep the release's default
    block (16 tokens in 0.33, 64 in 0.34), one bucket of 3, so every group holds 3 layers:
    1 + 8 MLA + 22 KDA groups."""
    case = Case(attn_tp=8, pp=2, pp_partition=(3, 90))
    engine = start(case, tmp_path)
    result = plan(layout.planner_model(case, tmp_path), layout.deployment(case))
    assert isinstance(result, VllmPlan)
    assert len(result.groups) == len(group_block_sizes(engine)) == 31
    assert result.groups[0].layers == (0, 1, 2)
    block = RELEASES[running()].default_block_tokens
    assert result.span_tokens(result.groups[0]) == group_block_sizes(engine)[0] == block
    assert result.num_planes == 3


# 4. MTP without MTP modules


@pytest.mark.parametrize("modules", [0, None])
def test_mtp_without_modules_fails_vllm_and_is_refused(modules: int | None, tmp_path: Path) -> None:
    case = Case(attn_tp=8, drafter="mtp", mtp_modules=0, spec_tokens=2)
    config = target_config(case)
    if modules is None:
        del config.get("text_config", config)["num_nextn_predict_layers"]
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ZeroDivisionError):  # vLLM's SpeculativeConfig, at start-up
        vllm_config(case, directory)
    model = layout.planner_model(case, tmp_path)
    assert not model.draft_layers  # the checkpoint gives the planner no module either
    with pytest.raises(Refusal) as refused:  # vLLM's method named: the plan refuses
        plan(model, replace_method(layout.deployment(case), "mtp"))
    assert refused.value.code == "draft_unsupported"
    assert refused.value.facts["mtp_modules"] == 0
    assert "dspark" in (refused.value.hint or "")


def replace_method(deployment: Deployment, method: str) -> Deployment:
    """``deployment`` with vLLM's ``--speculative-config`` method named."""
    return Deployment.model_validate({**dict(deployment), "speculative_method": method})
