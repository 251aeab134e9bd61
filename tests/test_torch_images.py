"""Checkpoint images on live tensors: views with no copy (proved by data pointers), packed to a
contiguous tier holding each KDA layer's state at its planned range, restored byte for byte
into other blocks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from k3layout import Deployment, Refusal, VllmPlan, plan_parent, plan_vllm, preset
from k3layout.offload import checkpoint_image, engine_layer_names
from k3layout.torch import (
    Allocation,
    PageUnits,
    allocate,
    block_tables,
    boundary_blocks,
    image_units,
    kv_units,
    pack_units,
    plane_view,
    restore_prefix,
    restore_units,
    store_prefix,
    validate,
)
from k3layout.torch.tiny_model import TinyK3Config

K3_TP8 = Deployment(attn_tp=8, spec_tokens=2)
PAGE = 1536 * 576  # K3 TP8 fp8 s2: block 1,536 x 576 B


@pytest.fixture(scope="module")
def k3_plan() -> VllmPlan:
    return plan_vllm(preset("kimi-k3-dspark"), K3_TP8)


def random_bytes(cache: Allocation, seed: int) -> Allocation:
    """Random pages, plane ``j`` shifted by ``j`` (uint8 wraps): no two pages alike."""
    gen = torch.Generator().manual_seed(seed)
    pages = torch.randint(0, 256, cache.planes[0].shape, generator=gen, dtype=torch.uint8)
    for j, plane in enumerate(cache.planes):
        plane.copy_(pages + j)
    return cache


def state_bytes(cache: Allocation, name: str, block: int) -> torch.Tensor:
    """The KDA layer's state in ``block`` read through its own typed views, as bytes."""
    return torch.cat(
        [t[block].contiguous().view(torch.uint8).flatten() for t in cache.layers[name]]
    )


def refusal(action: Callable[[], object]) -> Refusal:
    with pytest.raises(Refusal) as refused:
        action()
    assert refused.value.hint
    return refused.value


def test_the_image_is_views_of_the_kda_state_no_byte_copied(k3_plan: VllmPlan) -> None:
    cache = allocate(k3_plan, num_blocks=3)
    live = validate(k3_plan, cache.registered)
    blocks = (2, 0, 1)  # the boundary block of KDA groups 0, 1, 2
    units = image_units(live, cache.registered, blocks)
    # 3 units (KDA groups) x 23 planes x a page: 61,046,784 B, as the offload plans it
    assert units.num_bytes == 3 * 23 * PAGE == checkpoint_image(k3_plan).image_bytes
    names = engine_layer_names(k3_plan.model)
    for g, group in enumerate(k3_plan.groups[:3]):
        for j, layer in enumerate(group.layers):
            page = units.page(g, j)
            conv = cache.layers[names.name(layer)][0]
            attention = cache.registered[f"model.layers.{4 * j + 3}.self_attn.attn"]
            assert isinstance(attention, torch.Tensor)
            # the page starts where the layer's state starts: the attention layer's page
            assert page.data_ptr() == conv[blocks[g]].data_ptr()
            assert page.data_ptr() == attention.data_ptr() + blocks[g] * PAGE
            # ...a view of the one backing, on plane j's bytes
            plane = cache.planes[j]
            assert page.untyped_storage().data_ptr() == plane.untyped_storage().data_ptr()
            assert page.data_ptr() == plane[blocks[g]].data_ptr()
    # a write into a layer's state is a write into the image: one set of bytes
    conv, recurrent = cache.layers["model.layers.21.self_attn"]  # group 1 layer 5
    recurrent[0].fill_(2.0)  # block 0
    at = 3 * 96 // 8 * 128 * 5 * 2  # 46,080: the recurrent state follows the one conv tensor
    assert units.page(1, 5)[at : at + 4].view(torch.float32) == 2
    conv[0, 0, 0] = 3.0  # q channel 0 of row 0: the page's first bytes
    assert units.page(1, 5)[:2].view(torch.bfloat16) == 3


def test_the_packed_tier_holds_each_layers_state_at_its_planned_range() -> None:
    # 12 layers + 2 draft: KDA 9 over 5 attention planes -> 2 groups (5 and 4 layers)
    p = plan_vllm(
        TinyK3Config(num_layers=12, num_draft_layers=2).model(), Deployment(spec_tokens=2)
    )
    cache = random_bytes(allocate(p, num_blocks=3), seed=1)
    live = validate(p, cache.registered)
    blocks = (2, 0)
    tier = pack_units(image_units(live, cache.registered, blocks))
    image = checkpoint_image(p)
    assert (image.num_units, image.num_planes) == (2, 5)
    assert tier.numel() == image.image_bytes == 2 * 5 * p.page_bytes
    names = engine_layer_names(p.model)
    for state in image.ranges:
        held = state_bytes(cache, names.name(state.module_layer), blocks[state.unit])
        assert torch.equal(tier[state.offset_bytes : state.end_bytes], held)
    # the padding after each state is the page's own bytes too: the unit is the page
    first = image.ranges[0]
    assert torch.equal(tier[: p.page_bytes], cache.planes[0][blocks[0]])
    assert first.num_bytes < p.page_bytes


@st.composite
def restore_cases(draw: st.DrawFn) -> tuple[VllmPlan, int, tuple[int, ...], tuple[int, ...]]:
    config = TinyK3Config(
        num_layers=draw(st.integers(4, 12)), num_draft_layers=draw(st.integers(0, 2))
    )
    deployment = Deployment(
        attn_tp=draw(st.sampled_from((1, 2, 4))),
        kv_dtype=draw(st.sampled_from(("fp8", "bf16"))),
        spec_tokens=draw(st.integers(0, 2)),
    )
    p = plan_vllm(config.model(), deployment)
    kda = [len(group.layers) for group in p.groups if group.kind == "kda"]
    attention = [len(group.layers) for group in p.groups if group.kind == "attention"]
    assume(max(kda) <= max(attention))  # every KDA position rides an attention plane
    units = len(kda)
    num_blocks = draw(st.integers(units, 8))
    ids = st.permutations(range(num_blocks)).map(lambda ids: tuple(ids[:units]))
    return p, num_blocks, draw(ids), draw(ids)


@settings(max_examples=60, deadline=None)
@given(restore_cases())
def test_pack_then_restore_into_other_blocks_is_byte_exact_and_touches_nothing_else(
    case: tuple[VllmPlan, int, tuple[int, ...], tuple[int, ...]],
) -> None:
    p, num_blocks, source_blocks, target_blocks = case
    source = random_bytes(allocate(p, num_blocks), seed=2)
    target = random_bytes(allocate(p, num_blocks), seed=3)
    before = [plane.clone() for plane in target.planes]
    source_units = image_units(validate(p, source.registered), source.registered, source_blocks)
    target_live = validate(p, target.registered)
    target_units = image_units(target_live, target.registered, target_blocks)
    tier = pack_units(source_units)
    restore_units(tier, target_units)
    for unit in range(source_units.num_units):
        for j in range(source_units.num_planes):
            assert torch.equal(target_units.page(unit, j), source_units.page(unit, j))
    assert torch.equal(pack_units(target_units), tier)  # pack inverts restore
    # the image planes are allocation planes 0 .. P-1 (layer j of every group on plane j)
    for index, (after, old) in enumerate(zip(target.planes, before, strict=True)):
        for block in range(num_blocks):
            restored = index < target_units.num_planes and block in target_blocks
            assert restored or torch.equal(after[block], old[block]), (index, block)


def test_a_prefix_stored_and_restored_keeps_kv_and_state_byte_for_byte() -> None:
    config = TinyK3Config(num_draft_layers=2)
    p = plan_vllm(config.model(), Deployment(kv_dtype="bf16"))
    source, target = random_bytes(allocate(p, 12), 4), random_bytes(allocate(p, 12), 5)
    n = 2 * p.block_tokens
    source_tables = block_tables(p, n, range(12))
    target_tables = block_tables(p, n, range(11, -1, -1))
    tier = store_prefix(validate(p, source.registered), source.registered, source_tables, n)
    restore_prefix(tier, validate(p, target.registered), target.registered, target_tables)
    names = engine_layer_names(p.model)
    for group in p.groups:
        for layer in group.layers:
            name = names.name(layer)
            if group.kind == "attention":  # both blocks of KV: tokens 0 .. n - 1
                for row in range(2):
                    a = source.layers[name][0][source_tables.table(group.name)[row]]
                    b = target.layers[name][0][target_tables.table(group.name)[row]]
                    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            else:  # the state after n tokens: row (n - 1) // block = 1
                a = state_bytes(source, name, source_tables.table(group.name)[1])
                b = state_bytes(target, name, target_tables.table(group.name)[1])
                assert torch.equal(a, b)
    assert tier.num_kv_blocks == 2


def test_kv_units_are_every_published_plane_of_the_attention_blocks(k3_plan: VllmPlan) -> None:
    cache = allocate(k3_plan, num_blocks=2)
    live = validate(k3_plan, cache.registered)
    units = kv_units(live, cache.registered, (1,))
    assert units.num_planes == 29 and units.num_bytes == 29 * PAGE
    draft = cache.registered["draft.layers.4.self_attn.attn"]
    assert isinstance(draft, torch.Tensor)
    assert units.page(0, live.published.index("draft.layers.4.self_attn.attn")).data_ptr() == (
        draft[1].data_ptr()
    )


def test_image_refusals_name_units_blocks_and_sizes(k3_plan: VllmPlan) -> None:
    cache = allocate(k3_plan, num_blocks=2)
    live = validate(k3_plan, cache.registered)
    refused = refusal(lambda: image_units(live, cache.registered, (0, 1)))
    assert (refused.code, refused.facts) == (
        "invalid_argument",
        {"num_units": 3, "num_blocks_given": 2},
    )
    refused = refusal(lambda: image_units(live, cache.registered, (0, 1, 2)))
    assert (refused.code, refused.facts) == (
        "invalid_argument",
        {"unit": 2, "block_id": 2, "num_blocks": 2},
    )
    three = allocate(k3_plan, num_blocks=3)
    units = image_units(validate(k3_plan, three.registered), three.registered, (0, 1, 2))
    refused = refusal(lambda: restore_units(torch.zeros(10, dtype=torch.uint8), units))
    assert refused.code == "tensor_mismatch"
    assert refused.facts == {
        "dtype": "torch.uint8",
        "shape": (10,),
        "expected_bytes": 3 * 23 * PAGE,
    }
    refused = refusal(lambda: PageUnits(planes=(cache.planes[0], cache.planes[0][:1]), blocks=()))
    assert refused.code == "tensor_mismatch"
    # the backing's last plane (28 of 29, 2 blocks each) has no third block
    refused = refusal(lambda: plane_view(cache.planes[28], 3, PAGE))
    assert refused.code == "tensor_mismatch"
    assert (refused.facts["offset_bytes"], refused.facts["storage_bytes"]) == (
        28 * 2 * PAGE,
        29 * 2 * PAGE,
    )


def test_a_boundary_off_the_block_grid_is_refused(k3_plan: VllmPlan) -> None:
    cache = allocate(k3_plan, num_blocks=1)
    live = validate(k3_plan, cache.registered)
    tables = block_tables(k3_plan, 2000, range(8))  # 2 rows per group; only ids are read
    refused = refusal(lambda: boundary_blocks(live, tables, 1000))
    assert (refused.code, refused.facts) == (
        "invalid_argument",
        {"computed_tokens": 1000, "block_tokens": 1536},
    )
    assert boundary_blocks(live, tables, 1536) == tuple(
        tables.table(f"linear_attention_{g}")[0] for g in range(3)
    )


def test_a_tier_restores_only_under_its_own_plan(k3_plan: VllmPlan) -> None:
    config = TinyK3Config()
    p1 = plan_vllm(config.model(), Deployment())
    p2 = plan_vllm(config.model(), Deployment(attn_tp=2))
    source, target = allocate(p1, 8), allocate(p2, 8)
    tables = block_tables(p1, p1.block_tokens, range(8))
    tier = store_prefix(validate(p1, source.registered), source.registered, tables, 128)
    refused = refusal(
        lambda: restore_prefix(tier, validate(p2, target.registered), target.registered, tables)
    )
    assert refused.code == "tensor_mismatch"
    assert refused.facts == {"same_plan": False, "same_publish_order": True}


def test_a_parent_layout_has_no_image() -> None:
    p = plan_parent(preset("kimi-k3"), K3_TP8)
    cache = allocate(p, num_blocks=1)
    live = validate(p, cache.registered)
    assert refusal(lambda: image_units(live, cache.registered, (0, 0, 0))).code == (
        "engine_mismatch"
    )


def test_a_block_repeated_in_an_image_is_refused_naming_the_units(k3_plan: VllmPlan) -> None:
    """Two KDA groups cannot have one boundary block: its pages are one set of bytes, so a
    restore into both would keep only the second group's state."""
    cache = allocate(k3_plan, num_blocks=3)
    live = validate(k3_plan, cache.registered)
    refused = refusal(lambda: image_units(live, cache.registered, [1, 1, 1]))
    assert (refused.code, refused.facts) == ("aliasing", {"block_id": 1, "units": (0, 1, 2)})
    refused = refusal(lambda: image_units(live, cache.registered, [2, 0, 2]))
    assert refused.facts == {"block_id": 2, "units": (0, 2)}
    # the KV's units are blocks too: one block twice is one page restored twice
    refused = refusal(lambda: kv_units(live, cache.registered, (0, 0)))
    assert refused.facts == {"block_id": 0, "units": (0, 1)}


def test_a_stage_whose_state_cannot_ride_is_refused_by_the_image_and_kv_up_front() -> None:
    p = plan_vllm(preset("kimi-k3"), Deployment(attn_tp=8, pp=8))
    # stage 0: layers 0..10, KDA groups of 3 positions, 2 attention layers (3 and 7)
    cache = allocate(p, num_blocks=8, stage=0)
    live = validate(p, cache.registered, stage=0)  # the KV check itself passes
    tables = block_tables(p, p.block_tokens, range(8), stage=0)
    facts = {
        "stage": 0,
        "kda_positions": 3,
        "attention_layers": ("model.layers.3.self_attn.attn", "model.layers.7.self_attn.attn"),
    }
    for action in (
        lambda: kv_units(live, cache.registered, (6,)),
        lambda: image_units(live, cache.registered, (0, 2, 4)),
        lambda: store_prefix(live, cache.registered, tables, p.block_tokens),
    ):
        refused = refusal(action)
        assert (refused.code, refused.facts) == ("aliasing", facts)


def test_meta_units_and_tiers_are_a_dry_run_and_a_meta_source_is_refused() -> None:
    """Meta tensors hold no bytes: into meta, every size is checked and nothing copied; from
    meta into real memory there is nothing to copy, which is refused."""
    p = plan_vllm(preset("kimi-linear-48b"), Deployment(attn_tp=8))
    meta = allocate(p, num_blocks=4, device="meta")
    live = validate(p, meta.registered)  # addresses are relative to the one backing
    units = image_units(live, meta.registered, (3, 1, 0))
    tier = pack_units(units)
    assert (tier.device.type, tier.numel()) == ("meta", units.num_bytes)
    restore_units(tier, units)  # a dry run
    real = random_bytes(allocate(p, num_blocks=4), seed=7)
    real_units = image_units(validate(p, real.registered), real.registered, (0, 1, 2))
    restore_units(pack_units(real_units), units)  # real bytes into meta pages: a dry run
    assert pack_units(real_units, out=torch.empty_like(tier)).device.type == "meta"
    before = [plane.clone() for plane in real.planes]
    refused = refusal(lambda: restore_units(tier, real_units))
    assert (refused.code, refused.facts) == (
        "tensor_mismatch",
        {"operation": "restore", "source_device": "meta"},
    )
    assert all(torch.equal(a, b) for a, b in zip(real.planes, before, strict=True))
    refused = refusal(
        lambda: pack_units(units, out=torch.empty(units.num_bytes, dtype=torch.uint8))
    )
    assert refused.facts == {"operation": "pack", "source_device": "meta"}
    # the sizes are still checked on meta
    refused = refusal(lambda: restore_units(tier[:10], units))
    assert refused.facts["expected_bytes"] == units.num_bytes


def test_every_way_of_copying_units_packs_and_restores_the_same_bytes() -> None:
    """Rows of one backing (one gather, one scatter), a strided view per unit (pages no row
    divides), a page per page (planes in tensors of their own), into a strided tier: the
    same bytes, and only the units' pages written."""
    p = plan_vllm(preset("kimi-linear-48b"), Deployment(attn_tp=8))
    cache = random_bytes(allocate(p, num_blocks=4), seed=8)
    units = image_units(validate(p, cache.registered), cache.registered, (3, 0, 2))
    expected = torch.cat(units.pages())
    assert units.rows is not None  # 294,912 B pages: 18 rows of 16 KiB
    apart = PageUnits(planes=tuple(plane.clone() for plane in units.planes), blocks=units.blocks)
    assert apart.stacked is None
    # one backing cut in pages of 294,911 B (a prime): no row of 4 KiB or more
    # divides them, so a strided view per unit
    unaligned = PageUnits(planes=odd_pages(cache).unbind(0), blocks=units.blocks)
    assert unaligned.stacked is not None and unaligned.rows is None
    strided = torch.zeros(2 * units.num_bytes, dtype=torch.uint8)[::2]
    for way in (units, apart):
        assert torch.equal(pack_units(way), expected)
        assert torch.equal(pack_units(way, out=strided), expected)
    assert torch.equal(pack_units(unaligned), torch.cat(unaligned.pages()))
    target = random_bytes(allocate(p, num_blocks=4), seed=9)
    before = [plane.clone() for plane in target.planes]
    target_units = image_units(validate(p, target.registered), target.registered, (1, 2, 0))
    for tier in (expected, strided):
        restore_units(tier, target_units)
        assert torch.equal(torch.cat(target_units.pages()), expected)
    restored = {(j, block) for j in range(units.num_planes) for block in (1, 2, 0)}
    for j, (after, old) in enumerate(zip(target.planes, before, strict=True)):
        for block in range(4):
            assert (j, block) in restored or torch.equal(after[block], old[block])
    into = PageUnits(planes=odd_pages(random_bytes(target, seed=10)).unbind(0), blocks=(1, 2, 0))
    restore_units(pack_units(unaligned), into)
    assert torch.equal(torch.cat(into.pages()), torch.cat(unaligned.pages()))


def odd_pages(cache: Allocation) -> torch.Tensor:
    """The first 7 planes of the cache's backing recut in 4 pages of 294,911 B each."""
    page = 294_911
    backing = cache.planes[0].untyped_storage()
    return cache.planes[0].new_empty(0).set_(backing, 0, (7, 4, page), (4 * page, page, 1))
