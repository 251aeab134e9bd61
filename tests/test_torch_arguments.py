"""The torch adapter's public functions refuse bad arguments: a wrong type is
``invalid_argument`` naming the parameter, a tensor that does not fit is ``tensor_mismatch``, a
size beyond what can be held is ``size_limit``; never a bare ``TypeError``, ``KeyError`` or
torch's ``RuntimeError``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import k3layout.torch as adapter
from k3layout import (
    Deployment,
    HybridModel,
    KDALayer,
    MLALayer,
    Refusal,
    plan_transfer,
    plan_vllm,
)
from k3layout.engines.vllm import vllm_bound_views
from k3layout.model import kimi_layer_pattern
from k3layout.torch import (
    Allocation,
    BlockTables,
    LiveLayout,
    PageUnits,
    Tier,
    allocate,
    apply_segments,
    block_tables,
    boundary_blocks,
    boundary_row,
    image_units,
    pack_units,
    parts_of,
    plane_view,
    restore_across_tp,
    restore_units,
    store_prefix,
    tensor_view,
    tier_regions,
    validate,
    write_regions,
)
from k3layout.transfer import Region

MLA_LAYER = MLALayer(num_heads=4, kv_lora_rank=16, qk_rope_head_dim=8)
KDA_LAYER = KDALayer(num_heads=4, head_dim=4, conv_kernel=4)
MODEL = HybridModel(
    name="small", model_type="kimi_k3", layers=kimi_layer_pattern(8, MLA_LAYER, KDA_LAYER)
)
PLAN = plan_vllm(MODEL, Deployment(attn_tp=2))  # the consumer's
PRODUCER = plan_vllm(MODEL, Deployment(attn_tp=1))
TOKENS = 2 * PRODUCER.block_tokens
TRANSFER = plan_transfer(MODEL, Deployment(attn_tp=1), Deployment(attn_tp=2), prompt_tokens=TOKENS)
CONV = next(r.size_bytes for r in TRANSFER.consumer_regions(0) if r.key == ("conv", 0))
KDA = "model.layers.0.self_attn"
MLA = "model.layers.3.self_attn.attn"


@dataclass(frozen=True)
class Setup:
    """A consumer rank (TP 2) and the producer's tier (TP 1) of one prefix."""

    cache: Allocation
    live: LiveLayout
    tables: BlockTables
    units: PageUnits
    tier: Tier

    @property
    def registered(self) -> dict[str, Any]:
        return dict(self.cache.registered)

    def consumer(self) -> tuple[LiveLayout, dict[str, Any], BlockTables]:
        return (self.live, self.registered, self.tables)


@pytest.fixture(scope="module")
def setup() -> Setup:
    cache = allocate(PLAN, 8)
    live = validate(PLAN, cache.registered)
    tables = block_tables(PLAN, TOKENS, range(8))
    units = image_units(live, cache.registered, boundary_blocks(live, tables, TOKENS))
    producer = allocate(PRODUCER, 8)
    produced = validate(PRODUCER, producer.registered)
    tier = store_prefix(
        produced, producer.registered, block_tables(PRODUCER, TOKENS, range(8)), TOKENS
    )
    return Setup(cache=cache, live=live, tables=tables, units=units, tier=tier)


def refused(action: Callable[[], object]) -> Refusal:
    with pytest.raises(Refusal) as caught:
        action()
    assert caught.value.hint, "every refusal says what would work"
    return caught.value


T: Any = adapter
"""The adapter, untyped: the cases pass it what its signatures do not allow."""

Case = tuple[str, str, Callable[[Setup], object]]
"""``(code, the parameter the message names, the call)``."""

CASES: dict[str, Case] = {
    # allocate / cache_spec: types, and sizes no memory holds
    "allocate plan": ("invalid_argument", "plan", lambda s: T.allocate(None, 2)),
    "allocate num_blocks 2**63": ("size_limit", "num_blocks", lambda s: T.allocate(PLAN, 2**63)),
    "allocate num_blocks 10**400": (
        "size_limit",
        "num_blocks",
        lambda s: T.allocate(PLAN, 10**400),
    ),
    "allocate num_blocks -1": ("invalid_argument", "num_blocks", lambda s: T.allocate(PLAN, -1)),
    "allocate num_blocks str": ("invalid_argument", "num_blocks", lambda s: T.allocate(PLAN, "2")),
    "allocate fill": ("invalid_argument", "fill", lambda s: T.allocate(PLAN, 2, fill=256)),
    "allocate fill type": ("invalid_argument", "fill", lambda s: T.allocate(PLAN, 2, fill=0.5)),
    "allocate device name": (
        "invalid_argument",
        "device",
        lambda s: T.allocate(PLAN, 2, device="x"),
    ),
    "allocate device type": ("invalid_argument", "device", lambda s: T.allocate(PLAN, 2, device=0)),
    "allocate stage": ("invalid_argument", "stage", lambda s: T.allocate(PLAN, 2, stage="0")),
    "allocate names": ("invalid_argument", "names", lambda s: T.allocate(PLAN, 2, names=[KDA])),
    "allocate beyond memory": ("size_limit", "meta", lambda s: T.allocate(PLAN, 2**40)),
    "cache_spec plan": ("invalid_argument", "plan", lambda s: T.cache_spec(MODEL, 2)),
    "cache_spec num_blocks": ("size_limit", "num_blocks", lambda s: T.cache_spec(PLAN, 2**63)),
    "cache_spec stage": ("invalid_argument", "stage", lambda s: T.cache_spec(PLAN, 2, stage=None)),
    "cache_spec names": ("invalid_argument", "names", lambda s: T.cache_spec(PLAN, 2, names="x")),
    # cut / cut_bound / plane_view: views over bytes that must be there
    "cut plane type": (
        "invalid_argument",
        "plane",
        lambda s: T.cut(None, s.cache.spec.layers[0].parts[0]),
    ),
    "cut part type": ("invalid_argument", "part", lambda s: T.cut(s.cache.planes[0], None)),
    "cut plane dtype": (
        "tensor_mismatch",
        "plane",
        lambda s: T.cut(s.cache.planes[0].view(torch.float32), s.cache.spec.layers[0].parts[1]),
    ),
    "cut plane too small": (
        "tensor_mismatch",
        "plane",
        lambda s: T.cut(s.cache.planes[0][:1], s.cache.spec.layers[0].parts[1]),
    ),
    "cut plane not contiguous": (
        "tensor_mismatch",
        "plane",
        lambda s: T.cut(s.cache.planes[0].t(), s.cache.spec.layers[0].parts[0]),
    ),
    "cut_bound backing type": (
        "invalid_argument",
        "backing",
        lambda s: T.cut_bound([], vllm_bound_views(PLAN, 8)[0]),
    ),
    "cut_bound view type": (
        "invalid_argument",
        "view",
        lambda s: T.cut_bound(s.cache.planes[0], s.cache.spec.layers[0].parts[0]),
    ),
    "cut_bound backing too small": (
        "tensor_mismatch",
        "backing",
        lambda s: T.cut_bound(torch.zeros(3, dtype=torch.uint8), vllm_bound_views(PLAN, 8)[0]),
    ),
    "plane_view tensor": ("invalid_argument", "tensor", lambda s: T.plane_view("x", 1, 1)),
    "plane_view num_blocks huge": (
        "size_limit",
        "num_blocks",
        lambda s: T.plane_view(s.cache.planes[0], 10**400, 1),
    ),
    "plane_view num_blocks 0": (
        "invalid_argument",
        "num_blocks",
        lambda s: T.plane_view(s.cache.planes[0], 0, 1),
    ),
    "plane_view page_bytes": (
        "invalid_argument",
        "page_bytes",
        lambda s: T.plane_view(s.cache.planes[0], 1, -(2**63)),
    ),
    "plane_view past the storage": (
        "tensor_mismatch",
        "storage",
        lambda s: T.plane_view(torch.zeros(3), 2, 8),
    ),
    # registered values
    "parts_of junk": ("invalid_argument", "value", lambda s: T.parts_of(None)),
    "parts_of empty": ("invalid_argument", "value", lambda s: T.parts_of([])),
    "parts_of strings": ("invalid_argument", "value", lambda s: T.parts_of("ab")),
    "tensor_view junk": ("invalid_argument", "value", lambda s: T.tensor_view({})),
    "tensor_view empty": ("invalid_argument", "value", lambda s: T.tensor_view(())),
    "tensor_view 0-d": (
        "tensor_mismatch",
        "block axis",
        lambda s: T.tensor_view(torch.tensor(1.0)),
    ),
    # validate / layer_parts
    "validate plan": ("invalid_argument", "plan", lambda s: T.validate(s.live, s.registered)),
    "validate published": (
        "invalid_argument",
        "published",
        lambda s: T.validate(PLAN, s.registered, published=3),
    ),
    "validate published items": (
        "invalid_argument",
        "published[0]",
        lambda s: T.validate(PLAN, s.registered, published=[torch.zeros(2)]),
    ),
    "validate groups": (
        "invalid_argument",
        "groups[0]",
        lambda s: T.validate(PLAN, s.registered, groups=[3]),
    ),
    "validate stage": (
        "invalid_argument",
        "stage",
        lambda s: T.validate(PLAN, s.registered, stage=1.0),
    ),
    "validate names": (
        "invalid_argument",
        "names",
        lambda s: T.validate(PLAN, s.registered, names=PLAN),
    ),
    "validate a meta tensor among cpu ones": (
        "tensor_mismatch",
        MLA,
        lambda s: T.validate(PLAN, {**s.registered, MLA: torch.zeros(2, 2, device="meta")}),
    ),
    "layer_parts layout": (
        "invalid_argument",
        "layout",
        lambda s: T.layer_parts(PLAN, s.registered, KDA),
    ),
    "layer_parts registered": (
        "invalid_argument",
        "registered",
        lambda s: T.layer_parts(s.live, [], KDA),
    ),
    "layer_parts name": (
        "invalid_argument",
        "name",
        lambda s: T.layer_parts(s.live, s.registered, 0),
    ),
    "layer_parts value": (
        "invalid_argument",
        "registered",
        lambda s: T.layer_parts(s.live, {KDA: "x"}, KDA),
    ),
    "layer_parts tensor too small": (
        "tensor_mismatch",
        "storage",
        lambda s: T.layer_parts(s.live, {MLA: torch.zeros(3)}, MLA),
    ),
    # image_units / kv_units / boundary_blocks / boundary_row / block_tables
    "image_units layout": (
        "invalid_argument",
        "layout",
        lambda s: T.image_units(s.cache, s.registered, [0, 1, 2]),
    ),
    "image_units registered": (
        "invalid_argument",
        "registered",
        lambda s: T.image_units(s.live, None, [0, 1, 2]),
    ),
    "image_units blocks": (
        "invalid_argument",
        "blocks",
        lambda s: T.image_units(s.live, s.registered, 3),
    ),
    "image_units missing layer": (
        "tensor_mismatch",
        MLA,
        lambda s: T.image_units(s.live, {KDA: s.registered[KDA]}, s.units.blocks),
    ),
    "image_units a tensor too small": (
        "tensor_mismatch",
        "storage",
        lambda s: T.image_units(s.live, {**s.registered, MLA: torch.zeros(3)}, s.units.blocks),
    ),
    "kv_units registered value": (
        "invalid_argument",
        "registered",
        lambda s: T.kv_units(s.live, {**s.registered, MLA: [1, 2]}, [3]),
    ),
    "kv_units blocks": (
        "invalid_argument",
        "blocks",
        lambda s: T.kv_units(s.live, s.registered, {}),
    ),
    "boundary_blocks tables": (
        "invalid_argument",
        "tables",
        lambda s: T.boundary_blocks(s.live, s.registered, TOKENS),
    ),
    "boundary_blocks computed_tokens": (
        "invalid_argument",
        "computed_tokens",
        lambda s: T.boundary_blocks(s.live, s.tables, None),
    ),
    "boundary_row plan": ("invalid_argument", "plan", lambda s: T.boundary_row(s.live, 1024)),
    "boundary_row computed_tokens": (
        "invalid_argument",
        "computed_tokens",
        lambda s: T.boundary_row(PLAN, torch.tensor(1024)),
    ),
    "block_tables plan": ("invalid_argument", "plan", lambda s: T.block_tables(None, 1, range(4))),
    "block_tables num_tokens huge": (
        "size_limit",
        "num_tokens",
        lambda s: T.block_tables(PLAN, 2**63, range(4)),
    ),
    "block_tables num_tokens 0": (
        "invalid_argument",
        "num_tokens",
        lambda s: T.block_tables(PLAN, 0, range(4)),
    ),
    "block_tables block_ids": (
        "invalid_argument",
        "block_ids",
        lambda s: T.block_tables(PLAN, 1, None),
    ),
    "block_tables block id": (
        "invalid_argument",
        "block_ids",
        lambda s: T.block_tables(PLAN, 1, [0, "1", 2, 3]),
    ),
    "block_tables stage": (
        "invalid_argument",
        "stage",
        lambda s: T.block_tables(PLAN, 1, range(4), stage="0"),
    ),
    # pack_units / restore_units
    "pack_units units": ("invalid_argument", "units", lambda s: T.pack_units(s.live)),
    "pack_units out": ("invalid_argument", "out", lambda s: T.pack_units(s.units, [])),
    "pack_units out dtype": (
        "tensor_mismatch",
        "uint8",
        lambda s: T.pack_units(s.units, torch.zeros(s.units.num_bytes, dtype=torch.float64)),
    ),
    "pack_units out expanded": (
        "tensor_mismatch",
        "out",
        lambda s: T.pack_units(
            s.units, torch.zeros(1, dtype=torch.uint8).expand(s.units.num_bytes)
        ),
    ),
    "PageUnits expanded plane": (
        "tensor_mismatch",
        "planes[0]",
        lambda s: T.PageUnits(planes=(s.units.planes[0][:1].expand(4, -1),), blocks=(1,)),
    ),
    "restore_units tier": ("invalid_argument", "tier", lambda s: T.restore_units(None, s.units)),
    "restore_units units": (
        "invalid_argument",
        "units",
        lambda s: T.restore_units(torch.zeros(1, dtype=torch.uint8), [s.units]),
    ),
    "PageUnits planes": (
        "invalid_argument",
        "planes",
        lambda s: T.PageUnits(planes=None, blocks=()),
    ),
    # store_prefix / restore_prefix / Tier
    "store_prefix layout": (
        "invalid_argument",
        "layout",
        lambda s: T.store_prefix(None, s.registered, s.tables, TOKENS),
    ),
    "store_prefix registered": (
        "invalid_argument",
        "registered",
        lambda s: T.store_prefix(s.live, s.cache, s.tables, TOKENS),
    ),
    "store_prefix tables": (
        "invalid_argument",
        "tables",
        lambda s: T.store_prefix(s.live, s.registered, {}, TOKENS),
    ),
    "store_prefix computed_tokens": (
        "invalid_argument",
        "computed_tokens",
        lambda s: T.store_prefix(s.live, s.registered, s.tables, "2048"),
    ),
    "store_prefix missing layer": (
        "tensor_mismatch",
        "registered",
        lambda s: T.store_prefix(s.live, {KDA: s.registered[KDA]}, s.tables, TOKENS),
    ),
    "restore_prefix tier": (
        "invalid_argument",
        "tier",
        lambda s: T.restore_prefix(s.units, s.live, s.registered, s.tables),
    ),
    "restore_prefix tables": (
        "invalid_argument",
        "tables",
        lambda s: T.restore_prefix(s.tier, s.live, s.registered, None),
    ),
    "Tier kv": (
        "tensor_mismatch",
        "kv",
        lambda s: T.Tier(
            layout=s.tier.layout, computed_tokens=TOKENS, kv=s.tier.image, image=s.tier.image
        ),
    ),
    "Tier layout": (
        "invalid_argument",
        "layout",
        lambda s: T.Tier(layout=PLAN, computed_tokens=TOKENS, kv=s.tier.kv, image=s.tier.image),
    ),
    # tier_regions / apply_segments / write_regions / restore_across_tp
    "tier_regions tier": (
        "invalid_argument",
        "tier",
        lambda s: T.tier_regions(None, TRANSFER.producer_regions(0)),
    ),
    "tier_regions regions": ("invalid_argument", "regions", lambda s: T.tier_regions(s.tier, None)),
    "tier_regions region": (
        "invalid_argument",
        "regions[0]",
        lambda s: T.tier_regions(s.tier, [("conv", 0)]),
    ),
    "tier_regions region kind": (
        "tensor_mismatch",
        "slot",
        lambda s: T.tier_regions(
            s.tier, [Region(field="conv", layer=0, kind="page", size_bytes=CONV)]
        ),
    ),
    "apply_segments transfer": (
        "invalid_argument",
        "transfer",
        lambda s: T.apply_segments(PLAN, []),
    ),
    "apply_segments sources": (
        "invalid_argument",
        "sources",
        lambda s: T.apply_segments(TRANSFER, None),
    ),
    "apply_segments source mapping": (
        "invalid_argument",
        "sources[1]",
        lambda s: T.apply_segments(TRANSFER, [{}, [1]]),
    ),
    "apply_segments missing region": (
        "tensor_mismatch",
        "sources[0]",
        lambda s: T.apply_segments(TRANSFER, [{}]),
    ),
    "apply_segments source dtype": (
        "tensor_mismatch",
        "sources[0]",
        lambda s: T.apply_segments(
            TRANSFER,
            [
                {r.key: torch.zeros(r.size_bytes // 8) for r in TRANSFER.producer_regions(p)}
                for p in range(1)
            ],
        ),
    ),
    "apply_segments meta source": (
        "tensor_mismatch",
        "sources[0]",
        lambda s: T.apply_segments(
            TRANSFER,
            [
                {
                    r.key: torch.zeros(r.size_bytes, dtype=torch.uint8, device="meta")
                    for r in TRANSFER.producer_regions(p)
                }
                for p in range(1)
            ],
        ),
    ),
    "write_regions layout": (
        "invalid_argument",
        "layout",
        lambda s: T.write_regions(None, s.registered, s.tables, TOKENS, {}),
    ),
    "write_regions regions": (
        "invalid_argument",
        "regions",
        lambda s: T.write_regions(s.live, s.registered, s.tables, TOKENS, [1]),
    ),
    "write_regions region key": (
        "invalid_argument",
        "regions",
        lambda s: T.write_regions(s.live, s.registered, s.tables, TOKENS, {"conv": torch.zeros(1)}),
    ),
    "write_regions transfer": (
        "invalid_argument",
        "transfer",
        lambda s: T.write_regions(s.live, s.registered, s.tables, TOKENS, {}, transfer=PLAN),
    ),
    "write_regions data type": (
        "invalid_argument",
        "regions",
        lambda s: T.write_regions(s.live, s.registered, s.tables, TOKENS, {("conv", 0): b"x"}),
    ),
    "write_regions data size": (
        "tensor_mismatch",
        "regions",
        lambda s: T.write_regions(
            s.live, s.registered, s.tables, TOKENS, {("conv", 0): torch.zeros(7, dtype=torch.uint8)}
        ),
    ),
    "write_regions data dtype": (
        "tensor_mismatch",
        "regions",
        lambda s: T.write_regions(
            s.live, s.registered, s.tables, TOKENS, {("conv", 0): torch.zeros(CONV // 4)}
        ),
    ),
    "write_regions meta data": (
        "tensor_mismatch",
        "regions",
        lambda s: T.write_regions(
            s.live,
            s.registered,
            s.tables,
            TOKENS,
            {("conv", 0): torch.zeros(CONV, dtype=torch.uint8, device="meta")},
        ),
    ),
    "write_regions missing layer": (
        "tensor_mismatch",
        "registered",
        lambda s: T.write_regions(
            s.live, {}, s.tables, TOKENS, {("conv", 0): torch.zeros(CONV, dtype=torch.uint8)}
        ),
    ),
    "write_regions blocks beyond the cache": (
        "invalid_argument",
        "tables",
        lambda s: T.write_regions(
            s.live,
            s.registered,
            block_tables(PLAN, TOKENS, range(100, 108)),
            TOKENS,
            {("conv", 0): torch.zeros(CONV, dtype=torch.uint8)},
        ),
    ),
    "restore_across_tp blocks beyond the cache": (
        "invalid_argument",
        "tables",
        lambda s: T.restore_across_tp(
            TRANSFER,
            [s.tier],
            [(s.live, s.registered, block_tables(PLAN, TOKENS, range(100, 108)))] * 2,
        ),
    ),
    "restore_across_tp transfer": (
        "invalid_argument",
        "transfer",
        lambda s: T.restore_across_tp(None, [s.tier], [s.consumer()] * 2),
    ),
    "restore_across_tp tiers": (
        "invalid_argument",
        "tiers",
        lambda s: T.restore_across_tp(TRANSFER, s.tier, [s.consumer()] * 2),
    ),
    "restore_across_tp tier": (
        "invalid_argument",
        "tiers[0]",
        lambda s: T.restore_across_tp(TRANSFER, [None], [s.consumer()] * 2),
    ),
    "restore_across_tp consumer": (
        "invalid_argument",
        "consumers[0]",
        lambda s: T.restore_across_tp(TRANSFER, [s.tier], [s.live] * 2),
    ),
    "restore_across_tp consumer registered": (
        "invalid_argument",
        "consumers[1][1]",
        lambda s: T.restore_across_tp(
            TRANSFER,
            [s.tier],
            [s.consumer(), (s.live, None, s.tables)],
        ),
    ),
    "restore_across_tp consumer missing layer": (
        "tensor_mismatch",
        "registered",
        lambda s: T.restore_across_tp(TRANSFER, [s.tier], [(s.live, {}, s.tables)] * 2),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_argument_is_refused_naming_it(case: str, setup: Setup) -> None:
    code, named, action = CASES[case]
    refusal = refused(lambda: action(setup))
    assert refusal.code == code, str(refusal)
    assert named in str(refusal), str(refusal)


def test_every_function_of_the_adapter_has_a_case() -> None:
    functions = {name for name in adapter.__all__ if callable(getattr(adapter, name))}
    functions -= {"TORCH_DTYPES", "Registered", "RegionKey", "CacheSpec", "LayerSpec", "PartSpec"}
    functions -= {"Allocation", "BlockTables", "LiveLayout"}  # records validated by pydantic
    covered = {case.split()[0] for case in CASES}
    assert functions <= covered, sorted(functions - covered)


def test_a_refused_argument_names_its_field_in_the_facts(setup: Setup) -> None:
    refusal = refused(lambda: plane_view(setup.cache.planes[0], 2**63, 1))
    assert refusal.facts["field"] == "num_blocks"
    refusal = refused(lambda: allocate(PLAN, 2, fill=-1))
    assert refusal.facts["field"] == "fill"
    refusal = refused(lambda: image_units(setup.live, {}, setup.units.blocks))
    assert (refusal.facts["field"], refusal.facts["name"]) == ("registered", MLA)


def test_a_cpu_allocation_beyond_memory_is_refused_and_meta_is_a_dry_run() -> None:
    blocks = 2**32  # terabytes on the CPU; nothing at all on meta
    refusal = refused(lambda: allocate(PLAN, blocks))
    assert (refusal.code, refusal.facts["field"]) == ("size_limit", "num_blocks")
    assert "device='meta'" in (refusal.hint or "")
    dry = allocate(PLAN, blocks, device="meta")
    assert dry.spec.num_blocks == blocks and dry.planes[0].device.type == "meta"


def test_torch_running_out_of_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_memory(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")

    monkeypatch.setattr(torch, "full", out_of_memory)
    refusal = refused(lambda: allocate(PLAN, 2))
    assert (refusal.code, refusal.facts["field"]) == ("size_limit", "num_blocks")
    assert "can't allocate memory" in refusal.message


def test_the_checks_leave_good_arguments_alone(setup: Setup) -> None:
    """The fixture's own calls passed the checks; a round trip through them still works."""
    tier = pack_units(setup.units)
    restore_units(tier, setup.units)
    assert parts_of([torch.zeros(1)])[0].shape == (1,)
    assert tensor_view([torch.zeros(2, 3)]).block_stride_bytes == 12
    assert boundary_row(PLAN, TOKENS) == 1
    regions = [tier_regions(setup.tier, TRANSFER.producer_regions(p)) for p in range(1)]
    filled = apply_segments(TRANSFER, regions)
    write_regions(setup.live, setup.registered, setup.tables, TOKENS, filled[0], transfer=TRANSFER)
    restore_across_tp(TRANSFER, [setup.tier], [setup.consumer()] * 2)
