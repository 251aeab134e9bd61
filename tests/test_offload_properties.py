"""Property sweeps of the ride over models and deployments: the image covers every state byte
exactly once, the reorder is a permutation with exactly the aliased planes first, the aliasing
check agrees with it on addresses, and capped hits stay on the grid."""

from __future__ import annotations

import itertools
import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from k3layout import EngineLayout, Refusal, VllmPlan, plan_vllm, preset
from k3layout.offload import (
    RideOptions,
    RidePlan,
    aliasing_problems,
    check_aliasing,
    engine_layer_names,
    plan_ride,
    plane_order,
    vllm_views,
)
from k3layout.testing import deployments, hybrid_models

PLANE_GAP = 1 << 40


@st.composite
def vllm_stages(draw: st.DrawFn, ridable_type: bool = True) -> tuple[VllmPlan, int]:
    """A vLLM plan and one of its stages: synthetic hybrid models (model_type kimi_k3) and
    the K3 presets; with ``ridable_type=False`` also Kimi-Linear."""
    presets = ("kimi-k3", "kimi-k3-dspark") + (() if ridable_type else ("kimi-linear-48b",))
    model = draw(st.one_of(hybrid_models(max_layers=32), st.sampled_from(presets).map(preset)))
    deployment = draw(deployments(model, engine="vllm"))
    try:
        p = plan_vllm(model, deployment)
    except Refusal:
        assume(False)
        raise
    return p, draw(st.integers(0, deployment.pp - 1))


def predicted_refusal(p: VllmPlan, stage: int) -> str | None:
    """Not Kimi-K3, or no KDA layer: nothing rides. A stage whose longest KDA group is longer
    than its longest attention group has state on a plane no attention layer publishes."""
    if not p.model.kda_layer_ids or p.model.model_type != "kimi_k3":
        return "model_not_ridable"
    groups = p.stages[stage].groups
    kda = max((len(g.layers) for g in groups if g.kind == "kda"), default=0)
    attention = max((len(g.layers) for g in groups if g.kind == "attention"), default=0)
    return "aliasing" if kda > attention else None


@st.composite
def rides(draw: st.DrawFn) -> RidePlan:
    p, stage = draw(vllm_stages())
    assume(predicted_refusal(p, stage) is None)
    return plan_ride(p, stage=stage)


def plane_bases(p: EngineLayout, stage: int, data: st.DataObject) -> list[int]:
    """Separate allocations, one per plane, in a drawn order in memory."""
    num = p.stages[stage].num_planes
    slots = data.draw(st.permutations(range(num)))
    return [(slot + 1) * PLANE_GAP for slot in slots]


@settings(max_examples=120, deadline=None)
@given(vllm_stages(ridable_type=False))
def test_the_ride_is_refused_exactly_when_predicted(case: tuple[VllmPlan, int]) -> None:
    p, stage = case
    expected = predicted_refusal(p, stage)
    try:
        plan_ride(p, stage=stage)
    except Refusal as refusal:
        assert refusal.code == expected, refusal
    else:
        assert expected is None


@settings(max_examples=80, deadline=None)
@given(rides(), st.data())
def test_the_image_covers_every_state_byte_exactly_once_and_nothing_else(
    ride: RidePlan, data: st.DataObject
) -> None:
    image = ride.image
    state = ride.plan.sizes.kda_state_bytes
    on_stage = ride.plan.stages[ride.stage]
    kda_layers = sorted(i for g in on_stage.groups if g.kind == "kda" for i in g.layers)
    ranges = sorted(image.ranges, key=lambda r: r.offset_bytes)
    # One range per KDA layer of the stage, each exactly one state long.
    assert sorted(r.module_layer for r in ranges) == kda_layers
    assert all(r.num_bytes == state for r in ranges)
    assert image.state_bytes == len(kda_layers) * state == sum(r.num_bytes for r in ranges)
    # Disjoint, inside the image, each inside the page of its unit and plane.
    assert all(a.end_bytes <= b.offset_bytes for a, b in itertools.pairwise(ranges))
    for r in ranges:
        page_start = (r.unit * image.num_planes + r.plane) * image.page_bytes
        assert page_start == r.offset_bytes
        assert r.end_bytes <= page_start + image.page_bytes <= image.image_bytes
    page = ride.plan.page_stride_bytes(ride.plan.groups[0])
    assert image.image_bytes == image.num_units * image.num_planes * page
    # The image is views of the planes: unit g, plane j is published plane j in group g's
    # block, where the state of layer j of group g lives.
    names = engine_layer_names(ride.plan.model)
    views = vllm_views(ride.plan, plane_bases(ride.plan, ride.stage, data), 4, stage=ride.stage)
    rows = data.draw(
        st.lists(st.integers(0, 3), min_size=image.num_units, max_size=image.num_units)
    )
    published = ride.order.order
    page = ride.plan.page_stride_bytes(ride.plan.groups[0])  # one page size on every plane
    for r in image.ranges:
        unit_source = views[published[r.plane]].base_address + rows[r.unit] * page
        state_at = views[names.name(r.module_layer)].base_address + rows[r.unit] * page
        assert state_at == unit_source


@settings(max_examples=80, deadline=None)
@given(rides(), st.data())
def test_the_reorder_is_a_permutation_with_exactly_the_aliased_planes_first(
    ride: RidePlan, data: st.DataObject
) -> None:
    order = ride.order
    size = order.num_image_planes
    assert sorted(order.order) == sorted(order.given)
    assert len(set(order.order)) == len(order.order)
    assert size == ride.image.num_planes
    # Plane j of the image is the attention layer layer j of every KDA group aliases.
    for j, share in enumerate(order.planes[:size]):
        assert share.allocation_plane == j and share.riders
    aliased = set(order.order[:size])
    assert order.order[size:] == tuple(n for n in order.given if n not in aliased)
    # On addresses: the reordered publish order passes the check, whatever the memory order.
    views = vllm_views(ride.plan, plane_bases(ride.plan, ride.stage, data), 3, stage=ride.stage)
    check_aliasing(ride.plan, views, order.order, stage=ride.stage)
    # Matching the aliased layers on addresses, as an engine does, gives the same order.
    assert plane_order(ride.plan, order.given, stage=ride.stage, views=views) == order
    # Any other order passes exactly when its leading planes start where the reorder's do.
    shuffled = data.draw(st.permutations(order.given))
    leading_right = all(
        views[shuffled[j]].base_address == views[order.order[j]].base_address for j in range(size)
    )
    assert (aliasing_problems(ride.plan, views, shuffled, stage=ride.stage) == ()) == leading_right


@settings(max_examples=60, deadline=None)
@given(rides(), st.data())
def test_a_kda_layer_moved_to_another_plane_is_named(ride: RidePlan, data: st.DataObject) -> None:
    assume(ride.image.num_units > 0)  # a pipeline stage may hold no KDA layer
    published = ride.order.order
    views = vllm_views(ride.plan, plane_bases(ride.plan, ride.stage, data), 3, stage=ride.stage)
    names = engine_layer_names(ride.plan.model)
    unit = data.draw(st.integers(0, ride.image.num_units - 1))
    group = ride.image.groups[unit]
    layer = data.draw(st.integers(0, len(group.layers) - 1))
    home = views[published[layer]].base_address
    others = [p for p, name in enumerate(published) if views[name].base_address != home]
    assume(others)
    target = data.draw(st.sampled_from(others))
    views[names.name(group.layers[layer])] = views[published[target]]
    problems = aliasing_problems(ride.plan, views, published, stage=ride.stage)
    assert len(problems) == 1
    found = problems[0]
    assert (found.unit, found.layer, found.expected_plane) == (unit, layer, layer)
    assert (
        views[published[found.found_plane or 0]].base_address
        == views[published[target]].base_address
    )


@settings(max_examples=80, deadline=None)
@given(rides(), st.integers(1, 4), st.integers(0, 1 << 20), st.integers(0, 1 << 20))
def test_capped_hits_are_on_the_grid_never_above_the_hit_and_monotone(
    ride: RidePlan, multiple: int, hit: int, other: int
) -> None:
    chunked = plan_ride(
        ride.plan, RideOptions(chunk_tokens=multiple * ride.grid_tokens), stage=ride.stage
    )
    chunk = chunked.chunk_tokens
    capped = chunked.capped_hit(hit)
    assert capped % chunk == 0
    assert 0 <= hit - capped < chunk
    low, high = sorted((hit, other))
    assert chunked.capped_hit(low) <= chunked.capped_hit(high)
    load = chunked.load_destination(capped)
    if capped == 0:
        assert load is None
    else:
        assert load is not None
        assert load.row * chunked.block_tokens < capped <= (load.row + 1) * chunked.block_tokens
        assert load.groups == tuple(g.name for g in chunked.image.groups)
    if hit % chunk:
        assert chunked.load_destination(hit) is None


@settings(max_examples=80, deadline=None)
@given(rides(), st.integers(1, 1 << 16))
def test_a_chunk_is_valid_exactly_when_every_span_divides_it(ride: RidePlan, chunk: int) -> None:
    on_grid = all(chunk % span.span_tokens == 0 for span in ride.spans)
    assert ride.grid_tokens == math.lcm(*(span.span_tokens for span in ride.spans))
    try:
        plan_ride(ride.plan, RideOptions(chunk_tokens=chunk), stage=ride.stage)
    except Refusal as refusal:
        assert refusal.code == "chunk_off_grid"
        assert not on_grid
        assert refusal.facts["smallest_chunk_tokens"] == ride.grid_tokens
    else:
        assert on_grid


@settings(max_examples=60, deadline=None)
@given(rides())
def test_dsa_index_regions_fold_into_their_planes(ride: RidePlan) -> None:
    image = ride.image
    # One region per part of each image plane's attention layer: an MLA latent, a DSA layer's
    # latent and index, a GQA layer's K and V.
    parts = [len(ride.plan.sizes.spec_of(share.module_layer).parts) for share in image.planes]
    assert image.num_regions == sum(parts)
    page = ride.plan.page_stride_bytes(ride.plan.groups[0])
    assert image.plane_movable_bytes == (page,) * image.num_planes


@settings(max_examples=40, deadline=None)
@given(rides())
def test_rides_round_trip_through_json(ride: RidePlan) -> None:
    again = RidePlan.model_validate_json(ride.model_dump_json())
    assert again == ride
    assert again.image == ride.image and again.order == ride.order
