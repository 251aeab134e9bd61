"""The transfer's split algebra: fields as row-major arrays placed by TP, segments cut from them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import (
    Deployment,
    HybridModel,
    Interleave,
    Refusal,
    Replicate,
    Shard,
    rank_sizes,
)
from k3layout.sizes import ConvLayout
from k3layout.transfer import FieldLayout, Segment, kda_fields, token_segments

H, D, K = 96, 128, 4  # K3's KDA heads, head dim, short conv kernel


@pytest.mark.parametrize("conv_layout", ["channel_major", "time_major"])
@pytest.mark.parametrize(("tp", "s", "replayssm"), [(1, 0, False), (8, 2, True), (32, 2, True)])
def test_field_layouts_hold_exactly_the_bytes_rank_sizes_gives_each_rank(
    k3: HybridModel, conv_layout: ConvLayout, tp: int, s: int, replayssm: bool
) -> None:
    sizes = rank_sizes(k3, Deployment(attn_tp=tp, spec_tokens=s))
    assert sizes.kda is not None and sizes.replay is not None
    fields = kda_fields(sizes.kda, sizes.replay if replayssm else None, conv_layout)
    local = {f.field: f.local_bytes(tp, rank) for f in fields for rank in (0, tp - 1)}
    assert local["conv"] == sizes.kda.conv_bytes
    assert local["recurrent"] == sizes.kda.recurrent_bytes
    assert local["conv"] + local["recurrent"] == sizes.kda_state_bytes
    if replayssm:
        assert local["replay_k"] + local["replay_u"] + local["replay_g"] == sizes.replay.layer_bytes
    else:
        assert "replay_k" not in local


def test_conv_of_a_tp8_rank_from_a_tp1_rank_is_three_runs_one_per_part(k3: HybridModel) -> None:
    sizes = rank_sizes(k3, Deployment(attn_tp=1))
    assert sizes.kda is not None
    conv = kda_fields(sizes.kda, None, "channel_major")[0]
    assert conv.shape == (3, H, D, K - 1) and conv.tp == Shard(dim=1)
    d = 5
    segment = conv.segment(40, (1, 0), (8, d))
    head_bytes = D * (K - 1) * 2  # one head's channels x 3 rows of history, bf16
    assert segment.copies() == tuple(
        (part * H * head_bytes + d * 12 * head_bytes, part * 12 * head_bytes, 12 * head_bytes)
        for part in range(3)  # q, k, v: 12 heads of each, 96 heads apart on the TP1 rank
    )
    assert segment.total_bytes == 3 * H * D // 8 * (K - 1) * 2


def test_time_major_conv_is_one_run_per_row_and_part(k3: HybridModel) -> None:
    sizes = rank_sizes(k3, Deployment(attn_tp=1, spec_tokens=2))
    assert sizes.kda is not None
    conv = kda_fields(sizes.kda, None, "time_major")[0]
    segment = conv.segment(0, (2, 1), (8, 6))  # producer 1 of TP2 holds heads 48..95
    part = 12 * D * 2  # 12 heads x 128 channels, bf16
    assert segment.num_copies == 3 * (K - 1 + 2)  # q|k|v x 5 rows
    assert segment.length_bytes == part
    assert segment.src_offset_bytes == (6 % 4) * part  # consumer 6 is the 3rd of producer 1's 4
    assert segment.src_stride_bytes == 48 * D * 2 and segment.dst_stride_bytes == part


def test_recurrent_state_is_one_contiguous_head_slice(k3: HybridModel) -> None:
    sizes = rank_sizes(k3, Deployment(attn_tp=2))
    assert sizes.kda is not None
    recurrent = kda_fields(sizes.kda, None, "channel_major")[1]
    head = D * D * 4  # (D, D) fp32 per head
    assert recurrent.segment(7, (2, 1), (8, 5)).copies() == ((12 * head, 0, 12 * head),)


def test_a_replicated_field_is_copied_whole() -> None:
    cursor = FieldLayout(field="cursor", shape=(1,), elem_bytes=4, tp=Replicate())
    assert cursor.segment(None, (1, 0), (8, 7)).copies() == ((0, 0, 4),)


def test_a_consumer_share_outside_the_producer_share_is_refused() -> None:
    recurrent = FieldLayout(field="recurrent", shape=(8, 2, 2), elem_bytes=4, tp=Shard(dim=0))
    with pytest.raises(Refusal) as refused:
        recurrent.segment(3, (2, 1), (8, 1))  # consumer 1 holds head 1, producer 1 heads 4..7
    assert refused.value.code == "head_group_mismatch"
    assert refused.value.facts == {
        "field": "recurrent",
        "producer_tp_rank": 1,
        "prefill_tp": 2,
        "consumer_tp_rank": 1,
        "decode_tp": 8,
    }


def test_an_extent_the_tp_does_not_divide_is_refused_as_uneven() -> None:
    field = FieldLayout(field="recurrent", shape=(6, 2, 2), elem_bytes=4, tp=Shard(dim=0))
    with pytest.raises(Refusal) as refused:
        field.local_bytes(4)
    assert refused.value.code == "uneven_split"
    assert refused.value.facts == {"extent": 6, "num_ranks": 4}


def test_a_placed_dimension_outside_the_shape_is_rejected() -> None:
    with pytest.raises(Refusal):
        FieldLayout(field="conv", shape=(3, 4), elem_bytes=2, tp=Shard(dim=2))


def test_copies_that_touch_end_to_end_become_one_copy() -> None:
    segment = Segment.strided(
        "latent", 3, src_offset_bytes=0, dst_offset_bytes=0, length_bytes=8, num_copies=4,
        src_stride_bytes=8, dst_stride_bytes=8,
    )  # fmt: skip
    assert (segment.num_copies, segment.length_bytes) == (1, 32)
    assert (segment.src_stride_bytes, segment.dst_stride_bytes) == (0, 0)


def test_overlapping_strided_copies_are_rejected() -> None:
    with pytest.raises(Refusal):
        Segment(
            field="conv", layer=0, src_offset_bytes=0, dst_offset_bytes=0, length_bytes=8,
            num_copies=2, src_stride_bytes=4, dst_stride_bytes=8,
        )  # fmt: skip


def test_the_docstring_example_dcp4_interleave2_13_tokens_rank1() -> None:
    segments = token_segments(7, 10, 13, Interleave(num_ranks=4, interleave=2), 1)
    # rank 1 owns tokens 2, 3 and 10, 11: rows 2-3 -> 0-1 and 10-11 -> 2-3, 10 B a row
    assert [c for s in segments for c in s.copies()] == [(20, 0, 20), (100, 20, 20)]


def test_without_dcp_every_row_is_one_whole_copy() -> None:
    segments = token_segments(3, 576, 1000, Interleave(num_ranks=1, interleave=16), 0)
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
    copies = [c for s in token_segments(0, row, tokens, placement, rank) for c in s.copies()]
    rows = [(src // row + i, dst // row + i) for src, dst, n in copies for i in range(n // row)]
    runs = placement.runs(0, tokens, rank)
    assert rows == [(r.start + i, r.local_start + i) for r in runs for i in range(r.length)]
    assert len(copies) <= len(runs)  # runs are merged, never split
    assert len(token_segments(0, row, tokens, placement, rank)) <= 2  # not one per run
