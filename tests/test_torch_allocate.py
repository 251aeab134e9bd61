"""Allocation as the engines do it: vLLM planes shared by layer j of every group, per-layer views
cut from each page; the parent arena laid out by bind(n)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import given, settings
from torch_cases import small_plans

from k3layout import (
    ConvLayout,
    Deployment,
    HybridModel,
    KDALayer,
    MLALayer,
    ParentPlan,
    Refusal,
    VllmPlan,
    conv_channel_offset,
    plan_parent,
    plan_vllm,
    preset,
)
from k3layout.offload import vllm_views
from k3layout.torch import allocate, cache_spec, validate

K3_TP8 = Deployment(attn_tp=8, spec_tokens=2)  # fp8


@pytest.fixture(scope="module")
def k3_plan() -> VllmPlan:
    return plan_vllm(preset("kimi-k3-dspark"), K3_TP8)


def test_k3_tp8_kda_views_are_one_conv_tensor_then_the_state_from_the_page_start(
    k3_plan: VllmPlan,
) -> None:
    cache = allocate(k3_plan, num_blocks=2)
    conv, state = cache.layers["model.layers.0.self_attn"]
    rows = 4 - 1 + 2  # K - 1 + s
    channels = 3 * 96 // 8 * 128  # q|k|v side by side: 3 x heads on the rank x head dim
    assert conv.shape == (2, rows, channels)  # time-major, vLLM's default "SD" layout
    assert state.shape == (2, 96 // 8, 128, 128)
    assert (conv.dtype, state.dtype) == (torch.bfloat16, torch.float32)
    page = 1536 * 576  # block 1,536 tokens x 576 B fp8 = 884,736
    plane = cache.planes[0].data_ptr()
    conv_bytes = rows * channels * 2  # 46,080 B of bf16: 3 * 96 // 8 * 128 * 5 * 2
    assert conv_bytes == 3 * 96 // 8 * 128 * 5 * 2
    assert [t.data_ptr() - plane for t in (conv, state)] == [
        0,
        conv_bytes,  # 46,080: the recurrent state follows the one conv tensor
    ]
    assert conv[1].data_ptr() - conv[0].data_ptr() == page  # the page is the block stride
    assert conv.stride() == (page // 2, channels, 1)
    assert state.stride(0) * 4 == page
    # 832,512 B of state, the rest of the page is padding at its end
    assert conv_bytes + state[0].numel() * 4 == 832_512 < page


def test_k3_tp8_mla_is_latent_rows_in_the_cache_dtype(k3_plan: VllmPlan) -> None:
    cache = allocate(k3_plan, num_blocks=2)
    (latent,) = cache.layers["model.layers.3.self_attn.attn"]
    assert latent.shape == (2, 1536, 512 + 64) and latent.dtype == torch.float8_e4m3fn
    assert latent.stride() == (1536 * 576, 576, 1)


def test_layer_j_of_every_group_shares_plane_j_with_attention_layer_j(k3_plan: VllmPlan) -> None:
    cache = allocate(k3_plan, num_blocks=2)
    assert len(cache.planes) == 29  # 24 target + 5 draft attention layers
    # Plane 5: KDA layers 20, 21, 22 (layer 5 of each group) and attention layer 4*5 + 3 = 23.
    starts = {cache.layers[f"model.layers.{i}.self_attn"][0].data_ptr() for i in (20, 21, 22)}
    starts.add(cache.layers["model.layers.23.self_attn.attn"][0].data_ptr())
    assert starts == {cache.planes[5].data_ptr()}
    # ...and writing the state writes the attention layer's page: one set of bytes.
    cache.layers["model.layers.21.self_attn"][0][1].fill_(1.0)
    assert cache.layers["model.layers.23.self_attn.attn"][0][1].to(torch.float32).abs().sum() > 0


def test_the_views_are_the_ones_the_offload_plans_from_the_plane_addresses(
    k3_plan: VllmPlan,
) -> None:
    cache = allocate(k3_plan, num_blocks=3)
    planned = vllm_views(k3_plan, [plane.data_ptr() for plane in cache.planes], num_blocks=3)
    assert dict(validate(k3_plan, cache.registered).views) == planned


def test_a_ds_conv_state_is_channels_by_rows() -> None:
    p = plan_vllm(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2, conv_layout="DS"))
    conv, state = allocate(p, num_blocks=1).layers["model.layers.0.self_attn"]
    assert conv.shape == (1, 3 * 96 // 8 * 128, 4 - 1 + 2)
    assert conv.stride()[1:] == (4 - 1 + 2, 1)
    # the recurrent state still follows the whole conv tensor
    assert state.data_ptr() - conv.data_ptr() == 3 * 96 // 8 * 128 * 5 * 2


@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
def test_the_k_channels_of_row_0_sit_where_conv_channel_offset_says(
    conv_layout: ConvLayout,
) -> None:
    deployment = Deployment(attn_tp=8, spec_tokens=2, conv_layout=conv_layout)
    p = plan_vllm(preset("kimi-k3-dspark"), deployment)
    cache = allocate(p, num_blocks=2)
    conv, _ = cache.layers["model.layers.0.self_attn"]
    spec = p.sizes.spec_of(0)
    offset = conv_channel_offset(spec, "k", 8)
    channels = 96 // 8 * 128  # one of q, k, v on the rank
    # SD [rows, q|k|v]: row 0's k follows row 0's q; DS [q|k|v, rows]: k follows every q row
    rows = 4 - 1 + 2
    assert offset == (channels * 2 if conv_layout == "SD" else channels * rows * 2)
    block = 1
    if conv_layout == "SD":
        conv[block, 0, channels : 2 * channels] = torch.arange(channels).to(torch.bfloat16)
    else:
        conv[block, channels : 2 * channels, 0] = torch.arange(channels).to(torch.bfloat16)
    # read the plane's bytes where the k channel c of row 0 should be: the conv tensor's start
    # in the block, plus the offset, plus c channels further (row-major SD, or c rows in DS)
    start = conv[block].data_ptr() - cache.planes[0].data_ptr()
    plane = cache.planes[0].view(-1)
    step = 2 if conv_layout == "SD" else rows * 2
    for c in (0, 1, channels - 1):
        at = start + offset + c * step
        got = plane[at : at + 2].view(torch.bfloat16).item()
        assert got == float(torch.tensor(c).to(torch.bfloat16))
    # ...and nothing before the offset was written: the q channels of row 0 stay zero
    assert not plane[start : start + offset].any()


def test_a_dsa_index_region_follows_the_latent_rows_in_the_page() -> None:
    mla = MLALayer(num_heads=8, index_bytes_per_token=132)
    model = HybridModel(name="dsa", model_type="x", layers=(mla,) * 3)
    p = plan_vllm(model, Deployment(kv_dtype="bf16", attention_backend="FLASHMLA"))
    cache = allocate(p, num_blocks=2)
    (latent,) = cache.layers["model.layers.1.self_attn.attn"]
    (index,) = cache.layers["model.layers.1.self_attn.attn.indexer.k_cache"]
    block = p.block_tokens  # FlashMLA's preferred 64: no state to raise the block for
    assert block == 64
    assert index.shape == (2, block, 132) and index.dtype == torch.uint8
    # the block's latent rows of 576 bf16 come first, then its index rows of 132 B
    assert index.data_ptr() - latent.data_ptr() == block * 576 * 2
    assert index.stride(0) == p.page_bytes == block * (576 * 2 + 132)


def test_flashmla_fp8_rows_are_raw_656_byte_rows() -> None:
    # no engine here serves fp8_ds_mla for K3; the layer's own spec still describes the row
    layer = preset("kimi-k3").mla_layers[0]
    latent = layer.cache_spec(Deployment(attn_tp=8, kv_dtype="fp8_ds_mla")).part("latent")
    assert latent.dtype == "uint8"
    assert latent.engine_shape(8) == (512 + 512 // 128 * 4 + 64 * 2,)  # fp8, fp32 scales, rope


def test_the_parent_arena_is_laid_out_by_bind() -> None:
    p = plan_parent(preset("kimi-k3"), K3_TP8)
    n = 2
    cache = allocate(p, num_blocks=n)
    binding = p.bind(n)
    arena = cache.planes[0].data_ptr()
    assert cache.num_bytes == binding.arena_bytes == (n + 1) * p.parent_bytes
    names = validate(p, cache.registered).names
    page_counts = {group.group: group.page_count for group in binding.groups}
    for bound in binding.layers:
        first = cache.layers[names.name(bound.layer)][0]
        for page in range(page_counts[bound.group]):  # page 0 is the null page
            # every group's pages sit plane / p_g apart, from the null parent's last slot
            assert first[page].data_ptr() == arena + bound.page_offset(page)


@settings(max_examples=100, deadline=None)
@given(small_plans())
def test_every_part_sits_at_its_offset_on_its_plane_back_to_back_inside_one_page(
    case: tuple[VllmPlan | ParentPlan, int],
) -> None:
    p, stage = case
    cache = allocate(p, num_blocks=2, stage=stage)
    validate(p, cache.registered, stage=stage)  # what allocation builds, validation accepts
    if p.block_outermost:  # one backing of whole blocks: every part at its byte range
        validate(p, cache.bound, stage=stage)  # and vLLM's own binding of it
        backing = cache.planes[0].data_ptr()
        for layer in cache.spec.layers:
            for part, tensor in zip(layer.parts, cache.layers[layer.name], strict=True):
                for block in (0, 1):
                    at = p.byte_range(layer.module_layer, part.part, block, 2, stage)
                    assert tensor[block].data_ptr() - backing == at.offset_bytes
                    assert tensor[block].numel() * tensor.element_size() == at.size_bytes
        return
    for layer in cache.spec.layers:
        plane = cache.planes[layer.plane]
        # page 0 starts at the plane (vllm) or the null parent's last slot (tokenspeed)
        origin = p.page_origin_bytes(p.group(layer.group), layer.plane)
        for part, tensor in zip(layer.parts, cache.layers[layer.name], strict=True):
            inner = p.part_range(layer.module_layer, part.part)
            assert tensor.data_ptr() - plane.data_ptr() == part.offset_bytes
            assert part.offset_bytes == origin + inner.offset_bytes
            assert math.prod(tensor.shape[1:]) * tensor.element_size() == inner.size_bytes
        ranges = p.part_range_list(layer.module_layer)
        if layer.kind == "kda":  # conv (q|k|v), recurrent: S, nothing else
            assert sum(r.size_bytes for r in ranges) == p.sizes.kda_state_bytes
        first = cache.layers[layer.name][0]
        # a page's parts never spill into the next page
        assert ranges[-1].end_bytes <= first.stride(0) * first.element_size()


def test_refuses_a_block_count_below_one_and_an_unknown_conv_layout(k3_plan: VllmPlan) -> None:
    with pytest.raises(Refusal) as refused:
        allocate(k3_plan, num_blocks=0)
    assert (refused.value.code, refused.value.facts) == ("invalid_argument", {"num_blocks": "0"})
    with pytest.raises(Refusal) as refused:
        cache_spec(k3_plan, 0)
    assert (refused.value.code, refused.value.facts) == ("invalid_argument", {"num_blocks": "0"})
    # the layout is a deployment field now: an unknown one (or an old name) never plans
    for layout in ("diagonal", "time_major", "channel_major"):
        with pytest.raises(Refusal) as refused:
            Deployment.model_validate({"attn_tp": 8, "conv_layout": layout})
        assert refused.value.facts["field"] == "conv_layout"


def test_refuses_a_recurrent_state_that_starts_off_an_fp32_word() -> None:
    # conv: q|k|v x 1 head x 1 channel x (4 - 1) rows x 2 B = 18 B: the fp32 state would
    # start at byte 18, not a multiple of 4, and vLLM cannot cut it (nor can we).
    kda = KDALayer(num_heads=1, head_dim=1, conv_kernel=4)
    model = HybridModel(
        name="odd", model_type="x", layers=(kda, MLALayer(num_heads=1, kv_lora_rank=8))
    )
    with pytest.raises(Refusal) as refused:
        allocate(plan_vllm(model, Deployment()), num_blocks=1)
    assert refused.value.code == "tensor_mismatch"
    assert refused.value.facts == {
        "part": "recurrent",
        "dtype": "float32",
        "bytes": 3 * 1 * 1 * 3 * 2,
        "elem_bytes": 4,
    }
