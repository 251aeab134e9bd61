"""The ride planner: the chunk grid, hit capping, the load row, and the startup refusals."""

from __future__ import annotations

import time

import pytest

from k3layout import (
    Deployment,
    HybridModel,
    KDALayer,
    MLALayer,
    ParentPlan,
    Refusal,
    VllmPlan,
    plan_parent,
    plan_vllm,
)
from k3layout.constants import INT64_MAX, MAX_LISTED_ITEMS, MAX_PROMPT_TOKENS
from k3layout.offload import RideOptions, RidePlan, plan_ride

K3_BLOCK = 128 * 12  # 128 x ceil(832,512 / (128 x 576)): the block that holds one state


def k3_plan(model: HybridModel, dcp: int = 1) -> VllmPlan:
    return plan_vllm(model, Deployment(attn_tp=8, spec_tokens=2, dcp=dcp))


def refused(p: VllmPlan | ParentPlan, **options: object) -> Refusal:
    with pytest.raises(Refusal) as caught:
        plan_ride(p, RideOptions.model_validate(options))
    assert caught.value.hint, "every startup refusal says what would work"
    return caught.value


def test_chunk_1536_is_valid_for_k3_dspark_tp8(k3_dspark: HybridModel) -> None:
    ride = plan_ride(k3_plan(k3_dspark), RideOptions(chunk_tokens=1536))
    assert ride.block_tokens == K3_BLOCK == 1536
    # Every group spans one block: attention block x dcp 1, KDA block.
    assert {(s.kind, s.span_tokens) for s in ride.spans} == {
        ("attention", K3_BLOCK * 1),
        ("kda", K3_BLOCK),
    }
    assert ride.grid_tokens == ride.chunk_tokens == 1536
    assert plan_ride(k3_plan(k3_dspark)).chunk_tokens == 1536  # the smallest by default
    assert ride.image.image_bytes == 3 * 23 * 884_736


def test_with_dcp_8_the_smallest_chunk_is_12288(k3_dspark: HybridModel) -> None:
    ride = plan_ride(k3_plan(k3_dspark, dcp=8))
    # Attention block x dcp = 1,536 x 8; KDA block 1,536 (DCP does not split the state).
    assert ride.grid_tokens == ride.chunk_tokens == K3_BLOCK * 8 == 12_288
    assert plan_ride(k3_plan(k3_dspark, dcp=8), RideOptions(chunk_tokens=2 * 12_288))


def test_a_chunk_off_the_grid_names_the_chunk_the_spans_and_the_smallest(
    k3_dspark: HybridModel,
) -> None:
    refusal = refused(k3_plan(k3_dspark, dcp=8), chunk_tokens=1536)
    assert refusal.code == "chunk_off_grid"
    assert refusal.facts == {
        "chunk_tokens": 1536,
        "attention_span_tokens": 12_288,
        "kda_span_tokens": 1536,
        "smallest_chunk_tokens": 12_288,
    }
    assert "chunk_tokens=1,536" in refusal.message
    assert "attention block x dcp = 12,288, KDA block = 1,536" in refusal.message
    assert "the smallest valid chunk is 12,288" in refusal.message
    lmcache_default = refused(k3_plan(k3_dspark), chunk_tokens=256)
    assert lmcache_default.facts["smallest_chunk_tokens"] == 1536
    assert (
        refused(k3_plan(k3_dspark), chunk_tokens=2000).hint
        == "use a multiple of 1,536: 1,536 or 3,072"
    )


def test_hits_are_capped_to_the_chunk_grid(k3_dspark: HybridModel) -> None:
    ride = plan_ride(k3_plan(k3_dspark), RideOptions(chunk_tokens=3072))
    assert [ride.capped_hit(n) for n in (0, 1535, 3071, 3072, 5000, 9215, 9216)] == [
        0,
        0,
        0,
        3072,
        3072,
        6144,
        9216,
    ]


def test_the_load_lands_in_row_n_minus_1_over_block_of_every_kda_group(
    k3_dspark: HybridModel,
) -> None:
    ride = plan_ride(k3_plan(k3_dspark))
    load = ride.load_destination(3 * 1536)
    assert load is not None
    # Row p holds the state after (p + 1) x block tokens: 4,608 tokens -> row (4,608 - 1) // 1,536.
    assert load.row == (3 * 1536 - 1) // 1536 == 2
    assert load.groups == ("linear_attention_0", "linear_attention_1", "linear_attention_2")
    assert ride.load_destination(0) is None
    assert ride.load_destination(3 * 1536 + 1) is None  # off the grid: nothing is restored


def test_with_dcp_the_load_row_counts_kda_blocks(k3_dspark: HybridModel) -> None:
    ride = plan_ride(k3_plan(k3_dspark, dcp=8))
    load = ride.load_destination(12_288)
    assert load is not None and load.row == (12_288 - 1) // 1536 == 7
    assert ride.load_destination(1536) is None  # a KDA block, but not a chunk


def test_store_boundaries_are_the_chunk_multiples_stored(k3_dspark: HybridModel) -> None:
    ride = plan_ride(k3_plan(k3_dspark))
    assert ride.store_boundaries(5000) == (1536, 3072, 4608)
    assert ride.store_boundaries(5000, start_tokens=3072) == (4608,)
    assert ride.store_boundaries(1535) == ()


@pytest.mark.parametrize("num_tokens", [10**18, 2**40, INT64_MAX])
def test_a_store_of_more_boundaries_than_are_listed_is_refused_naming_the_bound(
    k3_dspark: HybridModel, num_tokens: int
) -> None:
    ride = plan_ride(k3_plan(k3_dspark))
    start = time.perf_counter()
    with pytest.raises(Refusal) as caught:
        ride.store_boundaries(num_tokens)
    assert time.perf_counter() - start < 1.0  # refused by arithmetic, not by running out
    # the last token count under the bound: MAX_LISTED_ITEMS chunk boundaries from token 0
    bound = (1 + MAX_LISTED_ITEMS) * K3_BLOCK - 1
    assert caught.value.code == "size_limit"
    assert caught.value.facts == {
        "field": "num_tokens",
        "bound": bound,
        "start_tokens": 0,
        "chunk_tokens": K3_BLOCK,
        "max_boundaries": MAX_LISTED_ITEMS,
    }


def test_the_store_bound_counts_boundaries_from_the_start(k3_dspark: HybridModel) -> None:
    ride = plan_ride(k3_plan(k3_dspark))
    start = 10**18  # a huge start with a short store lists its few boundaries
    first = (start // K3_BLOCK + 1) * K3_BLOCK
    assert ride.store_boundaries(first + K3_BLOCK, start) == (first, first + K3_BLOCK)
    with pytest.raises(Refusal) as caught:
        ride.store_boundaries(INT64_MAX, start)
    assert caught.value.facts["bound"] == first + MAX_LISTED_ITEMS * K3_BLOCK - 1
    # the bound is exact: at it, MAX_LISTED_ITEMS boundaries; one chunk more is refused
    bound = (1 + MAX_LISTED_ITEMS) * K3_BLOCK - 1
    assert len(ride.store_boundaries(bound)) == MAX_LISTED_ITEMS
    with pytest.raises(Refusal):
        ride.store_boundaries(bound + 1)


def test_a_chunk_beyond_a_requests_tokens_is_refused_by_the_options() -> None:
    for chunk in (10**18, MAX_PROMPT_TOKENS + 1):
        with pytest.raises(Refusal) as caught:
            RideOptions(chunk_tokens=chunk)
        assert caught.value.code == "size_limit"
        assert caught.value.facts == {
            "record": "RideOptions",
            "field": "chunk_tokens",
            "bound": MAX_PROMPT_TOKENS,
        }
    assert RideOptions(chunk_tokens=MAX_PROMPT_TOKENS).chunk_tokens == MAX_PROMPT_TOKENS


def test_negative_token_counts_are_refused(k3_dspark: HybridModel) -> None:
    ride = plan_ride(k3_plan(k3_dspark))
    with pytest.raises(Refusal) as caught:
        ride.capped_hit(-1)
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts == {"hit_tokens": -1}


@pytest.mark.parametrize("mode", ["none"])
def test_a_mamba_cache_mode_other_than_align_is_refused(k3_dspark: HybridModel, mode: str) -> None:
    refusal = refused(k3_plan(k3_dspark), mamba_cache_mode=mode)
    assert refusal.code == "mamba_cache_mode"
    assert refusal.facts == {"mamba_cache_mode": mode, "required": "align"}
    assert f"mamba_cache_mode={mode}" in refusal.message


def test_prefix_caching_off_is_refused(k3_dspark: HybridModel) -> None:
    refusal = refused(k3_plan(k3_dspark), prefix_caching=False)
    assert refusal.code == "prefix_caching_off"
    assert refusal.facts == {"prefix_caching": False}
    assert "prefix caching is off" in refusal.message


def test_a_load_failure_policy_other_than_recompute_is_refused(k3_dspark: HybridModel) -> None:
    refusal = refused(k3_plan(k3_dspark), kv_load_failure_policy="fail")
    assert refusal.code == "load_failure_policy"
    assert refusal.facts == {"kv_load_failure_policy": "fail", "required": "recompute"}
    assert "kv_load_failure_policy=fail" in refusal.message


def test_a_mamba_type_model_other_than_kimi_k3_is_refused(kimi_linear: HybridModel) -> None:
    """Kimi-Linear has the same KDA layers; the gate is the model, not the layer type."""
    refusal = refused(plan_vllm(kimi_linear, Deployment(attn_tp=8)))
    assert refusal.code == "model_not_ridable"
    assert refusal.facts == {
        "model": "kimi-linear-48b",
        "model_type": "kimi_linear",
        "required_model_type": "kimi_k3",
    }
    assert "model_type=kimi_linear" in refusal.message


def test_a_model_without_kda_layers_has_nothing_to_ride() -> None:
    dsa = HybridModel(name="dsa", model_type="deepseek_v32", layers=(MLALayer(num_heads=16),) * 4)
    refusal = refused(plan_vllm(dsa, Deployment()))
    assert refusal.code == "model_not_ridable"
    assert refusal.facts == {"model": "dsa", "model_type": "deepseek_v32", "num_kda_layers": 0}


def test_the_model_gate_comes_before_the_settings() -> None:
    qwen_like = HybridModel(
        name="gdn",
        model_type="qwen3_next",
        layers=(KDALayer(num_heads=16, head_dim=128), MLALayer(num_heads=16)),
    )
    assert refused(plan_vllm(qwen_like, Deployment()), prefix_caching=False).code == (
        "model_not_ridable"
    )


def test_a_parent_plan_is_refused(k3_dspark: HybridModel) -> None:
    refusal = refused(plan_parent(k3_dspark, Deployment(attn_tp=8, spec_tokens=2)))
    assert refusal.code == "engine_mismatch"
    assert refusal.facts == {"engine": "tokenspeed", "required_engine": "vllm"}


def test_pp_rides_per_stage(k3_dspark: HybridModel) -> None:
    p = plan_vllm(k3_dspark, Deployment(attn_tp=8, spec_tokens=2, pp=2))
    ride = plan_ride(p, stage=1)
    assert (ride.image.num_units, ride.image.num_planes) == (3, 11)
    assert refused(p).code == "aliasing"  # stage 0: 12 KDA positions, 11 attention planes
    with pytest.raises(Refusal) as caught:
        plan_ride(p, stage=2)
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts == {"stage": 2, "pp": 2}


def test_a_ride_plan_is_a_frozen_record_that_round_trips(k3_dspark: HybridModel) -> None:
    ride = plan_ride(k3_plan(k3_dspark), RideOptions(chunk_tokens=3072))
    again = RidePlan.model_validate_json(ride.model_dump_json())
    assert again == ride and hash(again) == hash(ride)
    assert again.image == ride.image and again.order == ride.order
