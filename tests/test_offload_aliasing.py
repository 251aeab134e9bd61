"""The aliasing check on addresses: layer j of every KDA group starts at published plane j and
strides by the page. Accepts vLLM's true layout; refuses every layout a loose check lets by."""

from __future__ import annotations

import pytest

from k3layout import Deployment, HybridModel, Refusal, VllmPlan, plan_parent, plan_vllm
from k3layout.offload import (
    TensorView,
    aliasing_problems,
    check_aliasing,
    engine_layer_names,
    plane_order,
    vllm_views,
)

NUM_BLOCKS = 6
PLANE_GAP = 1 << 32  # planes are separate allocations, far apart


@pytest.fixture(scope="module")
def k3_plan(k3_dspark: HybridModel) -> VllmPlan:
    return plan_vllm(k3_dspark, Deployment(attn_tp=8, spec_tokens=2))


def true_views(p: VllmPlan) -> dict[str, TensorView]:
    return vllm_views(p, [(j + 1) * PLANE_GAP for j in range(p.num_planes)], NUM_BLOCKS)


def kda_name(p: VllmPlan, group: int, layer: int) -> str:
    return engine_layer_names(p.model).name(p.groups[group].layers[layer])


def refusal(p: VllmPlan, views: dict[str, TensorView], published: tuple[str, ...]) -> Refusal:
    with pytest.raises(Refusal) as refused:
        check_aliasing(p, views, published)
    assert refused.value.code == "aliasing"
    return refused.value


def test_the_true_vllm_layout_published_aliased_first_passes(k3_plan: VllmPlan) -> None:
    published = plane_order(k3_plan).order
    assert aliasing_problems(k3_plan, true_views(k3_plan), published) == ()
    check_aliasing(k3_plan, true_views(k3_plan), published)


def test_true_views_share_plane_j_between_layer_j_of_every_group(k3_plan: VllmPlan) -> None:
    views = true_views(k3_plan)
    page = 128 * 12 * 576  # block 1,536 x 576 B fp8
    # Plane 5: KDA layers 20, 21, 22 (layer 5 of each group) and attention layer 23.
    on_plane_5 = {views[f"model.layers.{i}.self_attn"] for i in (20, 21, 22)}
    on_plane_5.add(views["model.layers.23.self_attn.attn"])
    assert on_plane_5 == {
        TensorView(base_address=6 * PLANE_GAP, block_stride_bytes=page, num_bytes=NUM_BLOCKS * page)
    }


def test_the_seed_first_boot_name_order_is_refused_at_group_0_layer_18_plane_23(
    k3_plan: VllmPlan,
) -> None:
    """Planes in name order with the draft: the five draft layers and 11..27 sort ahead of 3.

    KDA layer j aliases attention layer 4j+3; in string order that layer is published at plane
    5 (draft) + its rank among the target's names. The loose "one of the leading 23 planes"
    check first fails at group 0 layer 18 (attention layer 75), published at plane 23.
    """
    name_order = plane_order(k3_plan).given
    refused = refusal(k3_plan, true_views(k3_plan), name_order)
    facts = refused.facts
    # The exact check names the first layer off its plane: layer 0 (attention layer 3) sits on
    # plane 5 + 5 = 10 (draft 0..4, then 11, 15, 19, 23, 27 sort ahead of 3).
    assert (facts["group"], facts["position"], facts["found_plane"], facts["plane"]) == (
        "linear_attention_0",
        0,
        10,
        0,
    )
    assert (facts["layer"], facts["layer_name"]) == (0, "model.layers.0.self_attn")
    assert (facts["expected"], facts["actual"]) == (0, 10)
    # ...and every layer that starts outside the image: layers 18..22 of each of the 3 groups.
    assert facts["outside_image"] == tuple(
        kda_name(k3_plan, g, j) for g in range(3) for j in range(18, 23)
    )
    assert "break the rule" in refused.message and "of 69 KDA layers" in refused.message
    assert "15 start outside the image's 23 planes" in refused.message
    assert "KDA group 0 layer 18 starts on plane 23" in refused.message
    assert "KDA group 0 layer 0 (model.layers.0.self_attn) starts on plane 10" in refused.message


def test_a_kda_layer_on_a_plane_outside_the_image_is_refused(k3_plan: VllmPlan) -> None:
    published = plane_order(k3_plan).order
    views = true_views(k3_plan)
    moved = kda_name(k3_plan, 1, 3)
    views[moved] = views[published[25]]  # a draft layer's plane, not in the image
    refused = refusal(k3_plan, views, published)
    assert refused.facts["group"] == "linear_attention_1"
    assert refused.facts["position"] == 3
    assert refused.facts["layer"] == 4 * 3 + 1  # the strided groups: layer 3 of group 1
    assert refused.facts["found_plane"] == 25
    assert refused.facts["plane"] == 3
    assert refused.facts["outside_image"] == (moved,)
    assert refused.facts["num_misplaced"] == 1
    assert "KDA group 1 layer 3" in refused.message and "plane 25" in refused.message


def test_permuted_layers_within_a_group_are_refused(k3_plan: VllmPlan) -> None:
    published = plane_order(k3_plan).order
    views = true_views(k3_plan)
    first, second = kda_name(k3_plan, 0, 0), kda_name(k3_plan, 0, 1)
    views[first], views[second] = views[second], views[first]
    refused = refusal(k3_plan, views, published)
    assert (refused.facts["group"], refused.facts["position"]) == ("linear_attention_0", 0)
    assert (refused.facts["found_plane"], refused.facts["plane"]) == (1, 0)
    assert refused.facts["num_misplaced"] == 2
    assert refused.facts["outside_image"] == ()  # a loose check passes this layout


def test_layers_swapped_between_two_groups_are_refused(k3_plan: VllmPlan) -> None:
    """Group 0 and group 2 trade layers at different positions: both still start on leading
    planes (a loose check passes), neither on its own plane."""
    published = plane_order(k3_plan).order
    views = true_views(k3_plan)
    a, b = kda_name(k3_plan, 0, 2), kda_name(k3_plan, 2, 7)
    views[a], views[b] = views[b], views[a]
    refused = refusal(k3_plan, views, published)
    assert (refused.facts["group"], refused.facts["position"]) == ("linear_attention_0", 2)
    assert (refused.facts["found_plane"], refused.facts["plane"]) == (7, 2)
    problems = aliasing_problems(k3_plan, views, published)
    assert [(p.unit, p.layer, p.found_plane, p.expected_plane) for p in problems] == [
        (0, 2, 7, 2),
        (2, 7, 2, 7),
    ]


def test_a_group_aliasing_a_shifted_run_of_planes_is_refused(k3_plan: VllmPlan) -> None:
    """Group 1 rides planes 1..23 instead of 0..22: every layer is still on a published plane,
    22 of them inside the image."""
    published = plane_order(k3_plan).order
    views = true_views(k3_plan)
    for j in range(23):
        views[kda_name(k3_plan, 1, j)] = views[published[j + 1]]
    refused = refusal(k3_plan, views, published)
    assert (refused.facts["group"], refused.facts["position"], refused.facts["found_plane"]) == (
        "linear_attention_1",
        0,
        1,
    )
    assert refused.facts["num_misplaced"] == 23
    assert refused.facts["outside_image"] == (kda_name(k3_plan, 1, 22),)


def test_a_stride_that_is_not_the_page_is_refused(k3_plan: VllmPlan) -> None:
    published = plane_order(k3_plan).order
    views = true_views(k3_plan)
    name = kda_name(k3_plan, 2, 4)
    right = views[name]
    views[name] = TensorView(
        base_address=right.base_address,
        block_stride_bytes=832_512,  # the state's own size, not the 884,736 B page
        num_bytes=right.num_bytes,
    )
    refused = refusal(k3_plan, views, published)
    assert refused.facts["misplaced_by"] == "stride"
    assert (refused.facts["group"], refused.facts["position"]) == ("linear_attention_2", 4)
    assert (refused.facts["found_plane"], refused.facts["plane"]) == (4, 4)
    assert "strides by 832512 B, not the page (884736 B)" in refused.message


def test_a_state_inside_its_plane_but_not_at_its_start_is_refused(k3_plan: VllmPlan) -> None:
    published = plane_order(k3_plan).order
    views = true_views(k3_plan)
    name = kda_name(k3_plan, 0, 9)
    right = views[name]
    views[name] = TensorView(
        base_address=right.base_address + 4096,
        block_stride_bytes=right.block_stride_bytes,
        num_bytes=right.num_bytes - 4096,
    )
    refused = refusal(k3_plan, views, published)
    assert refused.facts["misplaced_by"] == "offset"
    assert (refused.facts["found_plane"], refused.facts["plane"]) == (9, 9)


def test_a_state_on_no_published_plane_is_refused(k3_plan: VllmPlan) -> None:
    """Three groups with their own tensors (not aliased) start on no plane at all."""
    published = plane_order(k3_plan).order
    views = true_views(k3_plan)
    name = kda_name(k3_plan, 0, 0)
    views[name] = TensorView(
        base_address=100 * PLANE_GAP, block_stride_bytes=884_736, num_bytes=NUM_BLOCKS * 884_736
    )
    refused = refusal(k3_plan, views, published)
    assert refused.facts["misplaced_by"] == "outside"
    assert refused.facts["found_plane"] is None
    assert refused.facts["outside_image"] == (name,)
    assert "starts on no published plane" in refused.message


def test_a_state_running_past_its_plane_is_refused(k3_plan: VllmPlan) -> None:
    published = plane_order(k3_plan).order
    views = true_views(k3_plan)
    name = kda_name(k3_plan, 1, 1)
    right = views[name]
    views[name] = TensorView(
        base_address=right.base_address,
        block_stride_bytes=right.block_stride_bytes,
        num_bytes=right.num_bytes + 884_736,  # one block more than the plane has
    )
    assert refusal(k3_plan, views, published).facts["misplaced_by"] == "extent"


def test_an_attention_plane_with_another_stride_is_refused(k3_plan: VllmPlan) -> None:
    published = plane_order(k3_plan).order
    views = true_views(k3_plan)
    right = views[published[28]]
    views[published[28]] = TensorView(
        base_address=right.base_address, block_stride_bytes=73_728, num_bytes=right.num_bytes
    )
    refused = refusal(k3_plan, views, published)
    assert refused.facts == {
        "check": "check_aliasing",
        "field": "block_stride_bytes",
        "stage": 0,
        "layer": 92,  # published last: the target's last attention layer (not aliased)
        "layer_name": published[28],
        "group": "full_attention",
        "position": 23,
        "plane": 28,
        "part": None,
        "block": None,
        "expected": 884_736,
        "actual": 73_728,
    }


def test_missing_views_are_refused_by_name(k3_plan: VllmPlan) -> None:
    views = true_views(k3_plan)
    del views["model.layers.0.self_attn"]
    with pytest.raises(Refusal) as refused:
        check_aliasing(k3_plan, views, plane_order(k3_plan).order)
    assert refused.value.code == "layer_names"
    facts = refused.value.facts
    assert (facts["check"], facts["field"], facts["stage"]) == ("check_aliasing", "names", 0)
    assert facts["missing"] == ("model.layers.0.self_attn",)
    assert facts["layer_name"] == "model.layers.0.self_attn"


def test_plane_bases_must_match_the_planes(k3_plan: VllmPlan) -> None:
    with pytest.raises(Refusal) as refused:
        vllm_views(k3_plan, [0, 1 << 32], NUM_BLOCKS)
    assert refused.value.code == "invalid_argument"
    assert refused.value.facts == {
        "stage": 0,
        "num_planes": 29,
        "num_bases": 2,
        "num_blocks": NUM_BLOCKS,
    }


def test_a_parent_plan_is_refused(k3_dspark: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        check_aliasing(plan_parent(k3_dspark, Deployment(attn_tp=8)), {}, ())
    assert refused.value.code == "engine_mismatch"


def test_matching_on_addresses_reproduces_the_reorder_of_the_seeds_fix(
    k3_plan: VllmPlan,
) -> None:
    name_order = plane_order(k3_plan).given
    matched = plane_order(k3_plan, name_order, views=true_views(k3_plan))
    assert matched == plane_order(k3_plan, name_order)
    check_aliasing(k3_plan, true_views(k3_plan), matched.order)


def test_matching_on_addresses_refuses_a_state_on_no_attention_plane(k3_plan: VllmPlan) -> None:
    views = true_views(k3_plan)
    name = kda_name(k3_plan, 0, 4)
    views[name] = TensorView(base_address=7, block_stride_bytes=884_736, num_bytes=884_736)
    with pytest.raises(Refusal) as refused:
        plane_order(k3_plan, views=views)
    assert refused.value.code == "aliasing"
    assert refused.value.facts == {
        "check": "plane_order",
        "field": "plane",
        "stage": 0,
        "layer": 16,  # layer 4 of the strided group 0: module layer 4 x 4
        "layer_name": name,
        "group": "linear_attention_0",
        "position": 4,
        "plane": 4,
        "part": None,
        "block": None,
        "expected": "model.layers.19.self_attn.attn",  # 4 x 4 + 3
        "actual": None,
    }


def test_matching_on_addresses_refuses_two_positions_on_one_plane(k3_plan: VllmPlan) -> None:
    views = true_views(k3_plan)
    views[kda_name(k3_plan, 0, 1)] = views[kda_name(k3_plan, 0, 0)]
    with pytest.raises(Refusal) as refused:
        plane_order(k3_plan, views=views)
    assert refused.value.code == "aliasing"
    facts = refused.value.facts
    assert (facts["position"], facts["other_layer"]) == (1, kda_name(k3_plan, 0, 0))
    assert facts["actual"] == "model.layers.3.self_attn.attn"
