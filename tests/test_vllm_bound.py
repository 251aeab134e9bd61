"""``vllm_bound_views``: the views vLLM 0.33 binds, as data (checked against vLLM's own binding
in tests/conformance/test_conformance_caches.py); here the golden shapes and the invariants
over the configuration space."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import Deployment, HybridModel, Refusal, VllmPlan, plan, plan_vllm, preset
from k3layout.engines.vllm import vllm_bound_views
from k3layout.engines.vllm.packed import packed_cache_part
from k3layout.testing import plannable_inputs


def test_k3_at_tp1_binds_raw_state_pages_and_flashmla_kernel_blocks() -> None:
    result = plan_vllm(preset("kimi-k3"), Deployment())
    views = {v.module_layer: v for v in vllm_bound_views(result, 272)}
    assert (views[0].dtype, views[0].shape) == ("int8", (272, 1, 1, 6_512_640))
    assert (views[3].dtype, views[3].shape) == ("uint8", (48_416, 1, 64, 576))
    assert views[3].entries_per_block == 178  # a 11,392-token block in 64-token kernel blocks
    assert views[0].name == "language_model.model.layers.0.self_attn"


def test_block_outermost_blocks_are_strided_by_the_whole_block() -> None:
    deployment = Deployment(attn_tp=8, attention_backend="TRITON_MLA", kv_cache_layout="BLHNC")
    result = plan(preset("kimi-k3"), deployment)
    assert isinstance(result, VllmPlan)
    for view in vllm_bound_views(result, 10):
        assert view.block_stride_bytes == result.stage_block_bytes(0)
        assert view.offset_bytes < result.stage_block_bytes(0)  # every layer in block 0


@settings(max_examples=60, deadline=None)
@given(
    inputs=plannable_inputs(engine="vllm", layouts=("LBNHC", "BLHNC")),
    num_blocks=st.integers(1, 50),
)
def test_every_view_sits_where_the_plan_puts_its_pages(
    inputs: tuple[HybridModel, Deployment], num_blocks: int
) -> None:
    model, deployment = inputs
    try:
        result = plan(model, deployment)
    except Refusal:
        return
    assert isinstance(result, VllmPlan)
    if result.packed:
        _check_packed_views(result, num_blocks)
        return
    for stage in range(len(result.stages)):
        views = vllm_bound_views(result, num_blocks, stage)
        assert [v.module_layer for v in views] == list(result.stage(stage).layers)
        assert len({v.name for v in views}) == len(views)
        backing = result.blocks_bytes(num_blocks, stage)
        for view in views:
            for block in {0, num_blocks - 1}:
                at = view.page_offset_bytes(block)
                assert at == result.page_offset_bytes(view.module_layer, block, num_blocks, stage)
                # one block's entries fit in the layer's page, and the page in the backing
                per_block = view.entries_per_block * view.strides[0] * view.elem_bytes
                span = view.entries_per_block * (view.shape[2] * view.shape[3]) * view.elem_bytes
                assert span <= result.page_bytes and at + span <= backing
                assert per_block == view.block_stride_bytes
            assert view.shape[0] == num_blocks * view.entries_per_block


def _check_packed_views(result: VllmPlan, num_blocks: int) -> None:
    """A packed plan's views: each of its caches (a KDA page; an indexed layer's latent,
    pooled keys and tail ring) starts where ``byte_range`` puts its part in every block,
    holds exactly that part's bytes a block (in whole kernel pages), and fits the backing."""
    for stage in range(len(result.stages)):
        views = vllm_bound_views(result, num_blocks, stage)
        assert sorted({v.module_layer for v in views}) == list(result.stage(stage).layers)
        assert len({v.name for v in views}) == len(views)
        backing = result.blocks_bytes(num_blocks, stage)
        ring = result.sizes.ring
        for view in views:
            part = packed_cache_part(result.sizes, view.name, view.module_layer)
            pages = view.shape[0] - (num_blocks - 1) * view.entries_per_block
            held = pages * math.prod(view.shape[1:]) * view.elem_bytes
            for block in {0, num_blocks - 1}:
                at = result.byte_range(view.module_layer, part, block, num_blocks, stage)
                assert view.page_offset_bytes(block) == at.offset_bytes
                if view.kind == "ring":
                    assert ring is not None and held == ring.payload_bytes(result.sizes.attn_tp)
                elif view.kind == "kda":
                    assert held == result.sizes.state_bytes
                else:
                    assert held == at.size_bytes
                assert at.offset_bytes + held <= backing


def test_bad_arguments_are_refused() -> None:
    parent = plan(preset("kimi-k3"), Deployment(engine="tokenspeed", attn_tp=8))
    for args in ((parent, 4), (plan_vllm(preset("kimi-k3"), Deployment()), 0)):
        try:
            vllm_bound_views(*args)  # a tokenspeed plan, refused
        except Refusal as refused:
            assert refused.code == "invalid_argument"
        else:
            raise AssertionError(f"accepted {args[1]}")
