"""The per-rank weight harness (``sglang_weights.py``) against itself: SGLang 0.5.23's own model
classes, built per rank on the ``meta`` device, must split and place their parameters
consistently across ranks, stages and parallel layouts. No numbers are hard-coded: each check
compares one SGLang build with another.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from sglang_weights import require_sglang

require_sglang()

from sglang_weights import DRAFT_FILES, MODEL_FILES, sglang_weights  # noqa: E402

K3 = MODEL_FILES["kimi-k3"]
KL = MODEL_FILES["kimi-linear"]
_CACHE: dict[str, dict[str, Any]] = {}


def weights(config: Any, **kw: Any) -> dict[str, Any]:
    key = f"{config}|{sorted(kw.items())}"
    if key not in _CACHE:
        _CACHE[key] = sglang_weights(config, **kw)
    answer = _CACHE[key]
    assert "refused" not in answer, answer
    return answer


def numel(p: dict[str, Any]) -> int:
    return math.prod(p["shape"])


def test_totals_are_the_sum_of_the_parameters() -> None:
    w = weights(KL, tp=2)
    assert w["model_class"].endswith("KimiLinearForCausalLM")
    assert w["total_bytes"] == sum(p["bytes"] for p in w["params"].values())
    assert w["total_bytes"] == sum(k["bytes"] for k in w["kinds"].values())
    assert w["total_bytes"] == sum(w["bytes_by_dtype"].values())
    assert all(p["device"] == "meta" for p in w["params"].values())


def test_k3_builds_the_vl_wrapper() -> None:
    w = weights(K3, tp=8)
    assert w["model_class"].endswith("KimiK3ForConditionalGeneration")
    assert any(n.startswith("vision_tower.") for n in w["params"])
    assert any(n.startswith("language_model.model.layers.") for n in w["params"])


@pytest.mark.parametrize(("config", "tp"), [(KL, 2), (K3, 8)])
def test_pipeline_stages_partition_the_model(config: Any, tp: int) -> None:
    """PP=2: the stages hold disjoint layers whose union is the PP=1 rank's parameters;
    only the parameters outside the decoder stack may sit on both stages."""
    whole = weights(config, tp=tp)
    stages = [weights(config, tp=tp, pp=2, pp_rank=r) for r in (0, 1)]
    assert stages[0]["end_layer"] == stages[1]["start_layer"]
    assert (stages[0]["start_layer"], stages[1]["end_layer"]) == (
        whole["start_layer"],
        whole["end_layer"],
    )
    names = [set(s["params"]) for s in stages]
    assert names[0] | names[1] == set(whole["params"])
    for name in names[0] & names[1]:
        assert ".layers." not in name or name.startswith("vision_tower."), name
    for s in stages:
        for name, p in s["params"].items():
            assert p["shape"] == whole["params"][name]["shape"], name
    shared = sum(whole["params"][n]["bytes"] for n in names[0] & names[1])
    assert stages[0]["total_bytes"] + stages[1]["total_bytes"] == whole["total_bytes"] + shared
    embed = [n for n in whole["params"] if n.endswith("embed_tokens.weight")]
    head = [n for n in whole["params"] if n.endswith("lm_head.weight")]
    assert embed and head
    assert set(embed) <= names[0] - names[1]
    assert set(head) <= names[1] - names[0]


@pytest.mark.parametrize("config", [KL, K3])
def test_tensor_parallel_splits_one_dimension_or_replicates(config: Any) -> None:
    """Every TP=2 parameter is the TP=1 one, or it with exactly one dimension halved; a
    ``MergedColumnParallelRepeatedLinear`` (Kimi-Linear's fused KDA input projection) halves
    its split outputs and repeats the rest on every rank."""
    one, two = weights(config, tp=1), weights(config, tp=2)
    assert set(one["params"]) == set(two["params"])
    split = 0
    for name, p in two["params"].items():
        full = one["params"][name]["shape"]
        assert len(p["shape"]) == len(full), name
        diff = [i for i, (a, b) in enumerate(zip(full, p["shape"], strict=True)) if a != b]
        assert len(diff) <= 1, name
        if not diff:
            continue
        split += 1
        whole, part = full[diff[0]], p["shape"][diff[0]]
        if p["module"] == "MergedColumnParallelRepeatedLinear":
            assert part < whole < 2 * part, name
        else:
            assert whole == 2 * part, name
    assert split > 0


@pytest.mark.parametrize(("config", "tp"), [(KL, 2), (K3, 8)])
def test_every_rank_holds_the_same_bytes(config: Any, tp: int) -> None:
    first = weights(config, tp=tp, ep=tp)
    last = weights(config, tp=tp, ep=tp, tp_rank=tp - 1)
    assert last["parallel"]["tp_rank"] == tp - 1
    assert last["parallel"]["moe_ep_rank"] == tp - 1
    assert {n: p["shape"] for n, p in first["params"].items()} == {
        n: p["shape"] for n, p in last["params"].items()
    }


def test_expert_parallel_moves_the_split_from_intermediate_to_experts() -> None:
    """Routed experts: EP=TP splits the expert dimension, MoE-TP the intermediate one; the
    bytes per rank are the same; nothing outside the routed experts changes."""
    tp, ep = weights(KL, tp=2), weights(KL, tp=2, ep=2)
    assert (ep["parallel"]["moe_ep_size"], ep["parallel"]["moe_tp_size"]) == (2, 1)
    full = weights(KL, tp=1)
    for name, p in ep["params"].items():
        if ".experts.w" not in name:
            assert p["shape"] == tp["params"][name]["shape"], name
            continue
        f, t = full["params"][name]["shape"], tp["params"][name]["shape"]
        assert p["shape"][0] * 2 == f[0] and p["shape"][1:] == f[1:], name
        assert t[0] == f[0] and numel(tp["params"][name]) * 2 == numel(full["params"][name])
    assert ep["total_bytes"] == tp["total_bytes"]


def test_dp_attention_splits_mla_over_attention_tp() -> None:
    """Under DP attention (TP 8, DP 2) the MLA projections are the TP 4 ones; the routed
    experts stay split over the full TP group."""
    dp, tp4, tp8 = weights(KL, tp=8, dp=2), weights(KL, tp=4), weights(KL, tp=8)
    assert dp["parallel"]["attn_tp_size"] == 4
    mla = [n for n in dp["params"] if ".self_attn.kv_b_proj." in n or ".self_attn.q_proj." in n]
    assert mla
    for name in mla:
        assert dp["params"][name]["shape"] == tp4["params"][name]["shape"], name
    experts = [n for n in dp["params"] if ".experts.w" in n]
    for name in experts:
        assert dp["params"][name]["shape"] == tp8["params"][name]["shape"], name


def test_fp8_block_scales_cover_the_weights() -> None:
    """fp8 block 128x128: each fp8 weight has a float32 ``weight_scale_inv`` with one entry per
    block, and the same element count as the unquantized weight."""
    fp8, bf16 = weights(K3, tp=1, quantization="fp8-block"), weights(K3, tp=1)
    assert fp8["quant_method"] == "fp8"
    quantized = [n for n, p in fp8["params"].items() if p["dtype"] == "float8_e4m3fn"]
    assert quantized
    for name in quantized:
        w = fp8["params"][name]
        assert numel(w) == numel(bf16["params"][name]), name
        scale = fp8["params"][name.removesuffix("weight") + "weight_scale_inv"]
        assert scale["dtype"] == "float32"
        blocks = [math.ceil(d / 128) for d in w["shape"][-2:]]
        assert scale["shape"][-2:] == blocks, name
        assert scale["shape"][:-2] == w["shape"][:-2], name
    assert fp8["total_bytes"] < bf16["total_bytes"]


def test_fp8_block_refused_where_a_shard_breaks_a_block() -> None:
    """SGLang's own check: at TP 8 the KDA ``b_proj`` shard (96 heads / 8) is under one
    128-row block, so a config quantizing every linear is refused."""
    answer = sglang_weights(K3, tp=8, quantization="fp8-block")
    assert "refused" in answer
    assert "block_n" in answer["refused"]


def test_dspark_draft_shares_embedding_and_head() -> None:
    tp1 = weights(K3, tp=1, draft=DRAFT_FILES["sglang-dspark"])
    tp8 = weights(K3, tp=8, draft=DRAFT_FILES["sglang-dspark"])
    assert tp8["model_class"].endswith("DSparkDraftModel")
    assert not any("embed_tokens" in n or "lm_head" in n for n in tp8["params"])
    assert set(tp1["params"]) == set(tp8["params"])
    qkv = "layers.0.self_attn.qkv_proj.weight"
    assert numel(tp1["params"][qkv]) == 8 * numel(tp8["params"][qkv])
    assert tp8["params"]["fc.weight"] == tp1["params"]["fc.weight"]
