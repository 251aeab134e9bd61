"""vLLM 0.33's weights per rank as k3layout lays them out (``k3layout.engines.vllm.weights``),
without vLLM: golden figures written as their derivations, the splits' properties and every
refusal the rule adds. ``tests/conformance/test_conformance_weights_vllm.py`` checks the same
rule tensor by tensor against vLLM's own model classes."""

from __future__ import annotations

import doctest
from typing import Any

import pytest

from k3layout import Deployment, HybridModel, Refusal, preset, weights_per_rank
from k3layout.engines.vllm import weights_layers, weights_quant
from k3layout.engines.vllm.weights_quant import Experts, Linear, QuantContext
from k3layout.model.architecture import Architecture, Quantization
from k3layout.weights import RankWeights

BF16, FP32 = 2, 4
H = 7168  # K3 hidden size
V8 = 163840 // 8  # the vocabulary (a multiple of 64) over TP 8


def k3(**deployment: Any) -> RankWeights:
    """Stage 0 of Kimi-K3 under vLLM on an H200."""
    return weights_per_rank(preset("kimi-k3"), Deployment(**deployment)).stages[0]


def with_architecture(model: HybridModel, **fields: Any) -> HybridModel:
    """``model`` with fields of its architecture replaced (validated anew)."""
    assert model.architecture is not None
    arch = Architecture.model_validate({**dict(model.architecture), **fields})
    return HybridModel.model_validate({**dict(model), "architecture": arch})


FP8 = Quantization(method="fp8_block", quant_method="fp8", weight_block=(128, 128))


def test_k3_tp8_ep_bytes_per_kind() -> None:
    """K3 bf16 at TP 8 with expert parallelism, kind by kind (vLLM's figure for the rank:
    1,376,941,645,264 bytes, parameters and buffers)."""
    vision = (
        1024 * 3 * 14 * 14 * BF16  # patch embedding conv
        + 64 * 64 * 1024 * BF16  # 2-D position embedding
        + 4 * 1 * 1024 * FP32  # its time table, an fp32 buffer
        # 27 blocks, whole on every rank (12 heads do not split 8 ways): wqkv, wo, fc0, fc1
        + 27 * ((3 * 1536 * 1024 + 1024 * 1536 + 2 * 4096 * 1024) * BF16 + 2 * 1024 * BF16)
        + 1024 * BF16  # final layernorm
        + (4096 * 4096 + H * 4096 + H) * BF16  # projector: linear_1, linear_2, post_norm
    )
    mla = 24 * (
        (1536 + 512 + 64 + 96 * 128 // 8) * H * BF16  # q and kv latents whole, gate split
        + 1536 * BF16  # q_a_layernorm
        + 96 // 8 * 192 * 1536 * BF16  # q_b_proj: 12 heads of nope 128 + rope 64
        + 512 * BF16  # kv_a_layernorm
        + 96 // 8 * 256 * 512 * BF16  # kv_b_proj: 12 heads of nope 128 + v 128
        + H * 96 // 8 * 128 * BF16  # o_proj
        + 5 * FP32  # _k, _v, _q, _prob and _one scales
    )
    local = 96 * 128 // 8  # a KDA layer's q (or k, v, g) rows a rank: 1,536
    kda = 69 * (
        (4 * local + 128 + 96 // 8 + 4) * H * BF16  # q k v g, f_a whole, beta, 4 rows to 16
        + local * 128 * BF16  # f_b_proj
        + local * FP32  # dt_bias
        + 3 * local * 4 * FP32  # conv1d
        + 96 // 8 * FP32  # A_log
        + 128 * BF16  # o_norm
        + H * local * BF16  # o_proj
        + (3 * 4 * local + 128) * FP32  # the native fused decode's conv and norm copies
    )
    expected = {
        "vision": vision,
        "embedding": V8 * H * BF16,
        "norm": (93 * 2 + 1) * H * BF16,
        "lm_head": V8 * H * BF16,
        "kda": kda,
        "dense_mlp": 3 * 11008 // 8 * H * BF16,  # layer 0: gate, up and down of 1,376
        "moe_router": 92 * (896 * H * BF16 + 896 * FP32),
        "shared_experts": 92 * 3 * 2 * 3072 // 8 * H * BF16,  # 2 shared experts split 8 ways
        "routed_experts": 92 * (896 // 8 * 3 * 3072 * H * BF16 + 896 * 4),  # 112 whole + map
        "mla": mla,
    }
    rank = k3(attn_tp=8, expert_parallel=True)
    assert rank.bytes_by_kind() == expected
    assert rank.total_bytes == sum(expected.values()) == 1_376_941_645_264


def test_tp_splits_experts_intermediate_and_ep_splits_experts() -> None:
    """At TP 8 each of 896 experts keeps 3072 / 8 = 384 columns a rank; with expert
    parallelism 112 experts are whole: the same expert bytes, plus the int32 expert map."""
    tp, ep = k3(attn_tp=8), k3(attn_tp=8, expert_parallel=True)
    routed = tp.bytes_by_kind()["routed_experts"]
    assert routed == 92 * 896 * 3 * 3072 // 8 * H * BF16
    assert ep.bytes_by_kind()["routed_experts"] == routed + 92 * 896 * 4


def test_moe_padding_reads_the_attention_tp() -> None:
    """Kimi-Linear's 1,024-wide experts at TP 8 would hold 128 columns a rank, under the 256
    floor: vLLM pads the intermediate to 256 x 8, so the rank holds twice TP 4's bytes for
    them, not the same; at DP 2 x TP 4 the attention TP (4) leaves them unpadded while the
    MoE spans 8 ranks: 128 columns a rank."""
    linear = preset("kimi-linear-48b")

    def routed(**deployment: Any) -> int:
        plan = weights_per_rank(linear, Deployment(**deployment))
        return plan.stages[0].bytes_by_kind()["routed_experts"]

    assert routed(attn_tp=8) == routed(attn_tp=4) == 26 * 256 * 3 * 256 * 2304 * BF16
    assert routed(attn_tp=4, attn_dp=2) == 26 * 256 * 3 * 128 * 2304 * BF16


def test_sequence_parallel_replicates_shared_experts_and_the_dense_mlp() -> None:
    """Expert parallelism with attention DP (and TP > 1, one stage) turns on vLLM's sequence
    parallel: shared experts and the dense MLP are whole on every rank."""
    linear = preset("kimi-linear-48b")
    plain = weights_per_rank(linear, Deployment(attn_tp=4, attn_dp=2)).stages[0].bytes_by_kind()
    sp = (
        weights_per_rank(linear, Deployment(attn_tp=4, attn_dp=2, expert_parallel=True))
        .stages[0]
        .bytes_by_kind()
    )
    assert sp["shared_experts"] == 4 * plain["shared_experts"] == 26 * 3 * 1024 * 2304 * BF16
    assert sp["dense_mlp"] == 4 * plain["dense_mlp"] == 3 * 9216 * 2304 * BF16


def test_pipeline_stages_partition_the_one_stage_model() -> None:
    """Without a draft, two stages hold the one-stage model's bytes between them, kind by
    kind (the vision tower and embedding on stage 0, the final norm and LM head on stage 1)."""
    for name in ("kimi-linear-48b", "kimi-k3"):
        model = preset(name)
        one = weights_per_rank(model, Deployment(attn_tp=8)).stages[0].bytes_by_kind()
        two = weights_per_rank(model, Deployment(attn_tp=8, pp=2)).stages
        summed: dict[str, int] = {}
        for stage in two:
            for kind, size in stage.bytes_by_kind().items():
                summed[kind] = summed.get(kind, 0) + size
        assert summed == one
        assert "vision" not in two[1].bytes_by_kind() and "lm_head" not in two[0].bytes_by_kind()


def test_a_dspark_drafter_makes_the_last_stage_read_the_embedding() -> None:
    """DSpark reads the target's embedding, so at PP 2 the last stage builds one too; the
    draft itself is on the last stage only, and only with speculative tokens."""
    model = preset("kimi-k3-dspark")
    stages = weights_per_rank(model, Deployment(attn_tp=8, pp=2, spec_tokens=2)).stages
    assert stages[1].bytes_by_kind()["embedding"] == V8 * H * BF16
    assert not stages[0].draft_groups and stages[1].draft_groups
    without = weights_per_rank(model, Deployment(attn_tp=8, pp=2)).stages
    assert "embedding" not in without[1].bytes_by_kind() and not without[1].draft_groups


def test_speculative_tokens_drop_the_native_decode_buffers_on_hopper() -> None:
    """With a drafter K3 KDA decodes several tokens, which the native fused kernel does not:
    its decode copies go (69 layers x (3 x 4 x 1,536 + 128) x 4 bytes at TP 8)."""
    model = preset("kimi-k3-dspark")
    target = weights_per_rank(model, Deployment(attn_tp=8)).stages[0]
    drafted = weights_per_rank(model, Deployment(attn_tp=8, spec_tokens=1)).stages[0]
    gone = target.bytes_by_kind()["kda"] - drafted.bytes_by_kind()["kda"]
    assert gone == 69 * (3 * 4 * 1536 + 128) * FP32


def test_the_rule_is_deterministic_and_round_trips_json() -> None:
    for deployment in (Deployment(attn_tp=8, expert_parallel=True), Deployment(attn_tp=2, pp=2)):
        plan = weights_per_rank(preset("kimi-k3-dspark"), deployment)
        assert plan == weights_per_rank(preset("kimi-k3-dspark"), deployment)
        for stage in plan.stages:
            assert RankWeights.model_validate_json(stage.model_dump_json()) == stage


def test_fp8_shapes_and_scales() -> None:
    """fp8 block: one byte an element and an fp32 scale per 128 x 128 block (rounded up):
    K3's fused q / kv / gate projection at TP 8, 3,648 x 7,168, has 29 x 56 scales."""
    ctx = QuantContext(FP8, "bfloat16", 8, ())
    layer = Linear("a", "m.fused_qkv_a_g_proj", (1536, 576, 1536), H, "col")
    weight, scale = weights_quant.linear_tensors(layer, ctx)
    assert (weight.shape, weight.dtype) == ((3648, H), "float8_e4m3fn")
    assert (scale.shape, scale.dtype) == ((29, 56), "float32")


def refusal(call: Any) -> Refusal:
    with pytest.raises(Refusal) as caught:
        call()
    return caught.value


def test_fp8_refuses_a_row_shard_off_the_block_grid() -> None:
    """K3's dense layer (11,008 wide) at TP 8: down_proj's 1,376 input columns a rank are not
    a multiple of 128, which vLLM refuses."""
    model = with_architecture(preset("kimi-k3"), quantization=FP8)
    error = refusal(lambda: weights_per_rank(model, Deployment(attn_tp=8)))
    assert error.code == "quantization_unsupported"
    assert error.facts["shard"] == 1376 and error.facts["block"] == 128
    assert str(error.facts["module"]).endswith("layers.0.mlp.down_proj")


def test_fp8_refuses_a_single_column_shard_off_the_block_grid() -> None:
    ctx = QuantContext(FP8, "bfloat16", 2, ())
    error = refusal(
        lambda: weights_quant.linear_tensors(Linear("a", "m.q", (100,), 512, "col"), ctx)
    )
    assert error.code == "quantization_unsupported" and error.facts["shard"] == 100


def test_fp8_refines_expert_blocks_or_refuses() -> None:
    """An expert shard of 192 columns is refined to 64-blocks (gcd of 128, 192 and 7,168);
    one of 16 has no block of 32 or more and is refused."""
    ctx = QuantContext(FP8, "bfloat16", 8, ())
    tensors = weights_quant.expert_tensors(Experts("m", 896, 192, H, 16), ctx)
    scales = {t.name: t.shape for t in tensors if "scale" in t.name}
    assert scales == {
        "w13_weight_scale_inv": (896, 2 * 192 // 64, H // 64),
        "w2_weight_scale_inv": (896, H // 64, 192 // 64),
    }
    error = refusal(lambda: weights_quant.expert_tensors(Experts("m", 256, 16, 2304, 64), ctx))
    assert error.code == "quantization_unsupported" and error.facts["shard"] == 16


def test_a_fused_layer_half_ignored_is_refused() -> None:
    ctx = QuantContext(FP8, "bfloat16", 8, ("m.layers.0.mlp.gate_proj",))
    error = refusal(lambda: weights_quant.is_ignored(ctx, "m.layers.0.mlp.gate_up_proj"))
    assert error.code == "quantization_unsupported"
    both = QuantContext(FP8, "bfloat16", 8, ("m.mlp.gate_proj", "m.mlp.up_proj"))
    assert weights_quant.is_ignored(both, "m.mlp.gate_up_proj")


def test_nvfp4_refuses_an_input_not_a_multiple_of_16() -> None:
    nvfp4 = Quantization(method="nvfp4", quant_method="modelopt", group_size=16)
    ctx = QuantContext(nvfp4, "bfloat16", 1, ())
    error = refusal(lambda: weights_quant.linear_tensors(Linear("a", "m.o", (64,), 40, "rep"), ctx))
    assert error.code == "quantization_unsupported" and error.facts["shard"] == 40


def test_compressed_tensors_lays_out_experts_only() -> None:
    """int4 on a linear layer the ignore list leaves quantized is not laid out; neither are
    compressed-tensors MXFP4 experts."""
    int4 = Quantization(method="int4_w4a16", quant_method="compressed-tensors", group_size=32)
    ctx = QuantContext(int4, "bfloat16", 1, ("re:.*self_attn.*",))
    assert (
        len(weights_quant.linear_tensors(Linear("a", "l.self_attn.o_proj", (8,), 8, "rep"), ctx))
        == 1
    )
    error = refusal(
        lambda: weights_quant.linear_tensors(Linear("a", "l.mlp.down_proj", (8,), 8, "rep"), ctx)
    )
    assert error.code == "quantization_unsupported"
    ct_mxfp4 = Quantization(method="mxfp4", quant_method="compressed-tensors", group_size=32)
    experts = Experts("m", 8, 256, 2304, 1)
    error = refusal(
        lambda: weights_quant.expert_tensors(experts, QuantContext(ct_mxfp4, "bfloat16", 1, ()))
    )
    assert error.code == "quantization_unsupported"


def test_mxfp4_refuses_shards_its_backends_would_pad() -> None:
    mxfp4 = Quantization(method="mxfp4", quant_method="mxfp4", group_size=32)
    ctx = QuantContext(mxfp4, "bfloat16", 1, ())
    assert len(weights_quant.expert_tensors(Experts("m", 8, 128, 2304, 1), ctx)) == 4
    error = refusal(lambda: weights_quant.expert_tensors(Experts("m", 8, 64, 2304, 1), ctx))
    assert error.code == "quantization_unsupported" and error.facts["shard"] == 64


def test_a_vocabulary_that_does_not_split_is_refused() -> None:
    """163,840 rows do not split over TP 3 (vLLM's divide asserts)."""
    error = refusal(lambda: weights_per_rank(preset("kimi-k3"), Deployment(attn_tp=3)))
    assert error.code == "uneven_split"


def test_what_vllm_builds_otherwise_is_not_laid_out() -> None:
    """ROCm GPUs run vLLM's amd classes; another model class; a DSpark draft whose config
    lacks the dimensions its weights need."""
    assert (
        refusal(
            lambda: weights_per_rank(preset("kimi-k3"), Deployment(attn_tp=8, gpu="mi355x"))
        ).code
        == "weights_unknown"
    )
    other = with_architecture(preset("kimi-linear-48b"), architecture="DeepseekV3ForCausalLM")
    assert refusal(lambda: weights_per_rank(other, Deployment(attn_tp=8))).code == "weights_unknown"
    bare = with_architecture(preset("kimi-k3-dspark"), draft=None)
    error = refusal(lambda: weights_per_rank(bare, Deployment(attn_tp=8, spec_tokens=1)))
    assert error.code == "weights_unknown" and error.facts["field"] == "draft"


def test_decode_buffer_rule_examples() -> None:
    failures, attempted = doctest.testmod(weights_layers)
    assert attempted and not failures
