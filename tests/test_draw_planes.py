"""The planes picture shows the plan: one column per plane, one page per layer on the plane of
its position in its group, padding shaded to the byte."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings

from k3layout import (
    Deployment,
    EngineLayout,
    HybridModel,
    KvCacheDtype,
    Refusal,
    plan,
    plan_parent,
    plan_vllm,
    preset,
)
from k3layout.testing import plannable_inputs

pytest.importorskip("matplotlib")

from figures import by_gid, column, rectangles, texts
from matplotlib.collections import LineCollection

from k3layout.draw import block_cells, draw_planes, plane_cells
from k3layout.draw.figure import CELL_SIZE

K3_TP8_SPEC2 = Deployment(attn_tp=8, spec_tokens=2)
# S(8, 2): conv 3 x 96 x 128 / 8 channels x (4 - 1 + 2) rows x 2 B + recurrent 12 x 128 x 128 x 4 B
S_TP8_SPEC2 = 3 * 96 * 128 // 8 * 5 * 2 + 96 // 8 * 128 * 128 * 4
PAGE_TP8_SPEC2 = 1536 * 576  # the raised block x 576 fp8 latent bytes per token


def shaded_bytes(rect_height: float, plane_bytes: int) -> float:
    """Bytes a shaded rectangle stands for: the cell's full height is the whole plane."""
    return rect_height / CELL_SIZE * plane_bytes


def drawn_columns(plan_: EngineLayout, stage: int | None = None) -> dict[int, set[str]]:
    """Plane -> the ``group.layer`` pages drawn in its column."""
    columns: dict[int, set[str]] = {}
    for key, rect in rectangles(draw_planes(plan_, stage=stage), "page").items():
        columns.setdefault(column(rect), set()).add(key)
    return columns


def test_a_vllm_block_of_k3_with_dspark_draws_29_planes_and_98_pages(
    k3_dspark: HybridModel,
) -> None:
    result = plan(k3_dspark, K3_TP8_SPEC2)
    figure = draw_planes(result)
    assert len(by_gid(figure, "plane")) == result.num_planes == 29
    pages = rectangles(figure, "page")
    # 29 attention layers (24 target + 5 draft) and 3 KDA groups of 23.
    assert len(pages) == 29 + 3 * 23
    assert set(pages) == {f"{g.name}.{layer}" for g in result.groups for layer in g.layers}
    labels = texts(figure, "label")
    assert labels == {key: key.rsplit(".", 1)[1] for key in pages}


def test_each_column_holds_layer_j_of_every_group_as_the_plan_aliases_them(
    k3_dspark: HybridModel,
) -> None:
    result = plan(k3_dspark, K3_TP8_SPEC2)
    expected = {
        j: {f"{member.group}.{member.layer}" for member in members}
        for j, members in enumerate(result.planes)
    }
    assert drawn_columns(result) == expected
    # Plane 0: KDA layers 0, 1, 2 (one per strided group) ride attention layer 3's page.
    assert expected[0] == {
        "linear_attention_0.0",
        "linear_attention_1.1",
        "linear_attention_2.2",
        "full_attention.3",
    }


def test_a_kda_page_shades_the_page_minus_the_state_and_an_attention_page_none(
    k3_dspark: HybridModel,
) -> None:
    result = plan_vllm(k3_dspark, K3_TP8_SPEC2)
    figure = draw_planes(result)
    padding = rectangles(figure, "padding")
    kda = {f"{g.name}.{layer}" for g in result.groups if g.kind == "kda" for layer in g.layers}
    assert set(padding) == kda  # attention pages are the page exactly: nothing shaded
    for rect in padding.values():
        assert shaded_bytes(rect.get_height(), result.page_bytes) == pytest.approx(
            PAGE_TP8_SPEC2 - S_TP8_SPEC2  # 884,736 - 832,512 = 52,224
        )
    # The six planes the KDA groups do not reach are shaded whole in each KDA row.
    unused = rectangles(figure, "unused")
    assert set(unused) == {f"linear_attention_{g}.{j}" for g in range(3) for j in range(23, 29)}


@pytest.mark.parametrize(
    ("attn_tp", "kv_dtype", "engine_version"),
    [
        (8, "fp8", None),
        (16, "bf16", None),
        (32, "bf16", None),  # main: 12 MLA pages, 8 state pages
        (1, "fp8", "pr1152"),  # #1152: 89 MLA pages, 1 state page (main refuses TP 1)
    ],
)
def test_a_parent_row_shades_exactly_the_groups_padding(
    k3: HybridModel, attn_tp: int, kv_dtype: KvCacheDtype, engine_version: str | None
) -> None:
    deployment = Deployment(
        engine="tokenspeed", engine_version=engine_version, attn_tp=attn_tp, kv_dtype=kv_dtype
    )
    result = plan_parent(k3, deployment)
    figure = draw_planes(result)
    plane = result.packing.plane_bytes
    shaded: dict[str, float] = {}
    for prefix in ("padding", "unused"):
        for key, rect in rectangles(figure, prefix).items():
            name = key.rsplit(".", 1)[0]
            shaded[name] = shaded.get(name, 0.0) + shaded_bytes(rect.get_height(), plane)
    for group in result.groups:
        per_parent = result.pages_per_parent(group)
        # padding_fraction = (parent / p_g - raw_g) / raw_g, so a parent wastes
        # padding_fraction * p_g * raw_g bytes on the group: what its row shades.
        expected = result.padding_fraction[group.name] * per_parent * result.raw_bytes(group)
        assert shaded.get(group.name, 0.0) == pytest.approx(expected, rel=1e-9, abs=1e-3)


def test_tp96_bf16_draws_one_mla_page_and_2_state_slots_per_plane(k3: HybridModel) -> None:
    # #1152's 1:2 packing (main refuses TP 96 bf16: 26 state pages break the plane's alignment)
    deployment = Deployment(
        engine="tokenspeed", engine_version="pr1152", attn_tp=96, kv_dtype="bf16"
    )
    result = plan_parent(k3, deployment)
    cells = {(c.group, c.layer): c for c in plane_cells(result)}
    assert cells[("full_attention", 3)].pages == 1  # one 147,456 B bf16 page = the plane
    assert cells[("linear_attention_0", 0)].pages == 2  # 2 x 67,840 B states
    # The plane: 128 tokens x 1,152 B; the state at TP 96: 3 x 128 x 3 x 2 + 128^2 x 4.
    assert cells[("linear_attention_0", 0)].padding_bytes == 128 * 1152 - 2 * (
        3 * 96 * 128 // 96 * 3 * 2 + 96 // 96 * 128 * 128 * 4
    )
    dividers = [a for a in draw_planes(result).findobj() if a.get_gid() == "dividers"]
    assert isinstance(dividers[0], LineCollection)
    # A line between pages inside a cell: 24 MLA cells x (1 - 1) + 69 state cells x (2 - 1).
    assert len(dividers[0].get_segments()) == 69 * 1


def test_a_pipeline_stage_draws_its_own_planes_and_layers(k3: HybridModel) -> None:
    result = plan(k3, Deployment(attn_tp=1, pp=4))
    stage = result.stages[1]
    figure = draw_planes(result, stage=1)
    assert len(by_gid(figure, "plane")) == stage.num_planes
    drawn_layers = {int(key.rsplit(".", 1)[1]) for key in rectangles(figure, "page")}
    assert drawn_layers == set(stage.layers)


@settings(max_examples=12, deadline=None)
@given(plannable_inputs())
def test_every_plannable_input_draws_one_column_per_plane_and_one_page_per_layer(
    inputs: tuple[HybridModel, Deployment],
) -> None:
    try:
        result = plan(*inputs)
    except Refusal as refusal:  # valid parallelism, yet a packing over the padding limit
        assert refusal.code in {"padding_limit", "layout_unsupported"}
        return
    figure = draw_planes(result)
    assert len(by_gid(figure, "plane")) == result.num_planes
    assert drawn_columns(result) == {
        j: {f"{m.group}.{m.layer}" for m in members} for j, members in enumerate(result.planes)
    }


def test_a_stage_that_is_not_a_stage_is_refused(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as caught:
        draw_planes(plan(k3, Deployment(pp=2)), stage=2)
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts == {"stage": 2, "pp": 2}


def test_something_other_than_a_plan_is_refused() -> None:
    with pytest.raises(Refusal) as caught:
        draw_planes(Deployment())  # type: ignore[arg-type]
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts == {"type": "Deployment"}


def test_a_packed_plan_draws_its_block_with_every_cache_at_its_byte_range() -> None:
    """GLM-5.3-Flash on vLLM has no planes: draw_planes draws its block, a row per group, each
    cache a segment at its byte range (block 0), no two caches of a group overlapping."""
    result = plan(preset("glm-5.3-flash"), Deployment(attn_tp=8))
    figure = draw_planes(result)
    assert not by_gid(figure, "plane")
    cells = block_cells(result)
    drawn = rectangles(figure, "cache")
    assert set(drawn) == {f"{c.group}.{c.layer}.{c.part}" for c in cells}
    block = result.block_bytes
    for cell in cells:
        rect = drawn[f"{cell.group}.{cell.layer}.{cell.part}"]
        assert rect.get_x() * block == pytest.approx(cell.offset_bytes)
        assert rect.get_width() * block == pytest.approx(cell.size_bytes)
    for group in result.groups:
        spans = sorted((c.offset_bytes, c.end_bytes) for c in cells if c.group == group.name)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
        assert spans[-1][1] <= block
    latents = [c for c in cells if c.part == "latent"]
    assert [(c.layer, c.size_bytes) for c in latents[:2]] == [(3, 1536 * 512), (7, 1536 * 512)]
    labels = texts(figure, "label")
    assert (labels["full_attention.3"], labels["linear_attention_0.0"]) == ("3", "0")


def test_a_block_of_a_layer_outermost_plan_is_refused() -> None:
    with pytest.raises(Refusal) as caught:
        block_cells(plan(preset("kimi-k3"), Deployment(attn_tp=8)))
    assert caught.value.code == "layout_unsupported"
    with pytest.raises(Refusal) as caught:
        block_cells("a plan")  # type: ignore[arg-type]
    assert caught.value.code == "invalid_argument"
