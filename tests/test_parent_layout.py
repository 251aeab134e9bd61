"""Engine layout B, parent-block packing (SPEC section 4)."""

from __future__ import annotations

import itertools
import math

import pytest

from k3layout import Deployment, HybridModel, ParentPlan, Refusal, plan_parent

PAGE_FP8 = 128 * 576  # 73,728: one 128-token fp8 latent page
PAGE_BF16 = 128 * 1152  # 147,456


def parent(model: HybridModel, **fields: object) -> ParentPlan:
    return plan_parent(model, Deployment.model_validate({"engine": "tokenspeed", **fields}))


def test_groups_are_full_attention_and_three_contiguous_state_groups(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=8)
    assert [g.name for g in p.groups] == [
        "full_attention",
        "linear_attention_0",
        "linear_attention_1",
        "linear_attention_2",
    ]
    kda = k3.kda_layer_ids
    assert [g.layers for g in p.groups[1:]] == [kda[:23], kda[23:46], kda[46:]]
    assert p.num_planes == 24


@pytest.mark.parametrize(("tp", "mla_pages"), [(8, 12), (4, 23), (2, 45), (1, 89)])
def test_fp8_packing_is_12_23_45_89_for_tp_8_4_2_1(
    k3: HybridModel, tp: int, mla_pages: int
) -> None:
    p = parent(k3, attn_tp=tp)
    state = 6_512_640 // tp  # S(tp, 0)
    assert p.packing.mla_pages == mla_pages == math.ceil(state / PAGE_FP8)
    assert p.packing.state_pages == 1
    assert p.packing_by_group == {
        "full_attention": mla_pages,
        "linear_attention_0": 1,
        "linear_attention_1": 1,
        "linear_attention_2": 1,
    }
    assert p.rule_1152 is not None and p.rule_1152.chosen


def test_tp1_parent_is_157483008_and_tp8_parent_21233664(k3: HybridModel) -> None:
    assert parent(k3, attn_tp=1).parent_bytes == 24 * 89 * PAGE_FP8 == 157_483_008
    assert parent(k3, attn_tp=8).parent_bytes == 24 * 12 * PAGE_FP8 == 21_233_664


def test_tp8_state_padding_is_0_134_and_mla_padding_0(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=8)
    raw_state = 23 * 814_080  # 23 layers x S(8, 0)
    expected = (21_233_664 / 1 - raw_state) / raw_state
    assert p.padding_fraction["linear_attention_0"] == pytest.approx(expected)
    assert round(expected, 3) == 0.134
    assert p.padding_fraction["full_attention"] == 0.0
    assert p.utilization["linear_attention_0"] == pytest.approx(raw_state / 21_233_664)


def test_bf16_tp32_plans_3_2_where_the_1152_rule_refuses(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=32, kv_dtype="bf16")
    assert (p.packing.mla_pages, p.packing.state_pages) == (3, 2)
    raw = 23 * 203_520  # 23 x S(32, 0)
    assert p.padding_fraction["linear_attention_2"] == pytest.approx(
        (24 * 3 * PAGE_BF16 / 2 - raw) / raw
    )
    assert round(p.padding_fraction["linear_attention_2"], 3) == 0.134
    rule = p.rule_1152
    assert rule is not None
    # ceil(203,520 / 147,456) = 2; max(1, 2 * 147,456 // 203,520) = 1
    assert (rule.mla_pages, rule.state_pages) == (2, 1)
    assert round(rule.worst_padding, 3) == 0.512
    assert not rule.chosen
    assert rule.reason is not None and "0.512" in rule.reason and "0.25" in rule.reason


def test_the_older_pinned_12_8_packing_also_passes_bf16_tp32(k3: HybridModel) -> None:
    frame = parent(k3, attn_tp=32, kv_dtype="bf16").frame
    assert frame.plane_bytes(12, 8) == 12 * PAGE_BF16  # 8 x 203,520 fits: exact stride kept
    assert round(max(frame.padding(g, 12, 8) for g in frame.groups), 3) == 0.134


def test_searched_packing_is_the_smallest_parent_within_the_limit(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=32, kv_dtype="bf16")
    frame = p.frame
    for smaller in range(1, p.packing.mla_pages):
        best = smaller * PAGE_BF16 // 203_520
        feasible = best >= 1 and all(frame.padding(g, smaller, best) <= 0.25 for g in frame.groups)
        assert not feasible


def test_state_padding_never_goes_below_one_in_23(k3: HybridModel) -> None:
    for tp in (1, 2, 4, 8, 16, 32):
        for kv_dtype in ("fp8", "bf16"):
            p = parent(k3, attn_tp=tp, kv_dtype=kv_dtype)
            assert min(p.padding_fraction[f"linear_attention_{i}"] for i in range(3)) > 1 / 23


def test_a_padding_limit_below_the_floor_is_refused_with_the_floor(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        parent(k3, attn_tp=8, max_padding=0.04)
    assert refused.value.code == "padding_limit"
    assert refused.value.facts["padding_floor"] == pytest.approx(24 / 23 - 1, abs=1e-6)
    assert refused.value.facts["max_padding"] == 0.04


def test_draft_planes_lift_the_default_limit_as_tokenspeed_does(k3_dspark: HybridModel) -> None:
    p = parent(k3_dspark, attn_tp=8)
    assert p.num_planes == 29 and p.max_padding is None
    assert min(p.padding_fraction.values()) >= 0
    assert p.padding_fraction["linear_attention_0"] > 29 / 23 - 1 > 0.25
    with pytest.raises(Refusal) as refused:
        parent(k3_dspark, attn_tp=8, max_padding=0.25)
    assert refused.value.code == "padding_limit"
    assert refused.value.facts["planes"] == 29 and refused.value.facts["layers"] == 23


def test_one_live_request_of_131072_tokens_needs_92_parents_at_tp8(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=8)
    mla_pages = math.ceil(131_072 / 128) + 1 - 1  # 1,024 pages, one live request
    state_pages = 2 * 1  # per state group: two slots per live request
    expected = math.ceil(mla_pages / 12) + 3 * math.ceil(state_pages / 1)
    assert p.parents_for(131_072, max_live=1) == expected == 92


@pytest.mark.parametrize("num_parents", [7, 8, 13, 92, 93, 500, 4096])
@pytest.mark.parametrize("max_live", [1, 2, 3])
def test_token_capacity_is_the_inverse_of_parents_for(
    k3: HybridModel, num_parents: int, max_live: int
) -> None:
    p = parent(k3, attn_tp=8)
    if p.parents_for(0, max_live) > num_parents:
        with pytest.raises(Refusal) as refused:
            p.token_capacity(num_parents, max_live)
        assert refused.value.code == "budget_too_small"
        return
    tokens = p.token_capacity(num_parents, max_live)
    assert p.parents_for(tokens, max_live) <= num_parents
    assert p.parents_for(tokens + 1, max_live) > num_parents


def test_a_budget_without_room_for_the_state_is_refused(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=8)
    with pytest.raises(Refusal) as refused:
        p.token_capacity(5, max_live=1)  # 3 groups x 2 state pages need 6 parents
    assert refused.value.code == "budget_too_small"
    assert refused.value.facts["state_parents"] == 6


def test_budget_keeps_one_null_parent(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=8)
    assert p.parents_for_budget(10 * 21_233_664) == 9
    assert p.parents_for_budget(100) == 0


def test_bind_lays_planes_out_plane_major_with_the_exact_mla_stride(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=8)
    n = 4
    binding = p.bind(n)
    plane = 12 * PAGE_FP8
    assert binding.arena_bytes == (n + 1) * 24 * plane
    pages = {g.group: g.page_count for g in binding.groups}
    assert pages == {
        "full_attention": 1 + n * 12,
        **{f"linear_attention_{i}": 1 + n for i in range(3)},
    }
    by_layer = {b.layer: b for b in binding.layers}
    first_mla = by_layer[3]
    assert first_mla.plane == 0 and first_mla.base_offset == 0
    for page in range(1 + n * 12):  # MLA page x of plane 0 starts at x * page: exact stride
        assert first_mla.page_offset(page) == page * PAGE_FP8
    last_state = by_layer[k3.kda_layer_ids[-1]]  # position 22 of linear_attention_2
    assert last_state.plane == 22
    assert last_state.page_offset(3) == 22 * (n + 1) * plane + 3 * plane
    assert len(binding.layers) == 93


def test_bind_never_overlaps_two_pages_of_one_group(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=32, kv_dtype="bf16")  # two state pages per plane
    binding = p.bind(3)
    pages = {g.group: g.page_count for g in binding.groups}
    by_group: dict[str, list[tuple[int, int]]] = {}
    for layer in binding.layers:
        size = p.mla_page_bytes if layer.kind == "attention" else p.sizes.kda_state_bytes
        by_group.setdefault(layer.group, []).extend(
            (layer.page_offset(x), size) for x in range(pages[layer.group])
        )
    # pages of different groups on one plane alias by design; within a group they never do
    for ranges in by_group.values():
        ranges.sort()
        for (start, size), (following, _) in itertools.pairwise(ranges):
            assert start + size <= following
        assert ranges[-1][0] + ranges[-1][1] <= binding.arena_bytes


def test_parent_engine_refuses_dcp(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        parent(k3, attn_tp=8, dcp=8)
    assert refused.value.code == "dcp_unsupported"
    assert refused.value.facts == {"engine": "tokenspeed", "dcp": 8}


def test_kimi_linear_state_groups_7_7_6_pad_within_the_limit(kimi_linear: HybridModel) -> None:
    p = parent(kimi_linear, attn_tp=4)
    assert [len(g.layers) for g in p.groups] == [7, 7, 7, 6]
    assert max(p.padding_fraction.values()) <= 0.25
    assert p.padding_fraction["linear_attention_2"] >= 7 / 6 - 1


def test_stage_parents_use_the_global_packing(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=8, pp=4)
    for stage in p.stages:
        assert p.stage_parent_bytes(stage.index) == stage.num_planes * p.packing.plane_bytes
    whole = parent(k3, attn_tp=8)
    assert p.packing == whole.packing
