"""k3layout's vLLM weights per rank against vLLM 0.33's own model classes built on ``meta``.

For each case the planner's :class:`~k3layout.RankWeights` of every pipeline stage is
compared, tensor by tensor (vLLM's parameter or buffer name, the rank's shape, the dtype),
with what ``vllm_weights`` finds on rank 0 of that stage (the heaviest where experts split
unevenly), and the totals must be equal; where vLLM refuses the configuration, k3layout must
refuse it too. Both sides count every registered buffer (persistent or not).

Cases cover Kimi-K3 (multimodal, with its default vision tower) and Kimi-Linear; TP 1 to 16,
expert parallelism, attention DP (the MoE over DP x TP; sequence parallel), PP 2 on every
stage; bf16, fp8 block (built and refused), compressed-tensors int4, mxfp4 and NVFP4;
ignore lists; DSpark and MTP drafts; latent MoE and attention residuals (config overrides);
the GPU's effect on K3 KDA's decode buffers (H200, B200, A100).

Not compared here: fp8 experts whose TP shard is off the block grid, which vLLM serves with
refined scale blocks through its Triton kernels (this CPU build has no Triton, so vLLM's MoE
oracle finds no backend and raises).
"""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from vllm_required import require_vllm, running

require_vllm()
RELEASE = running()
"""The vLLM release installed, which k3layout plans for."""

from vllm_engine import DSPARK_DRAFT, FIXTURES  # noqa: E402
from vllm_weights import QUANTIZATIONS, Weights, fixture_config, vllm_weights  # noqa: E402

from k3layout import Deployment, Refusal, load_config, weights_per_rank  # noqa: E402
from k3layout.weights import RankWeights, WeightsPlan  # noqa: E402

K3 = FIXTURES / "kimi-k3.config.json"
LINEAR = FIXTURES / "kimi-linear-48b-a3b.config.json"
CAPABILITY = {"h200": (9, 0), "b200": (10, 0), "a100": (8, 0)}
TARGET_LAYERS = {K3: "language_model.model.layers.", LINEAR: "model.layers."}
DRAFT_LAYERS = "model.layers."

WIDE_DENSE = {"intermediate_size": 18432}  # a dense layer 0 whose fp8 shards cut into blocks
LATENT = {"routed_expert_hidden_size": 1024, "latent_moe_use_norm": True, "attn_res_block_size": 4}
FP8 = QUANTIZATIONS["fp8-block"]


def fp8_ignoring(*modules: str) -> dict[str, Any]:
    """Block fp8 leaving ``modules`` (checkpoint names) unquantized."""
    return {**FP8, "ignored_layers": list(modules)}


DENSE_PARTS = tuple(f"language_model.layers.0.mlp.{p}" for p in ("gate_proj", "up_proj"))
NVFP4_WILDCARDS = {**QUANTIZATIONS["nvfp4"], "exclude_modules": ["lm_head", "*self_attn*"]}
NVFP4_HEAD = {k: v for k, v in QUANTIZATIONS["nvfp4"].items() if k != "exclude_modules"}

CASES: dict[str, tuple[Path, dict[str, Any]]] = {
    # Kimi-K3, bf16
    "k3-tp1": (K3, {"tp": 1}),
    "k3-tp2": (K3, {"tp": 2}),  # the vision tower's 12 heads split
    "k3-tp8": (K3, {"tp": 8}),
    "k3-tp8-ep": (K3, {"tp": 8, "ep": True}),
    "k3-tp16": (K3, {"tp": 16}),  # MoE padded to 256 columns a rank
    "k3-tp16-ep": (K3, {"tp": 16, "ep": True}),
    "k3-dp3-tp8-ep": (K3, {"tp": 8, "dp": 3, "ep": True}),  # 896 / 24: rank 0 holds 38
    "k3-dp2-tp8": (K3, {"tp": 8, "dp": 2}),
    "k3-pp2-tp8": (K3, {"tp": 8, "pp": 2}),
    # the GPU decides K3 KDA's decode buffers
    "k3-tp8-b200": (K3, {"tp": 8, "gpu": "b200"}),
    "k3-tp8-a100": (K3, {"tp": 8, "gpu": "a100"}),
    "k3-tp4-b200": (K3, {"tp": 4, "gpu": "b200"}),
    # drafts
    "k3-tp8-ep-dspark": (K3, {"tp": 8, "ep": True, "draft": "dspark"}),
    "k3-tp8-dspark-b200": (K3, {"tp": 8, "draft": "dspark", "gpu": "b200", "spec": 3}),
    "k3-pp2-tp8-dspark": (K3, {"tp": 8, "pp": 2, "draft": "dspark"}),
    "k3-tp8-ep-mtp": (K3, {"tp": 8, "ep": True, "draft": "mtp"}),
    "k3-pp2-tp8-mtp": (K3, {"tp": 8, "pp": 2, "draft": "mtp"}),
    # quantized
    "k3-tp8-ep-fp8-fixture": (K3, {"tp": 8, "ep": True, "quantization": FP8}),  # refused
    "k3-tp8-ep-fp8": (K3, {"tp": 8, "ep": True, "quantization": FP8, "text": WIDE_DENSE}),
    "k3-tp4-fp8": (K3, {"tp": 4, "quantization": FP8, "text": WIDE_DENSE}),
    "k3-tp8-fp8-ignore": (
        K3,
        {
            "tp": 8,
            "ep": True,
            "quantization": fp8_ignoring(*DENSE_PARTS, DENSE_PARTS[0][:-9] + "down_proj"),
        },
    ),
    "k3-tp8-fp8-half-ignored": (
        K3,
        {"tp": 8, "ep": True, "quantization": fp8_ignoring(DENSE_PARTS[0])},
    ),
    "k3-tp8-ep-int4": (K3, {"tp": 8, "ep": True, "quantization": QUANTIZATIONS["int4-w4a16"]}),
    "k3-tp8-ep-mxfp4": (K3, {"tp": 8, "ep": True, "quantization": QUANTIZATIONS["mxfp4"]}),
    "k3-tp8-ep-nvfp4": (K3, {"tp": 8, "ep": True, "quantization": QUANTIZATIONS["nvfp4"]}),
    "k3-tp4-nvfp4": (K3, {"tp": 4, "quantization": QUANTIZATIONS["nvfp4"]}),
    "k3-tp8-ep-nvfp4-head": (K3, {"tp": 8, "ep": True, "quantization": NVFP4_HEAD}),
    "k3-tp8-ep-nvfp4-wildcards": (K3, {"tp": 8, "ep": True, "quantization": NVFP4_WILDCARDS}),
    # Kimi-Linear
    "kl-tp1": (LINEAR, {"tp": 1}),
    "kl-tp2": (LINEAR, {"tp": 2}),
    "kl-tp4": (LINEAR, {"tp": 4}),
    "kl-tp8": (LINEAR, {"tp": 8}),  # MoE padded: 2 x 256 columns, not 2 x 128
    "kl-tp8-ep": (LINEAR, {"tp": 8, "ep": True}),
    "kl-dp2-tp4": (LINEAR, {"tp": 4, "dp": 2}),
    "kl-dp2-tp4-ep": (LINEAR, {"tp": 4, "dp": 2, "ep": True}),  # sequence parallel
    "kl-pp2-tp2": (LINEAR, {"tp": 2, "pp": 2}),
    "kl-tp2-fp8": (LINEAR, {"tp": 2, "quantization": FP8}),
    "kl-tp8-fp8": (LINEAR, {"tp": 8, "quantization": FP8}),
    "kl-dp64-fp8": (LINEAR, {"tp": 1, "dp": 64, "quantization": FP8}),  # 16 columns: refused
    "kl-tp2-int4": (LINEAR, {"tp": 2, "quantization": QUANTIZATIONS["int4-w4a16"]}),
    "kl-tp8-mxfp4": (LINEAR, {"tp": 8, "quantization": QUANTIZATIONS["mxfp4"]}),
    "kl-tp2-nvfp4": (LINEAR, {"tp": 2, "quantization": QUANTIZATIONS["nvfp4"]}),
    "kl-tp2-latent": (LINEAR, {"tp": 2, "text": LATENT}),
    "kl-pp2-tp2-latent-fp8": (LINEAR, {"tp": 2, "pp": 2, "quantization": FP8, "text": LATENT}),
}


@cache
def engine(name: str, stage: int) -> Weights | str:
    """vLLM's rank 0 of ``stage`` for case ``name``, or the message of what vLLM raised."""
    path, case = CASES[name]
    draft = case.get("draft")
    try:
        return vllm_weights(
            path,
            tp=case["tp"],
            dp=case.get("dp", 1),
            enable_expert_parallel=case.get("ep", False),
            pp=case.get("pp", 1),
            pp_rank=stage,
            quantization=case.get("quantization"),
            draft=draft,
            spec_tokens=case.get("spec", 1),
            text_config=case.get("text"),
            capability=CAPABILITY[case.get("gpu", "h200")],
        )
    except (ValueError, AssertionError) as error:
        return f"{type(error).__name__}: {error}"


@cache
def planner(name: str) -> WeightsPlan | Refusal:
    """k3layout's plan for case ``name`` (the same config.json vLLM reads), or its refusal."""
    path, case = CASES[name]
    draft = case.get("draft")
    config = fixture_config(path, case.get("quantization"), int(draft == "mtp"), case.get("text"))
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "config.json"
        file.write_text(json.dumps(config))
        model = load_config(file, draft=DSPARK_DRAFT / "config.json" if draft == "dspark" else None)
    deployment = Deployment(
        engine_version=RELEASE,
        engine="vllm",
        attn_tp=case["tp"],
        attn_dp=case.get("dp", 1),
        expert_parallel=case.get("ep", False),
        pp=case.get("pp", 1),
        spec_tokens=case.get("spec", 1) if draft else 0,
        gpu=case.get("gpu", "h200"),
    )
    try:
        return weights_per_rank(model, deployment)
    except Refusal as refusal:
        return refusal


def planned_tensors(rank: RankWeights, path: Path) -> dict[tuple[str, str], tuple[Any, ...]]:
    """``(part, vLLM name) -> (shape, dtype, bytes)`` of the planner's rank (a layer group's
    tensors are named within their decoder layer)."""
    out: dict[tuple[str, str], tuple[Any, ...]] = {}
    for part, groups, prefix in (
        ("target", rank.groups, TARGET_LAYERS[path]),
        ("draft", rank.draft_groups, DRAFT_LAYERS),
    ):
        for group in groups:
            for layer in group.layers or (None,):
                for tensor in group.tensors:
                    name = tensor.name if layer is None else f"{prefix}{layer}.{tensor.name}"
                    assert (part, name) not in out, name
                    out[part, name] = (tensor.shape, tensor.dtype, tensor.nbytes)
    return out


def engine_tensors(weights: Weights) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        (part, name): (info.shape, info.dtype.removeprefix("torch."), info.nbytes)
        for part, tensors in (("target", weights.target), ("draft", weights.draft))
        for name, info in tensors.items()
    }


def stages(name: str) -> list[tuple[str, int]]:
    return [(name, stage) for stage in range(CASES[name][1].get("pp", 1))]


@pytest.mark.parametrize(("name", "stage"), [s for n in CASES for s in stages(n)])
def test_every_tensor_of_the_rank_is_vllms(name: str, stage: int) -> None:
    """The planner's rank holds exactly vLLM's tensors (names, shapes, dtypes), so the
    same bytes; where vLLM refuses, k3layout refuses the weights (``quantization_unsupported``
    for a quantized shard vLLM's kernels cannot cut)."""
    built, plan = engine(name, stage), planner(name)
    if isinstance(built, str):
        assert isinstance(plan, Refusal), f"vLLM raised {built}; k3layout planned"
        assert plan.code == "quantization_unsupported", plan
        return
    assert not isinstance(plan, Refusal), f"k3layout refused what vLLM builds: {plan}"
    rank = plan.stages[stage]
    mine, theirs = planned_tensors(rank, CASES[name][0]), engine_tensors(built)
    missing, extra = sorted(set(theirs) - set(mine)), sorted(set(mine) - set(theirs))
    assert not missing and not extra, (missing[:5], extra[:5])
    assert {k: v for k, v in mine.items() if theirs[k] != v} == {}
    assert rank.total_bytes == built.bytes()
    assert rank.draft_bytes == built.bytes("draft")


def test_the_refused_cases_are_refused_by_vllm() -> None:
    """The grid holds cases vLLM refuses (so the refusal path above runs): K3's 11,008-wide
    dense layer at TP 8 in fp8 (1,376 columns a rank), a fused layer half ignored, 16 MoE
    columns a rank in fp8."""
    refused = {n for n in CASES if isinstance(engine(n, 0), str)}
    assert refused == {"k3-tp8-ep-fp8-fixture", "k3-tp8-fp8-half-ignored", "kl-dp64-fp8"}
