"""The checkpoint image and plane order pictures show the ride: units over planes, every
state in its page, and the publish order with the aliased attention layers first."""

from __future__ import annotations

import numpy as np
import pytest

from k3layout import (
    Deployment,
    HybridModel,
    Refusal,
    checkpoint_image,
    plan,
    plan_ride,
    plane_order,
)

pytest.importorskip("matplotlib")

from figures import by_gid, column, rectangles, texts
from matplotlib.lines import Line2D

from k3layout.draw import draw_image, draw_plane_order
from k3layout.draw.figure import CELL_SIZE

K3_TP8_SPEC2 = Deployment(attn_tp=8, spec_tokens=2)
S_TP8_SPEC2 = 3 * 96 * 128 // 8 * 5 * 2 + 96 // 8 * 128 * 128 * 4  # conv + recurrent: 832,512
PAGE_TP8_SPEC2 = 1536 * 576  # raised block x fp8 latent bytes per token: 884,736


def test_k3_with_dspark_draws_3_units_of_23_pages_each_holding_one_state(
    k3_dspark: HybridModel,
) -> None:
    image = checkpoint_image(plan(k3_dspark, K3_TP8_SPEC2))
    figure = draw_image(image)
    assert len(by_gid(figure, "unit")) == 3  # one unit per KDA group
    states = rectangles(figure, "state")
    assert len(states) == 3 * 23
    state_bytes = sum(r.get_height() / CELL_SIZE * PAGE_TP8_SPEC2 for r in states.values())
    assert state_bytes == pytest.approx(69 * S_TP8_SPEC2)  # 57,443,328
    padding = rectangles(figure, "padding")
    padding_bytes = sum(r.get_height() / CELL_SIZE * PAGE_TP8_SPEC2 for r in padding.values())
    assert padding_bytes == pytest.approx(3 * 23 * PAGE_TP8_SPEC2 - 69 * S_TP8_SPEC2)
    assert padding_bytes == pytest.approx(image.padding_bytes)


def test_the_state_of_layer_j_of_unit_u_is_drawn_in_column_j_labelled_by_module_layer(
    k3_dspark: HybridModel,
) -> None:
    image = checkpoint_image(plan(k3_dspark, K3_TP8_SPEC2))
    figure = draw_image(image)
    states = rectangles(figure, "state")
    labels = texts(figure, "label")
    for state in image.ranges:
        key = f"{state.unit}.{state.plane}"
        assert column(states[key]) == state.plane
        assert labels[key] == str(state.module_layer)
    # Unit 1 (linear_attention_1) on plane 0 is KDA layer 1, its state at byte 23 x page.
    assert labels["1.0"] == "1"
    assert image.range_of("linear_attention_1", 0).offset_bytes == 23 * PAGE_TP8_SPEC2


def test_each_unit_prints_its_byte_range_in_the_image(k3_dspark: HybridModel) -> None:
    figure = draw_image(plan(k3_dspark, K3_TP8_SPEC2))
    unit = 23 * PAGE_TP8_SPEC2  # 20,348,928 B: a page on each of the 23 image planes
    ranges = texts(figure, "range")
    assert ranges["2"].endswith(f"bytes [{2 * unit:,}, {3 * unit:,})")
    assert ranges["2"].endswith("bytes [40,697,856, 61,046,784)")


def test_the_columns_are_the_attention_layers_publishing_the_image_planes(
    k3_dspark: HybridModel,
) -> None:
    figure = draw_image(plan(k3_dspark, K3_TP8_SPEC2))
    ticks = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert ticks == [str(layer) for layer in range(3, 92, 4)]  # attention layers 3, 7, .., 91


def test_a_shorter_group_leaves_its_last_plane_all_padding(kimi_linear: HybridModel) -> None:
    image = checkpoint_image(plan(kimi_linear, Deployment(attn_tp=8)))
    assert [len(g.layers) for g in image.groups] == [7, 7, 6]  # 20 KDA layers, strided
    figure = draw_image(image)
    padding = rectangles(figure, "padding")
    assert "2.6" not in rectangles(figure, "state")
    assert padding["2.6"].get_height() == pytest.approx(CELL_SIZE)  # the whole page
    drawn = sum(r.get_height() / CELL_SIZE * image.page_bytes for r in padding.values())
    assert drawn == pytest.approx(image.padding_bytes)


def test_a_ride_plan_and_its_image_draw_the_same_cells(k3_dspark: HybridModel) -> None:
    ride = plan_ride(plan(k3_dspark, K3_TP8_SPEC2))
    assert set(rectangles(draw_image(ride), "state")) == set(
        rectangles(draw_image(ride.image), "state")
    )


def test_a_parent_plan_has_no_image_and_is_refused(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as caught:
        draw_image(plan(k3, Deployment(engine="tokenspeed", attn_tp=8)))
    assert caught.value.code == "engine_mismatch"
    assert caught.value.facts == {"engine": "tokenspeed", "required_engine": "vllm"}


def test_the_plane_order_joins_each_layers_given_and_published_place(
    k3_dspark: HybridModel,
) -> None:
    order = plane_order(plan(k3_dspark, K3_TP8_SPEC2))
    figure = draw_plane_order(order)
    count = len(order.planes)
    assert len(rectangles(figure, "given")) == len(rectangles(figure, "published")) == 29
    for share in order.planes:
        line = by_gid(figure, "move")[f"move.{share.plane}"]
        assert isinstance(line, Line2D)
        given_y, published_y = np.asarray(line.get_ydata(), dtype=float).tolist()
        assert count - 1 - given_y + 0.5 == order.given.index(share.attention_layer)
        assert count - 1 - published_y + 0.5 == share.plane
    # In name order the five draft layers come first; model.layers.3 is given place 10.
    assert order.given.index("model.layers.3.self_attn.attn") == 5 + 5


def test_the_image_planes_list_the_kda_layers_riding_them(k3_dspark: HybridModel) -> None:
    order = plane_order(plan(k3_dspark, K3_TP8_SPEC2))
    riders = texts(draw_plane_order(order), "riders")
    assert len(riders) == order.num_image_planes == 23
    assert riders["0"] == "KDA 0, 1, 2"  # layer 0 of each strided group rides layer 3
    assert riders["22"] == "KDA 88, 89, 90"


def test_without_the_draft_fewer_layers_change_place(
    k3: HybridModel, k3_dspark: HybridModel
) -> None:
    moved = []
    for model in (k3, k3_dspark):
        order = plane_order(plan(model, K3_TP8_SPEC2))
        title = draw_plane_order(order).axes[0].get_title()
        count = sum(order.given.index(s.attention_layer) != s.plane for s in order.planes)
        assert f"; {count} change place" in title
        moved.append(count)
    assert moved[0] < moved[1]
