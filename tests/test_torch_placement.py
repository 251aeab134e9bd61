"""validate proves where the bytes are: every part at its ``byte_range`` from the start of the
one backing. A layout whose tensors have the plan's shapes, dtypes and strides but whose planes
(or layers across planes) are in another order is refused, and named as a reordering, on the
registered dict (the adapter's parts) and on vLLM's bound dict alike."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import pytest

pytest.importorskip("torch")

import torch

from k3layout import Deployment, Refusal, plan_tokenspeed, plan_vllm, preset
from k3layout.engines.vllm import vllm_bound_views
from k3layout.errors import check_facts_violations
from k3layout.layouts import EngineLayout
from k3layout.torch import Allocation, allocate, cut, cut_bound, validate

Registered = dict[str, torch.Tensor | tuple[torch.Tensor, ...]]

K3_DSPARK_TP8 = ("kimi-k3-dspark", Deployment(attn_tp=8, spec_tokens=2))
LINEAR_TP8 = ("kimi-linear-48b", Deployment(attn_tp=8))


def refusal(action: Callable[[], object]) -> Refusal:
    with pytest.raises(Refusal) as refused:
        action()
    assert refused.value.hint, "every refusal says what would work"
    assert check_facts_violations(refused.value.facts) == [], refused.value.facts
    return refused.value


def backing(cache: Allocation) -> torch.Tensor:
    """The rank's one backing, flat (``uint8``)."""
    storage = cache.planes[0].untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))


def cut_at(cache: Allocation, starts: Sequence[int]) -> Registered:
    """Every layer cut as the plan cuts it, plane ``j`` taken from byte ``starts[j]`` of the
    same backing: each tensor's shape, dtype and strides are the plan's."""
    flat = backing(cache)
    spans = cache.spec.plane_spans
    registered: Registered = {}
    for layer in cache.spec.layers:
        start = starts[layer.plane]
        plane = flat[start : start + spans[layer.plane]]
        parts = tuple(cut(plane, part) for part in layer.parts)
        registered[layer.name] = parts if layer.kind in ("kda", "ring") else parts[0]
    return registered


@pytest.mark.parametrize("case", [K3_DSPARK_TP8, LINEAR_TP8], ids=lambda c: c[0])
def test_reversed_planes_are_refused_as_another_order(case: tuple[str, Deployment]) -> None:
    """Every layer cut from plane P-1-j instead of j: each tensor is right but for where it
    starts; the refusal says the planes are in another order, not that one layer is off."""
    model, deployment = case
    p = plan_vllm(preset(model), deployment)
    cache = allocate(p, num_blocks=3)
    starts = cache.spec.plane_starts
    planes = len(starts)
    refused = refusal(partial(validate, p, cut_at(cache, starts[::-1])))
    assert refused.code == "aliasing"
    facts = refused.facts
    assert facts["field"] == "plane_order"
    assert facts["expected"] == tuple(range(planes))
    assert facts["actual"] == facts["order"] == tuple(reversed(range(planes)))
    assert facts["layer"] == 0 and facts["moved"][0] == facts["layer_name"]  # type: ignore[index]
    assert (
        f"the planes are published in another order: plane 0 holds what the plan puts in plane "
        f"{planes - 1}" in str(refused)
    )
    assert "publish the planes in the plan's order" in str(refused)


def test_the_issues_reversed_layout_would_move_layer_40s_bytes() -> None:
    """Why it matters: the plan says KDA layer 40's conv state of block 1 is at 27,426,816 B
    (plane 10 of 29, 3 blocks of 884,736 B: (10 x 3 + 1) x page); reversed, the layer starts
    on plane 18, at 48,660,480 B. The ride, images and transfers read the plan's bytes."""
    model, deployment = K3_DSPARK_TP8
    p = plan_vllm(preset(model), deployment)
    page = 884_736
    assert p.byte_range(40, "conv", 1, 3).offset_bytes == (10 * 3 + 1) * page == 27_426_816
    cache = allocate(p, num_blocks=3)
    reversed_layout = cut_at(cache, cache.spec.plane_starts[::-1])
    conv = reversed_layout["model.layers.40.self_attn"][0]
    assert conv.storage_offset() * conv.element_size() + page == (18 * 3 + 1) * page == 48_660_480
    refused = refusal(partial(validate, p, reversed_layout))
    assert refused.facts["field"] == "plane_order"


def test_planes_rotated_by_one_are_refused_as_another_order() -> None:
    model, deployment = K3_DSPARK_TP8
    p = plan_vllm(preset(model), deployment)
    cache = allocate(p, num_blocks=2)
    starts = cache.spec.plane_starts
    planes = len(starts)
    rotated = [starts[(j + 1) % planes] for j in range(planes)]  # plane j where j + 1 is
    refused = refusal(partial(validate, p, cut_at(cache, rotated)))
    assert refused.facts["field"] == "plane_order"
    # the backing's plane 0 holds the plan's last plane, plane k the plan's plane k - 1
    assert refused.facts["order"] == (planes - 1, *range(planes - 1))
    assert f"plane 0 holds what the plan puts in plane {planes - 1}" in str(refused)


def test_tokenspeeds_planes_bound_in_numeric_order_are_named_as_an_order() -> None:
    """tokenspeed's recipe binds its planes in the order of their ids as strings (slot.0,
    slot.1, slot.10, ...); an engine binding them as numbers puts every plane from slot.2 on
    somewhere else. Refused as the planes' order, not as layer 0 on no plane."""
    p = plan_tokenspeed(preset("kimi-k3"), Deployment(attn_tp=8, spec_tokens=2))
    cache = allocate(p, num_blocks=2)
    spans = cache.spec.plane_spans
    numeric = [sum(spans[:j]) for j in range(len(spans))]
    assert numeric != list(cache.spec.plane_starts)  # the recipe's order is the strings'
    refused = refusal(partial(validate, p, cut_at(cache, numeric)))
    assert refused.code == "aliasing"
    facts = refused.facts
    assert facts["field"] == "plane_order"
    assert facts["actual"] == tuple(range(len(spans)))  # as numbers
    planned = sorted(range(len(spans)), key=lambda j: f"slot.{j}")
    assert facts["expected"] == tuple(planned)
    assert "the planes are published in another order" in str(refused)
    assert "starts on no plane" not in str(refused)


@pytest.mark.parametrize("case", [K3_DSPARK_TP8, LINEAR_TP8], ids=lambda c: c[0])
def test_vllms_bound_views_reversed_or_rotated_are_named_as_an_order(
    case: tuple[str, Deployment],
) -> None:
    """The same on the dict vLLM binds (its names, raw KDA pages, MLA kernel blocks): every
    view at plane P-1-j, or every plane shifted by one (the last to the front)."""
    model, deployment = case
    p = plan_vllm(preset(model), deployment)
    cache = allocate(p, num_blocks=2)
    flat = backing(cache)
    span = cache.spec.plane_span_bytes
    planes = cache.spec.num_planes
    moves: tuple[Callable[[int], int], ...] = (
        lambda j: planes - 1 - j,
        lambda j: (j + 1) % planes,
    )
    for moved_to in moves:
        bound: dict[str, torch.Tensor] = {}
        for view in vllm_bound_views(p, 2):
            j = view.offset_bytes // span
            shift = (moved_to(j) - j) * span
            at = view.model_copy(update={"offset_bytes": view.offset_bytes + shift})
            bound[view.name] = cut_bound(flat, at)
        refused = refusal(partial(validate, p, bound))
        assert refused.code == "aliasing"
        assert refused.facts["field"] == "plane_order", refused
        assert refused.facts["order"] == tuple(
            sorted(range(planes), key=moved_to)
        ), refused.facts["order"]
        assert "the planes are published in another order" in str(refused)


def test_a_whole_backing_shifted_is_named_as_a_shift() -> None:
    """Every plane cut one page later than the plan starts it (a backing with a page to
    spare at its front): no plane is permuted, every layer moved by the same bytes."""
    model, deployment = LINEAR_TP8
    p = plan_vllm(preset(model), deployment)
    cache = allocate(p, num_blocks=3)
    page = cache.spec.page_bytes
    # cut for 2 blocks, from a 3-block backing: a page later than the plan starts each plane
    spec2 = allocate(p, num_blocks=2).spec
    flat = backing(cache)
    registered: Registered = {}
    for layer in spec2.layers:
        start = spec2.plane_starts[layer.plane] + page
        plane = flat[start : start + spec2.plane_spans[layer.plane]]
        parts = tuple(cut(plane, part) for part in layer.parts)
        registered[layer.name] = parts if layer.kind == "kda" else parts[0]
    refused = refusal(partial(validate, p, registered))
    assert refused.facts["field"] == "offset_bytes"
    assert refused.facts["actual"] == refused.facts["expected"] + page  # type: ignore[operator]
    assert f"every layer starts {page:,} B after where the plan puts it" in str(refused)


def one_backing_plans() -> list[tuple[str, EngineLayout]]:
    return [
        ("vllm K3+DSpark TP8", plan_vllm(preset("kimi-k3-dspark"), K3_DSPARK_TP8[1])),
        (
            "vllm Kimi-Linear TP4 DS",
            plan_vllm(preset("kimi-linear-48b"), Deployment(attn_tp=4, conv_layout="DS")),
        ),
        ("vllm K3 PP2 stage 1", plan_vllm(preset("kimi-k3"), Deployment(attn_tp=8, pp=2))),
        ("vllm GLM TP8 packed", plan_vllm(preset("glm-5.3-flash"), Deployment(attn_tp=8))),
        (
            "tokenspeed K3 TP8",
            plan_tokenspeed(preset("kimi-k3"), Deployment(attn_tp=8, spec_tokens=2)),
        ),
    ]


@pytest.mark.parametrize("name", [name for name, _ in one_backing_plans()])
def test_what_validates_sits_at_the_plans_byte_ranges(name: str) -> None:
    """The proof validate gives: after it accepts, every part of every layer starts at the
    plan's byte_range of block 0 from the start of the backing (the function the ride, images
    and transfers read), for vLLM and tokenspeed, both dicts."""
    p = dict(one_backing_plans())[name]
    stage = len(p.stages) - 1
    cache = allocate(p, num_blocks=2, stage=stage)
    live = validate(p, cache.registered, stage=stage)
    assert live.plane_bases[0] == cache.planes[0].untyped_storage().data_ptr()
    for layer in live.spec.layers:
        parts = cache.layers[layer.name]
        for part, tensor in zip(layer.parts, parts, strict=True):
            planned = p.byte_range(layer.module_layer, part.part, 0, 2, stage).offset_bytes
            assert tensor.storage_offset() * tensor.element_size() == planned, (layer.name, part)
