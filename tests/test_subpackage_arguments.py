"""The functions the subpackages export refuse bad arguments by name: a wrong type, a value out
of range or beyond a bound is a :class:`~k3layout.Refusal` whose message names the parameter,
never a ``TypeError`` from inside. Good arguments still give the planner's answers."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from k3layout import Deployment, Group, Refusal, plan_parent, plan_ride, plan_vllm, preset
from k3layout.cache import element_bytes, record_len, replay_spec
from k3layout.engines.vllm import block_tokens_for
from k3layout.layouts import project_stages
from k3layout.model import KDALayer, MLALayer, kimi_layer_pattern
from k3layout.offload import (
    aliasing_problems,
    check_options,
    check_ridable,
    index_region_name,
    name_order,
    page_regions,
    plane_order,
    ride_report,
    vllm_views,
)
from k3layout.sweep import sweep
from k3layout.testing import plan_invariant_violations, vllm_pipeline_depths
from k3layout.transfer import (
    check_matching_deployments,
    check_same_model,
    dcp_rank_of,
    part_segment,
    plan_transfer,
    rank_regions,
    slot_parts,
    token_segments,
    transfer_report,
)

K3 = preset("kimi-k3")
DEPLOYMENT = Deployment(attn_tp=8)
PLAN = plan_vllm(K3, DEPLOYMENT)
SIZES = PLAN.sizes
KDA_LAYER = K3.kda_layer_ids[0]
MLA_LAYER = K3.attention_layer_ids[0]
CONV = SIZES.spec_of(KDA_LAYER).part("conv")
RIDE = plan_ride(PLAN)
ORDER = plane_order(PLAN)
VIEWS = vllm_views(PLAN, [j << 32 for j in range(PLAN.num_planes)], num_blocks=4)
TRANSFER = plan_transfer(K3, Deployment(pp=8), Deployment(attn_tp=8, dcp=8), prompt_tokens=4096)
MLA = MLALayer(num_heads=32)
KDA = KDALayer(num_heads=32, head_dim=128)
TOKENS = Deployment(attn_tp=8, dcp=4).dcp_placement
HUGE = 10**400

Call = Callable[[], object]

# (call, code, the parameter the message names)
BAD_CALLS: dict[str, tuple[Call, str, str]] = {
    # k3layout.cache
    "element_bytes of None": (lambda: element_bytes(None), "invalid_argument", "dtype"),  # type: ignore[arg-type]
    "element_bytes of an unknown dtype": (
        lambda: element_bytes("int8"),  # type: ignore[arg-type]
        "invalid_argument",
        "dtype",
    ),
    "element_bytes of a list": (lambda: element_bytes([]), "invalid_argument", "dtype"),  # type: ignore[arg-type]
    "record_len of no deployment": (lambda: record_len(None), "invalid_argument", "deployment"),  # type: ignore[arg-type]
    "replay_spec of string heads": (
        lambda: replay_spec("96", 128, DEPLOYMENT),  # type: ignore[arg-type]
        "invalid_argument",
        "num_heads",
    ),
    "replay_spec of no heads": (
        lambda: replay_spec(0, 128, DEPLOYMENT),
        "invalid_argument",
        "num_heads",
    ),
    "replay_spec of a huge head_dim": (
        lambda: replay_spec(96, HUGE, DEPLOYMENT),
        "size_limit",
        "head_dim",
    ),
    "replay_spec of no deployment": (
        lambda: replay_spec(96, 128, None),  # type: ignore[arg-type]
        "invalid_argument",
        "deployment",
    ),
    # k3layout.layouts
    "block_tokens_for of no sizes": (
        lambda: block_tokens_for(None, None),  # type: ignore[arg-type]
        "invalid_argument",
        "sizes",
    ),
    "block_tokens_for of a string block": (
        lambda: block_tokens_for(SIZES, "16"),  # type: ignore[arg-type]
        "invalid_argument",
        "requested",
    ),
    "block_tokens_for of a zero block": (
        lambda: block_tokens_for(SIZES, 0),
        "invalid_argument",
        "requested",
    ),
    "block_tokens_for of a huge block": (
        lambda: block_tokens_for(SIZES, HUGE),
        "size_limit",
        "requested",
    ),
    "block_tokens_for of an unknown backend": (
        lambda: block_tokens_for(SIZES, None, "FLASH"),  # type: ignore[arg-type]
        "invalid_argument",
        "backend",
    ),
    "block_tokens_for of an int backend": (
        lambda: block_tokens_for(SIZES, None, 3),  # type: ignore[arg-type]
        "invalid_argument",
        "backend",
    ),
    "project_stages of no model": (
        lambda: project_stages(None, DEPLOYMENT, ()),  # type: ignore[arg-type]
        "invalid_argument",
        "model",
    ),
    "project_stages of a plan as deployment": (
        lambda: project_stages(K3, PLAN, ()),  # type: ignore[arg-type]
        "invalid_argument",
        "deployment",
    ),
    "project_stages of no groups": (
        lambda: project_stages(K3, DEPLOYMENT, None),  # type: ignore[arg-type]
        "invalid_argument",
        "groups",
    ),
    "project_stages of int groups": (
        lambda: project_stages(K3, DEPLOYMENT, (1,)),  # type: ignore[arg-type]
        "invalid_argument",
        "groups[0]",
    ),
    "project_stages of a group past the model": (
        lambda: project_stages(
            K3, DEPLOYMENT, (Group(name="full_attention", kind="attention", layers=(3, 93)),)
        ),
        "invalid_argument",
        "groups[0]",
    ),
    # k3layout.model
    "kimi_layer_pattern of string layers": (
        lambda: kimi_layer_pattern("27", MLA, KDA),  # type: ignore[arg-type]
        "invalid_argument",
        "num_layers",
    ),
    "kimi_layer_pattern of no layers": (
        lambda: kimi_layer_pattern(0, MLA, KDA),
        "invalid_argument",
        "num_layers",
    ),
    "kimi_layer_pattern of 2**70 layers": (
        lambda: kimi_layer_pattern(2**70, MLA, KDA),
        "size_limit",
        "num_layers",
    ),
    "kimi_layer_pattern of no MLA layer": (
        lambda: kimi_layer_pattern(27, None, KDA),  # type: ignore[arg-type]
        "invalid_argument",
        "mla",
    ),
    "kimi_layer_pattern of an MLA layer as KDA": (
        lambda: kimi_layer_pattern(27, MLA, MLA),  # type: ignore[arg-type]
        "invalid_argument",
        "kda",
    ),
    # k3layout.offload
    "aliasing_problems of no plan": (
        lambda: aliasing_problems(None, VIEWS, ORDER.given),  # type: ignore[arg-type]
        "invalid_argument",
        "plan",
    ),
    "aliasing_problems of no views": (
        lambda: aliasing_problems(PLAN, None, ORDER.given),  # type: ignore[arg-type]
        "invalid_argument",
        "views",
    ),
    "aliasing_problems of int views": (
        lambda: aliasing_problems(PLAN, {"x": 1}, ORDER.given),  # type: ignore[dict-item]
        "invalid_argument",
        "views",
    ),
    "aliasing_problems of no published order": (
        lambda: aliasing_problems(PLAN, VIEWS, None),  # type: ignore[arg-type]
        "invalid_argument",
        "published",
    ),
    "aliasing_problems of a string stage": (
        lambda: aliasing_problems(PLAN, VIEWS, ORDER.given, stage="0"),  # type: ignore[arg-type]
        "invalid_argument",
        "stage",
    ),
    "aliasing_problems of int names": (
        lambda: aliasing_problems(PLAN, VIEWS, ORDER.given, names=5),  # type: ignore[arg-type]
        "invalid_argument",
        "names",
    ),
    "check_options of a dict": (lambda: check_options({}), "invalid_argument", "options"),  # type: ignore[arg-type]
    "check_ridable of a deployment": (
        lambda: check_ridable(DEPLOYMENT),  # type: ignore[arg-type]
        "invalid_argument",
        "model",
    ),
    "index_region_name of None": (
        lambda: index_region_name(None),  # type: ignore[arg-type]
        "invalid_argument",
        "attention_name",
    ),
    "index_region_name of an empty name": (
        lambda: index_region_name(""),
        "invalid_argument",
        "attention_name",
    ),
    "name_order of None": (lambda: name_order(None), "invalid_argument", "names"),  # type: ignore[arg-type]
    "name_order of one string": (lambda: name_order("ab"), "invalid_argument", "names"),
    "name_order of ints": (lambda: name_order(["a", 1]), "invalid_argument", "names[1]"),  # type: ignore[list-item]
    "page_regions of no plan": (lambda: page_regions(None, ORDER), "invalid_argument", "plan"),  # type: ignore[arg-type]
    "page_regions of no order": (lambda: page_regions(PLAN, None), "invalid_argument", "order"),  # type: ignore[arg-type]
    "ride_report of a plan": (lambda: ride_report(PLAN), "invalid_argument", "ride"),  # type: ignore[arg-type]
    "ride_report of a string hit": (
        lambda: ride_report(RIDE, "1536"),  # type: ignore[arg-type]
        "invalid_argument",
        "hit_tokens",
    ),
    "ride_report of a negative hit": (
        lambda: ride_report(RIDE, -1),
        "invalid_argument",
        "hit_tokens",
    ),
    "ride_report of a huge hit": (lambda: ride_report(RIDE, HUGE), "size_limit", "hit_tokens"),
    # k3layout.testing
    "plan_invariant_violations of a model": (
        lambda: plan_invariant_violations(K3),  # type: ignore[arg-type]
        "invalid_argument",
        "result",
    ),
    "vllm_pipeline_depths of no model": (
        lambda: vllm_pipeline_depths(None, 8),  # type: ignore[arg-type]
        "invalid_argument",
        "model",
    ),
    "vllm_pipeline_depths of a float depth": (
        lambda: vllm_pipeline_depths(K3, 8.0),  # type: ignore[arg-type]
        "invalid_argument",
        "up_to",
    ),
    # k3layout.transfer
    "check_matching_deployments of no prefill": (
        lambda: check_matching_deployments(None, DEPLOYMENT),  # type: ignore[arg-type]
        "invalid_argument",
        "prefill",
    ),
    "check_matching_deployments of no decode": (
        lambda: check_matching_deployments(DEPLOYMENT, None),  # type: ignore[arg-type]
        "invalid_argument",
        "decode",
    ),
    "check_same_model of no prefill model": (
        lambda: check_same_model(None, K3),  # type: ignore[arg-type]
        "invalid_argument",
        "prefill_model",
    ),
    "check_same_model of a plan": (
        lambda: check_same_model(K3, PLAN),  # type: ignore[arg-type]
        "invalid_argument",
        "decode_model",
    ),
    "dcp_rank_of of a string rank": (lambda: dcp_rank_of("3", 8), "invalid_argument", "tp_rank"),  # type: ignore[arg-type]
    "dcp_rank_of of a bool rank": (lambda: dcp_rank_of(True, 8), "invalid_argument", "tp_rank"),
    "dcp_rank_of of a negative rank": (lambda: dcp_rank_of(-1, 8), "invalid_argument", "tp_rank"),
    "dcp_rank_of of a huge rank": (lambda: dcp_rank_of(2**63, 8), "size_limit", "tp_rank"),
    "dcp_rank_of of dcp 0": (lambda: dcp_rank_of(3, 0), "invalid_argument", "dcp"),
    "dcp_rank_of of a float dcp": (lambda: dcp_rank_of(3, 8.0), "invalid_argument", "dcp"),  # type: ignore[arg-type]
    "dcp_rank_of of a huge dcp": (lambda: dcp_rank_of(3, HUGE), "size_limit", "dcp"),
    "part_segment of no part": (
        lambda: part_segment(None, KDA_LAYER, (1, 0), (8, 0)),  # type: ignore[arg-type]
        "invalid_argument",
        "part",
    ),
    "part_segment of a negative layer": (
        lambda: part_segment(CONV, -1, (1, 0), (8, 0)),
        "invalid_argument",
        "layer",
    ),
    "part_segment of a string layer": (
        lambda: part_segment(CONV, "0", (1, 0), (8, 0)),  # type: ignore[arg-type]
        "invalid_argument",
        "layer",
    ),
    "part_segment of a one-item src": (
        lambda: part_segment(CONV, 0, (1,), (8, 0)),  # type: ignore[arg-type]
        "invalid_argument",
        "src",
    ),
    "part_segment of a dict dst": (
        lambda: part_segment(CONV, 0, (1, 0), {}),  # type: ignore[arg-type]
        "invalid_argument",
        "dst",
    ),
    "part_segment of tp 0": (
        lambda: part_segment(CONV, 0, (0, 0), (8, 0)),
        "invalid_argument",
        "src[0]",
    ),
    "part_segment of a huge tp": (
        lambda: part_segment(CONV, 0, (HUGE, 0), (8, 0)),
        "size_limit",
        "src[0]",
    ),
    "part_segment of a rank outside its tp": (
        lambda: part_segment(CONV, 0, (1, 0), (8, 8)),
        "invalid_argument",
        "dst[1]",
    ),
    "rank_regions of no deployment": (
        lambda: rank_regions(None, SIZES, layers=(0,), tp_rank=0, prompt_tokens=8),  # type: ignore[arg-type]
        "invalid_argument",
        "deployment",
    ),
    "rank_regions of no sizes": (
        lambda: rank_regions(DEPLOYMENT, PLAN, layers=(0,), tp_rank=0, prompt_tokens=8),  # type: ignore[arg-type]
        "invalid_argument",
        "sizes",
    ),
    "rank_regions of no layers": (
        lambda: rank_regions(DEPLOYMENT, SIZES, layers=None, tp_rank=0, prompt_tokens=8),  # type: ignore[arg-type]
        "invalid_argument",
        "layers",
    ),
    "rank_regions of string layers": (
        lambda: rank_regions(DEPLOYMENT, SIZES, layers=("0",), tp_rank=0, prompt_tokens=8),  # type: ignore[arg-type]
        "invalid_argument",
        "layers[0]",
    ),
    "rank_regions of a rank outside attn_tp": (
        lambda: rank_regions(DEPLOYMENT, SIZES, layers=(0,), tp_rank=8, prompt_tokens=8),
        "invalid_argument",
        "tp_rank",
    ),
    "rank_regions of negative tokens": (
        lambda: rank_regions(DEPLOYMENT, SIZES, layers=(0,), tp_rank=0, prompt_tokens=-1),
        "invalid_argument",
        "prompt_tokens",
    ),
    "rank_regions of huge tokens": (
        lambda: rank_regions(DEPLOYMENT, SIZES, layers=(0,), tp_rank=0, prompt_tokens=HUGE),
        "size_limit",
        "prompt_tokens",
    ),
    "slot_parts of no sizes": (lambda: slot_parts(None, KDA_LAYER), "invalid_argument", "sizes"),  # type: ignore[arg-type]
    "slot_parts of a string layer": (lambda: slot_parts(SIZES, "0"), "invalid_argument", "layer"),  # type: ignore[arg-type]
    "slot_parts of an attention layer": (
        lambda: slot_parts(SIZES, MLA_LAYER),
        "invalid_argument",
        "layer",
    ),
    "token_segments of a negative layer": (
        lambda: token_segments(-1, "latent", 576, 64, TOKENS, rank=0),
        "invalid_argument",
        "layer",
    ),
    "token_segments of an int field": (
        lambda: token_segments(3, 1, 576, 64, TOKENS, rank=0),  # type: ignore[arg-type]
        "invalid_argument",
        "field",
    ),
    "token_segments of no row bytes": (
        lambda: token_segments(3, "latent", 0, 64, TOKENS, rank=0),
        "invalid_argument",
        "row_bytes",
    ),
    "token_segments of float tokens": (
        lambda: token_segments(3, "latent", 576, 64.0, TOKENS, rank=0),  # type: ignore[arg-type]
        "invalid_argument",
        "prompt_tokens",
    ),
    "token_segments of huge tokens": (
        lambda: token_segments(3, "latent", 576, HUGE, TOKENS, rank=0),
        "size_limit",
        "prompt_tokens",
    ),
    "token_segments beyond int64 bytes": (
        lambda: token_segments(3, "latent", 2**62, 64, TOKENS, rank=0),
        "size_limit",
        "row_bytes",
    ),
    "token_segments of a shard placement": (
        lambda: token_segments(3, "latent", 576, 64, CONV.tp, rank=0),  # type: ignore[arg-type]
        "invalid_argument",
        "placement",
    ),
    "token_segments of a rank outside the placement": (
        lambda: token_segments(3, "latent", 576, 64, TOKENS, rank=4),
        "invalid_argument",
        "rank",
    ),
    "transfer_report of a plan": (lambda: transfer_report(PLAN), "invalid_argument", "result"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_a_bad_argument_is_a_refusal_naming_the_parameter(name: str) -> None:
    call, code, parameter = BAD_CALLS[name]
    with pytest.raises(Refusal) as refused:
        call()
    assert refused.value.code == code
    assert parameter in str(refused.value)
    field = refused.value.facts.get("field")
    assert field is None or str(field).startswith(parameter.split("[")[0])


GOOD_CALLS: dict[str, tuple[Call, object]] = {
    "element_bytes of fp8": (lambda: element_bytes("float8_e4m3fn"), 1),
    "element_bytes of raw bytes": (lambda: element_bytes("uint8"), 1),
    "record_len at 2 spec tokens": (lambda: record_len(Deployment(spec_tokens=2)), 16),
    "replay_spec's record shape": (
        lambda: replay_spec(96, 128, DEPLOYMENT).parts[0].shape,
        (16, 96, 128),
    ),
    "block_tokens_for the plan's block": (
        lambda: block_tokens_for(SIZES, None, "FLASHMLA"),
        PLAN.block_tokens,
    ),
    "project_stages of the plan's groups": (
        lambda: project_stages(K3, DEPLOYMENT, list(PLAN.groups)),  # type: ignore[arg-type]
        PLAN.stages,
    ),
    "kimi_layer_pattern's MLA layers": (
        lambda: [i for i, layer in enumerate(kimi_layer_pattern(9, MLA, KDA)) if layer == MLA],
        [3, 7, 8],
    ),
    "aliasing_problems of vLLM's views": (lambda: aliasing_problems(PLAN, VIEWS, ORDER.order), ()),
    "index_region_name": (
        lambda: index_region_name("model.layers.3.self_attn.attn"),
        "model.layers.3.self_attn.attn.indexer.k_cache",
    ),
    "name_order of any sequence": (lambda: name_order(["b", "a11", "a3"]), ("a11", "a3", "b")),
    "page_regions of the plane order": (lambda: len(page_regions(PLAN, ORDER)), 24),
    "ride_report of a hit": (lambda: ride_report(RIDE, 5000).hit is not None, True),
    "plan_invariant_violations of a parent plan": (
        lambda: plan_invariant_violations(plan_parent(K3, DEPLOYMENT)),
        [],
    ),
    "vllm_pipeline_depths of K3": (lambda: vllm_pipeline_depths(K3, 2), (1, 2)),
    "dcp_rank_of": (lambda: dcp_rank_of(13, 8), 5),
    "slot_parts of a KDA layer": (
        lambda: [part.name for part in slot_parts(SIZES, KDA_LAYER)],
        ["conv", "recurrent"],
    ),
    "token_segments of DCP rank 1": (
        lambda: [s.copies() for s in token_segments(3, "latent", 1, 13, TOKENS, rank=1)],
        [((1, 0, 1), (5, 1, 1), (9, 2, 1))],
    ),
    "rank_regions of a consumer": (
        lambda: rank_regions(
            TRANSFER.decode, TRANSFER.decode_sizes, layers=(3,), tp_rank=1, prompt_tokens=4096
        ),
        tuple(region for region in TRANSFER.consumer_regions(1) if region.layer == 3),
    ),
    "transfer_report's pairs": (lambda: transfer_report(TRANSFER).pairs, 64),
}


@pytest.mark.parametrize("name", list(GOOD_CALLS))
def test_good_arguments_still_give_the_answer(name: str) -> None:
    call, expected = GOOD_CALLS[name]
    assert call() == expected


def test_check_functions_pass_good_arguments() -> None:
    check_options(RIDE.options)
    check_ridable(K3)
    check_same_model(K3, preset("kimi-k3"))
    check_matching_deployments(Deployment(pp=8), Deployment(attn_tp=8, dcp=8))
    assert part_segment(CONV, KDA_LAYER, (1, 0), (8, 7)).layers == (KDA_LAYER,)


# k3layout.draw (needs matplotlib) --------------------------------------------------------------


@pytest.fixture(scope="module")
def draw() -> Any:
    pytest.importorskip("matplotlib")
    return pytest.importorskip("k3layout.draw")


@pytest.fixture(scope="module")
def figure_type(draw: Any) -> Any:
    return pytest.importorskip("matplotlib.figure").Figure


def draw_calls(draw: Any, figure_type: Any, folder: Path) -> dict[str, tuple[Call, str, str]]:
    cells = sweep(K3, (8,), ("fp8",), ("vllm",))
    (folder / "taken.png").mkdir()
    return {
        "draw_sweep of no cells": (lambda: draw.draw_sweep(None), "invalid_argument", "cells"),
        "draw_sweep of ints": (lambda: draw.draw_sweep([1, 2]), "invalid_argument", "cells[0]"),
        "draw_sweep of an int title": (
            lambda: draw.draw_sweep(cells, title=5),
            "invalid_argument",
            "title",
        ),
        "draw_sweep of an int quantity": (
            lambda: draw.draw_sweep(cells, quantity=HUGE),
            "invalid_argument",
            "quantity",
        ),
        "sweep_grid of an int": (lambda: draw.sweep_grid(3), "invalid_argument", "cells"),
        "sweep_grid of a string quantity": (
            lambda: draw.sweep_grid(cells, "utilization"),
            "invalid_argument",
            "quantity",
        ),
        "human_bytes of a string": (lambda: draw.human_bytes("1"), "invalid_argument", "num_bytes"),
        "human_bytes of NaN": (
            lambda: draw.human_bytes(float("nan")),
            "invalid_argument",
            "num_bytes",
        ),
        "human_bytes of 10**400": (lambda: draw.human_bytes(HUGE), "size_limit", "num_bytes"),
        "human_bytes of 1e300": (lambda: draw.human_bytes(1e300), "size_limit", "num_bytes"),
        "topology of a plan": (lambda: draw.topology(PLAN), "invalid_argument", "deployment"),
        "picture_path of None": (lambda: draw.picture_path(None), "invalid_argument", "path"),
        "picture_path of bytes": (lambda: draw.picture_path(b"a.png"), "invalid_argument", "path"),
        "picture_path of a NUL": (
            lambda: draw.picture_path(str(folder / "a\0.png")),
            "invalid_argument",
            "path",
        ),
        "picture_path of a folder": (
            lambda: draw.picture_path(folder / "taken.png"),
            "invalid_argument",
            "path",
        ),
        "picture_path of a name too long": (
            lambda: draw.picture_path(folder / ("x" * 300 + ".png")),
            "invalid_argument",
            "path",
        ),
        "picture_path of a path too long": (
            lambda: draw.picture_path(folder / ("x/" * 3000 + "a.png")),
            "invalid_argument",
            "path",
        ),
        "picture_path of a missing folder": (
            lambda: draw.picture_path(folder / "missing" / "a.png"),
            "invalid_argument",
            "path",
        ),
        "save of no figure": (
            lambda: draw.save(None, folder / "a.png"),
            "invalid_argument",
            "figure",
        ),
        "save of a NUL": (lambda: draw.save(figure_type(), "a\0.svg"), "invalid_argument", "path"),
        "save of a list": (lambda: draw.save(figure_type(), ["a.png"]), "invalid_argument", "path"),
    }


DRAW_CASES = [
    "draw_sweep of no cells",
    "draw_sweep of ints",
    "draw_sweep of an int title",
    "draw_sweep of an int quantity",
    "sweep_grid of an int",
    "sweep_grid of a string quantity",
    "human_bytes of a string",
    "human_bytes of NaN",
    "human_bytes of 10**400",
    "human_bytes of 1e300",
    "topology of a plan",
    "picture_path of None",
    "picture_path of bytes",
    "picture_path of a NUL",
    "picture_path of a folder",
    "picture_path of a name too long",
    "picture_path of a path too long",
    "picture_path of a missing folder",
    "save of no figure",
    "save of a NUL",
    "save of a list",
]


@pytest.mark.parametrize("name", DRAW_CASES)
def test_a_bad_draw_argument_is_a_refusal_naming_the_parameter(
    name: str, draw: Any, figure_type: Any, tmp_path: Path
) -> None:
    calls = draw_calls(draw, figure_type, tmp_path)
    assert sorted(calls) == sorted(DRAW_CASES)
    call, code, parameter = calls[name]
    with pytest.raises(Refusal) as refused:
        call()
    assert refused.value.code == code
    assert parameter in str(refused.value)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes any folder"
)
def test_an_unwritable_folder_is_refused(draw: Any, tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(Refusal) as refused:
            draw.picture_path(tmp_path / "a.png")
    finally:
        tmp_path.chmod(0o700)
    assert refused.value.facts["field"] == "path"
    assert "not writable" in str(refused.value)


def test_a_write_the_os_refuses_is_a_refusal(draw: Any, figure_type: Any, tmp_path: Path) -> None:
    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    figure = figure_type()
    figure.savefig = full_disk
    with pytest.raises(Refusal) as refused:
        draw.save(figure, tmp_path / "a.png")
    assert refused.value.facts["field"] == "path"
    assert "No space left on device" in str(refused.value)


def test_good_draw_arguments_still_draw(draw: Any, figure_type: Any, tmp_path: Path) -> None:
    assert draw.human_bytes(884_736) == "884,736 B"
    assert draw.human_bytes(1.5 * (1 << 30)) == "1.50 GiB"
    assert draw.topology(Deployment(attn_tp=8, dcp=8)) == "tp8xdcp8"
    assert draw.save(figure_type(), str(tmp_path / "a.SVG")) == tmp_path / "a.SVG"
    assert (tmp_path / "a.SVG").read_text().startswith("<?xml")
