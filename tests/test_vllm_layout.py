"""Engine layout A, vLLM's hybrid allocator (SPEC section 3)."""

from __future__ import annotations

import math

import pytest

from k3layout import Deployment, HybridModel, KDALayer, MLALayer, Refusal, VllmPlan, plan_vllm
from k3layout.engines.vllm.rules import check_mtp_depth

PAGE_832512 = 832_512  # S(8, 2): K3 state at attention TP 8 with 2 speculative tokens


def k3_tp8(model: HybridModel, **fields: object) -> VllmPlan:
    return plan_vllm(model, Deployment.model_validate({"attn_tp": 8, "spec_tokens": 2, **fields}))


def test_block_is_raised_to_1536_tokens_so_one_page_holds_a_state(k3_dspark: HybridModel) -> None:
    p = k3_tp8(k3_dspark)
    # A = 128; 128 * ceil(832,512 / (128 * 576)) = 128 * 12
    assert p.block_tokens == 128 * math.ceil(PAGE_832512 / (128 * 576)) == 1536
    assert p.page_bytes == 1536 * 576 == 884_736 == 12 * 73_728  # 12 latent pages
    assert p.kda_page_padding_bytes == 884_736 - PAGE_832512


def test_k3_with_dspark_has_29_planes_and_25657344_bytes_per_block(
    k3_dspark: HybridModel,
) -> None:
    p = k3_tp8(k3_dspark)
    assert p.num_planes == 24 + 5 == 29
    assert p.block_bytes == 29 * 884_736 == 25_657_344


def test_k3_dspark_groups_three_strided_kda_groups_of_23_then_attention(
    k3_dspark: HybridModel,
) -> None:
    p = k3_tp8(k3_dspark)
    assert [(g.name, g.kind, len(g.layers)) for g in p.groups] == [
        ("linear_attention_0", "kda", 23),
        ("linear_attention_1", "kda", 23),
        ("linear_attention_2", "kda", 23),
        ("full_attention", "attention", 29),
    ]
    kda = k3_dspark.kda_layer_ids
    assert [g.layers for g in p.groups[:3]] == [kda[0::3], kda[1::3], kda[2::3]]
    assert p.groups[3].layers == (*range(3, 92, 4), 92, 93, 94, 95, 96, 97)


def test_k3_without_draft_groups_24_and_23_23_23(k3: HybridModel) -> None:
    p = k3_tp8(k3)
    assert sorted(len(g.layers) for g in p.groups) == [23, 23, 23, 24]
    assert p.num_planes == 24


def test_kimi_linear_groups_7_and_7_7_6(kimi_linear: HybridModel) -> None:
    p = plan_vllm(kimi_linear, Deployment(attn_tp=4))
    assert [len(g.layers) for g in p.groups] == [7, 7, 6, 7]
    assert p.num_planes == 7


def test_plane_j_is_shared_by_layer_j_of_every_group(k3_dspark: HybridModel) -> None:
    p = k3_tp8(k3_dspark)
    for j, members in enumerate(p.planes):
        assert [(m.group, m.layer) for m in members] == [
            (g.name, g.layers[j]) for g in p.groups if j < len(g.layers)
        ]
    # the draft's planes 23..28 carry attention only: the KDA groups stop at 23
    assert [len(members) for members in p.planes] == [4] * 23 + [1] * 6


def test_bucket_as_large_as_1_5x_the_smallest_sets_the_group_size() -> None:
    mla, kda = MLALayer(num_heads=8), KDALayer(num_heads=8, head_dim=64)
    # 4 attention, 5 KDA: 5 < 1.5 * 4, so one group of each and 5 planes
    model = HybridModel(name="m", model_type="x", layers=(mla,) * 4 + (kda,) * 5)
    p = plan_vllm(model, Deployment())
    assert [len(g.layers) for g in p.groups] == [4, 5]
    assert p.num_planes == 5
    # 4 attention, 6 KDA: 6 >= 1.5 * 4, so group size 4 and KDA splits 3 + 3
    model = HybridModel(name="m", model_type="x", layers=(mla,) * 4 + (kda,) * 6)
    assert [len(g.layers) for g in plan_vllm(model, Deployment()).groups] == [4, 3, 3]


@pytest.mark.parametrize(("kv_dtype", "block"), [("fp8", 1536), ("bf16", 768)])
def test_bf16_halves_the_block_but_keeps_the_page(
    k3: HybridModel, kv_dtype: str, block: int
) -> None:
    p = k3_tp8(k3, kv_dtype=kv_dtype)
    assert p.block_tokens == block
    assert p.page_bytes == 884_736


@pytest.mark.parametrize("requested", [64, 128, 256, 512, 1536])
def test_requested_blocks_up_to_the_raise_give_the_same_block(
    k3: HybridModel, requested: int
) -> None:
    assert k3_tp8(k3, block_tokens=requested).block_tokens == 1536


def test_a_larger_requested_block_is_kept_when_its_page_holds_the_state(k3: HybridModel) -> None:
    p = k3_tp8(k3, block_tokens=2048)
    assert p.block_tokens == 2048 and p.page_bytes == 2048 * 576


def test_blocks_for_a_budget_divide_by_page_times_group_size(k3_dspark: HybridModel) -> None:
    p = k3_tp8(k3_dspark)
    budget = 60 * 2**30
    assert p.num_blocks(budget) == budget // (884_736 * 29)


def test_dcp_spreads_an_attention_block_over_block_x_dcp_tokens(k3: HybridModel) -> None:
    p = k3_tp8(k3, dcp=8, dcp_interleave=1)
    assert p.attention_span_tokens == 1536 * 8 == 12_288
    assert p.kda_span_tokens == 1536
    assert p.bytes_per_token == p.block_bytes / 12_288
    placement = p.dcp_placement
    assert [placement.rank_of(o) for o in range(10)] == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]
    assert placement.local_position(9) == 1


def test_pp_stages_project_the_global_groups(k3_dspark: HybridModel) -> None:
    p = k3_tp8(k3_dspark, pp=8)
    assert [len(s.layers) for s in p.stages] == [11, 11, 12, 12, 12, 12, 12, 11 + 5]
    last = p.stages[-1]
    assert last.layers[-5:] == (93, 94, 95, 96, 97)
    for stage in p.stages:
        assert stage.num_planes == max(len(g.layers) for g in stage.groups)
        assert p.stage_block_bytes(stage.index) == stage.num_planes * p.page_bytes
    assert p.num_blocks(10**10) == min(10**10 // p.stage_block_bytes(i) for i in range(8))


def test_prefix_caching_off_spans_a_request_and_steps_on_the_lcm(k3_dspark: HybridModel) -> None:
    """vLLM 0.33: the KDA block is max_model_len in none mode; the scheduler steps on the lcm
    of every group's block (K3 TP 1 fp8, DSpark at 2 tokens, 8,192 tokens)."""
    p = plan_vllm(k3_dspark, Deployment(spec_tokens=2, prefix_caching=False))
    capacity = p.capacity(40 << 30, 8192)
    assert (p.block_tokens, capacity.kda_span_tokens) == (11_648, 8192)
    assert capacity.scheduler_block_tokens == math.lcm(11_648, 8192) == 745_472
    context = k3_dspark.context_tokens
    assert context is not None
    assert p.kda_span_tokens == context  # vLLM's default max_model_len
    assert p.scheduler_block_tokens == math.lcm(11_648, context)
    aligned = plan_vllm(k3_dspark, Deployment(spec_tokens=2))
    assert aligned.kda_span_tokens == aligned.scheduler_block_tokens == 11_648
    dcp = plan_vllm(k3_dspark, Deployment(attn_tp=8, dcp=8, spec_tokens=2, prefix_caching=False))
    assert dcp.capacity(40 << 30, 8192).scheduler_block_tokens == math.lcm(1536 * 8, 8192)


@pytest.mark.parametrize(("release", "default_block"), [("0.33.0", 16), ("0.34.0", 64)])
def test_a_stage_without_attention_keeps_its_own_kda_block(
    k3: HybridModel, release: str, default_block: int
) -> None:
    """Layers 0-2 alone on stage 0: their KDA block stays the release's default block (16 in
    vLLM 0.33, 64 in 0.34) or the requested one, so they bucket apart and every group holds 3
    layers; the page and the groups are the same in both releases."""
    p = k3_tp8(k3, pp=2, pp_partition=(3, 90), engine_version=release)
    assert [len(g.layers) for g in p.groups] == [3] * 31
    assert p.groups[0].layers == (0, 1, 2) and p.num_planes == 3
    assert [p.span_tokens(g) for g in p.groups[:2]] == [default_block, 1536]
    assert len({g.name for g in p.groups}) == 31
    assert p.capacity(40 << 30, 8192).scheduler_block_tokens == 1536
    requested = k3_tp8(k3, pp=2, pp_partition=(3, 90), block_tokens=256)
    assert requested.span_tokens(requested.groups[0]) == 256
    for same in ({"block_tokens": 1536}, {"prefix_caching": False}):  # one KDA spec again
        kept = k3_tp8(k3, pp=2, pp_partition=(3, 90), **same)
        assert [len(g.layers) for g in kept.groups] == [23, 23, 23, 24]


def test_mtp_without_modules_is_refused() -> None:
    with pytest.raises(Refusal) as refused:
        check_mtp_depth(0, 2)
    assert refused.value.code == "draft_unsupported"
    assert "num_nextn_predict_layers" in refused.value.message
    check_mtp_depth(1, 2)  # reused in turn
    with pytest.raises(Refusal, match="multiple"):
        check_mtp_depth(2, 3)
