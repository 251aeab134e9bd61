"""vLLM's rules in the planner (0.33.0 and 0.34.0): attention backends' kernel blocks, the block
raise on them, block-outermost layouts, the cache dtypes its dense MLA backends take, a sparse
backend named for MLA without an indexer, the pages shared planes keep, and refusals of vLLM
settings on the tokenspeed engine. ``tests/conformance`` runs vLLM itself on the same."""

from __future__ import annotations

import pytest

from k3layout import Deployment, HybridModel, MLALayer, Refusal, plan, plan_vllm, preset
from k3layout.engines.vllm.report import VllmReport
from k3layout.engines.vllm.rules import (
    DENSE_ATTENTION_BACKENDS,
    SPARSE_ATTENTION_BACKENDS,
    aligned_block_tokens,
    kernel_block_tokens,
    preferred_block_tokens,
    smallest_kernel_block,
)
from k3layout.layouts.report import report

K3_TP8_STATE = 3 * 4608 * 2 + 12 * 128 * 128 * 4  # conv (K-1 rows x q|k|v bf16) + fp32 state


def runs(backend: str, **fields: object) -> Deployment:
    """A deployment on a GPU ``backend`` runs on: Blackwell for CUTLASS and FlashInfer MLA,
    Hopper otherwise; FlashAttention MLA with a bf16 cache."""
    gpu = "b200" if backend in ("CUTLASS_MLA", "FLASHINFER_MLA") else "h200"
    dtype = "bf16" if backend == "FLASH_ATTN_MLA" else "fp8"
    return Deployment.model_validate(
        {"attention_backend": backend, "gpu": gpu, "kv_dtype": dtype, **fields}
    )


def test_kernel_blocks_are_each_backends_own() -> None:
    assert {b: smallest_kernel_block(b) for b in DENSE_ATTENTION_BACKENDS} == {
        "FLASHMLA": 64,
        "CUTLASS_MLA": 128,
        "FLASHINFER_MLA": 32,
        "TRITON_MLA": 16,
        "FLASH_ATTN_MLA": 16,
    }
    assert [kernel_block_tokens(b, 1536) for b in DENSE_ATTENTION_BACKENDS] == [
        64,
        128,
        64,
        1536,
        1536,
    ]
    # vLLM 0.33's default block is 16 and 0.34's 64: a backend that takes it keeps it
    assert [preferred_block_tokens(b, 16) for b in DENSE_ATTENTION_BACKENDS] == [
        64,
        128,
        32,
        16,
        16,
    ]
    assert [preferred_block_tokens(b, 64) for b in DENSE_ATTENTION_BACKENDS] == [
        64,
        128,
        64,
        64,
        64,
    ]
    # the sparse ones (an indexed layer's): FlashInfer's and FlashMLA's on SM90, FlashInfer's
    # on SM100
    assert [smallest_kernel_block(b) for b in SPARSE_ATTENTION_BACKENDS] == [64, 64, 32]


@pytest.mark.parametrize("backend", DENSE_ATTENTION_BACKENDS)
def test_every_backend_raises_k3_tp8_to_1536(k3: HybridModel, backend: str) -> None:
    p = plan_vllm(k3, runs(backend, attn_tp=8))
    per_token = 576 if p.deployment.kv_dtype == "fp8" else 1152
    block = 1536 if per_token == 576 else 768
    assert p.block_tokens == block and p.page_bytes == block * per_token
    assert p.kernel_block_tokens == kernel_block_tokens(backend, block)  # type: ignore[arg-type]
    assert p.sizes.state_bytes == K3_TP8_STATE


def test_a_requested_block_is_raised_on_whole_multiples_of_itself() -> None:
    # A = 192: 192 x ceil(814,080 / (192 x 576)) = 192 x 8
    assert aligned_block_tokens("FLASHMLA", 192, K3_TP8_STATE, 576, 16) == 1536
    # A = 640: pages of 640 and 1,280 tokens (368,640 and 737,280 B) are too small
    assert aligned_block_tokens("CUTLASS_MLA", 640, K3_TP8_STATE, 576, 16) == 1920
    assert aligned_block_tokens("TRITON_MLA", 2048, K3_TP8_STATE, 576, 16) == 2048
    # no state to hold: the requested (or preferred) block as it is, by release
    assert aligned_block_tokens("FLASHINFER_MLA", None, 0, 576, 16) == 32
    assert aligned_block_tokens("FLASHINFER_MLA", None, 0, 576, 64) == 64
    # with a state, the release's default block is raised past either
    assert {aligned_block_tokens("TRITON_MLA", None, K3_TP8_STATE, 576, d) for d in (16, 64)} == {
        1536
    }


@pytest.mark.parametrize(("backend", "kernel"), [("FLASHMLA", 64), ("CUTLASS_MLA", 128)])
def test_a_block_off_the_kernel_grid_is_refused_as_vllms_selector_does(
    k3: HybridModel, backend: str, kernel: int
) -> None:
    with pytest.raises(Refusal) as refused:
        plan(k3, runs(backend, attn_tp=8, block_tokens=200))
    assert refused.value.code == "block_unsupported"
    assert refused.value.facts == {
        "block_tokens": 200,
        "attention_backend": backend,
        "kernel": kernel,
    }
    assert str(kernel * -(-200 // kernel)) in (refused.value.hint or "")


def test_an_attention_only_model_keeps_the_backends_preferred_block() -> None:
    model = HybridModel(name="m", model_type="x", layers=(MLALayer(num_heads=8),) * 2)
    assert plan_vllm(model, Deployment()).block_tokens == 64
    assert plan_vllm(model, runs("CUTLASS_MLA")).block_tokens == 128


def test_block_outermost_pages_of_one_block_are_one_run(k3: HybridModel) -> None:
    p = plan_vllm(
        k3, Deployment(attn_tp=8, attention_backend="TRITON_MLA", kv_cache_layout="BLHNC")
    )
    page, planes, n = p.page_bytes, p.num_planes, 10
    assert p.layer_stride_bytes(n) == page and p.block_stride_bytes() == planes * page
    for layer, position in ((3, 0), (0, 0), (92, 23), (88, 22)):  # (module layer, plane)
        for block in (0, 1, n - 1):
            at = p.byte_range(layer, p.sizes.spec_of(layer).parts[0].name, block, n)
            assert at.offset_bytes == (block * planes + position) * page
    lbnhc = plan_vllm(k3, Deployment(attn_tp=8, attention_backend="TRITON_MLA"))
    assert lbnhc.byte_range(92, "latent", 1, n).offset_bytes == (23 * n + 1) * page


@pytest.mark.parametrize("backend", ["FLASHMLA", "CUTLASS_MLA", "FLASHINFER_MLA"])
def test_block_outermost_is_refused_where_kernel_blocks_would_split_it(
    k3: HybridModel, backend: str
) -> None:
    with pytest.raises(Refusal) as refused:
        plan(k3, runs(backend, attn_tp=8, kv_cache_layout="BLHNC"))
    assert refused.value.code == "layout_unsupported"
    assert refused.value.facts["block_tokens"] == 1536
    assert refused.value.facts["kernel_block_tokens"] == kernel_block_tokens(backend, 1536)  # type: ignore[arg-type]
    assert "TRITON_MLA" in (refused.value.hint or "")


def test_a_backend_runs_only_on_the_gpus_vllms_selector_takes_it_on(k3: HybridModel) -> None:
    for backend, gpu in (("CUTLASS_MLA", "h200"), ("FLASHMLA", "a100"), ("FLASHMLA", "mi300x")):
        with pytest.raises(Refusal) as refused:
            plan(k3, Deployment.model_validate({"attention_backend": backend, "gpu": gpu}))
        assert refused.value.code == "kernel_unsupported"
    with pytest.raises(Refusal) as refused:  # FlashAttention MLA takes no fp8 cache
        plan(k3, Deployment(attention_backend="FLASH_ATTN_MLA", kv_dtype="fp8"))
    assert refused.value.facts["field"] == "kv_dtype"
    # unset, the GPU's own pick: Blackwell FlashInfer, Hopper FlashMLA (fp8) or FA MLA (bf16)
    picks = {
        (gpu, dtype): plan_vllm(k3, Deployment(gpu=gpu, kv_dtype=dtype, attn_tp=8)).report_fields()[
            0
        ]["attention_backend"]
        for gpu in ("a100", "h200", "b200", "mi355x")
        for dtype in ("fp8", "bf16")
    }
    assert picks == {
        ("a100", "fp8"): "TRITON_MLA",
        ("a100", "bf16"): "TRITON_MLA",
        ("h200", "fp8"): "FLASHMLA",
        ("h200", "bf16"): "FLASH_ATTN_MLA",
        ("b200", "fp8"): "FLASHINFER_MLA",
        ("b200", "bf16"): "FLASHINFER_MLA",
        ("mi355x", "fp8"): "TRITON_MLA",
        ("mi355x", "bf16"): "TRITON_MLA",
    }


@pytest.mark.parametrize("backend", SPARSE_ATTENTION_BACKENDS)
def test_a_sparse_backend_is_refused_for_mla_without_an_indexer(
    k3: HybridModel, backend: str
) -> None:
    """vLLM's selector says ``non-sparse not supported`` (on every GPU and cache dtype)."""
    for gpu, dtype in (("h200", "bf16"), ("b200", "fp8"), ("h200", "fp8_ds_mla")):
        deployment = Deployment.model_validate(
            {"attention_backend": backend, "gpu": gpu, "kv_dtype": dtype, "attn_tp": 8}
        )
        with pytest.raises(Refusal) as refused:
            plan(k3, deployment)
        assert refused.value.code == "kernel_unsupported"
        assert refused.value.facts == {"attention_backend": backend, "field": "attention_backend"}
        assert "FLASHMLA" in (refused.value.hint or "")  # a dense backend


def test_shared_planes_keep_one_page_size(k3_dspark: HybridModel) -> None:
    """Every layer's page on shared planes is the attention page, the KDA state padded to it:
    the plan reports it once per group kind, with the parts it holds."""
    p = plan_vllm(k3_dspark, Deployment(attn_tp=8, spec_tokens=2))
    page = 1536 * 576  # the raised block x the fp8 latent row
    assert [(x.kind, x.parts, x.page_bytes) for x in p.pages] == [
        ("kda", ("conv", "recurrent"), page),
        ("attention", ("latent",), page),
    ]
    written = report(p)
    assert isinstance(written, VllmReport) and written.pages == p.pages


def test_vllms_dense_mla_backends_refuse_fp8_ds_mla(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        plan(k3, Deployment(attn_tp=8, kv_dtype="fp8_ds_mla"))
    assert refused.value.code == "dtype_unsupported"
    assert refused.value.facts == {"kv_dtype": "fp8_ds_mla", "attention_backend": "FLASHMLA"}


@pytest.mark.parametrize(
    ("field", "value"), [("attention_backend", "TRITON_MLA"), ("kv_cache_layout", "BLHNC")]
)
def test_the_parent_engine_refuses_vllms_settings(k3: HybridModel, field: str, value: str) -> None:
    with pytest.raises(Refusal) as refused:
        plan(k3, Deployment.model_validate({"engine": "tokenspeed", field: value}))
    assert refused.value.code == "engine_setting"
    assert refused.value.facts["field"] == field


def test_the_ride_refuses_a_block_outermost_plan_the_adapter_lays_it_out(k3: HybridModel) -> None:
    from k3layout import plan_ride  # noqa: PLC0415
    from k3layout.offload.tensors import cache_spec  # noqa: PLC0415

    p = plan_vllm(
        k3, Deployment(attn_tp=8, attention_backend="TRITON_MLA", kv_cache_layout="BLHNC")
    )
    with pytest.raises(Refusal) as refused:
        plan_ride(p)
    assert refused.value.code == "layout_unsupported"
    assert refused.value.facts["kv_cache_layout"] == "BLHNC"
    # the adapter: one plane of whole blocks, KDA layer j of a group at page j of the block
    spec = cache_spec(p, 4)
    assert (spec.num_planes, spec.page_bytes) == (1, p.stage_block_bytes(0))
    conv = spec.layer("model.layers.4.self_attn").parts[0]
    assert (conv.offset_bytes, conv.strides[0] * 2) == (p.page_bytes, p.stage_block_bytes(0))


def test_without_speculative_tokens_vllm_builds_no_drafter(k3_dspark: HybridModel) -> None:
    bare = plan_vllm(k3_dspark, Deployment(attn_tp=8))
    assert bare.num_planes == 24 and not bare.model.draft_layers
    assert bare.model.layers == k3_dspark.layers
    assert plan_vllm(k3_dspark, Deployment(attn_tp=8, spec_tokens=1)).num_planes == 29
    # the tokenspeed engine plans what it is given
    assert plan(k3_dspark, Deployment(engine="tokenspeed", attn_tp=8)).num_planes == 29


def test_mtp_depth_is_at_most_the_modules_or_a_multiple_of_them(k3: HybridModel) -> None:
    mtp = HybridModel(
        name="k3-mtp2",
        model_type=k3.model_type,
        layers=k3.layers,
        draft_layers=k3.mla_layers[:1] * 2,
        drafter="mtp",
    )
    for spec in (1, 2, 4, 6):
        assert plan_vllm(mtp, Deployment(attn_tp=8, spec_tokens=spec)).num_planes == 26
    with pytest.raises(Refusal) as refused:
        plan(mtp, Deployment(attn_tp=8, spec_tokens=3))
    assert refused.value.code == "spec_tokens"
    assert refused.value.facts == {"spec_tokens": 3, "mtp_modules": 2}
    # DSpark speculates any number of tokens with its 5 layers
    assert plan_vllm(preset_dspark(), Deployment(attn_tp=8, spec_tokens=3)).num_planes == 29


def preset_dspark() -> HybridModel:
    from k3layout import preset  # noqa: PLC0415

    return preset("kimi-k3-dspark")


def test_a_drafter_needs_draft_layers(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        HybridModel(name="m", model_type="x", layers=k3.layers, drafter="mtp")
    assert refused.value.code == "invalid_argument" and refused.value.facts["field"] == "drafter"


@pytest.mark.parametrize(
    "call",
    [
        lambda: kernel_block_tokens("FLASH", 64),  # type: ignore[arg-type]
        lambda: kernel_block_tokens("FLASHMLA", "64"),  # type: ignore[arg-type]
        lambda: aligned_block_tokens("FLASHMLA", None, 814_080, 0, 64),
        lambda: aligned_block_tokens("FLASHMLA", 0, 814_080, 576, 64),
        lambda: aligned_block_tokens("FLASHMLA", None, -1, 576, 64),
        lambda: preferred_block_tokens("FLASHMLA", 0),
        lambda: smallest_kernel_block(None),  # type: ignore[arg-type]
    ],
)
def test_the_rules_refuse_bad_arguments(call: object) -> None:
    with pytest.raises(Refusal) as refused:
        call()  # type: ignore[operator]
    assert refused.value.code == "invalid_argument"


def test_a_kernel_block_of_a_block_the_backend_refuses_is_refused() -> None:
    with pytest.raises(Refusal) as refused:
        kernel_block_tokens("FLASHMLA", 200)
    assert refused.value.code == "block_unsupported"


# Deployment.speculative_method: the method vLLM's --speculative-config names


def test_speculative_method_mtp_without_mtp_modules_is_refused_as_vllm_fails() -> None:
    k3 = preset("kimi-k3")  # num_nextn_predict_layers 0
    with pytest.raises(Refusal) as caught:
        plan(k3, Deployment(attn_tp=8, spec_tokens=2, speculative_method="mtp"))
    assert caught.value.code == "draft_unsupported"
    assert caught.value.facts["mtp_modules"] == 0
    assert "SpeculativeConfig" in str(caught.value)
    # without speculative tokens nothing speculates: planned
    plan(k3, Deployment(attn_tp=8, speculative_method="mtp"))


@pytest.mark.parametrize(("model", "method"), [("kimi-k3", "dspark"), ("kimi-k3-dspark", "mtp")])
def test_a_method_the_model_has_no_draft_for_is_refused_naming_both(
    model: str, method: str
) -> None:
    with pytest.raises(Refusal) as caught:
        plan(preset(model), Deployment(attn_tp=8, spec_tokens=2, speculative_method=method))
    assert caught.value.code == "draft_unsupported"
    assert caught.value.facts["speculative_method"] == method


def test_ngram_builds_no_draft_and_the_model_drafter_is_the_default() -> None:
    dspark = preset("kimi-k3-dspark")
    ngram = plan_vllm(dspark, Deployment(attn_tp=8, spec_tokens=2, speculative_method="ngram"))
    target = plan_vllm(dspark.without_draft(), Deployment(attn_tp=8, spec_tokens=2))
    assert ngram.model == dspark.without_draft()
    assert (ngram.block_tokens, ngram.num_planes) == (target.block_tokens, target.num_planes)
    named = plan_vllm(dspark, Deployment(attn_tp=8, spec_tokens=2, speculative_method="dspark"))
    default = plan_vllm(dspark, Deployment(attn_tp=8, spec_tokens=2))
    assert (named.num_planes, named.page_bytes) == (default.num_planes, default.page_bytes)
    assert named.num_planes > ngram.num_planes  # the draft's MLA layers join the planes


@pytest.mark.parametrize("engine", ["sglang", "tokenspeed"])
def test_speculative_method_is_vllms_setting(engine: str) -> None:
    with pytest.raises(Refusal) as caught:
        plan(preset("kimi-k3"), Deployment(engine=engine, attn_tp=8, speculative_method="mtp"))
    assert caught.value.code == "engine_setting"
    assert caught.value.facts["field"] == "speculative_method"


def test_the_launch_line_names_the_speculative_method() -> None:
    linear = preset("kimi-linear-48b")
    for method, drafted in (("ngram", '"method":"ngram","num_speculative_tokens":2'),):
        deployment = Deployment(
            attn_tp=2, gpu="h200", spec_tokens=2, speculative_method=method, expert_parallel=True
        )
        assert drafted in plan(linear, deployment).recommend(16, 8192).launch_line
    # unset: a model without a drafter names no method (vLLM then runs no draft)
    bare = plan(linear, Deployment(attn_tp=2, gpu="h200", expert_parallel=True))
    assert "--speculative-config" not in bare.recommend(16, 8192).launch_line
