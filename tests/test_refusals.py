"""Every refusal of the core planner: its code and the facts on both sides, and a hint."""

from __future__ import annotations

import pickle

import pytest

from k3layout import (
    Deployment,
    HybridModel,
    Interleave,
    KDALayer,
    MLALayer,
    Refusal,
    Shard,
    plan,
    plan_parent,
    plan_vllm,
    pp_stage_bounds,
)


def refusal_of(model: HybridModel, **fields: object) -> Refusal:
    with pytest.raises(Refusal) as refused:
        plan(model, Deployment.model_validate(fields))
    assert refused.value.hint, "every planner refusal says what would work"
    return refused.value


def test_attention_tp_not_dividing_the_kda_heads_names_the_nearest_that_do(
    k3: HybridModel,
) -> None:
    refusal = refusal_of(k3, attn_tp=5)
    assert refusal.code == "heads_not_divisible"
    assert refusal.facts == {"kind": "KDA", "num_heads": 96, "attn_tp": 5}
    assert "KDA num_heads=96 must be divisible by attn_tp=5" in str(refusal)
    assert "attn_tp=4 or attn_tp=6" in str(refusal)


def test_mla_query_heads_are_checked_too() -> None:
    model = HybridModel(
        name="m",
        model_type="x",
        layers=(MLALayer(num_heads=64), KDALayer(num_heads=96, head_dim=64)),
    )
    refusal = refusal_of(model, attn_tp=3)
    assert refusal.code == "heads_not_divisible"
    assert refusal.facts["kind"] == "MLA" and refusal.facts["num_heads"] == 64
    assert "attn_tp=2 or attn_tp=4" in str(refusal)  # divisors of gcd(64, 96) = 32


def test_mixed_geometries_of_one_kind_are_refused() -> None:
    model = HybridModel(
        name="mixed",
        model_type="x",
        layers=(MLALayer(num_heads=8), MLALayer(num_heads=8, kv_lora_rank=256)),
    )
    refusal = refusal_of(model)
    assert refusal.code == "mixed_layer_specs"
    assert refusal.facts == {"model": "mixed", "kind": "MLA", "geometries": 2}


def test_dcp_must_divide_attention_tp(k3: HybridModel) -> None:
    refusal = refusal_of(k3, attn_tp=8, dcp=3)
    assert refusal.code == "dcp_not_dividing_tp"
    assert refusal.facts == {"dcp": 3, "attn_tp": 8}
    assert "[1, 2, 4, 8]" in str(refusal)


def test_dcp_interleave_must_divide_the_block(k3: HybridModel) -> None:
    refusal = refusal_of(k3, attn_tp=8, dcp=8, dcp_interleave=7, spec_tokens=2)
    assert refusal.code == "dcp_interleave"
    assert refusal.facts == {"dcp_interleave": 7, "block_tokens": 1536}


def test_parent_engine_refuses_dcp(k3: HybridModel) -> None:
    refusal = refusal_of(k3, engine="tokenspeed", attn_tp=8, dcp=2)
    assert refusal.code == "dcp_unsupported"


def test_more_stages_than_layers_is_refused(kimi_linear: HybridModel) -> None:
    refusal = refusal_of(kimi_linear, pp=28)
    assert refusal.code == "pp_too_deep"
    assert refusal.facts == {"pp": 28, "num_layers": 27}


def test_a_partition_that_does_not_sum_to_the_layers_is_refused() -> None:
    with pytest.raises(Refusal) as refused:
        pp_stage_bounds(27, 2, (10, 10))
    assert refused.value.code == "pp_partition"
    assert refused.value.facts["num_layers"] == 27


def test_a_partition_of_the_wrong_length_is_a_validation_error() -> None:
    with pytest.raises(ValueError, match="pp_partition"):
        Deployment(pp=2, pp_partition=(10, 10, 7))


def test_a_padding_limit_below_the_rules_padding_is_refused_naming_the_group(
    k3: HybridModel,
) -> None:
    refusal = refusal_of(k3, engine="tokenspeed", attn_tp=8, max_padding=0.01)
    assert refusal.code == "padding_limit"
    assert refusal.facts["group"] == "linear_attention_0"
    assert refusal.facts["padding"] == pytest.approx(0.134044, abs=1e-6)


def test_fp8_ds_mla_needs_a_latent_in_scale_groups_of_128() -> None:
    layer = MLALayer(num_heads=8, kv_lora_rank=200)
    with pytest.raises(Refusal) as caught:
        layer.cache_spec(Deployment(kv_dtype="fp8_ds_mla"))
    assert caught.value.code == "dtype_unsupported"
    assert caught.value.facts["kv_lora_rank"] == 200


@pytest.mark.parametrize("engine", ["vllm", "tokenspeed", "sglang"])
def test_no_engine_serves_flashmlas_packed_fp8_row_for_k3(k3: HybridModel, engine: str) -> None:
    refusal = refusal_of(k3, engine=engine, attn_tp=8, kv_dtype="fp8_ds_mla")
    assert refusal.code in {"dtype_unsupported", "kernel_unsupported", "engine_setting"}
    assert "fp8_ds_mla" in str(refusal)


def test_negative_budgets_and_loads_are_refused(k3: HybridModel) -> None:
    vllm = plan_vllm(k3, Deployment(attn_tp=8))
    parent = plan_parent(k3, Deployment(attn_tp=8))
    for call in (
        lambda: vllm.num_blocks(-1),
        lambda: parent.parents_for(-5),
        lambda: parent.parents_for(10, max_live=0),
        lambda: parent.parents_for_budget(-1),
        lambda: parent.bind(-1),
        lambda: parent.bind(1, stage=1),
        lambda: vllm.num_blocks(10, stage=3),
        lambda: parent.parents_for(10, stage=-1),
    ):
        with pytest.raises(Refusal) as refused:
            call()
        assert refused.value.code == "invalid_argument"


def test_shard_refuses_an_uneven_split() -> None:
    with pytest.raises(Refusal) as refused:
        Shard().local_size_and_offset(96, 5, 0)
    assert refused.value.code == "uneven_split"
    assert refused.value.facts == {"extent": 96, "num_ranks": 5}
    with pytest.raises(Refusal) as refused:
        Shard().local_size_and_offset(96, 8, 8)
    assert refused.value.code == "invalid_argument"


def test_negative_token_positions_are_refused() -> None:
    placement = Interleave(num_ranks=4, interleave=2)
    for call in (
        lambda: placement.rank_of(-1),
        lambda: placement.local_position(-3),
        lambda: placement.global_token(0, -1),
        lambda: placement.local_count(-1, 0),
        lambda: placement.runs(-4, 10, 1),
    ):
        with pytest.raises(Refusal) as refused:
            call()
        assert refused.value.code == "invalid_argument"


def test_a_refusal_survives_pickling_and_serialises() -> None:
    refusal = Refusal("pp_too_deep", "x", facts={"pp": 3, "ids": (1, 2)}, hint="h")
    again = pickle.loads(pickle.dumps(refusal))
    assert (again.code, again.facts, again.hint, str(again)) == (
        "pp_too_deep",
        {"pp": 3, "ids": (1, 2)},
        "h",
        "x; h",
    )
    assert refusal.to_dict() == {
        "code": "pp_too_deep",
        "message": "x",
        "hint": "h",
        "facts": {"pp": 3, "ids": [1, 2]},
    }
    assert isinstance(refusal, ValueError)
