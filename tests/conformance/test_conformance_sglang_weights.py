"""k3layout's SGLang weights rule (``k3layout.engines.sglang.weights``) against SGLang 0.5.23's
own model classes, built for one rank on the ``meta`` device (``sglang_weights.py``).

For every case the planner's rank must hold exactly SGLang's tensors: the same names (the
planner's layer groups expanded to SGLang's ``...layers.<i>.`` names), shapes and dtypes, and
so the same bytes in total and per kind. Counted on both sides: every parameter and every
buffer the model allocates on its own device (``gpu_buffer_bytes``: the DSpark draft's fp32
rotary cache; K3's vision ``time_weight`` is built on the CPU). Where SGLang refuses a case,
k3layout must refuse it too, for the same reason.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from sglang_weights import require_sglang

require_sglang()

from sglang_weights import DRAFT_FILES, MODEL_FILES, QUANTIZATIONS, sglang_weights  # noqa: E402

from k3layout import Deployment, Refusal  # noqa: E402
from k3layout.layouts.weights import weights_per_rank  # noqa: E402
from k3layout.model import GQALayer, HybridModel, model_from_config  # noqa: E402
from k3layout.model.architecture import Architecture  # noqa: E402
from k3layout.model.hf_weights import dspark_draft_of  # noqa: E402
from k3layout.weights import RankWeights  # noqa: E402

FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
NVFP4 = QUANTIZATIONS["nvfp4"]
INT4 = QUANTIZATIONS["int4-w4a16-g32"]
K3_EXTRAS = {"attn_res_block_size": 6, "routed_expert_hidden_size": 3584,
             "latent_moe_use_norm": True}
"""Kimi-K3's attention residuals and latent MoE (not in the fixture; SGLang builds both)."""


@dataclass(frozen=True)
class Case:
    """One rank: SGLang's ``--tp-size tp``, ``--dp-size dp --enable-dp-attention`` (dp > 1),
    ``--ep-size ep`` (1 or tp), ``--pp-size pp`` and the stage, a ``quantization_config``
    (a name of the harness's ``QUANTIZATIONS`` or a dict), a DSpark draft."""

    model: str
    tp: int = 8
    dp: int = 1
    ep: int = 1
    pp: int = 1
    stage: int = 0
    quant: str | None = None
    quant_config: tuple[tuple[str, Any], ...] = ()
    gpu: str = "h200"
    draft: bool = False
    extra: tuple[tuple[str, Any], ...] = field(default=())

    def __str__(self) -> str:
        parts = [self.model, f"tp{self.tp}"]
        parts += [f"{k}{v}" for k, v in (("dp", self.dp), ("ep", self.ep)) if v > 1]
        if self.pp > 1:
            parts.append(f"pp{self.pp}s{self.stage}")
        parts += [p for p in (self.quant, self.gpu if self.gpu != "h200" else None) if p]
        parts += ["draft"] * self.draft + ["extras"] * bool(self.extra)
        return "-".join(parts)

    def quantization(self) -> dict[str, Any] | None:
        if self.quant_config:
            return dict(self.quant_config)
        return None if self.quant is None else QUANTIZATIONS.get(self.quant)


def _q(config: dict[str, Any], name: str, **changes: Any) -> dict[str, Any]:
    """A case's fields for a custom quantization_config named ``name``."""
    return {"quant": name, "quant_config": tuple({**config, **changes}.items())}


BUILT = [
    # bf16: TP, EP, attention DP, pipeline stages, Blackwell
    *(Case("kimi-k3", tp=tp) for tp in (1, 8, 16)),
    Case("kimi-k3", tp=8, ep=8),
    Case("kimi-k3", tp=16, ep=16),
    Case("kimi-k3", tp=8, dp=8),
    Case("kimi-k3", tp=8, dp=2, ep=8),
    Case("kimi-k3", tp=16, dp=2),
    Case("kimi-k3", tp=8, pp=2, stage=0),
    Case("kimi-k3", tp=8, pp=2, stage=1),
    Case("kimi-k3", tp=4, ep=4, pp=2, stage=1),
    Case("kimi-k3", tp=16, gpu="b200"),
    Case("kimi-k3", tp=8, extra=tuple(K3_EXTRAS.items())),
    *(Case("kimi-linear", tp=tp) for tp in (1, 2, 4, 8, 16)),
    Case("kimi-linear", tp=8, ep=8),
    Case("kimi-linear", tp=8, dp=2),
    Case("kimi-linear", tp=8, dp=4),
    Case("kimi-linear", tp=2, pp=2, stage=0),
    Case("kimi-linear", tp=2, pp=2, stage=1),
    # fp8 block: whole blocks, and ignore lists as SGLang matches them
    Case("kimi-k3", tp=1, quant="fp8-block"),
    Case("kimi-k3", tp=8, quant="fp8-block-tp8"),
    Case("kimi-k3", tp=8, ep=8, quant="fp8-block-tp8"),
    Case("kimi-k3", tp=16, ep=16, quant="fp8-block-tp8"),
    Case("kimi-k3", tp=8, ep=8, **_q(FP8, "fp8-shards", modules_to_not_convert=[
        "self_attn.b_proj", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
        "model.layers.0.mlp.down_proj"])),
    Case("kimi-k3", tp=8, **_q(FP8, "fp8-experts-bf16", ignored_layers=[
        "experts", "b_proj", "layers.0.mlp", "language_model.layers.3.self_attn"])),
    Case("kimi-k3", tp=4, **_q(FP8, "fp8-one-layer", ignored_layers=[
        "b_proj", "layers.0.mlp", "model.layers.4.self_attn.kv_b_proj",
        "layers.1.self_attn.fused_qkvg_proj"])),
    Case("kimi-linear", tp=1, quant="fp8-block"),
    Case("kimi-linear", tp=1, **_q(FP8, "fp8-kl-ignores", ignored_layers=[
        "shared_experts", "block_sparse_moe.experts", "model.layers.5.self_attn"])),
    # compressed-tensors int4 W4A16 and MXFP4 (K3 only), ModelOpt NVFP4 (Blackwell)
    Case("kimi-k3", tp=8, quant="int4-w4a16-g32"),
    Case("kimi-k3", tp=16, ep=16, quant="int4-w4a16-g32"),
    Case("kimi-k3", tp=8, **_q(INT4, "int4-attention", ignore=[
        "lm_head", "re:.*self_attn\\.(q|k|v|g)_proj", "mlp.gate_up_proj"])),
    Case("kimi-linear", tp=2, quant="int4-w4a16-g32"),
    Case("kimi-linear", tp=8, ep=8, quant="int4-w4a16-g32"),
    Case("kimi-linear", tp=8, dp=2, quant="int4-w4a16-g32"),
    Case("kimi-k3", tp=8, quant="ct-mxfp4"),
    Case("kimi-k3", tp=8, ep=8, quant="ct-mxfp4"),
    Case("kimi-k3", tp=16, quant="ct-mxfp4", gpu="b200"),
    Case("kimi-k3", tp=8, quant="nvfp4", gpu="b200"),
    Case("kimi-k3", tp=8, ep=8, quant="nvfp4", gpu="b200"),
    Case("kimi-k3", tp=16, quant="nvfp4", gpu="b200"),
    Case("kimi-k3", tp=8, gpu="b200", **_q(NVFP4, "nvfp4-head", exclude_modules=[])),
    Case("kimi-k3", tp=8, gpu="b200", **_q(NVFP4, "nvfp4-globs", exclude_modules=[
        "lm_head", "language_model.layers.*.self_attn.q_b_proj", "*shared_experts*",
        "model.layers.0.mlp*"])),
    Case("kimi-linear", tp=2, quant="nvfp4", gpu="b200"),
    Case("kimi-linear", tp=2, gpu="b200", **_q(NVFP4, "nvfp4-kl-attention", exclude_modules=[
        "lm_head", "*self_attn*"])),
    # SGLang's dense DSpark draft, in the target's TP scope
    *(Case("kimi-k3", tp=tp, draft=True) for tp in (1, 8, 16)),
]

REFUSED = [
    # (case, k3layout's code, a word of SGLang's own message)
    (Case("kimi-k3", tp=8, quant="fp8-block"), "quantization_unsupported", "block_n"),
    (Case("kimi-k3", tp=16, quant="fp8-block-tp8"), "quantization_unsupported", "block_n"),
    (Case("kimi-linear", tp=2, quant="fp8-block"), "quantization_unsupported", "block_n"),
    (Case("kimi-k3", tp=8, ep=8, **_q(FP8, "fp8-partial-shards", ignored_layers=[
        "q_proj", "b_proj", "layers.0.mlp"])), "quantization_unsupported", "shards"),
    (Case("kimi-k3", tp=8, quant="nvfp4"), "quantization_unsupported", "NVFP4"),
    (Case("kimi-linear", tp=2, quant="nvfp4"), "quantization_unsupported", "NVFP4"),
    (Case("kimi-k3", tp=8, quant="mxfp4"), "quantization_unsupported", "AssertionError"),
    (Case("kimi-linear", tp=2, quant="ct-mxfp4"), "quantization_unsupported", "scheme"),
    (Case("kimi-k3", tp=8, dp=8, draft=True), "draft_unsupported", "dp-lm-head"),
]


@functools.cache
def _config(model: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(MODEL_FILES[model].read_text())
    return config


def _model_dir(case: Case, tmp: Any) -> Any:
    """The fixture, with the case's extra text fields, for SGLang."""
    if not case.extra:
        return MODEL_FILES[case.model]
    config = json.loads(json.dumps(_config(case.model)))
    config.get("text_config", config).update(dict(case.extra))
    path = tmp / f"{case}.json"
    path.write_text(json.dumps(config))
    return path


def planner_model(case: Case) -> HybridModel:
    """The planner's model from the same config.json SGLang reads (with the case's
    ``quantization_config``); a draft as SGLang's bridge reads it (GQA layers) with the
    dimensions its weights need."""
    config = json.loads(json.dumps(_config(case.model)))
    config.get("text_config", config).update(dict(case.extra))
    quant = case.quantization()
    if quant is not None:
        config["quantization_config"] = quant
    model = model_from_config(config, name=case.model)
    if not case.draft:
        return model
    draft = json.loads(DRAFT_FILES["sglang-dspark"].read_text())
    layer = GQALayer(num_heads=draft["num_attention_heads"],
                     num_kv_heads=draft["num_key_value_heads"], head_dim=draft["head_dim"])
    # SGLang's draft config has no target_hidden_size: its fc reads hidden_size-wide features
    dims = dspark_draft_of({**draft, "target_hidden_size": draft["hidden_size"]}, "draft")
    assert model.architecture is not None and dims is not None
    return HybridModel(
        name=model.name, model_type=model.model_type, layers=model.layers,
        draft_layers=(layer,) * draft["num_hidden_layers"], drafter="dspark",
        context_tokens=model.context_tokens,
        architecture=Architecture.model_validate({**dict(model.architecture), "draft": dims}),
    )


def planned(case: Case) -> RankWeights:
    deployment = Deployment(
        engine="sglang", attn_tp=case.tp // case.dp, attn_dp=case.dp, pp=case.pp,
        expert_parallel=case.ep > 1, gpu=case.gpu, spec_tokens=3 if case.draft else 0,
    )
    return weights_per_rank(planner_model(case), deployment).stages[case.stage]


def built(case: Case, tmp: Any) -> dict[str, Any]:
    return sglang_weights(
        _model_dir(case, tmp), tp=case.tp, dp=case.dp, ep=case.ep, pp=case.pp,
        pp_rank=case.stage, quantization=case.quantization(), gpu=case.gpu,
        draft=DRAFT_FILES["sglang-dspark"] if case.draft else None,
    )


def engine_tensors(answer: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    found = {n: (tuple(p["shape"]), p["dtype"]) for n, p in answer["params"].items()}
    for name, buffer in answer["buffers"].items():
        if buffer["device"] == "meta":
            found[name] = (tuple(buffer["shape"]), buffer["dtype"])
    return found


def planner_tensors(rank: RankWeights, case: Case, num_layers: int) -> dict[str, Any]:
    """The planner's tensors under SGLang's full names."""
    if case.draft:
        groups, prefix, first = rank.draft_groups, "layers.", num_layers
    else:
        groups, first = rank.groups, 0
        prefix = "language_model.model.layers." if case.model == "kimi-k3" else "model.layers."
    found: dict[str, Any] = {}
    for group in groups:
        for tensor in group.tensors:
            names = [f"{prefix}{i - first}.{tensor.name}" for i in group.layers] or [tensor.name]
            for name in names:
                assert name not in found, name
                found[name] = (tensor.shape, tensor.dtype)
    return found


def kind_of(name: str) -> str:
    return ".".join(p if not p.isdigit() else "N" for p in name.split("."))


@pytest.mark.parametrize("case", BUILT, ids=str)
def test_the_planner_holds_the_tensors_sglang_builds(case: Case, tmp_path: Any) -> None:
    answer = built(case, tmp_path)
    assert "refused" not in answer, answer
    rank = planned(case)
    ours = planner_tensors(rank, case, planner_model(case).num_layers)
    theirs = engine_tensors(answer)
    differ = sorted(n for n in set(ours) | set(theirs) if ours.get(n) != theirs.get(n))
    assert not differ, [(kind_of(n), ours.get(n), theirs.get(n)) for n in differ[:8]]
    total = answer["total_bytes"] + answer["gpu_buffer_bytes"]
    assert (rank.draft_bytes if case.draft else rank.target_bytes) == total


@pytest.mark.parametrize(("case", "code", "word"), REFUSED, ids=[str(c) for c, _, _ in REFUSED])
def test_the_planner_refuses_what_sglang_refuses(
    case: Case, code: str, word: str, tmp_path: Any
) -> None:
    answer = built(case, tmp_path)
    assert word in answer.get("refused", ""), answer.get("refused", answer.get("total_bytes"))
    with pytest.raises(Refusal) as refused:
        planned(case)
    assert refused.value.code == code
