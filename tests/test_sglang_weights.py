"""SGLang 0.5.23's weights per rank (``k3layout.engines.sglang.weights``) without SGLang: golden
figures written as their derivations (the same figures SGLang's own classes give in
``tests/conformance/test_conformance_sglang_weights.py``), properties, and a test for each
refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from k3layout import Deployment, Refusal, preset
from k3layout.engines.sglang.weights_extra import padded_vocab
from k3layout.layouts.weights import weights_per_rank
from k3layout.model import GQALayer, HybridModel, model_from_config
from k3layout.model.architecture import Architecture, DSparkDraft
from k3layout.weights import RankWeights, WeightsPlan

FIXTURES = Path(__file__).parent / "fixtures"
FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
BF16, F32 = 2, 4


def sglang(**fields: Any) -> Deployment:
    return Deployment(engine="sglang", **fields)


def fixture(name: str, quantization: dict[str, Any] | None = None) -> HybridModel:
    config = json.loads((FIXTURES / name).read_text())
    if quantization is not None:
        config["quantization_config"] = quantization
    return model_from_config(config, name=name)


def with_draft(model: HybridModel) -> HybridModel:
    """K3 with SGLang's dense DSpark draft (5 layers of 64 heads x 128, MLP 18,432)."""
    assert model.architecture is not None
    draft = DSparkDraft(hidden_size=7168, intermediate_size=18432, vocab_size=163840,
                        target_hidden_size=7168, num_target_layers=4, markov_rank=64,
                        max_position_embeddings=1 << 20)
    return HybridModel(
        name=model.name, model_type=model.model_type, layers=model.layers,
        draft_layers=(GQALayer(num_heads=64, num_kv_heads=64, head_dim=128),) * 5,
        drafter="dspark", context_tokens=model.context_tokens,
        architecture=Architecture.model_validate({**dict(model.architecture), "draft": draft}),
    )


def rank(model: HybridModel, stage: int = 0, **fields: Any) -> RankWeights:
    return weights_per_rank(model, sglang(**fields)).stages[stage]


def test_k3_tp8_expert_parallel_per_kind_bytes() -> None:
    kinds = rank(preset("kimi-k3"), attn_tp=8, expert_parallel=True).bytes_by_kind()
    h, tp, proj = 7168, 8, 96 * 128  # hidden, TP, KDA heads x head_dim
    kda = (
        4 * proj // tp * h * BF16  # fused_qkvg_proj: q, k, v, g column-split
        + 96 // tp * h * BF16  # b_proj: a row per head
        + 128 * h * BF16  # f_a_proj: replicated
        + proj // tp * 128 * BF16  # f_b_proj
        + proj // tp * F32 + 96 // tp * F32  # dt_bias, A_log
        + 3 * proj // tp * 4 * F32  # qkv_conv1d: fp32, kernel 4
        + 128 * BF16  # o_norm
        + h * proj // tp * BF16  # o_proj: row-split
    )
    mla = (
        (1536 + 512 + 64) * h * BF16 + 1536 * BF16  # fused_qkv_a_proj_with_mqa, q_a_layernorm
        + 96 * 192 // tp * 1536 * BF16 + 512 * BF16  # q_b_proj, kv_a_layernorm
        + 96 * 256 // tp * 512 * BF16  # kv_b_proj
        + h * 96 * 128 // tp * BF16 * 2  # o_proj and the output gate g_proj
    )
    experts = 896 // tp * 3 * 3072 * h * BF16  # whole experts: 112 per rank
    assert kinds == {
        "vision": 894_717_952,
        "embedding": 163840 // tp * h * BF16,  # vocab over attention TP
        "kda": 69 * kda,
        "norm": 93 * 2 * h * BF16 + h * BF16,  # two per layer and the final norm
        "dense_mlp": 3 * 11008 // tp * h * BF16,  # layer 0, KimiLinearConfig's 11,008
        "moe_router": 92 * (896 * h * BF16 + 896 * F32),  # gate and fp32 correction bias
        "shared_experts": 92 * 3 * 2 * 3072 // tp * h * BF16,
        "routed_experts": 92 * experts,
        "mla": 24 * mla,
        "lm_head": 163840 // tp * h * BF16,
    }
    assert sum(kinds.values()) == 1_376_932_219_376  # SGLang's figure


def test_kimi_linear_kda_splits_over_full_tp_under_dp_attention() -> None:
    kl = fixture("kimi-linear-48b-a3b.config.json")
    dp, tp = rank(kl, attn_tp=4, attn_dp=2), rank(kl, attn_tp=8)
    kda = {g.kind: g.tensors for g in dp.groups}["kda"]
    assert {t.name: t.shape for t in kda}["self_attn.dt_bias"] == (32 * 128 // 8,)
    assert {g.kind: g.tensors for g in tp.groups}["kda"] == kda
    mla = {t.name: t.shape for t in {g.kind: g.tensors for g in dp.groups}["mla"]}
    assert mla["self_attn.kv_b_proj.weight"] == (32 * 256 // 4, 512)  # MLA over attn_tp 4
    assert dp.total_bytes == 12_393_546_560  # SGLang's figure


def test_fp8_block_scales_golden() -> None:
    k3 = fixture("kimi-k3.config.json", {**FP8, "ignored_layers": ["b_proj", "layers.0.mlp"]})
    found = rank(k3, attn_tp=8, expert_parallel=True)
    mla = {t.name: (t.shape, t.dtype) for t in {g.kind: g.tensors for g in found.groups}["mla"]}
    assert mla["self_attn.fused_qkv_a_proj_with_mqa.weight_scale_inv"] == (
        (-(-2112 // 128), 7168 // 128), "float32")  # 2,112 rows: 17 blocks, the last partial
    assert mla["self_attn.kv_b_proj.weight"] == ((96 * 256 // 8, 512), "float8_e4m3fn")
    assert mla["self_attn.attn_mqa.k_scale"] == ((), "float32")
    assert found.total_bytes == 690_005_538_368  # SGLang's figure


def test_draft_holds_its_layers_fc_markov_head_and_rotary_cache() -> None:
    draft = rank(with_draft(preset("kimi-k3")), attn_tp=8, spec_tokens=3)
    h, tp = 7168, 8
    layer = (
        (64 + 2 * 64) // tp * 128 * h + h * 64 // tp * 128 + 2 * 128  # qkv, o_proj, q/k norms
        + 3 * 18432 // tp * h + 2 * h  # MLP, two norms
    ) * BF16
    once = (2 * h + h * 4 * h + 2 * 163840 * 64) * BF16  # norms, fc, Markov head
    assert draft.draft_bytes == 5 * layer + once + (1 << 20) * 128 * F32
    assert draft.draft_bytes == 1_242_212_864 + 536_870_912  # SGLang's figure + its buffer


def test_vocabulary_pads_to_64_then_to_64_times_the_group() -> None:
    assert padded_vocab(163840, 8) == 163840
    assert padded_vocab(100, 1) == 128
    assert padded_vocab(1000, 3) == 1152  # 1,024 does not split over 3: pad to 192


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_tp_shards_of_the_routed_experts_sum_to_the_whole(expert_parallel: bool) -> None:
    kl = fixture("kimi-linear-48b-a3b.config.json")
    whole = rank(kl, attn_tp=1).bytes_by_kind()["routed_experts"]
    for tp in (2, 4, 8):
        kinds = rank(kl, attn_tp=tp, expert_parallel=expert_parallel).bytes_by_kind()
        assert kinds["routed_experts"] * tp == whole


def test_expert_parallel_moves_the_split_but_not_the_bytes() -> None:
    k3 = preset("kimi-k3")
    tp, ep = rank(k3, attn_tp=8), rank(k3, attn_tp=8, expert_parallel=True)
    assert tp.total_bytes == ep.total_bytes
    assert tp.groups != ep.groups


@pytest.mark.parametrize("name", ["kimi-k3", "kimi-linear-48b"])
def test_pipeline_stages_partition_the_one_stage_rank(name: str) -> None:
    """Every stage but the first repeats K3's vision tower (SGLang builds it on each)."""
    model = preset(name)
    whole = rank(model, attn_tp=8).total_bytes
    plan = weights_per_rank(model, sglang(attn_tp=8, pp=2))
    vision = plan.stages[1].bytes_by_kind().get("vision", 0)
    assert sum(stage.total_bytes for stage in plan.stages) == whole + vision
    assert "embedding" in plan.stages[0].bytes_by_kind()
    assert "lm_head" in plan.stages[1].bytes_by_kind()
    assert "lm_head" not in plan.stages[0].bytes_by_kind()


def test_weights_are_deterministic_and_round_trip_json() -> None:
    k3 = fixture("kimi-k3.config.json", {**FP8, "ignored_layers": ["b_proj", "layers.0.mlp"]})
    plan = weights_per_rank(k3, sglang(attn_tp=8, pp=2))
    assert plan == weights_per_rank(k3, sglang(attn_tp=8, pp=2))
    assert WeightsPlan.model_validate_json(plan.model_dump_json()) == plan
    assert RankWeights.model_validate_json(plan.stages[0].model_dump_json()) == plan.stages[0]


def refusal(model: HybridModel, **fields: Any) -> Refusal:
    with pytest.raises(Refusal) as refused:
        weights_per_rank(model, sglang(**fields))
    return refused.value


def test_refuses_an_fp8_shard_under_one_block() -> None:
    found = refusal(fixture("kimi-k3.config.json", FP8), attn_tp=8)
    assert found.code == "quantization_unsupported"
    assert found.facts["module"] == "model.layers.0.self_attn.b_proj"  # 96 / 8 = 12 rows
    assert (found.facts["output"], found.facts["block_n"]) == (12, 128)


def test_refuses_a_fused_module_ignored_in_part() -> None:
    k3 = fixture("kimi-k3.config.json", {**FP8, "ignored_layers": ["q_proj"]})
    found = refusal(k3, attn_tp=1)
    assert found.code == "quantization_unsupported"
    assert found.facts["shards"] == ("q_proj", "k_proj", "v_proj", "g_proj")


def test_refuses_nvfp4_on_hopper_only() -> None:
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}
    k3 = fixture("kimi-k3.config.json", nvfp4)
    assert refusal(k3, attn_tp=8, gpu="h200").facts["gpu"] == "h200"
    assert rank(k3, attn_tp=8, gpu="b200").total_bytes == 431_727_718_952  # SGLang's figure


def test_refuses_plain_mxfp4_and_mxfp4_on_kimi_linear() -> None:
    plain = refusal(fixture("kimi-k3.config.json", {"quant_method": "mxfp4"}), attn_tp=8)
    assert (plain.code, plain.facts["quant_method"]) == ("quantization_unsupported", "mxfp4")
    ct = {
        "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}}},
        "ignore": ["lm_head"],
    }
    kl = refusal(fixture("kimi-linear-48b-a3b.config.json", ct), attn_tp=2)
    assert kl.facts["architecture"] == "KimiLinearForCausalLM"
    k3 = refusal(fixture("kimi-k3.config.json", ct), attn_tp=8)  # its linears are not ignored
    assert k3.code == "quantization_unsupported" and "module" in k3.facts


def test_refuses_a_draft_under_dp_attention() -> None:
    found = refusal(with_draft(preset("kimi-k3")), attn_tp=1, attn_dp=8, spec_tokens=3)
    assert (found.code, found.facts["attn_dp"]) == ("draft_unsupported", 8)


def test_refuses_a_draft_without_its_dimensions() -> None:
    k3 = with_draft(preset("kimi-k3"))
    assert k3.architecture is not None
    bare = HybridModel.model_validate(
        {**dict(k3), "architecture": k3.architecture.model_copy(update={"draft": None})}
    )
    found = refusal(bare, attn_tp=8, spec_tokens=3)
    assert (found.code, found.facts["field"]) == ("weights_unknown", "architecture.draft")
    assert rank(bare, attn_tp=8).draft_groups == ()  # without speculative tokens: no draft


def test_refuses_heads_and_splits_sglang_asserts() -> None:
    heads = refusal(preset("kimi-k3"), attn_tp=5)
    assert (heads.code, heads.facts["attn_tp"]) == ("heads_not_divisible", 5)
    uneven = refusal(preset("kimi-k3"), attn_tp=3)  # 11,008 and 896 experts do not split by 3
    assert uneven.code == "uneven_split"


def test_refuses_an_architecture_it_does_not_lay_out() -> None:
    k3 = preset("kimi-k3")
    assert k3.architecture is not None
    other = k3.architecture.model_copy(update={"architecture": "DeepseekV3ForCausalLM"})
    found = refusal(HybridModel.model_validate({**dict(k3), "architecture": other}), attn_tp=8)
    assert (found.code, found.facts["architecture"]) == ("weights_unknown", "DeepseekV3ForCausalLM")
