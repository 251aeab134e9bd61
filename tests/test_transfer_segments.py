"""The transfer's split algebra: fields as row-major arrays placed by TP, segments cut from them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import (
    CachePart,
    ConvLayout,
    Deployment,
    HybridModel,
    Interleave,
    Refusal,
    Replicate,
    Shard,
    rank_sizes,
)
from k3layout.transfer import Segment, part_segment, slot_parts, token_segments
from k3layout.transfer.segments import (
    derive_part_segment,
    derive_token_segments,
    planned_segment,
    segment_fields,
)

H, D, K = 96, 128, 4  # K3's KDA heads, head dim, short conv kernel


def slot(k3: HybridModel, **deployment: object) -> tuple[CachePart, ...]:
    sizes = rank_sizes(k3, Deployment.model_validate(deployment))
    return slot_parts(sizes, k3.kda_layer_ids[0])


@pytest.mark.parametrize("conv_layout", ["SD", "DS"])
@pytest.mark.parametrize(("tp", "s", "replayssm"), [(1, 0, False), (8, 2, True), (32, 2, True)])
def test_slot_parts_hold_exactly_the_bytes_rank_sizes_gives_each_rank(
    k3: HybridModel, conv_layout: ConvLayout, tp: int, s: int, replayssm: bool
) -> None:
    deployment = Deployment(attn_tp=tp, spec_tokens=s, replayssm=replayssm, conv_layout=conv_layout)
    sizes = rank_sizes(k3, deployment)
    local = {p.name: p.local_bytes(tp) for p in slot_parts(sizes, k3.kda_layer_ids[0])}
    assert local["conv"] == 3 * H // tp * D * (K - 1 + s) * 2  # ONE conv tensor, q|k|v
    assert local["recurrent"] == H // tp * D * D * 4
    assert local["conv"] + local["recurrent"] == sizes.state_bytes
    if replayssm:
        assert sizes.replay is not None
        records = local["replay_k"] + local["replay_u"] + local["replay_g"]
        assert records == sizes.replay.payload_bytes(tp)
    else:
        assert "replay_k" not in local


def test_ds_conv_of_a_tp8_rank_from_a_tp1_rank_is_three_runs_one_per_channel_group(
    k3: HybridModel,
) -> None:
    conv = slot(k3, attn_tp=1, conv_layout="DS")[0]
    assert conv.shape == (3, H, D, K - 1) and conv.tp == Shard(dim=1)
    d = 5
    segment = part_segment(conv, 40, (1, 0), (8, d))
    head_bytes = D * (K - 1) * 2  # one head's channels x 3 rows of history, bf16
    assert segment.copies() == tuple(
        (part * H * head_bytes + d * 12 * head_bytes, part * 12 * head_bytes, 12 * head_bytes)
        for part in range(3)  # q, k, v: 12 heads of each, 96 heads apart on the TP1 rank
    )
    assert segment.total_bytes == 3 * H * D // 8 * (K - 1) * 2


def test_sd_conv_is_one_run_per_row_and_channel_group(k3: HybridModel) -> None:
    conv = slot(k3, attn_tp=1, spec_tokens=2)[0]
    assert conv.shape == (K - 1 + 2, 3, H, D) and conv.tp == Shard(dim=2)
    segment = part_segment(conv, 0, (2, 1), (8, 6))  # producer 1 of TP2 holds heads 48..95
    run = 12 * D * 2  # 12 heads x 128 channels, bf16
    assert segment.num_copies == (K - 1 + 2) * 3  # 5 rows x q|k|v
    assert segment.length_bytes == run
    assert segment.src_offset_bytes == (6 % 4) * run  # consumer 6 is the 3rd of producer 1's 4
    # One row of the producer's ONE tensor: q|k|v of its 48 heads; of the consumer's: 12.
    assert segment.src_stride_bytes == 48 * D * 2 and segment.dst_stride_bytes == run
    # The consumer's k channels of row 0 land after its q channels, as vLLM's kernel reads them.
    assert segment.copies()[1][1] == 12 * D * 2


def test_recurrent_state_is_one_contiguous_head_slice(k3: HybridModel) -> None:
    recurrent = slot(k3, attn_tp=2)[1]
    head = D * D * 4  # (D, D) fp32 per head
    assert part_segment(recurrent, 7, (2, 1), (8, 5)).copies() == ((12 * head, 0, 12 * head),)


def test_a_replicated_part_is_copied_whole() -> None:
    cursor = CachePart(name="cursor", shape=(1,), dtype="int32", tp=Replicate())
    assert part_segment(cursor, None, (1, 0), (8, 7)).copies() == ((0, 0, 4),)


def test_a_consumer_share_outside_the_producer_share_is_refused() -> None:
    recurrent = CachePart(name="recurrent", shape=(8, 2, 2), dtype="float32", tp=Shard(dim=0))
    with pytest.raises(Refusal) as refused:
        part_segment(recurrent, 3, (2, 1), (8, 1))  # consumer 1 holds head 1, producer 4..7
    assert refused.value.code == "head_group_mismatch"
    assert refused.value.facts == {
        "field": "recurrent",
        "producer_tp_rank": 1,
        "prefill_tp": 2,
        "consumer_tp_rank": 1,
        "decode_tp": 8,
    }


def test_an_extent_the_tp_does_not_divide_is_refused_as_uneven() -> None:
    part = CachePart(name="recurrent", shape=(6, 2, 2), dtype="float32", tp=Shard(dim=0))
    with pytest.raises(Refusal) as refused:
        part.local_bytes(4)
    assert refused.value.code == "uneven_split"
    assert refused.value.facts == {"extent": 6, "num_ranks": 4}


def test_a_placed_dimension_outside_the_shape_is_rejected() -> None:
    with pytest.raises(Refusal, match="dim=2"):
        CachePart(name="conv", shape=(3, 4), dtype="bfloat16", tp=Shard(dim=2))


def test_copies_that_touch_end_to_end_become_one_copy() -> None:
    segment = Segment.strided(
        "latent", (3,), "page", src_offset_bytes=0, dst_offset_bytes=0, length_bytes=8,
        num_copies=4, src_stride_bytes=8, dst_stride_bytes=8,
    )  # fmt: skip
    assert (segment.num_copies, segment.length_bytes) == (1, 32)
    assert (segment.src_stride_bytes, segment.dst_stride_bytes) == (0, 0)


def test_overlapping_strided_copies_are_rejected() -> None:
    with pytest.raises(Refusal, match="strides") as refused:
        Segment(
            field="conv", layers=(0,), kind="slot", src_offset_bytes=0, dst_offset_bytes=0,
            length_bytes=8, num_copies=2, src_stride_bytes=4, dst_stride_bytes=8,
        )  # fmt: skip
    assert refused.value.code == "invalid_argument"


@pytest.mark.parametrize("layers", [(4, 2), (2, 2), (0, 5, 5, 7)])
def test_a_segment_names_its_layers_once_each_in_increasing_order(
    layers: tuple[int, ...],
) -> None:
    with pytest.raises(Refusal, match="increasing") as refused:
        Segment(
            field="conv", layers=layers, kind="slot", src_offset_bytes=0, dst_offset_bytes=0,
            length_bytes=8,
        )  # fmt: skip
    assert refused.value.code == "invalid_argument"


def test_a_segment_of_several_layers_moves_its_copies_into_each() -> None:
    segment = Segment(
        field="conv", layers=(0, 1, 2, 4), kind="slot", src_offset_bytes=16, dst_offset_bytes=0,
        length_bytes=8, num_copies=3, src_stride_bytes=32, dst_stride_bytes=8,
    )  # fmt: skip
    assert segment.regions == (("conv", 0), ("conv", 1), ("conv", 2), ("conv", 4))
    assert segment.copies() == ((16, 0, 8), (48, 8, 8), (80, 16, 8))  # the same in each layer
    assert (segment.num_regions, segment.region_bytes) == (4, 3 * 8)
    assert segment.total_bytes == 4 * 3 * 8
    cursor = Segment(
        field="cursor", layers=(), kind="slot", src_offset_bytes=0, dst_offset_bytes=0,
        length_bytes=4,
    )  # fmt: skip
    assert (cursor.regions, cursor.num_regions, cursor.total_bytes) == ((("cursor", None),), 1, 4)


def test_the_docstring_example_dcp4_interleave2_13_tokens_rank1() -> None:
    segments = token_segments(7, "latent", 10, 13, Interleave(num_ranks=4, interleave=2), rank=1)
    # rank 1 owns tokens 2, 3 and 10, 11: rows 2-3 -> 0-1 and 10-11 -> 2-3, 10 B a row
    assert [c for s in segments for c in s.copies()] == [(20, 0, 20), (100, 20, 20)]


def test_without_dcp_every_row_is_one_whole_copy() -> None:
    segments = token_segments(
        3, "latent", 576, 1000, Interleave(num_ranks=1, interleave=16), rank=0
    )
    assert [s.copies() for s in segments] == [((0, 0, 1000 * 576),)]


@settings(max_examples=200, deadline=None)
@given(
    num_ranks=st.integers(1, 8),
    interleave=st.sampled_from((1, 2, 3, 4, 16)),
    tokens=st.integers(1, 300),
    data=st.data(),
)
def test_token_segments_are_the_interleave_runs_of_the_rank(
    num_ranks: int, interleave: int, tokens: int, data: st.DataObject
) -> None:
    placement = Interleave(num_ranks=num_ranks, interleave=interleave)
    rank = data.draw(st.integers(0, num_ranks - 1))
    row = 6
    copies = [
        c
        for s in token_segments(0, "latent", row, tokens, placement, rank=rank)
        for c in s.copies()
    ]
    rows = [(src // row + i, dst // row + i) for src, dst, n in copies for i in range(n // row)]
    runs = placement.runs(0, tokens, rank)
    assert rows == [(r.start + i, r.local_start + i) for r in runs for i in range(r.length)]
    assert len(copies) <= len(runs)  # runs are merged, never split
    assert (
        len(token_segments(0, "latent", row, tokens, placement, rank=rank)) <= 2
    )  # not one per run


@settings(max_examples=200, deadline=None)
@given(
    num_ranks=st.integers(1, 8),
    interleave=st.sampled_from((1, 2, 3, 4, 16)),
    tokens=st.integers(0, 300),
    data=st.data(),
)
def test_the_planners_unvalidated_segments_equal_the_validated_ones(
    num_ranks: int, interleave: int, tokens: int, data: st.DataObject
) -> None:
    """The planner makes its segments without validation (planned_segment, segment_fields);
    they equal what the validated path gives, field for field."""
    placement = Interleave(num_ranks=num_ranks, interleave=interleave)
    rank = data.draw(st.integers(0, num_ranks - 1))
    checked = token_segments(5, "latent", 6, tokens, placement, rank=rank)
    planned = derive_token_segments(
        5, "latent", 6, tokens, placement, rank=rank, make=planned_segment
    )
    fields = derive_token_segments(
        5, "latent", 6, tokens, placement, rank=rank, make=segment_fields
    )
    assert planned == checked
    assert [Segment.model_validate(f) for f in fields] == list(checked)
    for segment in planned:  # each a valid record: validating its dump gives it back
        assert Segment.model_validate(segment.model_dump()) == segment
    conv = CachePart(name="conv", shape=(5, 3, 96, 128), dtype="bfloat16", tp=Shard(dim=2))
    for d in range(8):
        made = derive_part_segment(conv, 40, (2, d // 4), (8, d), planned_segment)
        assert made == part_segment(conv, 40, (2, d // 4), (8, d))
