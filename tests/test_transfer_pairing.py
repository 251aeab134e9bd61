"""Pairing, placement by module layer and the transfer's refusals (SPEC section 6)."""

from __future__ import annotations

import pytest

from k3layout import Deployment, HybridModel, MLALayer, Refusal, Shard
from k3layout.transfer import (
    admission_refusal,
    check_admission,
    check_pairing,
    head_group,
    paired_producer,
    pairing_refusal,
    plan_transfer,
    transfer_violations,
)


def test_consumer_d_pairs_with_producer_d_over_k() -> None:
    # TP2 -> TP8: k = 4 consumers per producer
    assert [paired_producer(d, 2, 8) for d in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert head_group(1, 2, 8) == range(4, 8)
    assert all(pairing_refusal(d // 4, d, 2, 8) is None for d in range(8))


def test_tp_rank_mod_remote_tp_pairs_head_sharded_state_wrongly() -> None:
    modulo = {d: d % 2 for d in range(8)}  # tp_rank % remote_tp_size
    wrong = [d for d, p in modulo.items() if pairing_refusal(p, d, 2, 8) is not None]
    assert wrong == [1, 3, 4, 6]
    # Consumer 1 of TP8 needs KDA heads 12..23 of 96; "% 2" sends it producer 1's heads 48..95.
    assert Shard().local_size_and_offset(96, 8, 1) == (12, 12)
    assert Shard().local_size_and_offset(96, 2, modulo[1]) == (48, 48)
    assert Shard().local_size_and_offset(96, 2, paired_producer(1, 2, 8)) == (48, 0)


def test_a_consumer_outside_the_producers_head_group_is_refused() -> None:
    with pytest.raises(Refusal) as refused:
        check_pairing(1, 1, 2, 8)
    assert refused.value.code == "head_group_mismatch"
    assert refused.value.facts == {
        "producer_tp_rank": 1,
        "consumer_tp_rank": 1,
        "prefill_tp": 2,
        "decode_tp": 8,
        "head_group": (4, 5, 6, 7),
    }


def test_a_rank_outside_its_tp_group_is_an_invalid_argument() -> None:
    refusal = pairing_refusal(0, 8, 2, 8)
    assert refusal is not None and refusal.code == "invalid_argument"
    assert refusal.facts == {"consumer_tp_rank": 8, "attn_tp": 8}
    with pytest.raises(Refusal) as refused:
        paired_producer(-1, 2, 8)
    assert refused.value.code == "invalid_argument"


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(16, 24), (16, 8), (48, 8), (24, 32)])
def test_decode_tp_not_a_multiple_of_prefill_tp_is_refused_naming_both(
    k3: HybridModel, prefill_tp: int, decode_tp: int
) -> None:
    # one producer per consumer: the pairing helpers' mapping and tokenspeed's decode (TPs
    # tokenspeed main lays K3 fp8 out at, so that each side plans and the pairing refuses)
    for check in (
        lambda: plan_transfer(
            k3,
            Deployment(engine="tokenspeed", attn_tp=prefill_tp),
            Deployment(engine="tokenspeed", attn_tp=decode_tp),
            prompt_tokens=8,
        ),
        lambda: check_pairing(0, 0, prefill_tp, decode_tp),
        lambda: paired_producer(0, prefill_tp, decode_tp),
    ):
        with pytest.raises(Refusal) as refused:
            check()
        assert refused.value.code == "tp_not_multiple"
        assert refused.value.facts == {"prefill_tp": prefill_tp, "decode_tp": decode_tp}


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(2, 3), (3, 4), (6, 4), (16, 6)])
def test_a_vllm_decode_refuses_tps_neither_of_which_divides_the_other_with_vllms_reason(
    k3: HybridModel, prefill_tp: int, decode_tp: int
) -> None:
    with pytest.raises(Refusal) as refused:
        plan_transfer(
            k3, Deployment(attn_tp=prefill_tp), Deployment(attn_tp=decode_tp), prompt_tokens=8
        )
    assert refused.value.code == "tp_not_multiple"
    assert refused.value.facts == {"prefill_tp": prefill_tp, "decode_tp": decode_tp}
    # vLLM's check, and the TP it finds not divisible by the other (the larger by the smaller)
    larger, smaller = max(prefill_tp, decode_tp), min(prefill_tp, decode_tp)
    side = ("decode", "prefill") if decode_tp >= prefill_tp else ("prefill", "decode")
    assert "TransferTopology.tp_ratio" in str(refused.value)
    assert f"{side[0]} attn_tp={larger} is not divisible by {side[1]} attn_tp={smaller}" in str(
        refused.value
    )


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(4, 2), (8, 1), (16, 4), (6, 3)])
def test_a_vllm_decode_gathers_from_every_prefill_rank_of_its_heads(
    k3: HybridModel, prefill_tp: int, decode_tp: int
) -> None:
    result = plan_transfer(
        k3, Deployment(attn_tp=prefill_tp), Deployment(attn_tp=decode_tp), prompt_tokens=8
    )
    share = prefill_tp // decode_tp
    for consumer in range(decode_tp):
        pairs = result.pairs_to(consumer)
        # vLLM's compute_tp_mapping: state from prefill ranks d*g .. d*g+g-1, the latent
        # (replicated) from the first of them
        assert [p.producer for p in pairs] == list(range(consumer * share, (consumer + 1) * share))
        assert [p.kind_bytes("page") > 0 for p in pairs] == [True] + [False] * (share - 1)
    assert transfer_violations(result) == []


def test_rows_are_placed_by_module_layer_not_by_position_among_a_stages_kda_layers(
    k3: HybridModel,
) -> None:
    result = plan_transfer(k3, Deployment(pp=8), Deployment(attn_tp=8), prompt_tokens=16)
    stage = result.producer_stages[3]
    assert stage.layers == tuple(range(34, 46))
    kda_rows = [layer for layer in stage.layers if k3.module_layers[layer].kind == "kda"]
    # Per-kind numbering: KDA layer 40 is the 4th KDA row of stage 3 (34, 36, 37, 38, 40), and
    # "KDA row 4" of the decode is module layer 5; layer 40 is the 30th KDA layer overall.
    assert kda_rows.index(40) == 4
    assert k3.kda_layer_ids[4] == 5 and k3.kda_layer_ids.index(40) == 30
    per_kind = {layer: k3.kda_layer_ids[n] for n, layer in enumerate(kda_rows)}
    assert all(per_kind[layer] != layer for layer in kda_rows)  # every row in a wrong layer
    for pair in result.pairs_from(3):
        written = {layer for s in pair.segments if s.kind == "slot" for layer in s.layers}
        assert written == set(kda_rows)  # the plan writes each state into its own layer


def test_stage_boundaries_need_not_match_on_the_two_sides(k3: HybridModel) -> None:
    result = plan_transfer(k3, Deployment(pp=8), Deployment(attn_tp=4, pp=3), prompt_tokens=16)
    for pair in result.pairs:
        p_stage, _ = result.producer_coords(pair.producer)
        c_stage, _ = result.consumer_coords(pair.consumer)
        layers = {layer for s in pair.segments for layer in s.layers}
        assert layers <= set(result.producer_stages[p_stage].layers)
        assert layers <= set(result.consumer_stages[c_stage].layers)


def test_attention_dp_on_the_prefill_does_not_change_the_plan(k3: HybridModel) -> None:
    decode = Deployment(attn_tp=8, dcp=2)
    alone = plan_transfer(k3, Deployment(pp=2, attn_tp=4), decode, prompt_tokens=300)
    replicas = plan_transfer(k3, Deployment(pp=2, attn_tp=4, attn_dp=4), decode, prompt_tokens=300)
    assert replicas.pairs == alone.pairs


def test_chunked_transfer_to_a_dcp_decode_of_a_stateful_model_is_refused_at_admission(
    k3: HybridModel,
) -> None:
    decode = Deployment(attn_tp=8, dcp=8)
    with pytest.raises(Refusal) as refused:
        check_admission(k3, decode, chunked_transfer=True)
    assert refused.value.code == "chunked_dcp_stateful"
    assert refused.value.facts == {
        "chunked_transfer": True,
        "dcp": 8,
        "model": "kimi-k3",
        "num_kda_layers": 69,
    }


def test_admission_accepts_unchunked_dcp_free_and_stateless_requests(k3: HybridModel) -> None:
    dcp = Deployment(attn_tp=8, dcp=8)
    assert admission_refusal(k3, dcp, chunked_transfer=False) is None
    assert admission_refusal(k3, Deployment(attn_tp=8), chunked_transfer=True) is None
    mla_only = HybridModel(name="mla", model_type="deepseek", layers=(MLALayer(num_heads=8),) * 4)
    assert admission_refusal(mla_only, dcp, chunked_transfer=True) is None


def test_prefill_and_decode_of_different_models_are_refused(
    k3: HybridModel, k3_dspark: HybridModel, kimi_linear: HybridModel
) -> None:
    # Kimi-Linear's layer 0 is KDA with 32 heads, not 96; DSpark adds draft layers from 93 on
    for decode_model, first_difference in ((kimi_linear, 0), (k3_dspark, 93)):
        with pytest.raises(Refusal) as refused:
            plan_transfer(
                k3, Deployment(), Deployment(), prompt_tokens=8, decode_model=decode_model
            )
        assert refused.value.code == "model_mismatch"
        assert refused.value.facts == {
            "prefill_model": "kimi-k3",
            "decode_model": decode_model.name,
            "prefill_layers": 93,
            "decode_layers": len(decode_model.module_layers),
            "first_difference": first_difference,
        }


def test_the_same_model_under_another_name_is_accepted(k3: HybridModel) -> None:
    renamed = HybridModel(name="kimi-k3-from-config", model_type="kimi_k3", layers=k3.layers)
    result = plan_transfer(k3, Deployment(), Deployment(), prompt_tokens=8, decode_model=renamed)
    assert result.num_pairs == 1


@pytest.mark.parametrize(
    ("field", "prefill", "decode"),
    [
        ("kv_dtype", "fp8", "bf16"),
        ("spec_tokens", 0, 2),
        ("replayssm", False, True),
        ("replayssm_cache_len", 16, 32),
    ],
)
def test_deployments_with_different_cache_rows_are_refused_naming_both_values(
    k3: HybridModel, field: str, prefill: object, decode: object
) -> None:
    with pytest.raises(Refusal) as refused:
        plan_transfer(
            k3,
            Deployment.model_validate({field: prefill}),
            Deployment.model_validate({field: decode}),
            prompt_tokens=8,
        )
    assert refused.value.code == "model_mismatch"
    assert refused.value.facts == {"field": field, "prefill": prefill, "decode": decode}


def test_a_dcp_prefill_is_refused(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        plan_transfer(k3, Deployment(attn_tp=8, dcp=2), Deployment(attn_tp=8), prompt_tokens=8)
    assert refused.value.code == "dcp_unsupported"
    assert refused.value.facts == {"side": "prefill", "dcp": 2}


@pytest.mark.parametrize(
    ("prefill", "decode", "code", "facts"),
    [
        ({"pp": 8}, {"attn_tp": 5}, "heads_not_divisible",
         {"kind": "KDA", "num_heads": 96, "attn_tp": 5}),
        ({"pp": 100}, {"attn_tp": 8}, "pp_too_deep", {"pp": 100, "num_layers": 93}),
        ({}, {"attn_tp": 8, "dcp": 3}, "dcp_not_dividing_tp", {"dcp": 3, "attn_tp": 8}),
        ({"engine": "tokenspeed", "attn_tp": 8}, {"attn_tp": 8, "dcp": 8, "engine": "tokenspeed"},
         "dcp_unsupported",
         {"engine": "tokenspeed", "dcp": 8}),
    ],
)  # fmt: skip
def test_a_side_the_planner_refuses_is_refused_with_the_planners_code(
    k3: HybridModel,
    prefill: dict[str, object],
    decode: dict[str, object],
    code: str,
    facts: dict[str, object],
) -> None:
    with pytest.raises(Refusal) as refused:
        plan_transfer(
            k3,
            Deployment.model_validate(prefill),
            Deployment.model_validate(decode),
            prompt_tokens=8,
        )
    assert refused.value.code == code
    assert refused.value.facts == facts


@pytest.mark.parametrize(
    ("prompt_tokens", "facts"),
    [(0, {"prompt_tokens": 0}), (2.5, {"prompt_tokens": 2.5}), (None, {"prompt_tokens": "None"})],
)
def test_bad_request_inputs_are_invalid_arguments(
    k3: HybridModel, prompt_tokens: object, facts: dict[str, object]
) -> None:
    with pytest.raises(Refusal) as refused:
        plan_transfer(
            k3,
            Deployment(),
            Deployment(),
            prompt_tokens=prompt_tokens,  # type: ignore[arg-type]
        )
    assert refused.value.code == "invalid_argument"
    assert refused.value.facts == facts


def test_conv_layouts_that_differ_between_the_sides_are_refused(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        plan_transfer(k3, Deployment(conv_layout="DS"), Deployment(), prompt_tokens=8)
    assert refused.value.code == "model_mismatch"
    assert refused.value.facts == {"field": "conv_layout", "prefill": "DS", "decode": "SD"}


def test_rank_lookups_outside_the_plan_are_invalid_arguments(k3: HybridModel) -> None:
    result = plan_transfer(k3, Deployment(pp=2), Deployment(attn_tp=2), prompt_tokens=8)
    for lookup in (
        lambda: result.producer_regions(2),
        lambda: result.consumer_coords(-1),
        lambda: result.pairs_to(2),
    ):
        with pytest.raises(Refusal) as refused:
            lookup()
        assert refused.value.code == "invalid_argument"
