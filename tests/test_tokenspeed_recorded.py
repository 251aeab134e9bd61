"""The ``tokenspeed`` engine against tokenspeed's own Kimi-K3 recipe at #1152's head (a6ee91b3).

tokenspeed cannot be installed here; its recipe was run on CPU and its answers recorded in
``tests/fixtures/tokenspeed-1152/`` (``tests/tools/record_tokenspeed.py``, the revision in each
file). Every recorded cell is compared field by field: status and reason, sizes, packing, the
PR's rule, planes, parent, padding, utilization, strides, the verify workspace, capacity with
and without overlap scheduling, a budget's parents and pages, the bound arena's plane order and
sampled addresses.

One difference is tokenspeed's, not the recipe's: the recipe lays out a 64-head DSpark draft at
attention TP 3, 6, 12, 24, 48 and 96, but tokenspeed's draft attention (``deepseek_v3.py``)
refuses those TPs when the model loads, so the planner refuses them with that reason.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from k3layout import Deployment, HybridModel, ParentPlan, Refusal, plan, preset
from k3layout.engines.tokenspeed.capacity import workspace_bytes
from k3layout.engines.tokenspeed.recipe import REVISION

RECORDED = Path(__file__).parent / "fixtures" / "tokenspeed-1152"
SPELLINGS = {
    "auto": "bf16",
    "bfloat16": "bf16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "mxfp8": "fp8",
    "fp8_ds_mla": "fp8_ds_mla",
}
"""tokenspeed's ``--kv-cache-dtype`` spellings -> the planner's (``bf16`` is not one of them:
tokenspeed refuses it as a spelling, the planner's ``bf16`` is tokenspeed's ``bfloat16``)."""
DTYPES = {"bfloat16": "bf16", "float8_e4m3fn": "fp8", "fp8": "fp8"}
MODELS = {
    "sweep-kimi-k3.json": "kimi-k3",
    "sweep-kimi-k3-dspark.json": "kimi-k3-dspark",
    "sweep-kimi-linear-48b.json": "kimi-linear-48b",
}
DSPARK_DRAFT_TOKENS = 8
"""The recorder's ``--speculative-num-draft-tokens`` for DSpark (the planner's spec_tokens)."""
FIELDS = {"latent_kv": "latent", "conv_state": "conv", "recurrent_state": "recurrent"}
"""tokenspeed's field names -> the planner's part names."""


@cache
def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / name).read_text())
    assert data["source"]["commit"] == REVISION
    return data


def model_of(name: str) -> HybridModel:
    return preset(name)


def planned(model: str, attn_tp: int, attn_dp: int, dtype: str) -> ParentPlan | Refusal:
    spec = DSPARK_DRAFT_TOKENS if "dspark" in model else 0
    try:
        result = plan(
            model_of(model),
            Deployment(
                engine="tokenspeed",
                attn_tp=attn_tp,
                attn_dp=attn_dp,
                kv_dtype=dtype,
                spec_tokens=spec,
            ),
        )
    except Refusal as refusal:
        return refusal
    assert isinstance(result, ParentPlan)
    return result


def sweep_cells() -> list[tuple[str, dict[str, Any]]]:
    return [
        (model, cell)
        for name, model in MODELS.items()
        for cell in recorded(name)["cells"]
        if cell["kv_cache_dtype"] in SPELLINGS
    ]


def cell_id(item: tuple[str, dict[str, Any]]) -> str:
    model, cell = item
    return f"{model}-tp{cell['attn_tp']}-dp{cell['attn_dp']}-{cell['kv_cache_dtype']}"


def draft_heads_refused(model: str, attn_tp: int) -> bool:
    """Where tokenspeed's draft attention refuses at load what its recipe would lay out."""
    drafts = model_of(model).draft_layers
    return any(layer.num_heads % attn_tp for layer in drafts)


@pytest.mark.parametrize("item", sweep_cells(), ids=cell_id)
def test_every_recorded_cell_is_tokenspeeds_field_by_field(
    item: tuple[str, dict[str, Any]],
) -> None:
    model, cell = item
    result = planned(model, cell["attn_tp"], cell["attn_dp"], SPELLINGS[cell["kv_cache_dtype"]])
    if cell["status"] != "ok":
        assert isinstance(result, Refusal), (cell_id(item), cell["error"])
        assert cell["error"]["message"] in str(result)
        return
    if draft_heads_refused(model, cell["attn_tp"]):
        assert isinstance(result, Refusal)
        assert result.code == "heads_not_divisible"
        assert f"num_heads=64 must be divisible by attn_tp_size={cell['attn_tp']}." in str(result)
        return
    assert isinstance(result, ParentPlan), (cell_id(item), result)
    sizes = cell["sizes"]
    assert result.mla_page_bytes == sizes["mla_page_bytes"]
    assert result.sizes.state_bytes == sizes["kda_state_bytes_per_layer"]
    kda = result.model.kda_layer_ids[0]
    conv, recurrent = result.part_range(kda, "conv"), result.part_range(kda, "recurrent")
    assert (conv.size_bytes, recurrent.size_bytes) == (
        sizes["conv_state_bytes"],
        sizes["recurrent_state_bytes"],
    )
    if "draft_page_bytes" in sizes:
        draft = result.model.draft_layer_ids[0]
        assert result.layer_payload_bytes(draft) == sizes["draft_page_bytes"]
        assert result.deployment.draft_cache_dtype == DTYPES[sizes["draft_page_dtype"]]
    assert result.packing_by_group == cell["packing"]
    rule = cell["rule_1152"]
    assert result.rule_1152 is not None
    assert (result.rule_1152.mla_pages, result.rule_1152.state_pages) == (
        rule["mla_packing"],
        rule["linear_packing"],
    )
    assert result.num_planes == cell["num_planes"]
    counts: dict[str, int] = {}
    for size in result.plane_sizes:
        counts[str(size)] = counts.get(str(size), 0) + 1
    assert counts == cell["plane_bytes_counts"]
    assert result.parent_bytes == cell["parent_bytes"]
    limit = cell["max_padding_fraction"]
    assert result.max_padding == (None if limit == "inf" else limit)
    for group, padding in cell["padding"].items():
        held = result.group(group)
        assert result.parent_bytes // result.pages_per_parent(held) == padding["stride_bytes"]
        assert result.raw_bytes(held) == padding["raw_bytes"]
        assert result.padding_fraction[group] == padding["padding_fraction"]
        assert result.utilization[group] == cell["utilization"][group]
    for group, fields in cell["strides"].items():
        held = result.group(group)
        for field, variants in fields.items():
            listed = variants if isinstance(variants, list) else [variants]
            want = {
                (v["field_offset_bytes"], v["page_stride_bytes"], v["payload_bytes"])
                for v in listed
            }
            got = set()
            for position, layer in enumerate(held.layers):
                part = result.part_range(layer, FIELDS[field])
                stride = result.page_stride_at(held, held.plane_of(position))
                got.add((part.offset_bytes, stride, part.size_bytes))
            assert got == want, (group, field)
    assert workspace_bytes(result, cell["max_bs"]) == cell["workspace_bytes"]


def detail_cells() -> list[dict[str, Any]]:
    return list(recorded("detail.json")["cells"])


def detail_id(cell: dict[str, Any]) -> str:
    return f"{cell['model']}-tp{cell['attn_tp']}-dp{cell['attn_dp']}-{cell['kv_cache_dtype']}"


def detail_plan(cell: dict[str, Any]) -> ParentPlan:
    dtype = DTYPES.get(cell["kv_cache_dtype"], SPELLINGS.get(cell["kv_cache_dtype"], ""))
    result = planned(cell["model"], cell["attn_tp"], cell["attn_dp"], dtype)
    assert isinstance(result, ParentPlan), result
    return result


@pytest.mark.parametrize("cell", detail_cells(), ids=detail_id)
def test_every_field_of_every_layer_sits_where_tokenspeed_packs_it(cell: dict[str, Any]) -> None:
    result = detail_plan(cell)
    # the planes in tokenspeed's order (ids sorted as strings), each with its bytes
    order = [f"slot.{j}" for j in sorted(range(result.num_planes), key=lambda j: f"slot.{j}")]
    assert [name for name, _ in cell["plane_bytes"]] == order
    assert [size for _, size in cell["plane_bytes"]] == [
        result.plane_bytes_at(int(name.removeprefix("slot."))) for name in order
    ]
    for group, layers in cell["layers"].items():
        assert result.group(group).layers == tuple(layers)
    for group, fields in cell["fields_by_kind"].items():
        held = result.group(group)
        for field, shapes in fields.items():
            for shape in shapes:
                for layer in shape["layers"]:
                    position = held.layers.index(layer)
                    part = result.part_range(layer, FIELDS[field])
                    assert (part.offset_bytes, part.size_bytes) == (
                        shape["field_offset_bytes"],
                        shape["payload_bytes"],
                    )
                    stride = result.page_stride_at(held, held.plane_of(position))
                    assert stride == shape["page_stride_bytes"]
    assert workspace_bytes(result, cell["max_bs"]) == cell["workspace_bytes"]


def bind_cells() -> list[dict[str, Any]]:
    return list(recorded("bind.json")["cells"])


@pytest.mark.parametrize("cell", bind_cells(), ids=lambda c: f"{detail_id({**c, 'attn_dp': 1})}")
def test_bind_and_byte_range_give_tokenspeeds_addresses(cell: dict[str, Any]) -> None:
    result = detail_plan({**cell, "attn_dp": 1})
    count = cell["num_lcm_blocks"]
    binding = result.bind(count)
    assert binding.parent_bytes == cell["parent_bytes"]
    assert binding.arena_bytes == cell["arena_bytes"]
    assert [(g.group, g.pages_per_parent, g.page_count) for g in binding.groups] == [
        (g["group"], g["pages_per_parent"], g["page_count"]) for g in cell["groups"]
    ]
    starts = binding.plane_starts
    for plane in cell["planes"]:
        index = int(plane["plane"].removeprefix("slot."))
        assert starts[index] == plane["arena_offset_bytes"]
        assert binding.plane_bytes[index] == plane["bytes_per_lcm_block"]
    for address in cell["addresses"]:
        _, layer_text, field = address["field_id"].split(".")
        layer = int(layer_text)
        for page, offset in address["offsets"].items():
            got = result.byte_range(layer, FIELDS[field], int(page), count)
            assert (got.offset_bytes, got.size_bytes) == (offset, address["payload_bytes"]), (
                address["field_id"],
                page,
            )
    for beyond in cell["page_out_of_range"]:
        layer = result.group(beyond["group"]).layers[0]
        part = result.sizes.spec_of(layer).parts[0].name
        with pytest.raises(Refusal) as caught:
            result.byte_range(layer, part, beyond["page"], count)
        assert caught.value.code == "invalid_argument"


def capacity_cells() -> list[dict[str, Any]]:
    return list(recorded("capacity.json")["cells"])


def capacity_ids(cell: dict[str, Any]) -> str:
    return f"{cell['model']}-tp{cell['attn_tp']}-{cell['kv_cache_dtype']}"


def capacity_plan(cell: dict[str, Any]) -> ParentPlan:
    return detail_plan({**cell, "attn_dp": 1})


@pytest.mark.parametrize("cell", capacity_cells(), ids=capacity_ids)
def test_capacity_with_and_without_overlap_scheduling_is_tokenspeeds(
    cell: dict[str, Any],
) -> None:
    result = capacity_plan(cell)
    assert result.packing_by_group == cell["packing"]
    for probe in cell["probes"]:
        live, protected = probe["max_live"], probe["protected_pages"]
        limits = probe["scheduler_limits"]
        decode = limits["decode_input_tokens"]
        assert protected == live * math.ceil(probe["overlap_schedule_depth"] * decode / 128)
        for tokens, parents in probe["parents_needed"].items():
            assert result.parents_for(int(tokens), live, protected) == parents, (probe, tokens)
        for parents, tokens in probe["token_capacity"].items():
            if isinstance(tokens, dict):  # tokenspeed refuses: not one token fits
                with pytest.raises(Refusal) as caught:
                    result.token_capacity(int(parents), live, protected)
                assert caught.value.code == "budget_too_small"
                assert tokens["refused"]["message"] in str(caught.value)
            else:
                got = result.token_capacity(int(parents), live, protected)
                assert got == tokens, (probe, parents)


@pytest.mark.parametrize("cell", capacity_cells(), ids=capacity_ids)
def test_a_memory_budget_buys_the_parents_and_tokens_tokenspeeds_setup_gives(
    cell: dict[str, Any],
) -> None:
    result = capacity_plan(cell)
    for budget in cell["budgets"]:
        ask = (budget["budget_bytes"], budget["max_bs"])
        if "refused" in budget:
            with pytest.raises(Refusal) as caught:
                result.capacity(
                    ask[0], max_live=ask[1], max_total_tokens=budget["max_total_tokens"]
                )
            assert caught.value.code == "budget_too_small", budget
            assert budget["refused"]["message"] in str(caught.value)
            continue
        got = result.capacity(ask[0], max_live=ask[1], max_total_tokens=budget["max_total_tokens"])
        assert (
            got.workspace_bytes,
            got.num_parents,
            got.parent_bytes,
            got.arena_bytes,
            got.token_capacity,
            got.page_counts,
        ) == (
            budget["fixed_workspace_bytes"],
            budget["num_lcm_blocks"],
            budget["parent_bytes"],
            budget["arena_bytes"],
            budget["token_capacity"],
            budget["page_counts"],
        ), budget


def test_tokenspeeds_conv_state_keeps_k_minus_1_rows_whatever_the_speculative_depth() -> None:
    facts = recorded("sweep-kimi-k3.json")["facts"]["conv_rows_tp8"]
    assert {row["rows"] for row in facts.values()} == {3}
    for spec_tokens in (0, 2, 7):
        result = plan(
            preset("kimi-k3"), Deployment(engine="tokenspeed", attn_tp=8, spec_tokens=spec_tokens)
        )
        assert isinstance(result, ParentPlan)
        assert result.sizes.state_bytes == 814_080


def test_the_dspark_draft_has_the_heads_of_its_own_config() -> None:
    facts = recorded("sweep-kimi-k3.json")["facts"]["dspark_draft"]
    drafts = preset("kimi-k3-dspark").draft_layers
    assert len(drafts) == facts["num_hidden_layers"]
    assert {layer.num_heads for layer in drafts} == {facts["fixture_num_attention_heads"]}


def test_the_issues_overlap_probe_needs_108_parents_as_tokenspeed_does() -> None:
    result = planned("kimi-k3", 1, 1, "fp8")
    assert isinstance(result, ParentPlan)
    # 16 live requests, depth 1: 16 protected MLA pages, none in the state groups
    pages = 131_072 // 128 + 16 - 1 + 16
    assert result.parents_for(131_072, 16, 16) == -(-pages // 89) + 3 * 2 * 16 == 108
