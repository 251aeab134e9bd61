"""``k3layout.engines.sglang``'s bridge against SGLang 0.5.23's own objects, run on CPU.

The ``ServerArgs`` and ``ModelConfig`` are the ones SGLang builds and resolves
(``sglang_engine.sglang_server_args``); the pools are real CPU tensors SGLang's
``KVCacheConfigurator`` allocates at small sizes (``sglang_engine.sglang_allocate``).
``deployment_from_sglang`` reads the Deployment a user would write by hand for the same
launch, ``plan_from_sglang`` plans what the planner plans (and sizes what SGLang sizes), and
``check_pools`` passes SGLang's own pools and refuses (``plan_mismatch``) each corrupted one,
naming the tensor and blaming the layer it serves.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
from sglang_engine import require_sglang

require_sglang()

import torch  # noqa: E402
from sglang_engine import (  # noqa: E402
    FIXTURES,
    GIB,
    MODEL_FILES,
    sglang_allocate,
    sglang_case,
    sglang_draft_model_config,
    sglang_server_args,
)

from k3layout import Deployment, Refusal, load_config, plan  # noqa: E402
from k3layout.engines.sglang import (  # noqa: E402
    SglangPlan,
    check_pools,
    deployment_from_sglang,
    plan_from_sglang,
)
from k3layout.errors import check_facts_violations  # noqa: E402

DSPARK_DRAFT = FIXTURES / "sglang-dspark-draft"
K3_MLA = tuple(i for i in range(93) if i % 4 == 3 or i == 92)
"""Kimi-K3's MLA layers (0-based): 3, 7, ..., 91 and 92."""


# --------------------------------------------------------------------------------------------
# deployment_from_sglang / plan_from_sglang
# --------------------------------------------------------------------------------------------

EAGLE3 = {"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}

# (id, model, gpu, sglang_server_args flags, the Deployment written by hand)
LAUNCHES: list[tuple[str, str, str, dict[str, Any], dict[str, Any]]] = [
    ("tp8", "kimi-k3", "h200", {"tp": 8}, {"attn_tp": 8}),
    (
        "tp1-bf16",
        "kimi-k3",
        "h100",
        {"tp": 1, "kv_dtype": "bf16"},
        {"attn_tp": 1, "kv_dtype": "bf16"},
    ),
    (
        "kv-auto",
        "kimi-k3",
        "h200",
        {"tp": 8, "kv_dtype": "auto"},
        {"attn_tp": 8, "kv_dtype": "bf16"},
    ),
    (
        "tp8-dp8-enable-dp-attention",
        "kimi-k3",
        "h200",
        {"tp": 8, "dp": 8, "enable_dp_attention": True},
        {"attn_tp": 1, "attn_dp": 8},
    ),
    (
        "tp16-dp2-enable-dp-attention",
        "kimi-k3",
        "h200",
        {"tp": 16, "dp": 2, "enable_dp_attention": True},
        {"attn_tp": 8, "attn_dp": 2},
    ),
    (
        "tp8-attn-dp-size8",
        "kimi-k3",
        "h200",
        {"tp": 8, "server_args": {"attn_dp_size": 8}},
        {"attn_tp": 1, "attn_dp": 8},
    ),
    ("pp2", "kimi-k3", "h200", {"tp": 8, "pp": 2}, {"attn_tp": 8, "pp": 2}),
    ("pp4", "kimi-k3", "b200", {"tp": 8, "pp": 4}, {"attn_tp": 8, "pp": 4}),
    ("dcp8", "kimi-k3", "b200", {"tp": 8, "dcp": 8}, {"attn_tp": 8, "dcp": 8}),
    ("eagle3", "kimi-k3", "h200", {"tp": 8, "spec": EAGLE3}, {"attn_tp": 8, "spec_tokens": 3}),
    (
        "dspark",
        "kimi-k3",
        "h200",
        {"tp": 8, "spec": {"algorithm": "DSPARK", "draft_model_path": DSPARK_DRAFT}},
        {"attn_tp": 8, "spec_tokens": 7},
    ),
    (
        "no-radix",
        "kimi-k3",
        "h200",
        {"tp": 8, "server_args": {"disable_radix_cache": True}},
        {"attn_tp": 8, "prefix_caching": False},
    ),
    (
        "memory-flags",
        "kimi-k3",
        "h200",
        {
            "tp": 8,
            "max_running_requests": 64,
            "mamba_full_memory_ratio": 0.5,
            "max_mamba_cache_size": 200,
        },
        {
            "attn_tp": 8,
            "max_running_requests": 64,
            "mamba_full_memory_ratio": 0.5,
            "max_mamba_cache_size": 200,
        },
    ),
    ("linear-tp4", "kimi-linear", "b200", {"tp": 4}, {"attn_tp": 4}),
]
LAUNCH_IDS = [launch[0] for launch in LAUNCHES]


@pytest.mark.parametrize(("name", "model", "gpu", "flags", "fields"), LAUNCHES, ids=LAUNCH_IDS)
def test_deployment_from_sglang_reads_the_deployment_written_by_hand(
    name: str, model: str, gpu: str, flags: dict[str, Any], fields: dict[str, Any]
) -> None:
    server_args, _ = sglang_server_args(MODEL_FILES[model], gpu=gpu, **flags)
    # the bridge plans for the SGLang release running here
    by_hand = Deployment(engine="sglang", engine_version="0.5.23", gpu=gpu, **fields)
    read = deployment_from_sglang(server_args, gpu)
    assert read == by_hand, f"{name}: read {_differ(read, by_hand)}"


@pytest.mark.parametrize(("name", "model", "gpu", "flags", "fields"), LAUNCHES, ids=LAUNCH_IDS)
def test_the_deployment_written_by_hand_is_the_parallelism_sglang_resolves(
    name: str, model: str, gpu: str, flags: dict[str, Any], fields: dict[str, Any]
) -> None:
    """The hand-written Deployments above are SGLang's own resolution of the same flags."""
    answer = sglang_case(MODEL_FILES[model], gpu=gpu, budget_bytes=60 * GIB, pools=False, **flags)
    assert "refused" not in answer, answer.get("refused")
    by_hand = Deployment(engine="sglang", gpu=gpu, **fields)
    draft_tokens = answer["speculative_num_draft_tokens"]
    assert (by_hand.attn_tp, by_hand.attn_dp, by_hand.pp, by_hand.dcp, by_hand.spec_tokens) == (
        answer["attn_tp_size"],
        answer["attn_dp_size"],
        answer["pp_size"],
        answer["attn_dcp_size"],
        draft_tokens - 1 if draft_tokens else 0,
    )
    assert by_hand.prefix_caching is not answer["disable_radix_cache"]


def _differ(got: Deployment, want: Deployment) -> dict[str, tuple[Any, Any]]:
    """The fields two deployments differ in: ``{field: (got, want)}``."""
    a, b = got.model_dump(), want.model_dump()
    return {name: (a[name], b[name]) for name in a if a[name] != b[name]}


BRIDGE_PLANS = [launch for launch in LAUNCHES if launch[0] != "dspark"]
"""(The DSpark draft is a second checkpoint: a target ``ModelConfig`` does not describe it;
the test after the next plans it from the draft runner's own ``ModelConfig``.)"""


@pytest.mark.parametrize(
    ("name", "model", "gpu", "flags", "fields"),
    BRIDGE_PLANS,
    ids=[launch[0] for launch in BRIDGE_PLANS],
)
def test_plan_from_sglang_plans_what_the_planner_plans_and_sizes_what_sglang_sizes(
    name: str, model: str, gpu: str, flags: dict[str, Any], fields: dict[str, Any]
) -> None:
    server_args, model_config = sglang_server_args(MODEL_FILES[model], gpu=gpu, **flags)
    bridged = plan_from_sglang(server_args, model_config, gpu)
    planned = plan(load_config(MODEL_FILES[model]), Deployment(engine="sglang", gpu=gpu, **fields))
    assert isinstance(planned, SglangPlan)
    assert bridged.deployment == planned.deployment, (
        f"{name}: bridged {_differ(bridged.deployment, planned.deployment)}"
    )
    assert bridged.model.layers == planned.model.layers
    assert bridged.model.model_type == planned.model.model_type
    assert bridged.groups == planned.groups
    assert bridged.stages == planned.stages
    assert (bridged.prefill_attention_backend, bridged.attention_backend, bridged.page_tokens) == (
        planned.prefill_attention_backend,
        planned.attention_backend,
        planned.page_tokens,
    )
    answer = sglang_case(MODEL_FILES[model], gpu=gpu, budget_bytes=60 * GIB, pools=False, **flags)
    cap = bridged.capacity(60 * GIB, answer["context_len"])
    assert (
        cap.max_total_num_tokens,
        cap.logical_tokens,
        cap.max_mamba_cache_size,
        cap.max_running_requests,
    ) == (
        answer["max_total_num_tokens"],
        answer["logical_max_total_num_tokens"],
        answer["max_mamba_cache_size"],
        answer["max_running_requests"],
    )


# --------------------------------------------------------------------------------------------
# check_pools on SGLang's own pools
# --------------------------------------------------------------------------------------------

SLOTS = 3
"""State slots of the small pools (the temporal state is ~0.8 MB a KDA layer and slot at
attention TP 8)."""


Key = tuple[tuple[str, Any], ...]


def _key(flags: dict[str, Any]) -> Key:
    """Flags as a cache key (the nested ``spec`` / ``server_args`` dicts as item tuples)."""
    return tuple(
        sorted(
            (name, tuple(sorted(value.items())) if isinstance(value, dict) else value)
            for name, value in flags.items()
        )
    )


def _flags(key: Key) -> dict[str, Any]:
    nested = ("spec", "server_args")
    return {name: dict(value) if name in nested else value for name, value in key}


def allocated(
    model: str = "kimi-k3", gpu: str = "h200", pp_rank: int = 0, **flags: Any
) -> dict[str, Any]:
    """SGLang's real CPU pools for a launch: 64 tokens, 2 requests, ``SLOTS`` state slots
    (allocated once per launch; a test that corrupts them restores them)."""
    return _allocated(model, gpu, pp_rank, _key(flags))


@functools.cache
def _allocated(model: str, gpu: str, pp_rank: int, key: Key) -> dict[str, Any]:
    return sglang_allocate(
        MODEL_FILES[model],
        gpu=gpu,
        pp_rank=pp_rank,
        max_total_num_tokens=64,
        max_running_requests=2,
        max_mamba_cache_size=SLOTS,
        **_flags(key),
    )


def bridged(model: str = "kimi-k3", gpu: str = "h200", **flags: Any) -> SglangPlan:
    """``plan_from_sglang`` of SGLang's own ServerArgs and ModelConfig for a launch."""
    return _bridged(model, gpu, _key(flags))


@functools.cache
def _bridged(model: str, gpu: str, key: Key) -> SglangPlan:
    server_args, model_config = sglang_server_args(MODEL_FILES[model], gpu=gpu, **_flags(key))
    return plan_from_sglang(server_args, model_config, gpu)


# (id, model, gpu, pp_rank, flags)
POOLS: list[tuple[str, str, str, int, dict[str, Any]]] = [
    ("k3-tp8-fp8-h200", "kimi-k3", "h200", 0, {"tp": 8}),
    ("k3-tp4-bf16-h200", "kimi-k3", "h200", 0, {"tp": 4, "kv_dtype": "bf16"}),
    ("k3-tp8-fp8-b200-page64", "kimi-k3", "b200", 0, {"tp": 8}),
    ("k3-tp8-pp2-stage0", "kimi-k3", "h200", 0, {"tp": 8, "pp": 2}),
    ("k3-tp8-pp2-stage1", "kimi-k3", "h200", 1, {"tp": 8, "pp": 2}),
    ("k3-tp16-dp2", "kimi-k3", "h200", 0, {"tp": 16, "dp": 2, "enable_dp_attention": True}),
    ("k3-tp8-dcp8-b200", "kimi-k3", "b200", 0, {"tp": 8, "dcp": 8}),
    ("linear-tp4-fp8-h200", "kimi-linear", "h200", 0, {"tp": 4}),
    ("linear-tp8-eagle3", "kimi-linear", "h200", 0, {"tp": 8, "spec": EAGLE3}),
]


@pytest.mark.parametrize(
    ("name", "model", "gpu", "pp_rank", "flags"), POOLS, ids=[case[0] for case in POOLS]
)
def test_check_pools_passes_the_pools_sglang_allocates(
    name: str, model: str, gpu: str, pp_rank: int, flags: dict[str, Any]
) -> None:
    pools = allocated(model, gpu, pp_rank, **flags)
    p = bridged(model, gpu, **flags)
    assert check_pools(p, pools["req_to_token_pool"], pools["token_to_kv_pool"], stage=pp_rank) is p
    # The pools are the stage's: its MLA layers' kv_buffers and its KDA layers' state.
    mla = tuple(layer for g in p.stage(pp_rank).groups_of("attention") for layer in g.layers)
    assert tuple(pools["token_to_kv_pool"].full_attention_layer_id_mapping) == mla
    assert len(pools["kv_buffer"]) == len(mla)
    kda = tuple(layer for g in p.groups_of("kda", pp_rank) for layer in g.layers)
    assert tuple(pools["mamba_pool"].mamba_layer_ids) == kda


# --------------------------------------------------------------------------------------------
# check_pools on corrupted pools: a named refusal blaming the right layer
# --------------------------------------------------------------------------------------------


def _k3_tp8() -> tuple[SglangPlan, dict[str, Any]]:
    return bridged(tp=8), allocated(tp=8)


def _refusal(p: SglangPlan, pools: dict[str, Any], stage: int = 0) -> Refusal:
    with pytest.raises(Refusal) as caught:
        check_pools(p, pools["req_to_token_pool"], pools["token_to_kv_pool"], stage=stage)
    refusal = caught.value
    assert refusal.code == "plan_mismatch", refusal
    assert check_facts_violations(refusal.facts) == [], refusal.facts
    assert refusal.facts["check"] == "check_pools"
    return refusal


def _replace_kv_buffer(
    monkeypatch: pytest.MonkeyPatch, pools: dict[str, Any], index: int, tensor: torch.Tensor | None
) -> None:
    full = pools["token_to_kv_pool"].full_kv_pool
    buffers = list(full.kv_buffer)
    if tensor is None:
        del buffers[index]
    else:
        buffers[index] = tensor
    monkeypatch.setattr(full, "kv_buffer", buffers)


def _replace_state(monkeypatch: pytest.MonkeyPatch, pools: dict[str, Any], **tensors: Any) -> None:
    mamba = pools["mamba_pool"]
    monkeypatch.setattr(mamba, "mamba_cache", dataclasses.replace(mamba.mamba_cache, **tensors))


@pytest.mark.parametrize("index", [0, 5, 23])
def test_a_kv_buffer_of_the_wrong_dtype_is_refused_blaming_its_mla_layer(
    index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    p, pools = _k3_tp8()
    good = pools["kv_buffer"][index]
    _replace_kv_buffer(monkeypatch, pools, index, torch.zeros(good.shape, dtype=torch.bfloat16))
    refusal = _refusal(p, pools)
    assert refusal.facts["layer"] == K3_MLA[index]
    assert (refusal.facts["layer_name"], refusal.facts["field"]) == (f"kv_buffer[{index}]", "dtype")
    assert (refusal.facts["expected"], refusal.facts["actual"]) == ("uint8", "bfloat16")


def test_a_kv_buffer_of_the_wrong_shape_is_refused_blaming_its_mla_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, pools = _k3_tp8()
    good = pools["kv_buffer"][7]
    _replace_kv_buffer(
        monkeypatch, pools, 7, torch.zeros((good.shape[0], 1, 512), dtype=good.dtype)
    )
    refusal = _refusal(p, pools)
    assert refusal.facts["layer"] == K3_MLA[7] == 31
    assert (refusal.facts["layer_name"], refusal.facts["field"]) == ("kv_buffer[7]", "shape")


def test_a_missing_kv_buffer_is_refused_blaming_the_mla_layer_left_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, pools = _k3_tp8()
    _replace_kv_buffer(monkeypatch, pools, 23, None)
    refusal = _refusal(p, pools)
    assert refusal.facts["layer"] == 92
    assert refusal.facts["field"] == "count"
    assert (refusal.facts["expected"], refusal.facts["actual"]) == (24, 23)


def test_a_non_contiguous_kv_buffer_view_is_refused_blaming_its_mla_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, pools = _k3_tp8()
    good = pools["kv_buffer"][2]
    wide = torch.zeros((good.shape[0], 1, 2 * good.shape[2]), dtype=good.dtype)
    view = wide[:, :, ::2]
    assert view.shape == good.shape and not view.is_contiguous()
    _replace_kv_buffer(monkeypatch, pools, 2, view)
    refusal = _refusal(p, pools)
    assert refusal.facts["layer"] == K3_MLA[2] == 11
    assert (refusal.facts["layer_name"], refusal.facts["field"]) == ("kv_buffer[2]", "strides")


def test_a_conv_state_of_the_wrong_slot_count_is_refused_blaming_the_stages_first_kda_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, pools = _k3_tp8()
    good = pools["conv"][0]
    shape = (good.shape[0], good.shape[1] + 1, *good.shape[2:])
    _replace_state(monkeypatch, pools, conv=[torch.zeros(shape, dtype=good.dtype)])
    refusal = _refusal(p, pools)
    assert refusal.facts["layer"] == 0
    assert (refusal.facts["layer_name"], refusal.facts["field"]) == ("conv[0]", "shape")
    assert refusal.facts["actual"] == shape


def test_a_temporal_state_of_the_wrong_dtype_is_refused_blaming_the_stages_first_kda_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, pools = _k3_tp8()
    _replace_state(monkeypatch, pools, temporal=pools["temporal"].to(torch.bfloat16))
    refusal = _refusal(p, pools)
    assert refusal.facts["layer"] == 0
    assert (refusal.facts["layer_name"], refusal.facts["field"]) == ("temporal", "dtype")
    assert (refusal.facts["expected"], refusal.facts["actual"]) == ("float32", "bfloat16")


def test_a_non_contiguous_temporal_state_view_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, pools = _k3_tp8()
    view = pools["temporal"].transpose(-1, -2)  # [.., K, V] -> [.., V, K]: same shape (128 x 128)
    assert view.shape == pools["temporal"].shape and not view.is_contiguous()
    _replace_state(monkeypatch, pools, temporal=view)
    refusal = _refusal(p, pools)
    assert refusal.facts["layer"] == 0
    assert (refusal.facts["layer_name"], refusal.facts["field"]) == ("temporal", "strides")


def test_one_kv_buffer_bound_to_two_mla_layers_is_refused_as_an_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SGLang's own pools with kv_buffer[0] passed for the second MLA layer too: its shape,
    dtype and strides are right; two layers would write the same KV."""
    p, pools = _k3_tp8()
    _replace_kv_buffer(monkeypatch, pools, 1, pools["kv_buffer"][0])
    refusal = _refusal(p, pools)
    assert (refusal.facts["field"], refusal.facts["layer"], refusal.facts["other_layer"]) == (
        "overlap",
        K3_MLA[1],
        "kv_buffer[0]",
    )
    assert refusal.facts["actual"] == pools["kv_buffer"][0].untyped_storage().nbytes()


def test_pool_tensors_sharing_one_storage_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The conv and recurrent states cut from one storage: the recurrent state does not start
    where an allocation starts, and a conv state laid over the recurrent one overlaps it."""
    p, pools = _k3_tp8()
    conv, temporal = pools["conv"][0], pools["temporal"]
    whole = torch.zeros(conv.numel() * 2 + temporal.numel() * 4, dtype=torch.uint8)
    cut_conv = whole[: conv.numel() * 2].view(torch.bfloat16).view(conv.shape)
    cut_temporal = whole[conv.numel() * 2 :].view(torch.float32).view(temporal.shape)
    _replace_state(monkeypatch, pools, conv=[cut_conv], temporal=cut_temporal)
    refusal = _refusal(p, pools)
    assert (refusal.facts["layer_name"], refusal.facts["field"]) == ("temporal", "offset_bytes")
    assert refusal.facts["actual"] == conv.numel() * 2
    over_conv = whole.view(torch.float32)[: temporal.numel()].view(temporal.shape)
    _replace_state(monkeypatch, pools, conv=[cut_conv], temporal=over_conv)
    refusal = _refusal(p, pools)
    assert (refusal.facts["field"], refusal.facts["other_layer"]) == ("overlap", "conv[0]")


def test_pools_allocated_for_another_attention_tp_are_refused() -> None:
    """A plan at attention TP 8 against pools SGLang allocated at TP 4: the MLA latent is
    replicated (the kv_buffers agree), the KDA state is not: its conv channels double."""
    refusal = _refusal(bridged(tp=8), allocated(tp=4))
    assert refusal.facts["layer"] == 0
    assert (refusal.facts["layer_name"], refusal.facts["field"]) == ("conv[0]", "shape")
    assert (refusal.facts["expected"], refusal.facts["actual"]) == (
        (69, SLOTS + 1, 3, 4608),
        (69, SLOTS + 1, 3, 9216),
    )


@pytest.mark.parametrize(("planned_stage", "pool_stage", "blamed"), [(0, 1, 3), (1, 0, 47)])
def test_pools_of_another_pipeline_stage_are_refused_blaming_the_first_layer_they_lack(
    planned_stage: int, pool_stage: int, blamed: int
) -> None:
    """K3 on PP 2: stage 0 serves MLA layers 3..43, stage 1 47..92. Checked as the other
    stage's, the pools lack the planned stage's first MLA layer."""
    p = bridged(tp=8, pp=2)
    refusal = _refusal(p, allocated(tp=8, pp=2, pp_rank=pool_stage), stage=planned_stage)
    assert refusal.facts["layer"] == blamed, refusal


def test_plan_from_sglang_with_the_draft_runners_config_sizes_dspark_as_sglang_does() -> None:
    flags: dict[str, Any] = {
        "tp": 8,
        "spec": {"algorithm": "DSPARK", "draft_model_path": DSPARK_DRAFT},
    }
    server_args, model_config = sglang_server_args(MODEL_FILES["kimi-k3"], gpu="h200", **flags)
    draft_config = sglang_draft_model_config(server_args, "h200")
    bridged = plan_from_sglang(server_args, model_config, "h200", draft_config)
    assert len(bridged.model.draft_layers) == 5
    answer = sglang_case(
        MODEL_FILES["kimi-k3"], gpu="h200", budget_bytes=60 * GIB, pools=False, **flags
    )
    stage = answer["stages"][0]
    assert bridged.cell_bytes(0) == stage["cell_size"]
    cap = bridged.capacity(60 * GIB, answer["context_len"])
    assert (cap.max_total_num_tokens, cap.max_mamba_cache_size, cap.max_running_requests) == (
        stage["max_total_num_tokens"],
        stage["max_mamba_cache_size"],
        stage["max_running_requests"],
    )
