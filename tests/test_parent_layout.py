"""Engine layout B, parent-block packing (SPEC section 4), as tokenspeed #1152's head packs it
(``engine_version="pr1152"``: the packing grows with the KDA state; ``main`` pins 12:1 and is
tested in ``test_tokenspeed_main.py``)."""

from __future__ import annotations

import itertools
import math

import pytest

from k3layout import Deployment, HybridModel, ParentPlan, Refusal, plan_parent

PAGE_FP8 = 128 * 576  # 73,728: one 128-token fp8 latent page
PAGE_BF16 = 128 * 1152  # 147,456


def parent(model: HybridModel, **fields: object) -> ParentPlan:
    """The parent #1152's recipe lays out (these are its facts)."""
    deployment = {"engine": "tokenspeed", "engine_version": "pr1152", **fields}
    return plan_parent(model, Deployment.model_validate(deployment))


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


def test_bf16_tp32_is_refused_as_tokenspeeds_1152_rule_refuses_it(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        parent(k3, attn_tp=32, kv_dtype="bf16")
    # ceil(203,520 / 147,456) = 2; max(1, 2 * 147,456 // 203,520) = 1: padding 0.512 > 0.25
    assert refused.value.code == "padding_limit"
    assert refused.value.facts["group"] == "linear_attention_0"
    assert refused.value.facts["padding"] == pytest.approx(0.512059, abs=1e-6)
    assert "padding fraction 0.512059 exceeds limit 0.250000" in str(refused.value)
    # a limit of its own lets the rule's 2/1 plan
    lifted = parent(k3, attn_tp=32, kv_dtype="bf16", max_padding=0.6)
    assert (lifted.packing.mla_pages, lifted.packing.state_pages) == (2, 1)
    raw = 23 * 203_520  # 23 x S(32, 0)
    assert lifted.padding_fraction["linear_attention_2"] == (24 * 2 * PAGE_BF16 - raw) / raw


def test_state_padding_never_goes_below_one_in_23(k3: HybridModel) -> None:
    for tp in (1, 2, 4, 8, 16, 32):
        for kv_dtype in ("fp8", "bf16"):
            if (tp, kv_dtype) == (32, "bf16"):
                continue  # refused: padding 0.512
            p = parent(k3, attn_tp=tp, kv_dtype=kv_dtype)
            assert min(p.padding_fraction[f"linear_attention_{i}"] for i in range(3)) > 1 / 23


def test_a_padding_limit_below_the_state_padding_is_refused_naming_it(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        parent(k3, attn_tp=8, max_padding=0.04)
    assert refused.value.code == "padding_limit"
    assert refused.value.facts["padding"] == pytest.approx(0.134044, abs=1e-6)
    assert refused.value.facts["max_padding"] == 0.04


def test_draft_planes_lift_the_default_limit_as_tokenspeed_does(k3_dspark: HybridModel) -> None:
    p = parent(k3_dspark, attn_tp=8)
    assert p.num_planes == 29 and p.max_padding is None
    assert min(p.padding_fraction.values()) >= 0
    assert p.padding_fraction["linear_attention_0"] > 29 / 23 - 1 > 0.25
    with pytest.raises(Refusal) as refused:
        parent(k3_dspark, attn_tp=8, max_padding=0.25)
    assert refused.value.code == "padding_limit"
    assert refused.value.facts["group"] == "linear_attention_0"


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


def test_bind_lays_planes_out_in_tokenspeeds_order_and_page_slots(k3: HybridModel) -> None:
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
    # slot.0, slot.1, slot.10, ..., slot.19, slot.2, slot.20, ...: plane 2 is the 13th
    assert binding.plane_order[:4] == (0, 1, 10, 11)
    assert binding.plane_starts[2] == 12 * (n + 1) * plane
    by_layer = {b.layer: b for b in binding.layers}
    first_mla = by_layer[3]
    assert first_mla.plane == 0 and first_mla.base_offset == 0
    # the null page 0 is the last slot of the null parent; page x at (x + 11) * page
    for page in range(1 + n * 12):
        assert first_mla.page_offset(page) == (page + 11) * PAGE_FP8
    last_state = by_layer[k3.kda_layer_ids[-1]]  # position 22 of linear_attention_2
    assert last_state.plane == 22
    assert last_state.base_offset == binding.plane_starts[22] == 15 * (n + 1) * plane
    assert last_state.page_offset(3) == last_state.base_offset + 3 * plane
    assert len(binding.layers) == 93


def test_bind_never_overlaps_two_pages_of_one_group(k3: HybridModel) -> None:
    p = parent(k3, attn_tp=16, kv_dtype="bf16")
    binding = p.bind(3)
    pages = {g.group: g.page_count for g in binding.groups}
    by_group: dict[str, list[tuple[int, int]]] = {}
    for layer in binding.layers:
        size = p.layer_payload_bytes(layer.layer)
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


def test_kimi_linear_is_refused_as_tokenspeeds_recipe_refuses_it(
    kimi_linear: HybridModel,
) -> None:
    with pytest.raises(Refusal) as refused:
        parent(kimi_linear, attn_tp=4)
    assert refused.value.code == "layout_unsupported"
    assert (
        "Kimi-K3 cache requires the KDA layer count to divide into 3 state groups, got 20"
        in str(refused.value)
    )


def test_tokenspeed_has_no_pipeline_stages(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        parent(k3, attn_tp=8, pp=4)
    assert (refused.value.code, refused.value.facts["field"]) == ("engine_setting", "pp")
