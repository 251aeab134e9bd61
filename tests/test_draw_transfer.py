"""The transfer pictures show the transfer plan: the matrix of bytes sums to what each rank
sends and receives, the segment map names the producer of every (consumer, module layer)."""

from __future__ import annotations

import numpy as np
import pytest

from k3layout import Deployment, HybridModel, Refusal, plan_transfer, pp_stage_bounds
from k3layout.transfer import TransferPlan, transfer_report

pytest.importorskip("matplotlib")

from figures import image_mask, image_values, texts

from k3layout.draw import (
    NO_PRODUCER,
    draw_segment_map,
    draw_transfer,
    human_bytes,
    transfer_matrix,
)


def pp8_tp1_to_tp8_dcp8(model: HybridModel) -> TransferPlan:
    return plan_transfer(model, Deployment(pp=8), Deployment(attn_tp=8, dcp=8), prompt_tokens=4096)


def test_the_matrix_columns_sum_to_the_bytes_each_consumer_receives(k3: HybridModel) -> None:
    result = pp8_tp1_to_tp8_dcp8(k3)
    figure = draw_transfer(result)
    drawn = image_values(figure, "matrix")
    assert len(drawn) == len(drawn[0]) == 8  # 8 PP stages of TP1 x 8 TP ranks of the decode
    assert [sum(row[c] for row in drawn) for c in range(8)] == list(result.bytes_per_consumer)
    assert [sum(row) for row in drawn] == list(result.bytes_per_producer)
    # Consumer 0: its TP8 share of all 69 KDA states (S(8, 0) = 814,080 B each) and the fp8
    # latent rows of the 4,096 / 8 = 512 tokens its DCP rank owns in each of 24 MLA layers.
    assert result.bytes_per_consumer[0] == 69 * 814_080 + 24 * 512 * 576


def test_every_stage_writes_every_decode_rank_and_the_totals_are_printed(
    k3: HybridModel,
) -> None:
    result = pp8_tp1_to_tp8_dcp8(k3)
    figure = draw_transfer(result)
    cells = texts(figure, "cell")
    assert len(cells) == result.num_pairs == 64
    totals = texts(figure, "total")
    for consumer, received in enumerate(result.bytes_per_consumer):
        assert totals[f"consumer.{consumer}"] == human_bytes(received)
    for producer, sent in enumerate(result.bytes_per_producer):
        assert totals[f"producer.{producer}"] == human_bytes(sent)


def test_page_and_slot_matrices_split_the_bytes_as_the_report_does(k3: HybridModel) -> None:
    result = pp8_tp1_to_tp8_dcp8(k3)
    report = transfer_report(result)
    page = np.array(transfer_matrix(result, "page"))
    slot = np.array(transfer_matrix(result, "slot"))
    assert (page + slot).tolist() == [list(row) for row in transfer_matrix(result)]
    assert page.sum(axis=0).tolist() == list(report.page_bytes_per_consumer)
    assert slot.sum(axis=0).tolist() == list(report.slot_bytes_per_consumer)
    drawn = image_values(draw_transfer(result, kind="slot"), "matrix")
    assert drawn == slot.tolist()


def test_only_pairs_in_one_head_group_have_a_cell(k3_dspark: HybridModel) -> None:
    shared = {"spec_tokens": 2, "replayssm": True}
    result = plan_transfer(
        k3_dspark,
        Deployment(pp=2, attn_tp=2, **shared),
        Deployment(pp=2, attn_tp=8, **shared),
        prompt_tokens=1000,
    )
    drawn = image_values(draw_transfer(result), "matrix")
    nonzero = {(p, c) for p, row in enumerate(drawn) for c, moved in enumerate(row) if moved}
    assert nonzero == {(pair.producer, pair.consumer) for pair in result.pairs}
    # Producer TP rank 0 of a stage feeds decode TP ranks 0..3 of the same layers' stage.
    assert {c for p, c in nonzero if p == 0} == {0, 1, 2, 3}


def test_the_segment_map_places_every_layer_by_the_prefill_stage_holding_it(
    k3: HybridModel,
) -> None:
    result = pp8_tp1_to_tp8_dcp8(k3)
    figure = draw_segment_map(result)
    stage_of = {
        layer: stage
        for stage, (start, end) in enumerate(pp_stage_bounds(93, 8))
        for layer in range(start, end)
    }
    grid = image_values(figure, "map", NO_PRODUCER)
    assert (len(grid), len(grid[0])) == (8, 93)
    for consumer in range(8):  # a TP1 stage holds all 96 heads: producer rank = stage
        assert grid[consumer] == [stage_of[layer] for layer in range(93)]


def test_the_segment_map_leaves_blank_the_layers_a_decode_stage_does_not_hold(
    k3: HybridModel,
) -> None:
    result = plan_transfer(k3, Deployment(pp=4), Deployment(pp=2, attn_tp=2), prompt_tokens=300)
    figure = draw_segment_map(result)
    blank = image_mask(figure, "map")
    held = {consumer: set(range(*pp_stage_bounds(93, 2)[consumer // 2])) for consumer in range(4)}
    for consumer in range(4):
        for layer in range(93):
            assert blank[consumer][layer] == (layer not in held[consumer])
    assert image_values(figure, "kinds")[0] == [
        0 if layer.kind == "mla" else 1 for layer in k3.module_layers
    ]


def test_anything_but_a_transfer_plan_or_a_known_kind_is_refused(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as caught:
        draw_transfer(Deployment())  # type: ignore[arg-type]
    assert (caught.value.code, caught.value.facts) == ("invalid_argument", {"type": "Deployment"})
    with pytest.raises(Refusal) as caught:
        draw_transfer(pp8_tp1_to_tp8_dcp8(k3), kind="latent")  # type: ignore[arg-type]
    assert (caught.value.code, caught.value.facts) == ("invalid_argument", {"kind": "latent"})
    with pytest.raises(Refusal) as caught:
        draw_segment_map(Deployment())  # type: ignore[arg-type]
    assert caught.value.code == "invalid_argument"
