"""Byte-level check with numpy: apply a plan's segments to producer buffers filled with distinct
values and compare every consumer buffer with the same state sharded directly at the decode.

The reference shards are written here from the layouts SPEC section 2 describes (numpy slicing
of the TP1 arrays), not from the planner's placements, so the two are independent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from numpy.typing import NDArray
from test_transfer_properties import TransferInputs, transfer_inputs

from k3layout import ConvLayout, Deployment, HybridModel, KDALayer, MLALayer
from k3layout.model import kimi_layer_pattern
from k3layout.transfer import RankPair, RegionField, TransferPlan, plan_transfer

Bytes = NDArray[np.uint8]
Key = tuple[RegionField, int | None]


def global_fields(
    inputs: TransferInputs, layer: int
) -> Iterator[tuple[RegionField, tuple[int, ...], int, int | None]]:
    """``(field, TP1 shape, element bytes, head axis or None)`` of one module layer."""
    model, decode = inputs.model, inputs.decode
    unit = model.module_layers[layer]
    if isinstance(unit, MLALayer):
        element = 1 if decode.kv_dtype == "fp8" else 2
        row = (unit.kv_lora_rank + unit.qk_rope_head_dim) * element
        yield "latent", (inputs.prompt_tokens, row), 1, None
        if unit.index_bytes_per_token:  # a DSA index row is a part of its own
            yield "index", (inputs.prompt_tokens, unit.index_bytes_per_token), 1, None
        return
    assert isinstance(unit, KDALayer)  # the small models are MLA and KDA only
    heads, dim = unit.num_heads, unit.head_dim
    rows = unit.conv_kernel - 1 + decode.spec_tokens
    if decode.conv_layout == "DS":
        yield "conv", (3, heads, dim, rows), 2, 1  # q|k|v, head, channel, time; bf16
    else:  # SD: ONE tensor (time, q|k|v channels), each group split by heads
        yield "conv", (rows, 3, heads, dim), 2, 2  # time, q|k|v, head, channel; bf16
    yield "recurrent", (heads, dim, dim), 4, 0  # fp32
    if decode.replayssm:
        length = max(decode.replayssm_cache_len, 2 * (decode.spec_tokens + 1))
        yield "replay_k", (length, heads, dim), 2, 1
        yield "replay_u", (length, heads, dim), 2, 1
        yield "replay_g", (length, heads, dim), 4, 1


def fill(inputs: TransferInputs) -> dict[Key, Bytes]:
    """The request's whole state at TP1 as ``(*shape, element bytes)`` uint8 arrays, filled
    from one running uint32 counter: no two 4-byte words of the whole state are equal, so a
    copy from a wrong place, layer or rank cannot go unnoticed."""
    state: dict[Key, Bytes] = {}
    counter = 0
    for layer in range(len(inputs.model.module_layers)):
        for field, shape, element, _ in global_fields(inputs, layer):
            num_bytes = int(np.prod(shape)) * element
            words = -(-num_bytes // 4)
            ids = np.arange(counter, counter + words, dtype=np.uint32)
            counter += words
            state[(field, layer)] = ids.view(np.uint8)[:num_bytes].reshape(*shape, element)
    if inputs.decode.replayssm and inputs.model.kda_layer_ids:
        state[("cursor", None)] = np.array([[7, 0, 0, 0]], dtype=np.uint8)  # int32 7
    return state


def head_axes(inputs: TransferInputs) -> dict[str, int | None]:
    axes: dict[str, int | None] = {"cursor": None}
    for layer in range(len(inputs.model.module_layers)):
        axes.update({field: axis for field, _, _, axis in global_fields(inputs, layer)})
    return axes


def shard(array: Bytes, axis: int | None, tp: int, tp_rank: int) -> bytes:
    """A TP rank's share: the ``tp_rank``-th of ``tp`` equal slices along the head axis."""
    if axis is None:
        return array.tobytes()
    return np.ascontiguousarray(np.split(array, tp, axis=axis)[tp_rank]).tobytes()


def producer_buffers(
    result: TransferPlan, state: dict[Key, Bytes], axes: dict[str, int | None]
) -> list[dict[Key, bytes]]:
    buffers: list[dict[Key, bytes]] = []
    tp = result.prefill.attn_tp
    for rank in range(result.num_producers):
        _, tp_rank = result.producer_coords(rank)
        held = {
            r.key: shard(state[r.key], axes[r.field], tp, tp_rank)
            for r in result.producer_regions(rank)
        }
        assert all(len(held[r.key]) == r.size_bytes for r in result.producer_regions(rank))
        buffers.append(held)
    return buffers


def expected_consumer(
    result: TransferPlan, rank: int, state: dict[Key, Bytes], axes: dict[str, int | None]
) -> dict[Key, bytes]:
    """The consumer's share computed directly: its TP slice, and its DCP rank's token rows."""
    decode = result.decode
    _, tp_rank = result.consumer_coords(rank)
    dcp_rank = tp_rank % decode.dcp  # DCP groups are consecutive TP ranks
    owned = [
        t
        for t in range(result.prompt_tokens)
        if (t // decode.dcp_interleave) % decode.dcp == dcp_rank
    ]
    want: dict[Key, bytes] = {}
    for region in result.consumer_regions(rank):
        array = state[region.key]
        if region.kind == "page":
            want[region.key] = array[owned].tobytes()
        else:
            want[region.key] = shard(array, axes[region.field], decode.attn_tp, tp_rank)
    return want


def apply(
    result: TransferPlan,
    pairs: tuple[RankPair, ...],
    sources: list[dict[Key, bytes]],
    destination: Callable[[int, Key], Key] = lambda producer, key: key,
) -> list[dict[Key, bytearray]]:
    """Run the copies into zeroed consumer buffers; ``destination`` names the consumer region
    a producer's region is written to (the plan: the same field and module layer)."""
    buffers = [
        {r.key: bytearray(r.size_bytes) for r in result.consumer_regions(rank)}
        for rank in range(result.num_consumers)
    ]
    for pair in pairs:
        for segment in pair.segments:
            for region in segment.regions:  # the same copies in each of its layers
                source = sources[pair.producer][region]
                target = buffers[pair.consumer][destination(pair.producer, region)]
                for src, dst, length in segment.copies():
                    target[dst : dst + length] = source[src : src + length]
    return buffers


def check(
    result: TransferPlan,
    pairs: tuple[RankPair, ...] | None = None,
    destination: Callable[[int, Key], Key] = lambda producer, key: key,
) -> bool:
    """Whether applying ``pairs`` (the plan's by default) gives every consumer its share."""
    inputs = TransferInputs(result.model, result.prefill, result.decode, result.prompt_tokens)
    state, axes = fill(inputs), head_axes(inputs)
    sources = producer_buffers(result, state, axes)
    got = apply(result, result.pairs if pairs is None else pairs, sources, destination)
    return all(
        {key: bytes(value) for key, value in got[rank].items()}
        == expected_consumer(result, rank, state, axes)
        for rank in range(result.num_consumers)
    )


@settings(max_examples=80, deadline=None)
@given(transfer_inputs())
def test_applied_segments_give_every_consumer_its_directly_sharded_state(
    inputs: TransferInputs,
) -> None:
    assert check(inputs.plan())


def small_k3_like() -> HybridModel:
    """K3's pattern and conv kernel at a size numpy handles in milliseconds."""
    mla = MLALayer(num_heads=16, kv_lora_rank=16, qk_rope_head_dim=8)
    kda = KDALayer(num_heads=16, head_dim=4, conv_kernel=4)
    return HybridModel(
        name="k3-small", model_type="kimi_k3", layers=kimi_layer_pattern(23, mla, kda)
    )


def pp4_to_tp8_dcp8(conv_layout: ConvLayout = "SD") -> TransferPlan:
    shared = {"spec_tokens": 2, "replayssm": True, "conv_layout": conv_layout}
    return plan_transfer(
        small_k3_like(),
        Deployment.model_validate({"pp": 4, "attn_tp": 2, **shared}),
        Deployment.model_validate({"attn_tp": 8, "dcp": 4, "dcp_interleave": 2, **shared}),
        prompt_tokens=37,
    )


@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
def test_a_pp4_tp2_prefill_lands_byte_for_byte_on_a_tp8_dcp4_decode(
    conv_layout: ConvLayout,
) -> None:
    assert check(pp4_to_tp8_dcp8(conv_layout))


def test_per_kind_row_numbering_puts_state_in_the_wrong_layer() -> None:
    result = pp4_to_tp8_dcp8()
    kda_ids = result.model.kda_layer_ids

    def per_kind(producer: int, key: Key) -> Key:
        """The n-th KDA row of the producer's stage written as the n-th KDA layer."""
        field, layer = key
        stage, _ = result.producer_coords(producer)
        stage_kda = [i for i in result.producer_stages[stage].layers if i in kda_ids]
        if layer not in stage_kda:
            return key
        return (field, kda_ids[stage_kda.index(layer)])

    # the last stage holds 18..22, KDA rows 18, 20, 21: layer 20's state would land in layer 1
    assert per_kind(result.num_producers - 1, ("recurrent", 20)) == ("recurrent", 1)
    assert check(result)
    assert not check(result, destination=per_kind)


def test_tp_rank_mod_remote_tp_is_right_for_the_latent_only() -> None:
    result = pp4_to_tp8_dcp8()
    tp_p, tp_d = result.prefill.attn_tp, result.decode.attn_tp
    modulo: list[RankPair] = []
    for pair in result.pairs:
        stage, _ = result.producer_coords(pair.producer)
        _, consumer_tp = result.consumer_coords(pair.consumer)
        wrong = stage * tp_p + consumer_tp % tp_p  # tp_rank % remote_tp_size
        modulo.append(RankPair(producer=wrong, consumer=pair.consumer, segments=pair.segments))
    inputs = TransferInputs(result.model, result.prefill, result.decode, result.prompt_tokens)
    state, axes = fill(inputs), head_axes(inputs)
    got = apply(result, tuple(modulo), producer_buffers(result, state, axes))
    for rank in range(tp_d):
        want = expected_consumer(result, rank, state, axes)
        for key, value in want.items():
            if key[0] in ("latent", "cursor"):  # replicated on every producer TP rank: right
                assert bytes(got[rank][key]) == value
            elif rank % tp_p != rank // (tp_d // tp_p):  # head-sharded from the wrong group
                assert bytes(got[rank][key]) != value
