"""GLM-5.3-Flash on vLLM (0.33.0 or 0.34.0, whichever is installed): k3layout's packed plan
against vLLM's own planning, run on CPU by ``vllm_glm.plan_glm`` (its config objects,
block-size raise, cache specs, packed groups, ``KVCacheConfig``, scheduler concurrency and the
worker's bound views).

Every case compares, or both refuse: the sparse backend, the layout, the block, the KDA page
vLLM pads to, every group (kind and module layers, in vLLM's order), every stage's block
stride and the blocks a budget buys, every cache layer's byte offset inside a block and its
page (latent, pooled keys, tail ring, KDA state) as vLLM's own views bind them, the distinct
pages the plan reports (``VllmPlan.pages``: those of vLLM's cache layers, no other), the blocks
a request holds per group and vLLM's max concurrency. Every ``--attention-backend`` by cache
dtype: ``test_conformance_glm_backends.py``.
"""

from __future__ import annotations

import copy
import itertools
import json
from functools import cache
from typing import Any, cast

import pytest
from vllm_required import require_vllm, running

require_vllm()
RELEASE = running()
"""The vLLM release installed, which k3layout plans for."""

import torch  # noqa: E402
from glm_variants import VARIANTS, variant_id  # noqa: E402
from huggingface_hub.errors import StrictDataclassClassValidationError  # noqa: E402
from vllm_glm import FIXTURE, bound_views, plan_glm  # noqa: E402

from k3layout import (  # noqa: E402
    Deployment,
    HybridModel,
    Refusal,
    model_from_config,
    plan,
    plan_vllm,
)
from k3layout.engines.vllm import (  # noqa: E402
    check_kv_cache_config,
    check_kv_caches,
    plan_from_vllm,
)
from k3layout.engines.vllm.bound import vllm_bound_views  # noqa: E402
from k3layout.engines.vllm.plugin import check_after_kv_cache_init  # noqa: E402
from k3layout.gpus import GpuName  # noqa: E402
from k3layout.torch import allocate, layer_parts, validate  # noqa: E402

BUDGET = 40 << 30
LENGTH = 8192
GPUS = {"h200": "H200", "b200": "B200"}
DTYPES = {"fp8": "fp8", "bf16": "bfloat16", "fp8_ds_mla": "fp8_ds_mla"}
ROLE_PART = {"latent": "latent", "k_cache": "index", "tail": "k", "kda": "conv"}


@cache
def glm(mtp_layers: int) -> HybridModel:
    """The fixture, declaring ``mtp_layers`` MTP layers (none: as it ships)."""
    config = json.loads(FIXTURE.read_text())
    if mtp_layers:
        config["text_config"]["num_nextn_predict_layers"] = mtp_layers
    return model_from_config(config, name="glm-5.3-flash")


Case = tuple[str, int, str, int, int, int, int, bool, int | None]
"""gpu, attention TP, cache dtype, spec tokens, MTP layers, PP, DCP, prefix caching, block."""


def grid() -> list[Case]:
    cases: list[Case] = []
    for gpu, tp, dtype, (spec, mtp), pp in itertools.product(
        GPUS, (1, 2, 4, 8, 16), DTYPES, ((0, 0), (1, 1), (2, 1), (3, 3)), (1, 2, 4)
    ):
        cases.append((gpu, tp, dtype, spec, mtp, pp, 1, True, None))
    for gpu, tp, dtype, spec in itertools.product(GPUS, (2, 8), DTYPES, (0, 2)):
        cases.append((gpu, tp, dtype, spec, 1 if spec else 0, 1, 2, True, None))
    for gpu, tp, dtype in itertools.product(GPUS, (1, 8), ("fp8", "bf16")):
        cases.append((gpu, tp, dtype, 0, 0, 1, 1, False, None))
    for gpu, tp, dtype in itertools.product(GPUS, (32, 64), DTYPES):  # every TP of 64 heads
        cases.append((gpu, tp, dtype, 0, 0, 1, 1, True, None))
    for block in (16, 64, 100, 256, 512, 768, 1000, 1024, 1280, 2048, 3000, 4096, 8192):
        cases.append(("h200", 8, "fp8", 0, 0, 1, 1, True, block))
    for block in (16, 32, 96, 1000, 1024, 2048):
        cases.append(("b200", 2, "bf16", 1, 1, 2, 1, True, block))
    return cases


def case_id(case: Case) -> str:
    gpu, tp, dtype, spec, mtp, pp, dcp, prefix, block = case
    return (
        f"{gpu}-tp{tp}-{dtype}-s{spec}m{mtp}-pp{pp}-dcp{dcp}"
        + ("" if prefix else "-noprefix")
        + ("" if block is None else f"-b{block}")
    )


def part_of(role: str) -> str:
    return ROLE_PART[role]


@pytest.mark.parametrize("case", grid(), ids=case_id)
def test_glm_plan_matches_vllm(case: Case) -> None:
    gpu, tp, dtype, spec, mtp, pp, dcp, prefix, block = case
    theirs = plan_glm(
        gpu=GPUS[gpu],
        tp=tp,
        kv_dtype=DTYPES[dtype],
        spec_tokens=spec,
        mtp_layers=mtp or None,
        dcp=dcp,
        pp=pp,
        prefix_caching=prefix,
        block_size=block,
        max_model_len=LENGTH,
        budget_bytes=BUDGET,
    )
    deployment = Deployment(
        engine_version=RELEASE,
        attn_tp=tp,
        gpu=gpu,
        kv_dtype=dtype,
        spec_tokens=spec,
        speculative_method="mtp" if spec else None,
        pp=pp,
        dcp=dcp,
        prefix_caching=prefix,
        block_tokens=block,
    )
    compare(theirs, glm(mtp), deployment)


@pytest.mark.parametrize(
    "variant",
    [(v, tp, d) for v in VARIANTS for tp, d in ((8, "fp8"), (2, "bf16"), (4, "fp8_ds_mla"))],
    ids=lambda c: f"{variant_id(c[0])}-tp{c[1]}-{c[2]}",
)
def test_config_variants_plan_as_vllm(variant: tuple[dict[str, Any], int, str]) -> None:
    fields, tp, dtype = variant
    config = json.loads(FIXTURE.read_text())
    config["text_config"].update(fields)
    try:
        theirs = plan_glm(
            tp=tp,
            kv_dtype=DTYPES[dtype],
            max_model_len=LENGTH,
            budget_bytes=BUDGET,
            config_override={"text_config": config["text_config"]},
        )
    except (ValueError, StrictDataclassClassValidationError) as error:  # transformers' config
        theirs = {"refused": f"{type(error).__name__}: {error}"}
    try:
        model = model_from_config(config, name="glm-variant")
    except Refusal as refusal:
        assert "refused" in theirs, f"k3layout refused the config, vLLM planned: {refusal}"
        return
    compare(
        theirs, model, Deployment(engine_version=RELEASE, attn_tp=tp, gpu="h200", kv_dtype=dtype)
    )


def compare(theirs: dict[str, Any], model: HybridModel, deployment: Deployment) -> None:
    """k3layout's plan of ``model`` for ``deployment`` against vLLM's (``plan_glm``): both
    refuse, or every group, stride, cache offset and page, blocks and concurrency agree."""
    assert "unsupported" not in theirs, theirs
    try:
        ours = plan_vllm(model, deployment)
        capacity = ours.capacity(BUDGET, LENGTH)
    except Refusal as refusal:
        assert "refused" in theirs, f"k3layout refused, vLLM planned: {refusal}"
        if refusal.code == "pp_unsupported":  # a later stage fails to load the model
            assert theirs["refused_at"] == "load", theirs
            assert "make_empty_intermediate_tensors" in theirs["refused"]
        return
    assert "refused" not in theirs, f"vLLM refused: {theirs['refused']}; k3layout planned"
    assert theirs["backend"] == ours.attention_backend
    assert theirs["kv_cache_layout"] == ours.kv_cache_layout == "BLHNC"
    assert theirs["block_size"] == ours.block_tokens
    assert theirs["mamba_page_size_padded"] == ours.page_bytes
    assert theirs["mamba_cache_mode"] == capacity.mamba_cache_mode
    assert theirs["mamba_block_size"] == capacity.kda_span_tokens
    assert theirs["kda_prefill_backend"] == capacity.kda_prefill_backend
    kinds = {"kda": "kda", "k_cache": "attention", "latent": "attention", "tail": "ring"}
    assert [
        ({kinds[role] for role in group["roles"]}, sorted(set(group["module_layers"])))
        for group in theirs["groups"]
    ] == [({group.kind}, sorted(group.layers)) for group in ours.groups]
    # every page vLLM keeps (each cache layer's spec) is one the plan reports, and no other
    assert {
        (kinds[layer["role"]], part_of(layer["role"]), layer["page_size_bytes"])
        for layer in theirs["layers"]
    } == {(page.kind, page.parts[0], page.page_bytes) for page in ours.pages}
    assert theirs["block_strides"] == [ours.stage_block_bytes(s.index) for s in ours.stages]
    assert theirs["num_blocks"] == capacity.num_blocks == ours.num_blocks(BUDGET)
    assert theirs["blocks_per_request"] == [g.blocks for g in capacity.blocks_per_request]
    assert theirs["max_concurrency"] == pytest.approx(capacity.max_concurrency)
    assert theirs["offset_rule_holds"]
    blocks = ours.num_blocks(BUDGET)
    for layer in theirs["layers"]:
        at = ours.byte_range(
            layer["module_layer"], part_of(layer["role"]), 1, blocks, layer["stage"]
        )
        stride = ours.stage_block_bytes(layer["stage"])
        assert (layer["bound_offset"] + stride, layer["bound_block_stride"]) == (
            at.offset_bytes,
            stride,
        ), layer["name"]
        page = layer["page_size_bytes"]
        if layer["role"] == "tail":
            tail = ours.byte_range(layer["module_layer"], "score", 1, blocks, layer["stage"])
            assert page == tail.end_bytes - at.offset_bytes
        elif layer["role"] == "kda":
            assert page == ours.page_bytes
            assert layer["real_page_size_bytes"] == ours.sizes.state_bytes
        else:
            assert page == at.size_bytes


@pytest.mark.parametrize(
    ("gpu", "auto"), [("h200", "bf16"), ("b200", "fp8")], ids=["sm90-auto-bf16", "sm100-auto-fp8"]
)
def test_auto_is_the_gpus_dtype(gpu: str, auto: str) -> None:
    """vLLM's ``auto`` cache dtype is bf16 on SM90 and fp8 on SM100 for this model: k3layout's
    plan of that dtype is what vLLM plans for ``auto``."""
    theirs = plan_glm(gpu=GPUS[gpu], tp=8, kv_dtype="auto", max_model_len=LENGTH)
    ours = plan_vllm(glm(0), Deployment(engine_version=RELEASE, attn_tp=8, gpu=gpu, kv_dtype=auto))
    assert (theirs["block_size"], theirs["num_blocks"]) == (
        ours.block_tokens,
        ours.num_blocks(BUDGET),
    )


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"kv_cache_layout": "LBNHC"}, "kv_cache_layout"),
        ({"spec_tokens": 2}, "num_nextn_predict_layers"),
    ],
    ids=["lbnhc", "mtp-without-modules"],
)
def test_refused_as_vllm_refuses(settings: dict[str, Any], field: str) -> None:
    """What vLLM refuses at start-up, k3layout refuses: VLLM_KV_CACHE_LAYOUT=LBNHC (the tail
    ring's backend takes BLHNC only), MTP on a checkpoint declaring no MTP layers."""
    theirs = plan_glm(
        tp=8,
        spec_tokens=settings.get("spec_tokens", 0),
        kv_cache_layout=settings.get("kv_cache_layout"),
    )
    assert "refused" in theirs
    if field == "num_nextn_predict_layers":
        assert field in theirs["refused"]
    deployment = Deployment(
        engine_version=RELEASE,
        attn_tp=8,
        speculative_method="mtp" if settings.get("spec_tokens") else None,
        **settings,
    )
    with pytest.raises(Refusal):
        plan(glm(0), deployment)


def test_kpool_tail_required() -> None:
    config = json.loads(FIXTURE.read_text())
    config["text_config"]["index_kpool_always_select_tail"] = False
    theirs = plan_glm(
        tp=8, config_override={"text_config": {"index_kpool_always_select_tail": False}}
    )
    assert "NotImplementedError" in theirs["refused"]
    with pytest.raises(Refusal) as caught:
        plan(model_from_config(config), Deployment(engine_version=RELEASE, attn_tp=8))
    assert caught.value.facts["field"] == "index_kpool_always_select_tail"


BRIDGE_CASES = [
    ("h200", 8, "fp8", 0, 0, 1, 1),
    ("h200", 2, "bf16", 2, 1, 1, 1),
    ("h200", 8, "fp8_ds_mla", 0, 0, 1, 2),
    ("b200", 4, "fp8", 3, 3, 1, 1),
    ("b200", 8, "bf16", 1, 1, 1, 2),
]


@pytest.mark.parametrize("case", BRIDGE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_bridge_plans_vllms_config_and_checks_its_kv_cache_configs(
    case: tuple[str, int, str, int, int, int, int],
) -> None:
    """``plan_from_vllm`` reads GLM-5.3-Flash's engine config as vLLM built it, and
    ``check_kv_cache_config`` accepts every stage's ``KVCacheConfig`` vLLM planned (its groups,
    backing size and every cache's offset and strides), and refuses one whose tensor is moved."""
    name, tp, dtype, spec, mtp, pp, dcp = case
    gpu = cast("GpuName", name)
    theirs = plan_glm(
        gpu=GPUS[gpu],
        tp=tp,
        kv_dtype=DTYPES[dtype],
        spec_tokens=spec,
        mtp_layers=mtp or None,
        pp=pp,
        dcp=dcp,
        objects=True,
    )
    engine = theirs["objects"]
    ours = plan_from_vllm(engine["config"], gpu=gpu)
    expected = plan_vllm(
        glm(mtp),
        Deployment(
            engine_version=RELEASE,
            attn_tp=tp,
            gpu=gpu,
            kv_dtype=dtype,
            spec_tokens=spec,
            pp=pp,
            dcp=dcp,
        ),
    )
    assert ours.model.layers == expected.model.layers
    assert ours.model.draft_layers == expected.model.draft_layers
    assert (ours.block_tokens, ours.block_bytes, ours.groups) == (
        expected.block_tokens,
        expected.block_bytes,
        expected.groups,
    )
    for stage, kv_cache_config in enumerate(engine["kv_cache_configs"]):
        assert check_kv_cache_config(engine["config"], kv_cache_config, stage, gpu=gpu) == ours
    moved = copy.deepcopy(engine["kv_cache_configs"][0])
    moved.kv_cache_tensors[-1].offset += 512
    with pytest.raises(Refusal) as caught:
        check_kv_cache_config(engine["config"], moved, 0, gpu=gpu)
    assert caught.value.code == "plan_mismatch"


def test_startup_check_passes_vllms_own_caches() -> None:
    """The plugin's check on a GLM-5.3-Flash worker (H200, fp8, TP 8): the KV-cache config
    and the caches as vLLM binds them pass (one log line, the plan returned); a config with a
    moved tensor stops the start-up (``plan_mismatch``)."""
    case = {"gpu": "H200", "tp": 8, "kv_dtype": "fp8"}
    engine, kv_cache_config, caches = _bound_caches(case)
    assert check_after_kv_cache_init(engine["config"], kv_cache_config, caches, 0) is not None
    moved = copy.deepcopy(kv_cache_config)
    moved.kv_cache_tensors[0].offset += 512
    with pytest.raises(Refusal) as caught:
        check_after_kv_cache_init(engine["config"], moved, caches, 0)
    assert caught.value.code == "plan_mismatch"


VIEW_CASES = [
    {"gpu": "H200", "tp": 8, "kv_dtype": "fp8"},
    {"gpu": "H200", "tp": 8, "kv_dtype": "bfloat16"},
    {"gpu": "H200", "tp": 8, "kv_dtype": "fp8_ds_mla"},
    {"gpu": "B200", "tp": 8, "kv_dtype": "fp8"},
    {"gpu": "H200", "tp": 1, "kv_dtype": "fp8"},
    {"gpu": "H200", "tp": 1, "kv_dtype": "fp8", "block_size": 1024},
    {"gpu": "H200", "tp": 8, "kv_dtype": "fp8", "spec_tokens": 2, "mtp_layers": 1},
    {"gpu": "B200", "tp": 2, "kv_dtype": "fp8", "spec_tokens": 3, "mtp_layers": 3},
    {"gpu": "B200", "tp": 4, "kv_dtype": "bfloat16", "spec_tokens": 1, "mtp_layers": 1},
]


def _ours(case: dict[str, Any]) -> Any:
    gpu = next(name for name, label in GPUS.items() if label == case["gpu"])
    dtype = next(name for name, label in DTYPES.items() if label == case["kv_dtype"])
    spec = case.get("spec_tokens", 0)
    deployment = Deployment(
        engine_version=RELEASE,
        attn_tp=case["tp"],
        gpu=gpu,
        kv_dtype=dtype,
        spec_tokens=spec,
        speculative_method="mtp" if spec else None,
        pp=case.get("pp", 1),
        block_tokens=case.get("block_size"),
    )
    return plan(glm(case.get("mtp_layers", 0)), deployment)


@pytest.mark.parametrize("case", VIEW_CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_bound_views_are_the_ones_vllm_binds(case: dict[str, Any]) -> None:
    """Every cache layer's view, as vLLM's V2 model runner passes it to the layer's
    ``bind_kv_cache`` (``vllm_glm.bound_views`` runs vLLM's allocation, kernel-block mapping
    and binding): its name, dtype, shape, strides and offset in the backing; the pooled keys
    split into the indexer's kernel pages where the block is not one."""
    theirs = bound_views(**case)
    ours = _ours(case)
    for stage in theirs["stages"]:
        index = theirs["stages"].index(stage)
        views = {v.name: v for v in vllm_bound_views(ours, stage["num_blocks"], index)}
        assert set(views) == set(stage["layers"])
        for name, layer in stage["layers"].items():
            view = views[name]
            assert (view.dtype, list(view.shape), list(view.strides), view.offset_bytes) == (
                layer["dtype"],
                layer["shape"],
                layer["strides"],
                layer["offset_bytes"],
            ), name
            if "kernel_block_stride" in layer:
                assert view.entries_per_block == layer["kernel_block_stride"], name


@pytest.mark.parametrize("case", VIEW_CASES[:4], ids=lambda c: "-".join(map(str, c.values())))
def test_check_kv_caches_accepts_vllms_bound_caches(case: dict[str, Any]) -> None:
    """``check_kv_caches`` (the plugin's check) on tensors laid over one ``meta`` backing as
    vLLM's binding lays them: accepted, KDA states cut by vLLM's own spec included; a latent
    one block off is refused."""
    engine, kv_cache_config, caches = _bound_caches(case)
    gpu = cast("GpuName", next(n for n, label in GPUS.items() if label == case["gpu"]))
    assert check_kv_caches(engine["config"], kv_cache_config, caches, 0, gpu=gpu).packed
    latent = next(n for n in caches if n.endswith(".attn"))
    caches[latent] = torch.as_strided(
        caches[latent],
        caches[latent].shape,
        caches[latent].stride(),
        caches[latent].storage_offset() + caches[latent].stride(0),  # one block on
    )
    with pytest.raises(Refusal):
        check_kv_caches(engine["config"], kv_cache_config, caches, 0, gpu=gpu)


ADAPTER_CASES = [VIEW_CASES[i] for i in (0, 2, 5, 6, 8)]


@pytest.mark.parametrize("case", ADAPTER_CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_adapter_validates_and_cuts_vllms_bound_caches(case: dict[str, Any]) -> None:
    """The torch adapter on the caches vLLM binds: ``validate`` accepts them, the parts it cuts
    are the KDA states vLLM's layers cut (dtype, shape, strides, offset) and the halves of
    vLLM's tail ring, and ``allocate`` lays every part where vLLM's views put it."""
    their = bound_views(**case)["stages"][0]["layers"]
    _, _, caches = _bound_caches(case)
    ours = _ours(case)
    live = validate(ours, caches)
    mine = allocate(ours, live.spec.num_blocks, names=live.names, device="meta")
    origin = mine.planes[0].data_ptr()
    backing = next(iter(caches.values())).untyped_storage().data_ptr()
    for layer in live.spec.layers:
        parts = layer_parts(live, caches, layer.name)
        at = [t.data_ptr() - backing for t in parts]
        assert at == [t.data_ptr() - origin for t in mine.layers[layer.name]], layer.name
        if layer.kind == "kda":
            states = their[layer.name]["states"]
            assert [
                (str(t.dtype).removeprefix("torch."), list(t.shape), list(t.stride()), a)
                for t, a in zip(parts, at, strict=True)
            ] == [(s["dtype"], s["shape"], s["strides"], s["offset_bytes"]) for s in states]
        if layer.kind == "ring":
            bound = their[layer.name]["bound"]
            half = parts[1].data_ptr() - parts[0].data_ptr()
            assert (at[0], half) == (bound["offset_bytes"], bound["strides"][1] * 2)


def _bound_caches(case: dict[str, Any]) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """vLLM's engine objects for ``case`` and stage 0's caches: tensors over one ``meta``
    backing, each the view vLLM's binding gives its layer (``vllm_glm.bound_views``)."""
    stage = bound_views(**case)["stages"][0]
    engine = plan_glm(**case, objects=True)["objects"]
    kv_cache_config = engine["kv_cache_configs"][0]
    size = max(t.size for t in kv_cache_config.kv_cache_tensors)
    backing = torch.empty(size, dtype=torch.int8, device="meta")
    caches = {
        name: torch.as_strided(
            backing.view(getattr(torch, layer["dtype"])),
            layer["shape"],
            layer["strides"],
            layer["offset_bytes"] // layer["element_size"],
        )
        for name, layer in stage["layers"].items()
    }
    return engine, kv_cache_config, caches


SETTINGS_CASES = [
    # gpu, tp, dtype, spec, pp, dcp, KDA prefill backend, prefix caching, max_model_len
    ("H200", 8, "fp8", 0, 1, 1, "triton", True, 4096),
    ("B200", 4, "bfloat16", 2, 1, 1, "triton", True, 65536),
    ("H200", 2, "fp8_ds_mla", 1, 1, 2, "auto", False, 65536),
    ("B200", 16, "fp8", 2, 1, 2, "auto", False, 4096),
    ("H200", 1, "bfloat16", 0, 1, 1, "triton", False, 131072),
]


@pytest.mark.parametrize("case", SETTINGS_CASES, ids=lambda c: "-".join(map(str, c)))
def test_kda_backend_and_lengths(case: tuple[Any, ...]) -> None:
    """The settings the main grid holds fixed: the Triton KDA prefill (no checkpoint block),
    other request lengths, with and without prefix caching."""
    gpu, tp, dtype, spec, pp, dcp, kda, prefix, length = case
    theirs = plan_glm(
        gpu=gpu,
        tp=tp,
        kv_dtype=dtype,
        spec_tokens=spec,
        mtp_layers=1 if spec else None,
        pp=pp,
        dcp=dcp,
        prefix_caching=prefix,
        max_model_len=length,
        kda_prefill_backend=kda,
    )
    assert "refused" not in theirs, theirs
    deployment = Deployment(
        engine_version=RELEASE,
        attn_tp=tp,
        gpu=cast("GpuName", gpu.lower()),
        kv_dtype=next(name for name, label in DTYPES.items() if label == dtype),
        spec_tokens=spec,
        speculative_method="mtp" if spec else None,
        pp=pp,
        dcp=dcp,
        prefix_caching=prefix,
        kda_prefill_backend=kda,
    )
    ours = plan_vllm(glm(1 if spec else 0), deployment)
    capacity = ours.capacity(BUDGET, length)
    assert (theirs["block_size"], theirs["kda_prefill_backend"]) == (
        ours.block_tokens,
        capacity.kda_prefill_backend,
    )
    assert theirs["block_strides"] == [ours.stage_block_bytes(s.index) for s in ours.stages]
    assert theirs["num_blocks"] == capacity.num_blocks
    assert theirs["blocks_per_request"] == [g.blocks for g in capacity.blocks_per_request]
    assert theirs["max_concurrency"] == pytest.approx(capacity.max_concurrency)
