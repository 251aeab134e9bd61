"""PAGE plane order: the engine's layer names, name order, and the aliased planes first."""

from __future__ import annotations

import pytest

from k3layout import Deployment, HybridModel, Refusal, VllmPlan, plan_vllm
from k3layout.offload import LayerNames, engine_layer_names, name_order, plane_order


def k3_dspark_tp8(model: HybridModel) -> VllmPlan:
    return plan_vllm(model, Deployment(attn_tp=8, spec_tokens=2))


def test_names_follow_the_engines_convention_with_the_draft_after_the_target(
    k3_dspark: HybridModel,
) -> None:
    names = engine_layer_names(k3_dspark)
    assert len(names.names) == 93 + 5  # target layers, then the DSpark draft's
    assert names.name(0) == "model.layers.0.self_attn"  # KDA
    assert names.name(3) == "model.layers.3.self_attn.attn"  # MLA
    assert names.name(92) == "model.layers.92.self_attn.attn"  # the last target layer is MLA
    assert [names.name(i) for i in range(93, 98)] == [
        f"draft.layers.{k}.self_attn.attn" for k in range(5)
    ]
    assert names.layer_of("draft.layers.4.self_attn.attn") == 97


def test_in_name_order_five_of_the_29_attention_layers_sort_ahead_of_the_aliased_ones(
    k3_dspark: HybridModel,
) -> None:
    names = engine_layer_names(k3_dspark)
    attention = [names.name(i) for i in k3_dspark.attention_layer_ids]
    assert len(attention) == 24 + 5
    first_aliased = names.name(3)  # KDA layer 0 of every group aliases attention layer 3
    ordered = name_order(attention)
    assert ordered[:5] == tuple(f"draft.layers.{k}.self_attn.attn" for k in range(5))
    # String order also puts 11, 15, 19, 23, 27 ahead of 3: plane 10 holds layer 3.
    assert ordered.index(first_aliased) == 5 + 5
    assert ordered != tuple(attention)


def test_the_aliased_attention_layers_publish_first_in_kda_layer_order(
    k3_dspark: HybridModel,
) -> None:
    order = plane_order(k3_dspark_tp8(k3_dspark))
    # 69 KDA layers in 3 strided groups of 23: plane j carries layer j of each group, which is
    # KDA module layer 4j, 4j+1, 4j+2, and aliases attention layer 4j+3.
    assert order.num_image_planes == 69 // 3
    assert order.order[:23] == tuple(f"model.layers.{4 * j + 3}.self_attn.attn" for j in range(23))
    for j, share in enumerate(order.image_planes):
        assert (share.plane, share.allocation_plane, share.module_layer) == (j, j, 4 * j + 3)
        assert [(m.group, m.layer) for m in share.riders] == [
            (f"linear_attention_{g}", 4 * j + g) for g in range(3)
        ]
    # The rest keep the given (name) order: the draft, then the last target layer 92.
    assert order.order[23:] == (
        *(f"draft.layers.{k}.self_attn.attn" for k in range(5)),
        "model.layers.92.self_attn.attn",
    )
    assert all(not share.riders for share in order.planes[23:])
    assert order.moved


def test_a_given_order_that_already_leads_with_the_aliased_planes_is_kept(
    k3_dspark: HybridModel,
) -> None:
    p = k3_dspark_tp8(k3_dspark)
    names = engine_layer_names(k3_dspark)
    module_order = [names.name(i) for i in k3_dspark.attention_layer_ids]
    order = plane_order(p, module_order)
    assert order.order == tuple(module_order)
    assert not order.moved


def test_a_publish_order_that_is_not_the_attention_layers_is_refused(
    k3_dspark: HybridModel,
) -> None:
    p = k3_dspark_tp8(k3_dspark)
    names = engine_layer_names(k3_dspark)
    given = [names.name(i) for i in k3_dspark.attention_layer_ids]
    given[0] = "model.layers.0.self_attn"  # a KDA layer in place of attention layer 3
    given.append(given[1])
    with pytest.raises(Refusal) as refused:
        plane_order(p, given)
    assert refused.value.code == "layer_names"
    facts = refused.value.facts
    assert (facts["check"], facts["field"], facts["stage"]) == ("plane_order", "names", 0)
    assert (facts["extra"], facts["missing"], facts["repeated"]) == (
        ("model.layers.0.self_attn",),
        ("model.layers.3.self_attn.attn",),
        ("model.layers.7.self_attn.attn",),
    )
    assert (len(facts["expected"]), facts["actual"]) == (29, tuple(given))  # type: ignore[arg-type]


def test_names_must_be_one_per_module_layer_and_unique(k3_dspark: HybridModel) -> None:
    p = k3_dspark_tp8(k3_dspark)
    short = LayerNames(names=engine_layer_names(k3_dspark).names[:-1])
    with pytest.raises(Refusal) as refused:
        plane_order(p, names=short)
    assert refused.value.code == "layer_names"
    assert refused.value.facts == {
        "model": "kimi-k3-dspark",
        "num_names": 97,
        "num_module_layers": 98,
    }
    with pytest.raises(Refusal):
        LayerNames(names=("a", "a"))
    with pytest.raises(Refusal) as unknown:
        short.layer_of("lm_head")
    assert unknown.value.code == "layer_names"
    assert unknown.value.facts == {"name": "lm_head"}


def test_custom_names_drive_the_order(k3_dspark: HybridModel) -> None:
    """An engine with other names passes them; the order follows the plan, not the names."""
    p = k3_dspark_tp8(k3_dspark)
    names = LayerNames(names=tuple(f"L{i:03d}" for i in range(98)))
    order = plane_order(p, names=names)
    assert order.given == tuple(f"L{i:03d}" for i in k3_dspark.attention_layer_ids)
    assert order.order[:2] == ("L003", "L007")
    assert not order.moved  # zero-padded names sort in module order


def test_the_plane_order_is_a_frozen_record_that_round_trips(k3_dspark: HybridModel) -> None:
    order = plane_order(k3_dspark_tp8(k3_dspark))
    assert type(order).model_validate_json(order.model_dump_json()) == order
    assert hash(order) == hash(type(order).model_validate_json(order.model_dump_json()))
    assert order.plane_of("model.layers.92.self_attn.attn") == 28
    with pytest.raises(Refusal) as refused:
        order.plane_of("model.layers.0.self_attn")
    assert refused.value.code == "layer_names"
