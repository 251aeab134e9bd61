"""Properties of every transfer plan over prefill PP / TP, decode TP / DCP / PP and interleave.

Small synthetic Kimi-pattern models keep each example cheap; the invariants are checked here
from the plan's own regions, written out rather than through ``transfer_violations`` (which is
tested against them at the end).
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import Deployment, HybridModel, KDALayer, MLALayer, Refusal
from k3layout.model import kimi_layer_pattern
from k3layout.testing import vllm_pipeline_depths
from k3layout.transfer import (
    RankPair,
    RegionKey,
    Segment,
    TransferPlan,
    dcp_rank_of,
    part_segment,
    plan_transfer,
    slot_parts,
    token_segments,
    transfer_violations,
)

HEADS = (4, 8, 12, 16)


class TransferInputs(NamedTuple):
    model: HybridModel
    prefill: Deployment
    decode: Deployment
    prompt_tokens: int

    def plan(self) -> TransferPlan:
        return plan_transfer(
            self.model, self.prefill, self.decode, prompt_tokens=self.prompt_tokens
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def small_models(draw: st.DrawFn) -> HybridModel:
    """Kimi's 3:1 pattern with few layers, heads and dimensions (and maybe draft layers)."""
    heads = draw(st.sampled_from(HEADS))
    mla = MLALayer(
        num_heads=heads,
        kv_lora_rank=draw(st.sampled_from((8, 16))),
        qk_rope_head_dim=draw(st.sampled_from((4, 8))),
        index_bytes_per_token=draw(st.sampled_from((0, 0, 4))),
    )
    kda = KDALayer(
        num_heads=heads,
        head_dim=draw(st.sampled_from((2, 4, 8))),
        conv_kernel=draw(st.integers(2, 4)),
    )
    num_layers = draw(st.integers(2, 12))
    return HybridModel(
        name=f"small-{num_layers}",
        model_type="kimi_k3",
        layers=kimi_layer_pattern(num_layers, mla, kda),
        draft_layers=(mla,) * draw(st.integers(0, 2)),
    )


@st.composite
def transfer_inputs(draw: st.DrawFn) -> TransferInputs:
    """A model, a plannable prefill and decode of it, a prompt length and a conv layout."""
    model = draw(small_models())
    heads = model.layers[0].num_heads
    prefill_tp = draw(st.sampled_from(_divisors(heads)))
    decode_tp = prefill_tp * draw(st.sampled_from(_divisors(heads // prefill_tp)))
    shared = {
        "kv_dtype": draw(st.sampled_from(("fp8", "bf16"))),
        "spec_tokens": draw(st.integers(0, 3)),
        "replayssm": draw(st.booleans()),
        "replayssm_cache_len": draw(st.sampled_from((2, 16))),
        "conv_layout": draw(st.sampled_from(("SD", "DS"))),
    }
    prefill = Deployment.model_validate(
        {
            **shared,
            "attn_tp": prefill_tp,
            "attn_dp": draw(st.sampled_from((1, 2))),
            "pp": draw(st.sampled_from(vllm_pipeline_depths(model, 4))),
        }
    )
    decode = Deployment.model_validate(
        {
            **shared,
            "attn_tp": decode_tp,
            "dcp": draw(st.sampled_from(_divisors(decode_tp))),
            "dcp_interleave": draw(st.sampled_from((1, 2, 4, 16))),
            "pp": draw(st.sampled_from(vllm_pipeline_depths(model, 2))),
        }
    )
    return TransferInputs(
        model,
        prefill,
        decode,
        draw(st.integers(1, 80)),
    )


Copy = tuple[int, int, int, int]  # producer, src offset, dst offset, length


def copies_by_consumer(result: TransferPlan) -> dict[int, dict[RegionKey, list[Copy]]]:
    """Every expanded copy, by consumer rank and destination region (a segment's copies once
    in each of its layers' regions)."""
    out: dict[int, dict[RegionKey, list[Copy]]] = defaultdict(lambda: defaultdict(list))
    for pair in result.pairs:
        for segment in pair.segments:
            for region in segment.regions:
                out[pair.consumer][region] += [
                    (pair.producer, src, dst, n) for src, dst, n in segment.copies()
                ]
    return out


@settings(max_examples=120, deadline=None)
@given(transfer_inputs())
def test_every_destination_byte_is_written_exactly_once(inputs: TransferInputs) -> None:
    result = inputs.plan()
    copies = copies_by_consumer(result)
    for consumer in range(result.num_consumers):
        for region in result.consumer_regions(consumer):
            hits = [0] * region.size_bytes
            for _, _, dst, n in copies[consumer].pop(region.key, []):
                for byte in range(dst, dst + n):
                    hits[byte] += 1
            assert hits == [1] * region.size_bytes, (consumer, region)
        assert copies[consumer] == {}  # nothing written outside the consumer's regions


@settings(max_examples=120, deadline=None)
@given(transfer_inputs())
def test_segments_of_one_consumer_never_overlap(inputs: TransferInputs) -> None:
    result = inputs.plan()
    for regions in copies_by_consumer(result).values():
        for spans in regions.values():
            ordered = sorted((dst, dst + n) for _, _, dst, n in spans)
            assert all(end <= start for (_, end), (start, _) in pairwise(ordered))


@settings(max_examples=120, deadline=None)
@given(transfer_inputs())
def test_every_source_range_lies_inside_its_producers_region(inputs: TransferInputs) -> None:
    result = inputs.plan()
    for pair in result.pairs:
        held = {region.key: region for region in result.producer_regions(pair.producer)}
        stage, _ = result.producer_coords(pair.producer)
        for segment in pair.segments:
            assert set(segment.layers) <= set(result.producer_stages[stage].layers)
            for region in segment.regions:
                assert region in held  # the producer's stage holds this module layer
                for src, _, n in segment.copies():
                    assert src >= 0
                    assert src + n <= held[region].size_bytes


@settings(max_examples=120, deadline=None)
@given(transfer_inputs())
def test_each_layer_gets_the_copies_planned_for_it_alone(inputs: TransferInputs) -> None:
    """A segment naming several layers recomposes into the segments each layer would get on
    its own (:func:`part_segment`, :func:`token_segments`): naming a run of layers at once
    changes no copy, and every region of every consumer is named, by one producer (a DCP
    rank that owns none of a short prompt's tokens holds empty latent regions, named by
    none)."""
    result = inputs.plan()
    sizes = result.decode_sizes
    tp_p, tp_d = result.prefill.attn_tp, result.decode.attn_tp
    for consumer in range(result.num_consumers):
        _, tp_rank = result.consumer_coords(consumer)
        named: dict[RegionKey, list[tuple[int, Segment]]] = defaultdict(list)
        for pair in result.pairs_to(consumer):
            for segment in pair.segments:
                specs = {sizes.layer_specs[layer] for layer in segment.layers}
                assert len(specs) <= 1  # the layers of one segment share a cache spec
                for region in segment.regions:
                    named[region].append((pair.producer, segment))
        held = result.consumer_regions(consumer)
        assert set(named) == {region.key for region in held if region.size_bytes}  # none empty
        for (field, layer), got in named.items():
            producers = {producer for producer, _ in got}
            assert len(producers) == 1  # one producer per region
            src, dst = (tp_p, result.producer_coords(producers.pop())[1]), (tp_d, tp_rank)
            alone: tuple[Segment, ...]
            if layer is None:  # the cursor
                assert sizes.cursor is not None
                alone = (part_segment(sizes.cursor.parts[0], None, src, dst),)
            elif sizes.spec_of(layer).paging == "slot":
                part = next(p for p in slot_parts(sizes, layer) if p.name == field)
                alone = (part_segment(part, layer, src, dst),)
            else:
                alone = token_segments(
                    layer,
                    field,
                    sizes.spec_of(layer).part(field).local_bytes(tp_d),
                    result.prompt_tokens,
                    result.dcp_placement,
                    rank=dcp_rank_of(tp_rank, result.decode.dcp),
                )
            assert [(s.field, s.kind, s.copies()) for _, s in got] == [
                (s.field, s.kind, s.copies()) for s in alone
            ], (consumer, field, layer)


@settings(max_examples=120, deadline=None)
@given(transfer_inputs())
def test_replicated_regions_arrive_whole(inputs: TransferInputs) -> None:
    result = inputs.plan()
    row_bytes = _row_bytes(result)
    copies = copies_by_consumer(result)
    for consumer in range(result.num_consumers):
        for region in result.consumer_regions(consumer):
            spans = copies[consumer].get(region.key, [])
            if region.field == "cursor":  # one int32 per slot: one copy, whole, from offset 0
                assert [(src, dst, n) for _, src, dst, n in spans] == [(0, 0, region.size_bytes)]
            if region.field == "latent":  # every row whole: rows never split across copies
                assert all(
                    src % row_bytes == dst % row_bytes == n % row_bytes == 0
                    for _, src, dst, n in spans
                )


def _row_bytes(result: TransferPlan) -> int:
    """Latent row: (kv_lora_rank + rope) elements of 1 (fp8) or 2 (bf16) bytes (a DSA index
    row is a region of its own)."""
    mla = result.model.mla_layers[0]
    element = 1 if result.decode.kv_dtype == "fp8" else 2
    return (mla.kv_lora_rank + mla.qk_rope_head_dim) * element


@settings(max_examples=60, deadline=None)
@given(transfer_inputs())
def test_the_plan_is_deterministic_and_round_trips_through_json(inputs: TransferInputs) -> None:
    first, second = inputs.plan(), inputs.plan()
    assert first == second and hash(first) == hash(second)
    assert first.model_dump_json() == second.model_dump_json()
    assert TransferPlan.model_validate_json(first.model_dump_json()) == first


@settings(max_examples=120, deadline=None)
@given(transfer_inputs())
def test_each_consumer_gets_its_paired_producers_only(inputs: TransferInputs) -> None:
    result = inputs.plan()
    ratio = inputs.decode.attn_tp // inputs.prefill.attn_tp
    for pair in result.pairs:
        _, producer_tp = result.producer_coords(pair.producer)
        _, consumer_tp = result.consumer_coords(pair.consumer)
        assert producer_tp == consumer_tp // ratio


@settings(max_examples=120, deadline=None)
@given(transfer_inputs())
def test_the_checker_finds_no_violation_in_any_plan(inputs: TransferInputs) -> None:
    assert transfer_violations(inputs.plan()) == []


def _with_pairs(result: TransferPlan, pairs: tuple[RankPair, ...]) -> TransferPlan:
    # A plan re-derives itself on validation, so a broken one is built without it
    # (model_construct), the way a corrupted plan could reach an engine's checker.
    fields = {name: getattr(result, name) for name in TransferPlan.model_fields}
    return TransferPlan.model_construct(**{**fields, "pairs": pairs})


def _edit_first(result: TransferPlan, edit: dict[str, object]) -> TransferPlan:
    first = result.pairs[0]
    segment = Segment.model_validate({**first.segments[0].model_dump(), **edit})
    changed = RankPair(
        producer=first.producer,
        consumer=first.consumer,
        segments=(segment, *first.segments[1:]),
    )
    return _with_pairs(result, (changed, *result.pairs[1:]))


@settings(max_examples=40, deadline=None)
@given(transfer_inputs())
def test_the_checker_catches_dropped_repeated_and_misplaced_copies(
    inputs: TransferInputs,
) -> None:
    result = inputs.plan()
    first = result.pairs[0]
    segment = first.segments[0]
    dropped = RankPair(producer=first.producer, consumer=first.consumer, segments=())
    repeated = RankPair(
        producer=first.producer, consumer=first.consumer, segments=(segment, *first.segments)
    )
    broken = [
        _with_pairs(result, (dropped, *result.pairs[1:])),
        _with_pairs(result, (repeated, *result.pairs[1:])),
        _edit_first(result, {"src_offset_bytes": segment.src_offset_bytes + 10**9}),
        _edit_first(result, {"layers": (10**6,)}),
        _edit_first(result, {"layers": segment.layers[1:]}),  # a layer left unwritten
    ]
    for plan in broken:
        assert transfer_violations(plan) != []
        with pytest.raises(ValueError, match=r"plan_mismatch|is not what the planner derives"):
            TransferPlan.model_validate(
                {name: getattr(plan, name) for name in TransferPlan.model_fields}
            )


@settings(max_examples=200, deadline=None)
@given(
    prefill=st.fixed_dictionaries(
        {
            "attn_tp": st.integers(1, 40),
            "pp": st.integers(1, 14),
            "dcp": st.integers(1, 3),
            "spec_tokens": st.integers(0, 2),
        }
    ),
    decode=st.fixed_dictionaries(
        {
            "attn_tp": st.integers(1, 40),
            "pp": st.integers(1, 3),
            "dcp": st.integers(1, 10),
            "dcp_interleave": st.integers(1, 300),
            "spec_tokens": st.integers(0, 2),
            "engine": st.sampled_from(("vllm", "tokenspeed")),
        }
    ),
    model=small_models(),
    prompt_tokens=st.integers(-2, 50),
)
def test_any_input_either_plans_or_is_refused_with_a_code(
    prefill: dict[str, object],
    decode: dict[str, object],
    model: HybridModel,
    prompt_tokens: int,
) -> None:
    try:
        result = plan_transfer(
            model,
            Deployment.model_validate(prefill),
            Deployment.model_validate(decode),
            prompt_tokens=prompt_tokens,
        )
    except Refusal as refusal:
        assert refusal.code
        return
    assert transfer_violations(result) == []
