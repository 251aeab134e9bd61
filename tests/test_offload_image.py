"""The checkpoint image: one unit per KDA group over the leading planes, no copy."""

from __future__ import annotations

import math

import pytest

from k3layout import (
    Deployment,
    HybridModel,
    MLALayer,
    Refusal,
    plan_parent,
    plan_vllm,
)
from k3layout.offload import CheckpointImage, checkpoint_image, page_regions, plane_order


def k3_tp8_image(model: HybridModel, **fields: int) -> CheckpointImage:
    return checkpoint_image(plan_vllm(model, Deployment(attn_tp=8, spec_tokens=2, **fields)))


def test_golden_k3_dspark_tp8_fp8_two_spec_tokens(k3_dspark: HybridModel) -> None:
    image = k3_tp8_image(k3_dspark)
    # KDA state per layer per rank: conv q|k|v, 3 x 96*128/8 channels x (4-1+2) rows x 2 B,
    # plus the fp32 recurrent state, 96/8 heads x 128 x 128 x 4 B.
    state = 3 * 96 * 128 // 8 * (4 - 1 + 2) * 2 + 96 // 8 * 128 * 128 * 4
    assert image.layer_state_bytes == state == 832_512
    # Block raised to hold one state: 128 x ceil(S / (128 tokens x 576 B fp8)) = 1,536 tokens;
    # page = 1,536 x 576.
    page = 128 * math.ceil(state / (128 * 576)) * 576
    assert image.page_bytes == page == 884_736
    # 69 KDA layers over 29 planes: ceil(69/29) = 3 groups of 23, one unit each.
    assert image.num_units == math.ceil(69 / 29) == 3
    assert image.num_planes == 69 // 3 == 23
    assert image.num_regions == 23  # K3 has no DSA index: one region per plane
    assert image.unit_bytes == 23 * page
    assert image.image_bytes == 3 * 23 * page == 61_046_784
    assert image.state_bytes == 69 * state == 57_443_328
    assert image.padding_bytes == 3 * 23 * (page - state)


def test_k3_without_the_draft_rides_the_same_23_planes_of_24(k3: HybridModel) -> None:
    image = k3_tp8_image(k3)
    assert (image.num_units, image.num_planes) == (3, 23)
    assert image.image_bytes == 3 * 23 * 884_736


def test_every_kda_layer_has_a_range_on_its_plane_of_its_unit(k3_dspark: HybridModel) -> None:
    image = k3_tp8_image(k3_dspark)
    page, state = image.page_bytes, image.layer_state_bytes
    ranges = image.ranges
    assert len(ranges) == 69
    # KDA group 1, layer 5: module layer 4*5 + 1 = 21, on plane 5 (attention layer 23),
    # at unit 1: (1 x 23 + 5) pages into the image.
    r = image.range_of("linear_attention_1", 5)
    assert (r.unit, r.plane, r.module_layer) == (1, 5, 21)
    assert r.attention_layer == "model.layers.23.self_attn.attn"
    assert (r.offset_bytes, r.end_bytes) == ((1 * 23 + 5) * page, (1 * 23 + 5) * page + state)
    with pytest.raises(Refusal) as refused:
        image.range_of("linear_attention_1", 23)
    assert refused.value.code == "invalid_argument"
    assert refused.value.facts["layer"] == 23


def dsa_k3(k3_dspark: HybridModel) -> HybridModel:
    """K3 + DSpark with a DSA index row (132 B/token) on every attention layer."""
    dsa = MLALayer(num_heads=96, q_lora_rank=1536, index_bytes_per_token=132)
    return HybridModel(
        name="k3-dsa",
        model_type="kimi_k3",
        layers=tuple(dsa if layer.kind == "mla" else layer for layer in k3_dspark.layers),
        draft_layers=(dsa,) * len(k3_dspark.draft_layers),
    )


def test_a_dsa_index_region_folds_into_its_attention_layer(k3_dspark: HybridModel) -> None:
    p = plan_vllm(dsa_k3(k3_dspark), Deployment(attn_tp=8, spec_tokens=2))
    image = checkpoint_image(p)
    # Attention bytes per token: 576 latent + 132 index; block 128 x ceil(832,512 / (128 x 708))
    # = 1,280 tokens; the page holds both parts.
    block = 128 * math.ceil(832_512 / (128 * (576 + 132)))
    assert p.block_tokens == block == 1_280
    page = block * (576 + 132)
    assert image.page_bytes == page
    # Each image plane publishes two regions (latent, index) but counts once.
    assert image.num_planes == 23
    assert image.num_regions == 2 * 23
    assert image.plane_movable_bytes == (block * 576 + block * 132,) * 23
    assert image.image_bytes == 3 * 23 * page
    assert image.state_bytes == 69 * 832_512
    regions = page_regions(p, plane_order(p))
    assert len(regions) == 2 * 29
    latent, index = regions[0], regions[1]
    assert (latent.name, latent.part, latent.offset_bytes, latent.num_bytes) == (
        "model.layers.3.self_attn.attn",
        "latent",
        0,
        block * 576,
    )
    assert (index.name, index.part, index.offset_bytes, index.num_bytes) == (
        "model.layers.3.self_attn.attn.indexer.k_cache",
        "index",
        block * 576,
        block * 132,
    )
    assert index.attention_layer == latent.attention_layer


def test_kimi_linear_groups_of_7_7_6_span_7_planes(kimi_linear: HybridModel) -> None:
    image = checkpoint_image(plan_vllm(kimi_linear, Deployment(attn_tp=8, spec_tokens=2)))
    # 20 KDA layers over 7 attention planes: ceil(20/7) = 3 groups of 7, 7, 6.
    assert [len(g.layers) for g in image.groups] == [7, 7, 6]
    assert image.num_planes == 7
    assert image.state_bytes == 20 * image.layer_state_bytes
    # The third unit's plane 6 holds no state: it is image, not state.
    assert image.padding_bytes == 3 * 7 * image.page_bytes - 20 * image.layer_state_bytes


def test_with_pp_each_stage_has_its_own_image(k3_dspark: HybridModel) -> None:
    p = plan_vllm(k3_dspark, Deployment(attn_tp=8, spec_tokens=2, pp=2))
    last = p.stages[1]
    image = checkpoint_image(p, stage=1)
    kda_on_stage = [g for g in last.groups if g.kind == "kda"]
    assert [len(g.layers) for g in image.groups] == [len(g.layers) for g in kda_on_stage]
    assert image.num_planes == max(len(g.layers) for g in kda_on_stage) == 11
    assert image.image_bytes == 3 * 11 * p.page_bytes
    assert (
        image.planes[0].attention_layer
        == f"model.layers.{last.group('full_attention').layers[0]}.self_attn.attn"
    )


def test_a_stage_whose_kda_group_outgrows_its_attention_planes_is_refused(
    k3_dspark: HybridModel,
) -> None:
    p = plan_vllm(k3_dspark, Deployment(attn_tp=8, spec_tokens=2, pp=2))
    first = p.stages[0]
    attention = len(first.group("full_attention").layers)
    kda = len(first.group("linear_attention_0").layers)
    assert (attention, kda) == (11, 12)  # layers 0..46: attention 3, 7, ..., 43
    with pytest.raises(Refusal) as refused:
        checkpoint_image(p, stage=0)
    assert refused.value.code == "aliasing"
    assert refused.value.facts == {
        "check": "plane_order",
        "field": "planes",
        "stage": 0,
        "layer": first.group("linear_attention_0").layers[attention],
        "layer_name": None,
        "group": "linear_attention_0",
        "position": attention,
        "plane": attention,
        "part": None,
        "block": None,
        "expected": attention + 1,  # attention planes the stage would need
        "actual": attention,
    }


def test_a_parent_plan_is_refused(k3_dspark: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        checkpoint_image(plan_parent(k3_dspark, Deployment(attn_tp=8, spec_tokens=2)))
    assert refused.value.code == "engine_mismatch"
    assert refused.value.facts == {"engine": "tokenspeed", "required_engine": "vllm"}


def test_an_image_is_a_frozen_record_that_round_trips(k3_dspark: HybridModel) -> None:
    image = k3_tp8_image(k3_dspark)
    again = CheckpointImage.model_validate_json(image.model_dump_json())
    assert again == image and hash(again) == hash(image)
