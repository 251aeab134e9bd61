"""The ``tokenspeed`` engine follows two revisions, chosen by ``Deployment.engine_version``:
#1152's head (``pr1152``) and ``main`` (the default). What differs is a record per revision
(:mod:`k3layout.engines.tokenspeed.releases`) read by the same code; this checks the choice,
the records, what ``main`` refuses that #1152 laid out, and where ``main``'s replay-commit
verify workspace applies. Every figure is checked against the recordings in
``tests/test_tokenspeed_recorded.py``; here only how the revisions relate.
"""

from __future__ import annotations

import json

import pytest

from k3layout import (
    Deployment,
    HybridModel,
    ParentPlan,
    Refusal,
    load_plan,
    plan,
    plan_sglang,
    plan_tokenspeed,
    plan_vllm,
    preset,
)
from k3layout.engines.tokenspeed import REVISION, REVISION_NAME
from k3layout.engines.tokenspeed.capacity import (
    activation_dtype,
    replay_row_bytes,
    replays_verify,
    workspace_bytes,
)
from k3layout.engines.tokenspeed.releases import (
    MAIN,
    PR1152,
    REVISIONS,
    TOKENSPEED_VERSIONS,
    revision_of,
)
from k3layout.gpus import GPUS, GpuName
from k3layout.layouts.report import report
from k3layout.registry import facts_of


def tokenspeed(model: str, **fields: object) -> ParentPlan:
    result = plan(preset(model), Deployment.model_validate({"engine": "tokenspeed", **fields}))
    assert isinstance(result, ParentPlan)
    return result


def refused(model: str, **fields: object) -> Refusal:
    with pytest.raises(Refusal) as caught:
        plan(preset(model), Deployment.model_validate({"engine": "tokenspeed", **fields}))
    return caught.value


def test_main_is_the_default_and_a_plan_says_which_revision_it_follows() -> None:
    assert TOKENSPEED_VERSIONS == ("pr1152", "main") == facts_of("tokenspeed").versions
    assert Deployment(engine="tokenspeed").version_run == "main"
    assert revision_of(Deployment(engine="tokenspeed")) is MAIN
    assert revision_of(Deployment(engine="vllm")) is MAIN  # a tokenspeed rule asked directly
    for version in TOKENSPEED_VERSIONS:
        result = tokenspeed("kimi-k3", engine_version=version, attn_tp=8)
        assert result.deployment.engine_version == version
        assert result.tokenspeed_revision is REVISIONS[version]
        assert result.revision == REVISIONS[version].title
        rows = dict(result.summary())
        assert rows["followed revision"] == REVISIONS[version].title
        assert rows["packing rule"] == REVISIONS[version].packing_formula
        assert load_plan(result.model_dump_json()) == result
    assert tokenspeed("kimi-k3", attn_tp=8).deployment.engine_version == "main"


def test_the_old_revision_names_stay_pr1152s() -> None:
    assert (PR1152.commit, PR1152.title) == (REVISION, REVISION_NAME)


def test_another_revision_is_refused_with_the_list() -> None:
    with pytest.raises(Refusal) as caught:
        Deployment(engine="tokenspeed", engine_version="pr1156")
    assert caught.value.code == "version_unsupported"
    assert caught.value.facts["allowed"] == TOKENSPEED_VERSIONS


def test_the_rule_is_the_revisions_record() -> None:
    """The shared code reads the record: #1152 grows the MLA packing until a plane holds a
    state, ``main`` pins it; both give the state groups what fits beside it."""
    for tp in (1, 8, 96):
        result = tokenspeed("kimi-k3", engine_version="pr1152", attn_tp=tp)
        page, state = result.mla_page_bytes, result.sizes.state_bytes
        assert PR1152.fixed_mla_packing is None
        assert PR1152.packing(page, state)[0] * page >= state
        assert (result.packing.mla_pages, result.packing.state_pages) == PR1152.packing(page, state)
        fixed = MAIN.fixed_mla_packing
        assert fixed is not None
        assert MAIN.packing(page, state) == (fixed, max(1, fixed * page // state))


@pytest.mark.parametrize("kv_dtype", ["fp8", "bf16"])
def test_rule_1152_is_kept_for_pr1152_and_packing_rule_is_every_revisions(kv_dtype: str) -> None:
    old = tokenspeed("kimi-k3", engine_version="pr1152", attn_tp=8, kv_dtype=kv_dtype)
    new = tokenspeed("kimi-k3", engine_version="main", attn_tp=8, kv_dtype=kv_dtype)
    assert old.rule_1152 == old.packing_rule and old.packing_rule.chosen
    assert new.rule_1152 is None and new.packing_rule.chosen
    assert (new.packing_rule.mla_pages, new.packing_rule.state_pages) == (
        new.packing.mla_pages,
        new.packing.state_pages,
    )
    for result in (old, new):
        data = json.loads(report(result).model_dump_json())
        assert data["packing_rule"]["mla_pages"] == result.packing.mla_pages
        assert (data["rule_1152"] is None) == (result.rule_1152 is None)
    # where #1152 picked 12 MLA pages too, main's layout is #1152's
    if old.packing.mla_pages == MAIN.fixed_mla_packing:
        assert (old.plane_sizes, old.parent_bytes) == (new.plane_sizes, new.parent_bytes)


def test_main_refuses_a_state_wider_than_its_12_mla_pages() -> None:
    assert tokenspeed("kimi-k3", engine_version="pr1152", attn_tp=1)  # #1152 grows p_m
    refusal = refused("kimi-k3", engine_version="main", attn_tp=1)
    assert refusal.code == "layout_unsupported"
    assert str(refusal.facts["sized_by"]).endswith(".recurrent_state")
    assert "the KDA state is wider than the 12 MLA pages" in str(refusal)
    assert "its kernel indexes pages by an implicit payload-sized stride" in str(refusal)
    assert refusal.hint is not None and "attention TP" in refusal.hint


def test_main_refuses_a_plane_the_state_packing_rounds_up() -> None:
    assert tokenspeed("kimi-k3", engine_version="pr1152", attn_tp=96)
    refusal = refused("kimi-k3", engine_version="main", attn_tp=96)
    assert refusal.code == "layout_unsupported"
    assert str(refusal.facts["sized_by"]).endswith(".latent_kv")
    assert "rounds 12 MLA pages up to the alignment" in str(refusal)
    assert int(str(refusal.facts["stride"])) > int(str(refusal.facts["page_bytes"]))


def test_a_padding_refusal_names_the_revision_whose_packing_it_is() -> None:
    refusal = refused("kimi-k3", engine_version="main", attn_tp=12, kv_dtype="fp8")
    assert refusal.code == "padding_limit"
    assert refusal.facts["revision"] == MAIN.title and MAIN.title in str(refusal)
    assert refusal.hint is not None and MAIN.packing_formula in refusal.hint
    assert tokenspeed("kimi-k3", engine_version="pr1152", attn_tp=12, kv_dtype="fp8")
    old = refused("kimi-k3", engine_version="pr1152", attn_tp=32, kv_dtype="bf16")
    assert old.code == "padding_limit" and old.facts["revision"] == PR1152.title
    assert tokenspeed("kimi-k3", engine_version="main", attn_tp=32, kv_dtype="bf16")
    # a draft lifts the limit at either revision
    assert tokenspeed("kimi-k3-dspark", engine_version="main", attn_tp=8, kv_dtype="fp8")


@pytest.mark.parametrize("version", TOKENSPEED_VERSIONS)
def test_the_settings_refusals_name_the_deployments_revision(version: str) -> None:
    title = REVISIONS[version].title
    dtype = refused("kimi-k3", engine_version=version, attn_tp=8, kv_dtype="fp8_ds_mla")
    assert (dtype.code, dtype.facts["revision"]) == ("dtype_unsupported", title)
    heads = refused("kimi-k3", engine_version=version, attn_tp=5)
    assert (heads.code, heads.facts["revision"]) == ("heads_not_divisible", title)
    stages = refused("kimi-k3", engine_version=version, attn_tp=8, pp=2)
    assert stages.code == "engine_setting" and title in str(stages)


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_the_replay_commit_applies_where_tokenspeed_kernel_has_its_kernels(gpu: GpuName) -> None:
    fields = {"attn_tp": 8, "gpu": gpu, "spec_tokens": 8}
    new = tokenspeed("kimi-k3-dspark", engine_version="main", **fields)
    old = tokenspeed("kimi-k3-dspark", engine_version="pr1152", **fields)
    nvidia = GPUS[gpu].vendor == "nvidia"
    assert replays_verify(new) is nvidia
    assert not replays_verify(old)
    assert (
        workspace_bytes(old, 80)
        == tokenspeed("kimi-k3-dspark", engine_version="main", **{**fields, "gpu": "mi355x"})
        .capacity(100 << 30, max_live=80)
        .workspace_bytes
    )
    budget = 100 << 30
    got_new, got_old = new.capacity(budget, max_live=80), old.capacity(budget, max_live=80)
    assert got_new.replay_commit is nvidia and not got_old.replay_commit
    label = "verify workspace (replay commit)" if nvidia else "verify workspace (KDA state rows)"
    assert label in dict(got_new.rows())
    if nvidia:  # a conv checkpoint and compact rows instead of every candidate's state
        assert got_new.workspace_bytes < got_old.workspace_bytes
        assert got_new.num_parents > got_old.num_parents
        assert replay_row_bytes(new) < new.sizes.state_bytes
    else:
        assert got_new.workspace_bytes == got_old.workspace_bytes
        assert got_new.num_parents == got_old.num_parents


def test_without_speculative_tokens_no_revision_reserves_a_workspace() -> None:
    for version in TOKENSPEED_VERSIONS:
        result = tokenspeed("kimi-k3-dspark", engine_version=version, attn_tp=8)
        assert not replays_verify(result)
        assert workspace_bytes(result, 80) == 0


def with_dtype(model: HybridModel, dtype: str | None) -> HybridModel:
    data = model.model_dump()
    if dtype is None:
        data["architecture"] = None
    else:
        data["architecture"]["torch_dtype"] = dtype
    return HybridModel.model_validate(data)


@pytest.mark.parametrize(
    ("dtype", "activations"),
    [("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float16"), (None, "bfloat16")],
)
def test_the_activation_dtype_is_tokenspeeds_auto(dtype: str | None, activations: str) -> None:
    """``--dtype auto`` runs a float32 checkpoint in float16 and a config without a dtype in
    bfloat16: every checkpoint k3layout plans has activations the replay kernels take."""
    model = with_dtype(preset("kimi-k3-dspark"), dtype)
    assert activation_dtype(model) == activations
    result = plan(model, Deployment(engine="tokenspeed", attn_tp=8, spec_tokens=8))
    assert isinstance(result, ParentPlan)
    assert replays_verify(result)


def test_the_replay_commit_needs_both_the_vendor_and_the_activation_dtype() -> None:
    assert MAIN.replays_verify("nvidia", "bfloat16") and MAIN.replays_verify("nvidia", "float16")
    assert not MAIN.replays_verify("nvidia", "float32")
    assert not MAIN.replays_verify("amd", "bfloat16")
    assert not any(PR1152.replays_verify(v, "bfloat16") for v in ("nvidia", "amd"))


@pytest.mark.parametrize("revision", ["pr1152", "main"])
def test_state_groups_longer_than_the_attention_layers_are_refused_as_the_recipe_does(
    revision: str,
) -> None:
    """The recipe's check_layout (both revisions): one plane per MLA layer plus one per draft
    layer. One MLA layer, a one-layer MLA draft and 33 KDA layers (3 state groups of 11) would
    lay out 11 planes for 2 attention layers: refused, and vLLM and SGLang plan it."""
    k3 = preset("kimi-k3")
    mla, kda = k3.layers[3], k3.layers[0]
    model = HybridModel(
        name="long-state",
        model_type="kimi_linear",
        layers=(mla, *(kda,) * 33),
        draft_layers=(mla,),
        drafter="dspark",
    )
    with pytest.raises(Refusal) as refused:
        plan_tokenspeed(model, Deployment(engine="tokenspeed", engine_version=revision, attn_tp=8))
    assert refused.value.code == "layout_unsupported"
    assert (refused.value.facts["num_planes"], refused.value.facts["expected_planes"]) == (
        33 // 3,
        1 + 1,
    )
    assert "Kimi-K3 LCM requires one target plane per MLA layer" in str(refused.value)
    plan_vllm(model, Deployment(attn_tp=8, spec_tokens=1))  # the hint's engines plan it
    plan_sglang(model, Deployment(engine="sglang", attn_tp=8))
