"""The ``tokenspeed`` engine against tokenspeed's own Kimi-K3 recipe at both revisions k3layout
follows: #1152's head (a6ee91b3, ``engine_version="pr1152"``) and ``main`` (f4d8ec6e, ``"main"``).

tokenspeed cannot be installed here; its recipe was run on CPU and its answers recorded in
``tests/fixtures/tokenspeed-1152/`` and ``tests/fixtures/tokenspeed-main/``
(``tests/tools/record_tokenspeed.py``, the commit in each file; ``tokenspeed-main/DIFFERENCES.md``
says what ``main`` computes differently). Every recorded cell of both recordings is compared
field by field: status and reason (each refusal with a fitting code and tokenspeed's words),
sizes and shapes, packing, the revision's rule, planes, parent, padding, utilization, strides,
every slot, the groups and how ``main``'s pools map state layers to them, the verify workspace
(``main``: the replay commit on the H200 and the dense rows without replay on the MI350X,
planned on k3layout's ``mi355x``, the same gfx950), capacity with and without overlap
scheduling, a budget's parents and pages, the bound arena's plane order and sampled addresses.
``weights.json`` exists only for #1152 (``tests/test_tokenspeed_weights.py``): ``main``'s
weights were not recorded.

One difference is tokenspeed's, not the recipe's: the recipe lays out (or, at ``main``, refuses
for its own reasons) a 64-head DSpark draft at attention TP 3, 6, 12, 24, 48 and 96, but
tokenspeed's draft attention (``deepseek_v3.py``, the same at both revisions) refuses those
TPs when the model loads, so the planner refuses them with that reason. Those cells are still
compared with the recipe's answer: the same model planned with draft query heads the TP
divides (:func:`recipe_model`), which the recipe never reads (an MLA page holds one latent
head, whatever the query heads).
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from k3layout import Deployment, HybridModel, ParentPlan, Refusal, plan, preset
from k3layout.engines.tokenspeed.capacity import (
    replay_row_bytes,
    replay_row_parts,
    replays_verify,
    workspace_bytes,
)
from k3layout.engines.tokenspeed.launch import KV_CACHE_DTYPE
from k3layout.engines.tokenspeed.releases import REVISIONS, TOKENSPEED_VERSIONS
from k3layout.engines.tokenspeed.rules import KV_CACHE_DTYPES
from k3layout.gpus import GPUS, GpuName
from k3layout.registry import facts_of

FIXTURES = Path(__file__).parent / "fixtures"
RECORDINGS = {"pr1152": "tokenspeed-1152", "main": "tokenspeed-main"}
"""Each followed revision's recording."""
PLATFORMS: dict[str, GpuName] = {"nvidia-h200": "h200", "amd-mi350x": "mi355x"}
"""The recording's platforms -> k3layout's GPUs of the same vendor and architecture (the
MI350X and the MI355X are both gfx950)."""
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
ELEMENT_BYTES = {"uint8": 1, "float8_e4m3fn": 1, "bfloat16": 2, "float32": 4}
MODELS = {
    "sweep-kimi-k3.json": "kimi-k3",
    "sweep-kimi-k3-dspark.json": "kimi-k3-dspark",
    "sweep-kimi-linear-48b.json": "kimi-linear-48b",
}
DSPARK_DRAFT_TOKENS = 8
"""The recorder's ``--speculative-num-draft-tokens`` for DSpark (the planner's spec_tokens)."""
FIELDS = {"latent_kv": "latent", "conv_state": "conv", "recurrent_state": "recurrent"}
"""tokenspeed's field names -> the planner's part names."""
REFUSAL_CODES = (
    ("Unsupported kv_cache_dtype", "dtype_unsupported", "settings"),
    ("KDA num_heads=", "heads_not_divisible", "groups"),
    ("Kimi-K3 cache requires the KDA layer count", "layout_unsupported", "groups"),
    ("cache field ", "layout_unsupported", "pack"),
    ("cache group ", "padding_limit", "pack"),
)
"""How tokenspeed's recipe words a refusal -> the planner's code for it, and where it meets it
(``pack``: after the model loads, so after the draft's heads are checked)."""


def test_every_followed_revision_has_a_recording() -> None:
    assert tuple(RECORDINGS) == TOKENSPEED_VERSIONS == facts_of("tokenspeed").versions
    assert TOKENSPEED_VERSIONS[-1] == "main"  # the default: the newest


@cache
def recorded(revision: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / RECORDINGS[revision] / name).read_text())
    assert data["source"]["commit"] == REVISIONS[revision].commit
    assert data["source"]["ref"] == REVISIONS[revision].ref
    assert data["source"]["files_match_commit"] is True
    platforms = data.get("platforms", {"recorded_on": {"nvidia-h200": {"vendor": "nvidia"}}})
    assert list(platforms["recorded_on"]) == ["nvidia-h200"]  # planned on the default GPU
    assert Deployment().gpu == PLATFORMS["nvidia-h200"]
    for where in platforms.values():
        for platform, facts in where.items() if isinstance(where, dict) else ():
            assert GPUS[PLATFORMS[platform]].vendor == facts["vendor"]
    return data


def model_of(name: str) -> HybridModel:
    return preset(name)


def deployment(
    revision: str, model: str, attn_tp: int, attn_dp: int, dtype: str, *, gpu: GpuName = "h200"
) -> Deployment:
    return Deployment.model_validate(
        {
            "engine": "tokenspeed",
            "engine_version": revision,
            "gpu": gpu,
            "attn_tp": attn_tp,
            "attn_dp": attn_dp,
            "kv_dtype": dtype,
            "spec_tokens": DSPARK_DRAFT_TOKENS if "dspark" in model else 0,
        }
    )


def with_draft_heads(model: HybridModel, heads: int) -> HybridModel:
    """``model`` with ``heads`` query heads in every draft layer."""
    data = model.model_dump()
    data["draft_layers"] = [{**layer, "num_heads": heads} for layer in data["draft_layers"]]
    return HybridModel.model_validate(data)


def draft_heads_refused(model: str, attn_tp: int) -> bool:
    """Where tokenspeed's draft attention refuses at load what its recipe would lay out."""
    drafts = model_of(model).draft_layers
    return any(layer.num_heads % attn_tp for layer in drafts)


@cache
def recipe_model(name: str, attn_tp: int) -> HybridModel:
    """The model whose plan is the recipe's answer at ``attn_tp``: ``name`` itself, or, where
    the draft's load-time check refuses its query heads, ``name`` with draft heads the TP
    divides (``test_the_drafts_query_heads_do_not_change_the_cache``)."""
    model = model_of(name)
    if not draft_heads_refused(name, attn_tp):
        return model
    heads = {layer.num_heads for layer in model.draft_layers}
    return with_draft_heads(model, math.lcm(*heads, attn_tp))


def _planned(model: HybridModel, at: Deployment) -> ParentPlan | Refusal:
    try:
        result = plan(model, at)
    except Refusal as refusal:
        return refusal
    assert isinstance(result, ParentPlan)
    return result


def planned(
    revision: str, model: str, attn_tp: int, attn_dp: int, dtype: str, *, gpu: GpuName = "h200"
) -> ParentPlan | Refusal:
    """What :func:`k3layout.plan` answers."""
    return _planned(model_of(model), deployment(revision, model, attn_tp, attn_dp, dtype, gpu=gpu))


def recipe_planned(
    revision: str, model: str, attn_tp: int, attn_dp: int, dtype: str, *, gpu: GpuName = "h200"
) -> ParentPlan | Refusal:
    """The recipe's own answer, which the recording holds: :func:`planned` of
    :func:`recipe_model`."""
    at = deployment(revision, model, attn_tp, attn_dp, dtype, gpu=gpu)
    return _planned(recipe_model(model, attn_tp), at)


def refusal_kind(message: str) -> tuple[str, str]:
    """``(code, stage)`` of a recorded refusal."""
    kinds = [(code, stage) for start, code, stage in REFUSAL_CODES if message.startswith(start)]
    assert len(kinds) == 1, message  # a new kind of refusal needs its code here
    return kinds[0]


def assert_refused_like(result: ParentPlan | Refusal, error: dict[str, Any], where: str) -> None:
    """``result`` is tokenspeed's refusal: a fitting code, and tokenspeed's whole text."""
    assert isinstance(result, Refusal), (where, error["message"])
    assert result.code == refusal_kind(error["message"])[0], (where, result)
    assert error["message"] in str(result), (where, str(result))


def assert_plan_answers_as_tokenspeed_runs(
    result: ParentPlan | Refusal,
    recipe: ParentPlan | Refusal,
    model: str,
    attn_tp: int,
    error: dict[str, Any] | None,
) -> None:
    """:func:`plan` answers the recipe's answer (``error``: its recorded refusal), but where
    the draft refuses its heads first: before the recipe lays out the cache."""
    laid_out = error is None or refusal_kind(error["message"])[1] == "pack"
    if laid_out and draft_heads_refused(model, attn_tp):
        assert isinstance(result, Refusal)
        assert result.code == "heads_not_divisible"
        assert f"num_heads=64 must be divisible by attn_tp_size={attn_tp}." in str(result)
    elif isinstance(recipe, Refusal):
        assert isinstance(result, Refusal) and str(result) == str(recipe)
    else:
        assert result == recipe


# -- what the cells share -------------------------------------------------------------------


def check_sizes(result: ParentPlan, sizes: dict[str, Any]) -> None:
    tp = result.deployment.attn_tp
    mla = result.model.attention_layer_ids[0]
    latent = result.sizes.spec_of(mla).parts[0]
    assert result.mla_page_bytes == sizes["mla_page_bytes"]
    assert latent.elem_bytes == ELEMENT_BYTES[sizes["mla_page_dtype"]]
    # one latent head of a 128-token page
    assert tuple(sizes["latent_shape"]) == (result.page_tokens, 1, *latent.engine_shape(tp))
    kda = result.model.kda_layer_ids[0]
    assert result.sizes.state_bytes == sizes["kda_state_bytes_per_layer"]
    assert result.layer_payload_bytes(kda) == sizes["kda_state_span_bytes_per_layer"]
    assert result.model.kda_layers[0].conv_rows(result.deployment) == sizes["conv_rows"]
    for field in ("conv_state", "recurrent_state"):
        part = result.sizes.spec_of(kda).part(FIELDS[field])
        assert tuple(part.engine_shape(tp)) == tuple(sizes[f"{field}_shape"])
        assert part.dtype == sizes[f"{field}_dtype"]
        assert result.part_range(kda, FIELDS[field]).size_bytes == sizes[f"{field}_bytes"]
    if "draft_page_bytes" in sizes:
        draft = result.model.draft_layer_ids[0]
        assert result.layer_payload_bytes(draft) == sizes["draft_page_bytes"]
        assert result.deployment.draft_cache_dtype == DTYPES[sizes["draft_page_dtype"]]


def check_rule(result: ParentPlan, cell: dict[str, Any]) -> None:
    """The revision's packing rule: #1152's ``rule_1152`` or ``main``'s ``packing_rule``."""
    revision = result.deployment.engine_version
    rule = cell["rule_1152"] if revision == "pr1152" else cell["packing_rule"]
    checked = result.packing_rule
    assert checked.chosen and checked.exact_stride
    assert (checked.mla_pages, checked.state_pages) == (rule["mla_packing"], rule["linear_packing"])
    assert result.rule_1152 == (checked if revision == "pr1152" else None)
    assert result.mla_page_bytes == rule["mla_page_bytes"]
    state_group = result.group("linear_attention_0")
    assert result.layer_payload_bytes(state_group.layers[0]) == rule["linear_plane_bytes"]
    pages = result.tokenspeed_revision.packing(rule["mla_page_bytes"], rule["linear_plane_bytes"])
    assert pages == (rule["mla_packing"], rule["linear_packing"])
    if "mla_plane_bytes" in rule:
        assert checked.mla_pages * result.mla_page_bytes == rule["mla_plane_bytes"]
    assert checked.parent_bytes == result.parent_bytes
    assert checked.plane_bytes == result.plane_sizes[0]


def check_padding(result: ParentPlan, cell: dict[str, Any]) -> None:
    for group, padding in cell["padding"].items():
        held = result.group(group)
        assert result.parent_bytes // result.pages_per_parent(held) == padding["stride_bytes"]
        assert result.raw_bytes(held) == padding["raw_bytes"]
        assert result.padding_fraction[group] == padding["padding_fraction"]
        assert result.utilization[group] == cell["utilization"][group]
    assert set(cell["padding"]) == set(result.padding_fraction)


def check_specs(result: ParentPlan, specs: list[dict[str, Any]]) -> None:
    """tokenspeed's group specs: one per group, the attention group paging 128 tokens of
    history, each state group a state checkpointed every 128 tokens."""
    assert {spec["group_id"] for spec in specs} == {g.name for g in result.groups if g.layers}
    for spec in specs:
        held = result.group(spec["group_id"])
        attention = held.kind == "attention"
        assert spec["family"] == ("history" if attention else "state")
        assert spec["rows_per_page"] == (result.page_tokens if attention else None)
        assert spec["checkpoint_granularity"] == (None if attention else result.page_tokens)
        assert spec["block_granularity"] == result.page_tokens
        assert spec["retention"] == "full_history"
        fields = sum(len(result.sizes.spec_of(layer).parts) for layer in held.layers)
        assert spec["num_fields"] == fields


def state_groups_by_layer(result: ParentPlan, first: int, count: int) -> dict[str, list[int]]:
    """What ``main``'s pools derive from the plan (#1178) for the view of module layers
    ``first .. first + count``: each state group's layers inside it."""
    window = range(first, first + count)
    mapped = {
        g.name: [layer for layer in g.layers if layer in window]
        for g in result.groups
        if g.kind != "attention"
    }
    return {name: layers for name, layers in mapped.items() if layers}


def check_pool_state_groups(result: ParentPlan, pools: dict[str, Any]) -> None:
    """``main``'s pools find each state layer's group in the plan (#1178): the same groups."""
    model = result.model
    assert pools["layer_types"] == {
        "linear_attention": len(model.kda_layer_ids),
        "full_attention": len(model.attention_layer_ids),
    }
    states = [g.name for g in result.groups if g.kind != "attention" and g.layers]
    assert pools["state_family_groups"] == states
    windows = {"target": (0, len(model.module_layers))}
    if model.draft_layers:
        windows["draft"] = (model.num_layers, len(model.draft_layers))
    assert set(pools["views"]) == set(windows)
    for name, (first, count) in windows.items():
        view = pools["views"][name]
        assert (view["first_layer"], view["num_layers"]) == (first, count)
        assert view["state_group_by_layer"] == state_groups_by_layer(result, first, count)
        assert view["matches_recipe_group_ids"] is True


def check_verify_workspace(result: ParentPlan, cell: dict[str, Any]) -> None:
    """The verify workspace, and at ``main`` its parts: the replay commit on the H200 (#1156),
    #1152's dense state rows on the MI350X."""
    max_bs = cell["max_bs"]
    assert workspace_bytes(result, max_bs) == cell["workspace_bytes"]
    verify = cell.get("verify_workspace")
    if verify is None:  # #1152: dense state rows only
        assert not replays_verify(result)
        return
    assert replays_verify(result) is verify["replay_kda"]
    assert workspace_bytes(result, max_bs) == verify["workspace_bytes"]
    spec = result.deployment.spec_tokens
    kda = result.model.kda_layer_ids
    if verify["replay_kda"]:
        conv = sum(result.part_range(layer, "conv").size_bytes for layer in kda)
        row = replay_row_bytes(result)
        assert verify["conv_checkpoint_rows"] == max_bs
        assert verify["conv_checkpoint_bytes"] == max_bs * conv
        assert (verify["replay_layers"], verify["replay_rows"]) == (len(kda), max_bs * spec)
        assert verify["replay_row_parts"] == replay_row_parts(result)
        assert verify["replay_row_bytes"] == row
        assert verify["replay_payload_bytes"] == len(kda) * max_bs * spec * row
        assert verify["workspace_bytes"] == max_bs * conv + len(kda) * max_bs * spec * row
    else:
        assert verify == {"replay_kda": False, "workspace_bytes": 0}  # no speculation
        assert not spec
    without = verify.get("without_replay")
    if without is None:
        return
    d = result.deployment
    gpu = PLATFORMS[without["platform"]]
    other = recipe_planned(
        d.version_run, result.model.name, d.attn_tp, d.attn_dp, d.kv_dtype, gpu=gpu
    )
    assert isinstance(other, ParentPlan)
    assert GPUS[gpu].vendor == "amd"
    assert replays_verify(other) is without["replay_kda"] is False
    assert workspace_bytes(other, max_bs) == without["workspace_bytes"]
    assert without["verify_rows"] == max_bs * (spec + 1)
    assert without["state_layers"] == len(kda)
    assert without["state_row_bytes"] == len(kda) * other.sizes.state_bytes
    assert without["workspace_bytes"] == without["verify_rows"] * without["state_row_bytes"]


def check_strides(result: ParentPlan, strides: dict[str, Any]) -> None:
    for group, fields in strides.items():
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
            for variant in listed:
                elements = {
                    result.sizes.spec_of(at).part(FIELDS[field]).elem_bytes for at in held.layers
                }
                assert ELEMENT_BYTES[variant["dtype"]] in elements


# -- the sweeps -----------------------------------------------------------------------------


def sweep_cells() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (revision, model, cell)
        for revision in RECORDINGS
        for name, model in MODELS.items()
        for cell in recorded(revision, name)["cells"]
    ]


def cell_id(item: tuple[str, str, dict[str, Any]]) -> str:
    revision, model, cell = item
    return f"{revision}-{model}-tp{cell['attn_tp']}-dp{cell['attn_dp']}-{cell['kv_cache_dtype']}"


@pytest.mark.parametrize("item", sweep_cells(), ids=cell_id)
def test_every_recorded_cell_is_tokenspeeds_field_by_field(
    item: tuple[str, str, dict[str, Any]],
) -> None:
    revision, model, cell = item
    tp, dp, spelling = cell["attn_tp"], cell["attn_dp"], cell["kv_cache_dtype"]
    if spelling not in SPELLINGS:  # tokenspeed refuses the spelling; k3layout never emits it
        assert cell["status"] == "refused" and not cell["cli_accepts"]
        assert cell["error"]["message"] == f"Unsupported kv_cache_dtype: {spelling!r}"
        assert spelling not in KV_CACHE_DTYPE.values()
        return
    dtype = SPELLINGS[spelling]
    result = planned(revision, model, tp, dp, dtype)
    recipe = recipe_planned(revision, model, tp, dp, dtype)
    error = cell["error"] if cell["status"] != "ok" else None
    assert_plan_answers_as_tokenspeed_runs(result, recipe, model, tp, error)
    if cell["status"] != "ok":
        assert_refused_like(recipe, cell["error"], cell_id(item))
        return
    assert isinstance(recipe, ParentPlan), (cell_id(item), recipe)
    assert DTYPES[cell["resolved_kv_cache_dtype"]] == recipe.deployment.kv_dtype
    if "resolved_draft_kv_cache_dtype" in cell and recipe.model.draft_layers:
        assert DTYPES[cell["resolved_draft_kv_cache_dtype"]] == recipe.deployment.draft_cache_dtype
    check_sizes(recipe, cell["sizes"])
    assert recipe.packing_by_group == cell["packing"]
    check_rule(recipe, cell)
    assert recipe.num_planes == cell["num_planes"]
    counts: dict[str, int] = {}
    for size in recipe.plane_sizes:
        counts[str(size)] = counts.get(str(size), 0) + 1
    assert counts == cell["plane_bytes_counts"]
    assert recipe.parent_bytes == cell["parent_bytes"]
    limit = cell["max_padding_fraction"]
    assert recipe.max_padding == (None if limit == "inf" else limit)
    check_padding(recipe, cell)
    check_strides(recipe, cell["strides"])
    check_verify_workspace(recipe, cell)


@pytest.mark.parametrize("revision", RECORDINGS)
@pytest.mark.parametrize("name", MODELS)
def test_the_accepted_tps_and_the_groups_are_tokenspeeds(revision: str, name: str) -> None:
    data, model = recorded(revision, name), MODELS[name]
    accepted = set()
    for cell in data["cells"]:
        dtype = SPELLINGS.get(cell["kv_cache_dtype"])
        if dtype is not None:
            tp = cell["attn_tp"]
            if isinstance(recipe_planned(revision, model, tp, cell["attn_dp"], dtype), ParentPlan):
                accepted.add(tp)
    assert sorted(accepted) == data["accepted_attn_tp"]
    groups = data["groups"]
    if groups == {"refused": groups.get("refused")}:  # Kimi-Linear: the recipe groups nothing
        assert not accepted
        return
    # recorded at TP 8 fp8
    result = recipe_planned(revision, model, 8, 1, "fp8")
    assert isinstance(result, ParentPlan)
    assert {g.name: list(g.layers) for g in result.groups if g.layers} == groups["layers"]
    assert groups["num_target_layers"] == result.model.num_layers
    assert groups["num_draft_layers"] == len(result.model.draft_layers)
    check_specs(result, groups["specs"])
    if "pool_state_groups" in groups:  # main (#1178)
        check_pool_state_groups(result, groups["pool_state_groups"])


@pytest.mark.parametrize("revision", RECORDINGS)
def test_the_facts_are_tokenspeeds(revision: str) -> None:
    facts = recorded(revision, "sweep-kimi-k3.json")["facts"]
    # the flags k3layout writes are spellings tokenspeed's CLI takes, one per planner dtype
    assert {KV_CACHE_DTYPE[dtype] for dtype in KV_CACHE_DTYPES} <= set(
        facts["cli_kv_cache_dtype_choices"]
    )
    assert {SPELLINGS[s] for s in facts["cli_kv_cache_dtype_choices"]} == set(KV_CACHE_DTYPES)
    assert {row["rows"] for row in facts["conv_rows_tp8"].values()} == {3}
    drafts = preset("kimi-k3-dspark").draft_layers
    assert len(drafts) == facts["dspark_draft"]["num_hidden_layers"]
    assert {layer.num_heads for layer in drafts} == {
        facts["dspark_draft"]["fixture_num_attention_heads"]
    }
    # fp16 and e5m2 caches and per_token_head are no planner setting: nothing to plan
    for refusal in facts["extra_refusals"]:
        assert refusal["status"] == "refused"


# -- the detail cells -----------------------------------------------------------------------


def detail_cells() -> list[tuple[str, dict[str, Any]]]:
    return [
        (revision, cell)
        for revision in RECORDINGS
        for cell in recorded(revision, "detail.json")["cells"]
    ]


def detail_id(item: tuple[str, dict[str, Any]]) -> str:
    revision, cell = item
    dp = cell.get("attn_dp", 1)
    return f"{revision}-{cell['model']}-tp{cell['attn_tp']}-dp{dp}-{cell['kv_cache_dtype']}"


def planner_dtype(spelling: str) -> str:
    return DTYPES.get(spelling, SPELLINGS.get(spelling, ""))


def detail_plan(revision: str, cell: dict[str, Any], gpu: GpuName = "h200") -> ParentPlan | Refusal:
    """The recipe's answer for a recorded cell, after checking :func:`plan` answers it too
    (or refuses the draft's heads first)."""
    args = (
        cell["model"],
        cell["attn_tp"],
        cell.get("attn_dp", 1),
        planner_dtype(cell["kv_cache_dtype"]),
    )
    recipe = recipe_planned(revision, *args, gpu=gpu)
    assert_plan_answers_as_tokenspeed_runs(
        planned(revision, *args, gpu=gpu), recipe, cell["model"], cell["attn_tp"], cell.get("error")
    )
    return recipe


def planned_cell(item: tuple[str, dict[str, Any]]) -> ParentPlan | None:
    """The plan of a recorded detail cell, or ``None`` where tokenspeed refused it and
    k3layout refuses it alike (checked here)."""
    revision, cell = item
    result = detail_plan(revision, cell)
    if cell.get("status") == "refused":
        assert_refused_like(result, cell["error"], detail_id(item))
        return None
    assert isinstance(result, ParentPlan), result
    return result


@pytest.mark.parametrize("item", detail_cells(), ids=detail_id)
def test_every_field_of_every_layer_sits_where_tokenspeed_packs_it(
    item: tuple[str, dict[str, Any]],
) -> None:
    cell = item[1]
    result = planned_cell(item)
    if result is None:  # refused as tokenspeed refused it
        return
    assert result.packing_by_group == cell["packing"]
    check_rule(result, cell)
    assert result.parent_bytes == cell["parent_bytes"]
    # the planes in tokenspeed's order (ids sorted as strings), each with its bytes
    order = [f"slot.{j}" for j in sorted(range(result.num_planes), key=lambda j: f"slot.{j}")]
    assert [name for name, _ in cell["plane_bytes"]] == order
    assert [size for _, size in cell["plane_bytes"]] == [
        result.plane_bytes_at(int(name.removeprefix("slot."))) for name in order
    ]
    check_specs(result, cell["groups"])
    for group, layers in cell["layers"].items():
        assert result.group(group).layers == tuple(layers)
    check_sizes(result, cell["sizes"])
    check_padding(result, cell)
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
    for name, entries in cell["slots"].items():
        plane = int(name.removeprefix("slot."))
        got = []
        for group in result.groups:
            if group.layers and plane - group.first_plane < len(group.layers):
                layer = group.layers[plane - group.first_plane]
                for part in result.part_range_list(layer):
                    got.append(
                        (
                            group.name,
                            layer,
                            part.part,
                            part.offset_bytes,
                            part.size_bytes,
                            result.page_stride_at(group, plane),
                        )
                    )
        want = [
            (e["group"], e["layer"], FIELDS[e["field"]], e["offset"], e["payload"], e["stride"])
            for e in entries
        ]
        assert sorted(got) == sorted(want), name
    assert {f"slot.{j}" for j in range(result.num_planes)} == set(cell["slots"])
    check_verify_workspace(result, cell)
    if "pool_state_groups" in cell:
        check_pool_state_groups(result, cell["pool_state_groups"])


# -- bind -----------------------------------------------------------------------------------


def bind_cells() -> list[tuple[str, dict[str, Any]]]:
    return [
        (revision, cell)
        for revision in RECORDINGS
        for cell in recorded(revision, "bind.json")["cells"]
    ]


@pytest.mark.parametrize("item", bind_cells(), ids=detail_id)
def test_bind_and_byte_range_give_tokenspeeds_addresses(item: tuple[str, dict[str, Any]]) -> None:
    cell = item[1]
    result = planned_cell(item)
    if result is None:  # refused as tokenspeed refused it
        return
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


# -- capacity -------------------------------------------------------------------------------


def capacity_cells() -> list[tuple[str, dict[str, Any]]]:
    return [
        (revision, cell)
        for revision in RECORDINGS
        for cell in recorded(revision, "capacity.json")["cells"]
    ]


@pytest.mark.parametrize("item", capacity_cells(), ids=detail_id)
def test_capacity_with_and_without_overlap_scheduling_is_tokenspeeds(
    item: tuple[str, dict[str, Any]],
) -> None:
    cell = item[1]
    result = planned_cell(item)
    if result is None:  # refused as tokenspeed refused it
        return
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


def check_budgets(result: ParentPlan, budgets: list[dict[str, Any]]) -> None:
    for budget in budgets:
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
        assert got.replay_commit is replays_verify(result)


@pytest.mark.parametrize("item", capacity_cells(), ids=detail_id)
def test_a_memory_budget_buys_the_parents_and_tokens_tokenspeeds_setup_gives(
    item: tuple[str, dict[str, Any]],
) -> None:
    revision, cell = item
    result = planned_cell(item)
    if result is None:  # refused as tokenspeed refused it
        return
    check_budgets(result, cell["budgets"])
    without = cell.get("budgets_without_replay")
    if without is not None:  # main, speculative: the same budgets on the MI350X
        gpu = PLATFORMS[without["platform"]]
        other = detail_plan(revision, cell, gpu)
        assert isinstance(other, ParentPlan) and not replays_verify(other)
        assert other.parent_bytes == result.parent_bytes
        check_budgets(other, without["budgets"])


# -- a few things beside the cells ----------------------------------------------------------


def test_tokenspeeds_conv_state_keeps_k_minus_1_rows_whatever_the_speculative_depth() -> None:
    for revision in RECORDINGS:
        facts = recorded(revision, "sweep-kimi-k3.json")["facts"]["conv_rows_tp8"]
        assert {row["rows"] for row in facts.values()} == {3}
        for spec_tokens in (0, 2, 7):
            result = plan(
                preset("kimi-k3"),
                Deployment(
                    engine="tokenspeed",
                    engine_version=revision,
                    attn_tp=8,
                    spec_tokens=spec_tokens,
                ),
            )
            assert isinstance(result, ParentPlan)
            assert result.sizes.state_bytes == 814_080


@pytest.mark.parametrize("revision", RECORDINGS)
def test_the_drafts_query_heads_do_not_change_the_cache(revision: str) -> None:
    dspark = preset("kimi-k3-dspark")
    at = deployment(revision, "kimi-k3-dspark", 8, 1, "fp8")
    own, other = plan(dspark, at), plan(with_draft_heads(dspark, 128), at)
    assert isinstance(own, ParentPlan) and isinstance(other, ParentPlan)
    assert other.model.draft_layers != own.model.draft_layers
    assert (other.sizes.specs, other.groups, other.packing, other.packing_rule) == (
        own.sizes.specs,
        own.groups,
        own.packing,
        own.packing_rule,
    )
    assert other.plane_sizes == own.plane_sizes
    assert workspace_bytes(other, 80) == workspace_bytes(own, 80)


def test_the_issues_overlap_probe_needs_108_parents_as_tokenspeed_1152_does() -> None:
    result = planned("pr1152", "kimi-k3", 1, 1, "fp8")
    assert isinstance(result, ParentPlan)
    # 16 live requests, depth 1: 16 protected MLA pages, none in the state groups
    pages = 131_072 // 128 + 16 - 1 + 16
    assert result.parents_for(131_072, 16, 16) == -(-pages // 89) + 3 * 2 * 16 == 108
