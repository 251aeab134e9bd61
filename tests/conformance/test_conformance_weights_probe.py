"""The weights harness (``vllm_weights``) against itself: each rank's tensors, built by vLLM's
own model classes on ``meta``, add up across ranks to the single-rank model, as vLLM's
splits say they must. (The planner's conformance with these figures comes later.)"""

from __future__ import annotations

import json
import math
from functools import cache
from typing import Any

import pytest
from vllm_required import require_vllm

require_vllm()

from vllm_engine import FIXTURES  # noqa: E402
from vllm_weights import TensorInfo, Weights, vllm_weights  # noqa: E402

K3 = FIXTURES / "kimi-k3.config.json"
LINEAR = FIXTURES / "kimi-linear-48b-a3b.config.json"
EXPERTS = ("w13_weight", "w2_weight")


@cache
def _build(path: str, **flags: Any) -> Weights:
    return vllm_weights(path, **flags)


def build(path: object, **flags: Any) -> Weights:
    """``vllm_weights``, once per case for the module."""
    return _build(str(path), **flags)


def numel(info: TensorInfo) -> int:
    return math.prod(info.shape)


def params(weights: Weights) -> dict[str, TensorInfo]:
    return {n: t for n, t in weights.target.items() if t.kind == "parameter"}


def test_tp_ranks_add_up_to_one_rank() -> None:
    """At TP 2 (no padding: 1024 / 2 >= 256 MoE columns, vocabulary a multiple of 64 x 2),
    every parameter is either the same on both ranks (replicated) or split in two, and the
    two ranks' shards hold exactly the single rank's elements; but KDA's fused input
    projection, whose ``f_a`` shard (``head_dim`` rows) every rank holds whole."""
    config = json.loads(LINEAR.read_text())
    f_a_rows, hidden = config["linear_attn_config"]["head_dim"], config["hidden_size"]
    whole = params(build(LINEAR))
    ranks = [params(build(LINEAR, tp=2, tp_rank=rank)) for rank in (0, 1)]
    assert set(ranks[0]) == set(ranks[1]) == set(whole)
    replicated = split = 0
    for name, info in whole.items():
        shards = [rank[name] for rank in ranks]
        assert shards[0] == shards[1], name  # equal shapes on every rank
        if shards[0].shape == info.shape:
            replicated += 1
            continue
        split += 1
        excess = sum(numel(s) for s in shards) - numel(info)
        partly = name.endswith("in_proj_qkvgfab.weight")
        assert excess == (f_a_rows * hidden if partly else 0), name
    assert replicated and split
    assert {n for n, t in whole.items() if ranks[0][n].shape == t.shape} >= {
        "model.layers.0.self_attn.g_a_proj.weight",  # the low-rank gate's first half
        "model.layers.3.self_attn.kv_a_proj_with_mqa.weight",  # MLA's latent projection
        "model.layers.1.block_sparse_moe.gate.weight",  # the router
    }


def test_expert_parallel_splits_experts_not_columns() -> None:
    """With ``--enable-expert-parallel`` at TP 8, a rank holds 1/8 of the experts, each
    whole; without it, all experts with 1/8 of the columns. Same bytes either way."""
    whole = params(build(K3))
    ep = params(build(K3, tp=8, enable_expert_parallel=True))
    tp = params(build(K3, tp=8))
    for name, info in whole.items():
        if name.rsplit(".", 1)[-1] in EXPERTS:
            experts, *rest = info.shape
            assert ep[name].shape == (experts // 8, *rest), name
            assert tp[name].shape[0] == experts, name
            assert numel(ep[name]) * 8 == numel(info) == numel(tp[name]) * 8, name


def test_moe_columns_pad_to_the_partition_minimum() -> None:
    """Kimi-Linear's 1024 expert columns over TP 8 are 128 a rank, under vLLM's default
    ``min_moe_intermediate_per_partition`` (256): the rank holds more than an eighth. At
    TP 4 (256 a rank) it holds exactly a quarter."""
    whole = params(build(LINEAR))
    four = params(build(LINEAR, tp=4))
    eight = params(build(LINEAR, tp=8))
    for name, info in whole.items():
        if name.rsplit(".", 1)[-1] in EXPERTS:
            assert numel(four[name]) * 4 == numel(info), name
            assert numel(eight[name]) * 8 > numel(info), name


def test_data_parallel_attention_and_flattened_moe() -> None:
    """At DP 2 x TP 4 the attention is the TP 4 attention; the MoE spans all 8 ranks (an
    eighth of the expert columns, without EP; an eighth of the experts, with EP)."""
    whole = params(build(LINEAR))
    tp4 = params(build(LINEAR, tp=4))
    dp = params(build(LINEAR, tp=4, dp=2))
    dp_ep = params(build(LINEAR, tp=4, dp=2, enable_expert_parallel=True))
    for name, info in whole.items():
        if name.rsplit(".", 1)[-1] in EXPERTS:
            assert numel(dp[name]) * 8 == numel(dp_ep[name]) * 8 == numel(info), name
            assert dp_ep[name].shape[0] * 8 == info.shape[0], name
        elif ".self_attn." in name:
            assert dp[name] == tp4[name] == dp_ep[name], name


def test_pipeline_stages_partition_the_model() -> None:
    """Two pipeline stages hold disjoint tensors that together are the one-stage model (the
    embedding on the first, the final norm and LM head on the last)."""
    whole = build(LINEAR).target
    first = build(LINEAR, pp=2, pp_rank=0).target
    last = build(LINEAR, pp=2, pp_rank=1).target
    assert not set(first) & set(last)
    assert {**first, **last} == whole
    assert "model.embed_tokens.weight" in first
    assert {"model.norm.weight", "lm_head.weight"} <= set(last)


def test_drafts_share_the_target_embedding_and_head() -> None:
    """DSpark and MTP drafts use the target's embedding and LM head (vLLM's proposer
    loaders alias them): the draft's own tensors exclude them."""
    target = build(K3, tp=8, enable_expert_parallel=True)
    for draft in ("dspark", "mtp"):
        both = build(K3, tp=8, enable_expert_parallel=True, draft=draft)
        assert both.draft and both.bytes("draft") > 0
        assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(both.shared)
        assert not any("embed_tokens" in n or "lm_head" in n for n in both.draft)
        # the target's parameters do not change with a draft (its KDA decode buffers may)
        assert params(both) == params(target)


def test_fp8_block_scales_cover_the_weights() -> None:
    """fp8 block quantisation: each fp8 weight (a byte an element, half its bf16 bytes) has
    a float32 ``weight_scale_inv`` of one entry per 128 x 128 block."""
    bf16 = params(build(LINEAR, tp=2))
    fp8 = params(build(LINEAR, tp=2, quantization="fp8-block"))
    quantised = [n for n, t in fp8.items() if t.dtype == "torch.float8_e4m3fn"]
    assert quantised
    for name in quantised:
        weight = fp8[name]
        scale = fp8[f"{name}_scale_inv"]
        assert weight.shape == bf16[name].shape and 2 * weight.nbytes == bf16[name].nbytes
        *experts, rows, cols = weight.shape
        assert scale.shape == (*experts, -(-rows // 128), -(-cols // 128)), name
        assert scale.dtype == "torch.float32"


@pytest.mark.parametrize("method", ["int4-w4a16", "mxfp4", "nvfp4"])
def test_four_bit_experts_are_a_quarter(method: str) -> None:
    """4-bit routed experts hold a quarter of their bf16 bytes, plus scales."""
    bf16 = params(build(LINEAR, tp=2))
    four = params(build(LINEAR, tp=2, quantization=method))
    for layer in ("1", "26"):
        prefix = f"model.layers.{layer}.block_sparse_moe.experts.routed_experts."
        for weight in EXPERTS:
            name = prefix + weight
            stored = four.get(name) or four[name.replace("_weight", "_weight_packed")]
            assert 4 * stored.nbytes == bf16[name].nbytes, name
            assert any(n.startswith(prefix + weight) and "scale" in n for n in four), name
