"""GLM-5.3-Flash (``glm5_next``): its config loader, its cache parts (pooled indexer keys, the
tail ring) and vLLM's packed layout of it (0.33.0 and 0.34.0 alike), its sparse MLA backends
and the pages it keeps, against the figures vLLM's own code gave on CPU
(``tests/fixtures/glm-5.3-flash/vllm-0.33-notes.md``; the conformance suites run vLLM again:
``tests/conformance/test_conformance_glm.py``, ``test_conformance_glm_backends.py``)."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import (
    Deployment,
    Refusal,
    load_config,
    load_plan,
    model_from_config,
    plan,
    plan_ride,
    plan_sglang,
    plan_transfer,
    plan_vllm,
    preset,
    weights_per_rank,
)
from k3layout.cache import DSAIndexer, ring_spec, ring_tokens
from k3layout.engines.vllm.report import VllmReport
from k3layout.layouts.report import REPORT_ADAPTER, report
from k3layout.transfer import transfer_violations

FIXTURE = Path(__file__).parent / "fixtures" / "glm-5.3-flash" / "config.json"
SHARED = Path(__file__).parents[2] / "shared" / "fixtures" / "glm-5.3-flash.config.json"


def config(**text: Any) -> dict[str, Any]:
    """The fixture with ``text`` replacing fields of its ``text_config`` (``None`` drops)."""
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    inner = data["text_config"]
    for key, value in text.items():
        if value is None:
            inner.pop(key, None)
        else:
            inner[key] = value
    return data


def glm(mtp_layers: int = 0) -> Any:
    return model_from_config(config(num_nextn_predict_layers=mtp_layers or None), name="glm")


def test_preset_is_the_fixture() -> None:
    assert load_config(FIXTURE) == preset("glm-5.3-flash")
    if SHARED.exists():
        assert load_config(SHARED).layers == preset("glm-5.3-flash").layers


def test_layers_follow_layer_types() -> None:
    model = preset("glm-5.3-flash")
    assert model.model_type == "glm5_next"
    assert [i for i, layer in enumerate(model.layers) if layer.kind == "mla"] == list(
        range(3, 45, 4)
    )
    mla, kda = model.mla_layers[0], model.kda_layers[0]
    assert (mla.num_heads, mla.latent_dim, mla.qk_rope_head_dim) == (64, 512, 0)
    assert mla.indexer == DSAIndexer(head_dim=128, num_heads=32, topk=2048, kpool=16)
    assert (kda.num_heads, kda.head_dim, kda.conv_kernel, kda.safe_gate) == (64, 128, 4, True)
    assert model.draft_layers == () and model.drafter is None


def test_flat_form_and_full_attention() -> None:
    nested = json.loads(FIXTURE.read_text())
    flat = {**nested["text_config"], "model_type": "glm5_next"}
    flat["layer_types"] = [
        "full_attention" if kind == "indexed_attention" else kind for kind in flat["layer_types"]
    ]
    assert model_from_config(flat).layers == preset("glm-5.3-flash").layers


def test_default_layer_types_are_transformers() -> None:
    assert glm().layers == model_from_config(config(layer_types=None)).layers


def test_mtp_layers_join_as_draft() -> None:
    model = glm(mtp_layers=2)
    assert len(model.draft_layers) == 2 and model.drafter == "mtp"
    assert model.draft_layers[0] == model.mla_layers[0]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"layer_types": ["linear_attention"] * 44}, "text_config.layer_types"),
        ({"indexer_types": ["full"] * 46}, "text_config.indexer_types"),
        ({"layer_types": ["linear_attention"] * 45}, "text_config.layer_types"),
        ({"layer_types": ["sliding_attention"] * 45}, "text_config.layer_types.0"),
        ({"index_topk": 2047}, "text_config.index_topk"),
        ({"qk_rope_head_dim": 64}, "text_config.qk_rope_head_dim"),
        ({"num_key_value_heads": 8}, "text_config.num_key_value_heads"),
        ({"q_lora_rank": None}, "text_config.q_lora_rank"),
        ({"indexer_types": ["shared"] * 45}, "text_config.indexer_types.3"),
        ({"index_kpool": 0}, "text_config.index_kpool"),
        ({"mlp_layer_types": ["dense"] * 44}, "text_config.mlp_layer_types"),
        ({"mlp_layer_types": ["moe"] * 45}, "text_config.mlp_layer_types.0"),
        ({"hc_mult": 0}, "text_config.hc_mult"),
        ({"mhc": "yes"}, "text_config.mhc"),
    ],
)
def test_bad_config_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(Refusal) as caught:
        model_from_config(config(**fields))
    assert caught.value.code == "invalid_config"
    assert caught.value.facts["field"] == field


def test_a_bad_vision_field_is_refused_naming_it() -> None:
    data = config()
    data["vision_config"]["depth"] = "24"
    with pytest.raises(Refusal) as caught:
        model_from_config(data)
    assert (caught.value.code, caught.value.facts["field"]) == (
        "invalid_config",
        "vision_config.depth",
    )


def test_the_weights_read_what_the_config_says() -> None:
    arch = model_from_config(config(mhc=False, topk_method="noaux_tc")).architecture
    assert arch is not None
    assert (arch.hyper_connections, arch.router_bias) == (0, True)
    assert "mhc" not in arch.undeclared and "topk_method" not in arch.undeclared
    assert arch.mlp_layer_types == ("dense",) * 3 + ("sparse",) * 42
    assert [arch.is_moe_layer(i) for i in (2, 3, 45)] == [False, True, True]  # 45: an MTP layer
    default = model_from_config(config(mlp_layer_types=None)).architecture
    assert default is not None and default.mlp_layer_types == arch.mlp_layer_types
    assert model_from_config(config()).architecture == preset("glm-5.3-flash").architecture


def test_indexer_and_ring_parts() -> None:
    indexer = preset("glm-5.3-flash").mla_layers[0].indexer
    assert indexer is not None and indexer.entry_bytes == 132
    spec = preset("glm-5.3-flash").mla_layers[0].cache_spec(Deployment(attn_tp=8))
    ranges = spec.ranges(8, 1536)
    assert [(r.part, r.size_bytes) for r in ranges] == [("latent", 786432), ("index", 12672)]
    assert spec.bytes_per_token(8) == 512  # the pooled keys are not a per-token row
    assert spec.tokens_bytes(8, 17) == 17 * 512 + 2 * 132
    with pytest.raises(Refusal):
        spec.ranges(8, 8)
    assert [ring_tokens(16, s) for s in (0, 1, 16, 17, 48, 49)] == [16, 32, 32, 64, 64, 128]
    assert ring_spec(indexer, 0).payload_bytes(8) == 8192
    assert ring_spec(indexer, 2).payload_bytes(1) == 16384


# vLLM 0.33.0's own planning on CPU (the notes' table): gpu, kv, tp, spec tokens, MTP layers ->
# block, KDA padded page, groups (layers each), block stride, num_blocks of 40 GiB.
VLLM_GOLDEN = [
    ("h200", "fp8", 1, 0, 0, 8704, 4456448, (9, 9, 8, 8, 11, 11), 49826304, 861),
    ("h200", "fp8", 2, 2, 1, 4608, 2359296, (12, 11, 11, 12, 12), 28773888, 1492),
    ("h200", "fp8", 4, 0, 0, 2560, 1310720, (9, 9, 8, 8, 11, 11), 14665728, 2928),
    ("h200", "fp8", 8, 0, 0, 1536, 786432, (9, 9, 8, 8, 11, 11), 8802816, 4879),
    ("h200", "fp8", 8, 2, 1, 1536, 786432, (12, 11, 11, 12, 12), 9596928, 4475),
    ("h200", "bf16", 1, 0, 0, 4608, 4718592, (9, 9, 8, 8, 11, 11), 52343808, 820),
    ("h200", "bf16", 8, 2, 1, 1024, 1048576, (12, 11, 11, 12, 12), 12684288, 3386),
    ("h200", "fp8_ds_mla", 1, 0, 0, 8704, 4456448, (12, 11, 11, 11, 11), 63731712, 673),
    ("h200", "fp8_ds_mla", 8, 0, 0, 1536, 786432, (12, 11, 11, 11, 11), 12469248, 3444),
    ("h200", "fp8_ds_mla", 8, 2, 1, 1536, 786432, (12, 11, 11, 12, 12), 12469248, 3444),
    ("b200", "fp8", 1, 2, 1, 8704, 4456448, (12, 11, 11, 12, 12), 54607872, 786),
    ("b200", "fp8", 8, 0, 0, 1536, 786432, (9, 9, 8, 8, 11, 11), 9191424, 4672),
    ("b200", "fp8", 8, 2, 1, 1536, 786432, (12, 11, 11, 12, 12), 9732096, 4413),
    ("b200", "bf16", 2, 0, 0, 2560, 2621440, (9, 9, 8, 8, 11, 11), 29196288, 1471),
    ("b200", "bf16", 8, 0, 0, 1024, 1048576, (9, 9, 8, 8, 11, 11), 11632640, 3692),
]


@pytest.mark.parametrize("case", VLLM_GOLDEN, ids=lambda case: "-".join(map(str, case[:5])))
def test_vllm_packed_layout(case: tuple[Any, ...]) -> None:
    gpu, kv, tp, spec, mtp, block, page, groups, stride, blocks = case
    deployment = Deployment(attn_tp=tp, gpu=gpu, kv_dtype=kv, spec_tokens=spec)
    result = plan_vllm(glm(mtp), deployment)
    assert (result.block_tokens, result.page_bytes) == (block, page)
    assert tuple(len(g.layers) for g in result.groups) == groups
    assert (result.block_bytes, result.num_blocks(40 << 30)) == (stride, blocks)
    assert result.kv_cache_layout == "BLHNC" and result.packed


@pytest.mark.parametrize(
    ("gpu", "length", "concurrency"),
    [("h200", 8192, 256.79), ("h200", 131072, 49.28), ("b200", 131072, 47.19)],
)
def test_vllm_max_concurrency(gpu: str, length: int, concurrency: float) -> None:
    result = plan_vllm(preset("glm-5.3-flash"), Deployment(attn_tp=8, gpu=gpu))
    assert round(result.capacity(40 << 30, length).max_concurrency, 2) == concurrency


def test_mtp_concurrency() -> None:
    result = plan_vllm(glm(1), Deployment(attn_tp=8, spec_tokens=2))
    assert round(result.capacity(40 << 30, 131072).max_concurrency, 2) == 43.87


@pytest.mark.parametrize(
    ("deployment", "code"),
    [
        (Deployment(attn_tp=8, gpu="b200", kv_dtype="fp8_ds_mla"), "kernel_unsupported"),
        (Deployment(attn_tp=8, gpu="h200", kv_dtype="fp8", dcp=2), "kernel_unsupported"),
        (Deployment(attn_tp=8, gpu="a100"), "kernel_unsupported"),
        (Deployment(attn_tp=8, gpu="mi300x"), "kernel_unsupported"),
        (Deployment(attn_tp=8, attention_backend="FLASHMLA"), "kernel_unsupported"),
        (Deployment(attn_tp=8, kv_cache_layout="LBNHC"), "layout_unsupported"),
        (Deployment(attn_tp=8, spec_tokens=2, speculative_method="mtp"), "draft_unsupported"),
        (Deployment(attn_tp=3), "heads_not_divisible"),
        (Deployment(attn_tp=8, engine="sglang", dcp=2), "dcp_unsupported"),
        (Deployment(attn_tp=8, engine="sglang", mamba_track_interval=256), "engine_setting"),
        (Deployment(attn_tp=8, engine="sglang", kv_dtype="fp8_ds_mla"), "dtype_unsupported"),
        (Deployment(attn_tp=8, engine="tokenspeed"), "layout_unsupported"),
    ],
)
def test_refusals(deployment: Deployment, code: str) -> None:
    with pytest.raises(Refusal) as caught:
        plan(preset("glm-5.3-flash"), deployment)
    assert caught.value.code == code


# vLLM's selector for an indexed layer of head 512 (0.33.0 and 0.34.0 agree; run for every
# backend and cache dtype by tests/conformance/test_conformance_glm_backends.py): gpu, dcp ->
# the cache dtypes each sparse backend is planned for.
SPARSE_TAKES = {
    ("h200", 1): {
        "FLASHINFER_MLA_SPARSE_SM90": {"fp8", "bf16"},
        "FLASHMLA_SPARSE": {"bf16", "fp8_ds_mla"},
        "FLASHINFER_MLA_SPARSE": set(),
    },
    ("h200", 2): {  # SM90 FlashInfer takes no DCP
        "FLASHINFER_MLA_SPARSE_SM90": set(),
        "FLASHMLA_SPARSE": {"bf16", "fp8_ds_mla"},
        "FLASHINFER_MLA_SPARSE": set(),
    },
    ("b200", 1): {
        "FLASHINFER_MLA_SPARSE_SM90": set(),
        "FLASHMLA_SPARSE": set(),  # head 512 only on SM90
        "FLASHINFER_MLA_SPARSE": {"fp8", "bf16"},
    },
}


@pytest.mark.parametrize(("gpu", "dcp"), list(SPARSE_TAKES), ids=str)
def test_a_named_sparse_backend_is_planned_where_vllm_takes_it(gpu: str, dcp: int) -> None:
    model = preset("glm-5.3-flash")
    for backend, takes in SPARSE_TAKES[(gpu, dcp)].items():
        for dtype in ("fp8", "bf16", "fp8_ds_mla"):
            fields = {"attn_tp": 8, "gpu": gpu, "kv_dtype": dtype, "dcp": dcp}
            deployment = Deployment.model_validate({**fields, "attention_backend": backend})
            if dtype in takes:
                named = plan_vllm(model, deployment)
                assert named.attention_backend == backend
                auto = plan_vllm(model, Deployment.model_validate(fields))
                # the same layout as vLLM's own pick (FLASHMLA_SPARSE bf16 aligns its latent
                # blocks to one row, as SM90 FlashInfer does)
                assert (named.block_tokens, named.block_bytes, named.groups) == (
                    auto.block_tokens,
                    auto.block_bytes,
                    auto.groups,
                )
                continue
            with pytest.raises(Refusal) as caught:
                plan(model, deployment)
            assert caught.value.code == "kernel_unsupported"
            assert caught.value.facts == {
                "attention_backend": backend,
                "kv_dtype": dtype,
                "gpu": gpu,
                "dcp": dcp,
                "field": "attention_backend",
            }
            # the hint names every backend vLLM takes for the dtype here
            for other, other_takes in SPARSE_TAKES[(gpu, dcp)].items():
                if dtype in other_takes:
                    assert other in (caught.value.hint or "")


def test_flashmla_sparse_with_fp8_is_refused_naming_what_works() -> None:
    deployment = Deployment(attn_tp=8, kv_dtype="fp8", attention_backend="FLASHMLA_SPARSE")
    with pytest.raises(Refusal) as caught:
        plan(preset("glm-5.3-flash"), deployment)
    hint = caught.value.hint or ""
    assert "'bf16' or 'fp8_ds_mla' with FLASHMLA_SPARSE" in hint
    assert "FLASHINFER_MLA_SPARSE_SM90" in hint
    bf16 = plan_vllm(
        preset("glm-5.3-flash"),
        Deployment(attn_tp=8, kv_dtype="bf16", attention_backend="FLASHMLA_SPARSE"),
    )
    assert (bf16.attention_backend, bf16.block_tokens) == ("FLASHMLA_SPARSE", 1024)
    assert dict(bf16.launch_flags())["--attention-backend"] == "FLASHMLA_SPARSE"


def test_every_page_vllm_keeps_is_reported() -> None:
    """fp8_ds_mla at TP 8: vLLM's groups keep four page sizes (its KVCacheConfig specs), each
    reported once with the group kind and the parts it holds."""
    result = plan_vllm(preset("glm-5.3-flash"), Deployment(attn_tp=8, kv_dtype="fp8_ds_mla"))
    block = 1536
    assert [(p.kind, p.parts, p.page_bytes) for p in result.pages] == [
        ("kda", ("conv", "recurrent"), block * 512),  # padded to the latent's 1-byte elements
        ("attention", ("index",), block // 16 * 132),  # one 132-byte key per 16-token pool
        ("attention", ("latent",), block * (512 + 4 * 4 + 64 * 2)),  # 656-byte rows
        ("ring", ("k", "score"), 2 * 16 * 128 * 2),  # a 16-token ring of k and score, bf16
    ]
    written = report(result)
    assert isinstance(written, VllmReport) and written.pages == result.pages
    read = REPORT_ADAPTER.validate_json(written.model_dump_json())
    assert isinstance(read, VllmReport) and read.pages == result.pages
    # a page of every layer's cache: each part's byte range lies in one of them
    for group in result.groups:
        for layer in group.layers[:1]:
            for part in result.group_spec(group).part_names:
                size = result.byte_range(layer, part, 0, 1).size_bytes
                assert any(
                    part in p.parts and size <= p.page_bytes for p in result.pages
                ), (group.name, part)


# SGLang 0.5.23's own configurator on CPU (the notes' table): gpu, dtype, attention TP, PP,
# attention DP -> cell per stage, max_total_num_tokens, max_mamba_cache_size,
# max_running_requests of 40 GiB per rank at the model's context.
SGLANG_GOLDEN = [
    ("h200", "fp8", 1, 1, 1, (5907,), 3828736, 136, 27),
    ("h200", "bf16", 2, 1, 1, (11363,), 1990656, 273, 54),
    ("h200", "bf16", 4, 1, 1, (11363,), 1986560, 548, 109),
    ("h200", "fp8", 8, 1, 1, (5907,), 3819520, 1098, 219),
    ("h200", "bf16", 8, 1, 1, (11363,), 1985536, 1098, 219),
    ("b200", "fp8", 8, 1, 1, (5731,), 3937280, 1098, 219),
    ("h200", "fp8", 4, 2, 1, (2685, 3222), 7003136, 1098, 274),
]


@pytest.mark.parametrize("case", SGLANG_GOLDEN, ids=lambda case: "-".join(map(str, case[:5])))
def test_sglang_pools(case: tuple[Any, ...]) -> None:
    gpu, kv, tp, pp, dp, cells, tokens, slots, requests = case
    deployment = Deployment(engine="sglang", gpu=gpu, kv_dtype=kv, attn_tp=tp, pp=pp, attn_dp=dp)
    result = plan_sglang(preset("glm-5.3-flash"), deployment)
    assert result.page_tokens == 1024
    assert tuple(result.cell_bytes(stage.index) for stage in result.stages) == cells
    capacity = result.capacity(40 << 30)
    assert capacity.max_total_num_tokens == tokens
    assert (capacity.max_mamba_cache_size, capacity.max_running_requests) == (slots, requests)
    flags = dict(result.launch_flags())
    assert flags["--mamba-track-interval"] == "1024"
    assert json.loads(flags["--json-model-override-args"])["text_config"] == {
        "architectures": ["Glm5NextForConditionalGeneration"]
    }


def test_vllm_refuses_a_one_token_pool() -> None:
    with pytest.raises(Refusal) as caught:
        plan(model_from_config(config(index_kpool=1, index_topk=2048)), Deployment(attn_tp=8))
    assert caught.value.facts["field"] == "index_kpool"


def test_vllm_refuses_pipeline_stages_it_cannot_load() -> None:
    for pp in (2, 4):
        with pytest.raises(Refusal) as caught:
            plan(preset("glm-5.3-flash"), Deployment(attn_tp=4, pp=pp))
        assert caught.value.code == "pp_unsupported"
        assert caught.value.facts == {"field": "pp", "pp": pp, "model_type": "glm5_next"}
    # SGLang runs its stages
    assert plan(preset("glm-5.3-flash"), Deployment(engine="sglang", attn_tp=4, pp=2)).stages


def test_vllm_refuses_a_head_its_sparse_backends_do_not_take() -> None:
    with pytest.raises(Refusal) as caught:
        plan(model_from_config(config(kv_lora_rank=256)), Deployment(attn_tp=8))
    assert caught.value.code == "kernel_unsupported"
    assert caught.value.facts["field"] == "kv_lora_rank"
    assert caught.value.facts["head_size"] == 256


@pytest.mark.parametrize("width", [64, 256])
def test_sglang_refuses_an_index_key_width_its_dsa_pool_does_not_take(width: int) -> None:
    model = model_from_config(config(index_head_dim=width))
    with pytest.raises(Refusal) as caught:
        plan(model, Deployment(engine="sglang", attn_tp=8))
    assert caught.value.code == "kernel_unsupported"
    assert (caught.value.facts["field"], caught.value.facts["allowed"]) == (
        "index_head_dim",
        (128,),
    )
    assert plan_vllm(model, Deployment(attn_tp=8)).packed  # vLLM takes it


def test_the_ride_refuses_the_model_as_atoms_gate_does() -> None:
    # ATOM's plugin rides Kimi-K3's state only (it gates on the model type), whatever the layout
    with pytest.raises(Refusal) as caught:
        plan_ride(plan(preset("glm-5.3-flash"), Deployment(attn_tp=8)))
    assert caught.value.code == "model_not_ridable"
    assert caught.value.facts["model_type"] == "glm5_next"


@pytest.mark.parametrize(
    ("engine", "prefill_tp", "decode_tp", "ring_bytes"),
    [("vllm", 8, 8, 8192), ("vllm", 8, 2, 8192), ("vllm", 2, 8, 8192), ("sglang", 8, 4, 0)],
)
def test_transfer_moves_pooled_keys_and_rings(
    engine: str, prefill_tp: int, decode_tp: int, ring_bytes: int
) -> None:
    """A request of 5,000 tokens: each consumer gets every indexed layer's latent rows, its
    ceil(5000 / 16) = 313 pooled key entries of 132 B and, where the engine keeps it (vLLM),
    its tail ring whole from one producer; every KDA layer's heads; nothing twice."""
    model = preset("glm-5.3-flash")
    prefill = Deployment(engine=engine, attn_tp=prefill_tp)
    decode = Deployment(engine=engine, attn_tp=decode_tp)
    result = plan_transfer(model, prefill, decode, prompt_tokens=5000)
    assert transfer_violations(result) == []
    decoded = plan(model, decode)
    row = decoded.sizes.spec_of(3).part("latent").local_bytes(decode_tp)
    state = decoded.sizes.state_bytes
    per_consumer = 34 * state + 11 * (5000 * row + 313 * 132 + ring_bytes)
    assert result.total_bytes == decode_tp * per_consumer
    # vLLM's prefill keeps rings SGLang's decode has nowhere to put
    with pytest.raises(Refusal) as caught:
        plan_transfer(
            model, Deployment(attn_tp=8), Deployment(engine="sglang", attn_tp=8), prompt_tokens=8
        )
    assert caught.value.code in ("model_mismatch", "engine_mismatch")


def test_transfer_refuses_pooled_keys_dealt_by_dcp() -> None:
    model = preset("glm-5.3-flash")
    prefill = Deployment(attn_tp=8, kv_dtype="bf16")
    decode = Deployment(attn_tp=8, kv_dtype="bf16", dcp=2)
    with pytest.raises(Refusal) as caught:
        plan_transfer(model, prefill, decode, prompt_tokens=64)
    assert caught.value.code == "dcp_unsupported"


DEPLOYMENTS = st.builds(
    Deployment,
    attn_tp=st.sampled_from((1, 2, 4, 8, 16)),
    gpu=st.sampled_from(("h100", "h200", "b200", "gb200")),
    kv_dtype=st.sampled_from(("fp8", "bf16")),
    spec_tokens=st.integers(0, 3),
    prefix_caching=st.booleans(),
)


@settings(max_examples=40, deadline=None)
@given(deployment=DEPLOYMENTS, mtp=st.integers(0, 3))
def test_packed_ranges_tile_disjointly(deployment: Deployment, mtp: int) -> None:
    """Every part of every layer of a group lies inside its block, none overlaps another of
    the group (groups overlay the same bytes: a block belongs to one group at a time), block
    1 is block 0 one stride on; the plan round-trips through JSON."""
    model = glm(mtp)
    if mtp and deployment.spec_tokens:
        deployment = deployment.model_copy(update={"speculative_method": "mtp"})
    try:
        result = plan(model, deployment)
    except Refusal as refusal:
        assert refusal.code in ("spec_tokens", "pp_too_deep")
        return
    assert load_plan(result.model_dump_json()) == result
    for stage in result.stages:
        stride = result.stage_block_bytes(stage.index)
        for group in stage.groups:
            spans = []
            spec = result.group_spec(group)
            for layer in group.layers:
                for part in spec.part_names:
                    first = result.byte_range(layer, part, 0, 2, stage.index)
                    second = result.byte_range(layer, part, 1, 2, stage.index)
                    assert second.offset_bytes == first.offset_bytes + stride
                    spans.append((first.offset_bytes, first.end_bytes))
            spans.sort()
            assert not spans or spans[-1][1] <= stride
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_deterministic() -> None:
    model = preset("glm-5.3-flash")
    first = plan(model, Deployment(attn_tp=4))
    again = plan(copy.deepcopy(model), Deployment(attn_tp=4))
    assert first.model_dump_json() == again.model_dump_json()


@settings(max_examples=30, deadline=None)
@given(
    case=st.tuples(
        st.sampled_from((1, 2, 4, 8)),  # prefill TP
        st.sampled_from((1, 2, 4, 8)),  # decode TP
        st.sampled_from((1, 2)),  # prefill PP
        st.integers(0, 2),  # speculative tokens
        st.integers(1, 70_000),  # prompt tokens
        st.sampled_from(("vllm", "sglang")),
    )
)
def test_transfers_recompose(case: tuple[int, int, int, int, int, str]) -> None:
    """Every consumer region of a GLM-5.3-Flash transfer is written exactly once from its
    producers' regions, pooled keys and rings included, or the pair is refused by name."""
    prefill_tp, decode_tp, prefill_pp, spec, tokens, engine = case
    prefill_pp = prefill_pp if engine == "sglang" else 1  # vLLM loads no later stage of GLM
    mtp = "mtp" if spec and engine == "vllm" else None
    model = glm(1) if spec else preset("glm-5.3-flash")
    fields: dict[str, Any] = {"engine": engine, "spec_tokens": spec, "speculative_method": mtp}
    prefill = Deployment(attn_tp=prefill_tp, pp=prefill_pp, **fields)
    decode = Deployment(attn_tp=decode_tp, **fields)
    try:
        result = plan_transfer(model, prefill, decode, prompt_tokens=tokens)
    except Refusal as refusal:
        assert refusal.code in {"tp_not_multiple", "pp_too_deep"}, refusal
        return
    assert transfer_violations(result) == []


DECLARED = {
    "mhc": True,
    "mla_use_nope": True,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "index_kpool_compress": True,
}
"""The fields the engines' GLM constructors read that the fixture lacks."""


@pytest.mark.parametrize(
    ("engine", "field", "total"),
    # the totals vLLM 0.33's and SGLang 0.5.23's classes build at TP 8 (conformance suites)
    [("vllm", "mhc", 79_115_999_720), ("sglang", "index_kpool_compress", 79_056_957_752)],
)
def test_weights_need_the_fields_each_engine_reads(engine: str, field: str, total: int) -> None:
    deployment = Deployment(engine=engine, attn_tp=8)
    with pytest.raises(Refusal) as caught:
        weights_per_rank(preset("glm-5.3-flash"), deployment)
    assert (caught.value.code, caught.value.facts["field"]) == ("weights_unknown", field)
    declared = model_from_config(config(**DECLARED))
    assert weights_per_rank(declared, deployment).max_bytes == total
