"""One description of the cache: every derived view's bytes come from the layers' specs.

Sizes, the engine layouts' byte ranges, the adapter's tensors, transfer regions and the
checkpoint image are each checked against :class:`~k3layout.LayerCacheSpec` for random models
and deployments, in both conv layouts.
"""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import (
    Deployment,
    EngineLayout,
    HybridModel,
    ParentPlan,
    Refusal,
    checkpoint_image,
    plan,
    plan_transfer,
)
from k3layout.offload.tensors import cache_spec
from k3layout.testing import plannable_inputs


def planned(inputs: tuple[HybridModel, Deployment]) -> EngineLayout | None:
    try:
        result: EngineLayout = plan(*inputs)
        return result
    except Refusal:
        return None  # a refused packing is a refusal with a code, tested elsewhere


@settings(max_examples=150, deadline=None)
@given(plannable_inputs())
def test_the_parts_of_every_layer_tile_its_page_or_slot_exactly(
    inputs: tuple[HybridModel, Deployment],
) -> None:
    p = planned(inputs)
    if p is None:
        return
    tp = p.deployment.attn_tp
    for group in p.groups:
        if not group.layers:
            continue
        spec = p.group_spec(group)
        ranges = p.part_range_list(group.layers[0])
        assert ranges[0].offset_bytes == 0
        assert all(a.end_bytes == b.offset_bytes for a, b in pairwise(ranges))
        assert ranges[-1].end_bytes == p.payload_bytes(group)
        assert ranges[-1].end_bytes <= p.page_stride_bytes(group)
        # every part's bytes are its local shape's: elements x element bytes (x rows of a page)
        rows = p.tokens_per_page(group)
        for r in ranges:
            part = spec.part(r.part)
            assert r.size_bytes == rows * math.prod(part.local_shape(tp)) * part.elem_bytes


@settings(max_examples=100, deadline=None)
@given(plannable_inputs(), st.integers(1, 4))
def test_the_adapters_tensors_sit_at_the_byte_ranges_the_plan_gives(
    inputs: tuple[HybridModel, Deployment], num_blocks: int
) -> None:
    p = planned(inputs)
    if p is None:
        return
    if not p.one_backing:  # SGLang: a tensor per pool, which the adapter refuses to lay out
        with pytest.raises(Refusal) as caught:
            cache_spec(p, num_blocks)
        assert caught.value.code == "engine_mismatch"
        return
    spec = cache_spec(p, num_blocks)
    tp = p.deployment.attn_tp
    for layer in spec.layers:
        group = p.group(layer.group)
        for part in layer.parts:
            inner = p.part_range(layer.module_layer, part.part)
            # one page of the part is its spec's page shape, after the page axes
            page_shape = p.group_spec(group).page_shape(part.part, tp, p.tokens_per_page(group))
            page_axes = len(part.shape) - len(page_shape)
            assert part.shape[page_axes:] == page_shape
            assert math.prod(page_shape) * part.elem_bytes == inner.size_bytes
            pages = math.prod(part.shape[:page_axes])
            if isinstance(p, ParentPlan):  # page 0 is the null page, then n parents' pages
                pages = 1 + num_blocks * p.pages_per_parent(group)
            for page in {0, pages - 1}:
                index = []
                rest = page
                for count in reversed(part.shape[:page_axes]):
                    index.append(rest % count)
                    rest //= count
                index.reverse()
                offset = (
                    spec.plane_starts[layer.plane]
                    + part.offset_bytes
                    + sum(
                        i * s * part.elem_bytes for i, s in zip(index, part.strides, strict=False)
                    )
                )
                ranged = p.byte_range(layer.module_layer, part.part, page, num_blocks)
                assert (ranged.offset_bytes, ranged.size_bytes) == (offset, inner.size_bytes)


@settings(max_examples=60, deadline=None)
@given(plannable_inputs(engine="vllm"), st.integers(1, 300))
def test_transfer_regions_hold_each_parts_bytes(
    inputs: tuple[HybridModel, Deployment], prompt_tokens: int
) -> None:
    model, deployment = inputs
    prefill = Deployment.model_validate(
        {**deployment.model_dump(), "dcp": 1, "dcp_interleave": 1, "pp": 1, "attn_tp": 1}
    )
    try:
        transfer = plan_transfer(model, prefill, deployment, prompt_tokens=prompt_tokens)
    except Refusal:
        return
    p = plan(model, deployment)
    tp = deployment.attn_tp
    for rank in range(transfer.num_consumers):
        for region in transfer.consumer_regions(rank):
            if region.layer is None:
                assert p.sizes.cursor is not None
                assert region.size_bytes == p.sizes.cursor.payload_bytes(tp)
                continue
            spec = p.sizes.spec_of(region.layer)
            held = [s for s in (spec, p.sizes.replay) if s and region.field in s.part_names]
            part = held[0].part(region.field)
            if region.kind == "page":
                assert region.size_bytes % part.local_bytes(tp) == 0
            else:
                assert region.size_bytes == part.local_bytes(tp)


@settings(max_examples=60, deadline=None)
@given(plannable_inputs(engine="vllm"))
def test_the_checkpoint_image_holds_each_state_layers_slot(
    inputs: tuple[HybridModel, Deployment],
) -> None:
    p = planned(inputs)
    if p is None or p.sizes.state is None:
        return
    try:
        image = checkpoint_image(p)
    except Refusal:
        return  # a stage the ride refuses (aliasing), tested in the offload suite
    tp = p.deployment.attn_tp
    for r in image.ranges:
        assert r.num_bytes == p.sizes.spec_of(r.module_layer).payload_bytes(tp)
        assert r.offset_bytes == (r.unit * image.num_planes + r.plane) * p.page_stride_bytes(
            p.group(r.group)
        )
