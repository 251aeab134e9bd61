"""The weights one rank of SGLang 0.5.23 holds, as its model classes lay them out.

SGLang builds Kimi-K3 as ``KimiK3ForConditionalGeneration`` (a vision tower and projector,
replicated and built on every pipeline stage, around ``KimiK3LinearForCausalLM``) and
Kimi-Linear as ``KimiLinearForCausalLM`` (another code path). ``--tp-size`` is ``attn_tp x
attn_dp``; ``--ep-size`` is 1, or the TP size with ``expert_parallel`` (MoE TP = TP / EP).
What splits over which group (per rank; ``tests/conformance/test_conformance_sglang_weights.py``
builds SGLang's classes on the ``meta`` device and compares every tensor)::

    module                         Kimi-K3                       Kimi-Linear
    embed_tokens (first stage)     vocab / attn_tp               vocab / tp
    lm_head (last stage)           vocab / tp                    vocab / tp
    MLA projections                heads / attn_tp               heads / attn_tp
    KDA projections and state      heads / attn_tp               heads / tp (even under DP
                                                                 attention: SGLang's own
                                                                 split, not its state pool's)
    dense MLP, shared experts      intermediate / tp             intermediate / tp
    routed experts                 experts / ep, width / moe_tp  experts / ep, width / moe_tp
    router, norms, vision tower    replicated                    replicated

The vocabulary pads to 64 rows, or to ``64 x`` the group when that does not divide
(SGLang's ``pad_vocab_size``). Counted: every parameter and every buffer the classes allocate
on the GPU at construction (the DSpark draft's fp32 rotary cache); not counted: what weight
loading adds afterwards (MLA's ``w_kc`` / ``w_vc`` copies of ``kv_b_proj``), and the vision
tower's small positional table SGLang builds on the CPU. The quantized layouts and ignore
lists are :mod:`.weights_quant`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from ...deployment import Deployment
from ...errors import Refusal
from ...layouts.groups import stage_bounds
from ...model import GQALayer, HybridModel, KDALayer, MLALayer
from ...model.architecture import Architecture
from ...weights import RankWeights, WeightDtype, WeightGroup, WeightTensor
from ...weights.records import Entry, grouped
from .weights_extra import (
    draft_groups,
    padded_vocab,
    refuse_quantization,
    vision_tensors,
    vocab_rows,
)
from .weights_glm import GLM_CLASS, glm_sglang_weights
from .weights_quant import Linear, QuantScheme, attention_scales, expert_tensors, linear_tensors

K3_CLASS: Final = "KimiK3ForConditionalGeneration"
KL_CLASS: Final = "KimiLinearForCausalLM"

"""A module kind, its layer (None: held once) and its tensors."""


def _t(name: str, shape: tuple[int, ...], dtype: WeightDtype) -> WeightTensor:
    return WeightTensor(name=name, shape=shape, dtype=dtype)


class _Rank:
    """One rank's parallel widths and the model facts the rule reads."""

    def __init__(self, model: HybridModel, arch: Architecture, deployment: Deployment) -> None:
        self.model, self.arch, self.deployment = model, arch, deployment
        self.k3 = arch.architecture == K3_CLASS
        self.attn_tp = deployment.attn_tp
        self.tp = deployment.attn_tp * deployment.attn_dp
        self.ep = self.tp if deployment.expert_parallel else 1
        self.moe_tp = self.tp // self.ep
        self.kda_tp = self.attn_tp if self.k3 else self.tp
        self.dtype: WeightDtype = arch.torch_dtype
        self.scheme = None if arch.quantization is None else QuantScheme(arch.quantization, self.k3)

    def column(
        self, name: str, prefix: str, outputs: tuple[int, ...], inp: int, ranks: int
    ) -> tuple[WeightTensor, ...]:
        """A column-parallel linear's tensors (outputs split over ``ranks``)."""
        return linear_tensors(
            Linear(name, prefix, outputs, inp, "column", ranks), self.scheme, self.dtype
        )

    def row(
        self, name: str, prefix: str, out: int, inp: int, ranks: int
    ) -> tuple[WeightTensor, ...]:
        """A row-parallel linear's tensors (input split over ``ranks``)."""
        return linear_tensors(
            Linear(name, prefix, (out,), inp, "row", ranks), self.scheme, self.dtype
        )

    def replicated(self, name: str, prefix: str, out: int, inp: int) -> tuple[WeightTensor, ...]:
        """A replicated linear's tensors."""
        return linear_tensors(
            Linear(name, prefix, (out,), inp, "replicated", 1), self.scheme, self.dtype
        )


def _uneven(what: str, size: int, ranks: int, group: str) -> Refusal:
    return Refusal(
        "uneven_split",
        f"{what}={size} does not split over {group}={ranks}: SGLang 0.5.23 asserts it divides",
        facts={"field": what, what: size, group: ranks},
        hint=f"use a {group} that divides {size}",
    )


def _check_parallel(r: _Rank) -> None:
    arch = r.arch
    for layer in r.model.layers:
        if isinstance(layer, MLALayer):
            for ranks, group in ((r.attn_tp, "attn_tp"), (r.tp if not r.k3 else 1, "tp")):
                if layer.num_heads % ranks:
                    raise Refusal(
                        "heads_not_divisible",
                        f"MLA num_heads={layer.num_heads} must be divisible by {group}={ranks} "
                        "(SGLang 0.5.23 asserts it)",
                        facts={"num_heads": layer.num_heads, group: ranks},
                        hint=f"use a {group} that divides {layer.num_heads}",
                    )
        elif isinstance(layer, KDALayer) and layer.num_heads % r.kda_tp:
            group = "attn_tp" if r.k3 else "tp"
            raise Refusal(
                "heads_not_divisible",
                f"KDA num_heads={layer.num_heads} must be divisible by {group}={r.kda_tp} "
                "(SGLang 0.5.23 asserts it)",
                facts={"num_heads": layer.num_heads, group: r.kda_tp},
                hint=f"use a {group} that divides {layer.num_heads}",
            )
        elif isinstance(layer, GQALayer):
            raise Refusal(
                "weights_unknown",
                f"model {r.model.name}: a GQA target layer is not a layer SGLang's "
                f"{arch.architecture} builds",
                facts={"model": r.model.name},
                hint="plan a Kimi-K3 or Kimi-Linear checkpoint",
            )
    if arch.intermediate_size % r.tp and arch.first_k_dense_replace:
        raise _uneven("intermediate_size", arch.intermediate_size, r.tp, "tp")
    if arch.num_experts is not None and arch.moe_intermediate_size is not None:
        if arch.num_experts % r.ep:
            raise _uneven("num_experts", arch.num_experts, r.ep, "ep")
        if arch.moe_intermediate_size % r.moe_tp:
            raise _uneven("moe_intermediate_size", arch.moe_intermediate_size, r.moe_tp, "moe_tp")
        shared = arch.moe_intermediate_size * arch.num_shared_experts
        if shared % r.tp:
            raise _uneven("shared_intermediate", shared, r.tp, "tp")


def _mla(r: _Rank, layer: MLALayer, at: str) -> tuple[WeightTensor, ...]:
    h, dtype, tp = r.arch.hidden_size, r.dtype, r.attn_tp
    nh, nope, rope, v = (
        layer.num_heads,
        layer.qk_nope_head_dim,
        layer.qk_rope_head_dim,
        layer.v_head_dim,
    )
    kv, q_lora = layer.kv_lora_rank, layer.q_lora_rank
    found: list[WeightTensor] = []
    if q_lora is not None:
        found += r.replicated(
            "self_attn.fused_qkv_a_proj_with_mqa",
            f"{at}.fused_qkv_a_proj_with_mqa",
            q_lora + kv + rope,
            h,
        )
        found.append(_t("self_attn.q_a_layernorm.weight", (q_lora,), dtype))
        found += r.column("self_attn.q_b_proj", f"{at}.q_b_proj", (nh * (nope + rope),), q_lora, tp)
    else:
        found += r.column("self_attn.q_proj", f"{at}.q_proj", (nh * (nope + rope),), h, tp)
        found += r.replicated(
            "self_attn.kv_a_proj_with_mqa", f"{at}.kv_a_proj_with_mqa", kv + rope, h
        )
    found.append(_t("self_attn.kv_a_layernorm.weight", (kv,), dtype))
    found += r.column("self_attn.kv_b_proj", f"{at}.kv_b_proj", (nh * (nope + v),), kv, tp)
    found += r.row("self_attn.o_proj", f"{at}.o_proj", h, nh * v, tp)
    if r.k3 and r.arch.mla_output_gate:
        found += r.column("self_attn.g_proj", f"{at}.g_proj", (nh * v,), h, tp)
    found += attention_scales(r.scheme)
    return tuple(found)


def _kda(r: _Rank, layer: KDALayer, at: str) -> tuple[WeightTensor, ...]:
    h, dtype = r.arch.hidden_size, r.dtype
    hk, dk, kernel = layer.num_heads, layer.head_dim, layer.conv_kernel
    proj = hk * dk
    tp = r.kda_tp  # K3: attention TP; Kimi-Linear: the full TP group
    found: list[WeightTensor] = []
    if r.k3 and layer.full_rank_gate:
        found += r.column("self_attn.fused_qkvg_proj", f"{at}.fused_qkvg_proj", (proj,) * 4, h, tp)
        found += r.column("self_attn.b_proj", f"{at}.b_proj", (hk,), h, tp)
        found += r.replicated("self_attn.f_a_proj", f"{at}.f_a_proj", dk, h)
        found += r.column("self_attn.f_b_proj", f"{at}.f_b_proj", (proj,), dk, tp)
    elif r.scheme is None and (not r.k3 or r.attn_tp == r.tp):
        # the fused q|k|v|b + repeated f_a|g_a projection and the batched f_b|g_b, over TP
        width = (3 * proj + hk) // r.tp + 2 * dk
        found.append(_t("self_attn.fused_qkvbfg_a_proj.weight", (width, h), dtype))
        found.append(_t("self_attn.fused_fg_b_proj.weight", (2, proj // r.tp, dk), dtype))
    else:  # quantized: separate projections (q|k|v over attention TP in both classes)
        found += r.column("self_attn.qkv_proj", f"{at}.qkv_proj", (proj,) * 3, h, r.attn_tp)
        found += r.replicated("self_attn.f_a_proj", f"{at}.f_a_proj", dk, h)
        found += r.column("self_attn.f_b_proj", f"{at}.f_b_proj", (proj,), dk, tp)
        found += r.column("self_attn.b_proj", f"{at}.b_proj", (hk,), h, tp)
        found += r.replicated("self_attn.g_a_proj", f"{at}.g_a_proj", dk, h)
        found += r.column("self_attn.g_b_proj", f"{at}.g_b_proj", (proj,), dk, tp)
    found += [
        _t("self_attn.dt_bias", (proj // tp,), "float32"),
        _t("self_attn.A_log", (1, 1, hk // tp, 1), "float32"),
        _t("self_attn.qkv_conv1d.weight", (3 * proj // tp, 1, kernel), "float32"),
        _t("self_attn.o_norm.weight", (dk,), dtype),
    ]
    found += r.row("self_attn.o_proj", f"{at}.o_proj", h, proj, tp)
    return tuple(found)


def _mlp(r: _Rank, layer_id: int, at: str) -> Iterator[tuple[str, tuple[WeightTensor, ...]]]:
    arch, dtype, h = r.arch, r.dtype, r.arch.hidden_size
    if not arch.is_moe_layer(layer_id):
        i = arch.intermediate_size
        yield (
            "dense_mlp",
            (
                *r.column("mlp.gate_up_proj", f"{at}.mlp.gate_up_proj", (i, i), h, r.tp),
                *r.row("mlp.down_proj", f"{at}.mlp.down_proj", h, i, r.tp),
            ),
        )
        return
    assert arch.num_experts is not None and arch.moe_intermediate_size is not None
    e, moe_i = arch.num_experts, arch.moe_intermediate_size
    module = "mlp" if r.k3 else "block_sparse_moe"
    bias: WeightDtype = "float32" if r.k3 else dtype
    yield (
        "moe_router",
        (
            _t(f"{module}.gate.weight", (e, h), dtype),
            _t(f"{module}.gate.e_score_correction_bias", (e,), bias),
        ),
    )
    if arch.num_shared_experts:
        shared = moe_i * arch.num_shared_experts
        # Kimi-Linear's shared experts get no module prefix: their names are bare
        gate_up = f"{at}.mlp.shared_experts.gate_up_proj" if r.k3 else "gate_up_proj"
        down = f"{at}.mlp.shared_experts.down_proj" if r.k3 else "down_proj"
        yield (
            "shared_experts",
            (
                *r.column(
                    f"{module}.shared_experts.gate_up_proj", gate_up, (shared, shared), h, r.tp
                ),
                *r.row(f"{module}.shared_experts.down_proj", down, h, shared, r.tp),
            ),
        )
    latent = arch.routed_expert_hidden_size if r.k3 else None
    experts = expert_tensors(
        f"{at}.mlp.experts",
        r.scheme,
        dtype,
        num_local=e // r.ep,
        num_experts=e,
        hidden=latent or h,
        intermediate=moe_i // r.moe_tp,
        moe_tp=r.moe_tp,
    )
    found = [_t(f"{module}.{t.name}", t.shape, t.dtype) for t in experts]
    if latent is not None:  # K3's latent MoE: replicated, never quantized here
        found.append(_t(f"{module}.routed_expert_down_proj.weight", (latent, h), dtype))
        if arch.latent_moe_use_norm:
            found.append(_t(f"{module}.routed_expert_norm.weight", (latent,), dtype))
        found.append(_t(f"{module}.routed_expert_up_proj.weight", (h, latent), dtype))
    yield "routed_experts", tuple(found)


def _layer_entries(r: _Rank, start: int, end: int) -> Iterator[Entry]:
    h, dtype = r.arch.hidden_size, r.dtype
    for i in range(start, end):
        layer = r.model.layers[i]
        at = f"model.layers.{i}.self_attn"
        if isinstance(layer, MLALayer):
            yield "mla", i, _mla(r, layer, at)
        elif isinstance(layer, KDALayer):
            yield "kda", i, _kda(r, layer, at)
        yield (
            "norm",
            i,
            (
                _t("input_layernorm.weight", (h,), dtype),
                _t("post_attention_layernorm.weight", (h,), dtype),
            ),
        )
        if r.k3 and r.arch.attn_res_block_size is not None:
            yield (
                "attention_residual",
                i,
                (
                    _t("self_attention_res_norm.weight", (h,), dtype),
                    _t("mlp_res_norm.weight", (h,), dtype),
                    _t("self_attention_res_proj.weight", (1, h), dtype),
                    _t("mlp_res_proj.weight", (1, h), dtype),
                ),
            )
        for kind, tensors in _mlp(r, i, f"model.layers.{i}"):
            yield kind, i, tensors


def _edges(r: _Rank, first: bool, last: bool) -> Iterator[Entry]:
    arch, dtype, h = r.arch, r.dtype, r.arch.hidden_size
    lm, root = ("language_model.", "language_model.model.") if r.k3 else ("", "model.")
    if r.k3 and arch.vision is not None:
        yield "vision", None, vision_tensors(arch.vision, h, dtype)
    if first:
        ranks = r.attn_tp if r.k3 else r.tp  # K3's embedding reduces within attention TP
        rows = vocab_rows(arch.vocab_size, ranks)
        yield "embedding", None, (_t(f"{root}embed_tokens.weight", (rows, h), dtype),)
    if not last:
        return
    yield "norm", None, (_t(f"{root}norm.weight", (h,), dtype),)
    if r.k3 and arch.attn_res_block_size is not None:
        yield (
            "attention_residual",
            None,
            (
                _t(f"{root}output_attn_res_norm.weight", (h,), dtype),
                _t(f"{root}output_attn_res_proj.weight", (1, h), dtype),
            ),
        )
    vocab = padded_vocab(arch.vocab_size, r.tp)
    quantized = r.scheme is not None and r.scheme.quantization.quant_method == "modelopt"
    head = Linear(f"{lm}lm_head", "lm_head", (vocab,), h, "column", r.tp)
    yield "lm_head", None, linear_tensors(head, r.scheme if quantized else None, dtype)


def sglang_weights(model: HybridModel, deployment: Deployment, stage: int) -> RankWeights:
    """The weights one rank of pipeline stage ``stage`` holds under SGLang 0.5.23 (every rank
    of a stage holds the same: SGLang asserts even splits and pads the vocabulary)."""
    arch = model.architecture
    assert arch is not None  # weights_per_rank refuses a model without one
    if arch.architecture == GLM_CLASS:
        return glm_sglang_weights(model, deployment, stage)
    if arch.architecture not in (K3_CLASS, KL_CLASS):
        raise Refusal(
            "weights_unknown",
            f"model {model.name}: architecture {arch.architecture} is not a class whose SGLang "
            f"layout k3layout models ({K3_CLASS}, {KL_CLASS}, {GLM_CLASS})",
            facts={"model": model.name, "architecture": arch.architecture},
            hint="plan a Kimi-K3, Kimi-Linear or GLM-5.3-Flash checkpoint",
        )
    r = _Rank(model, arch, deployment)
    _check_parallel(r)
    refuse_quantization(arch, deployment.gpu)
    bounds = stage_bounds(model, deployment)
    start, end = bounds[stage]

    def entries() -> Iterator[Entry]:
        yield from _edges(r, stage == 0, False)
        yield from _layer_entries(r, start, end)
        if stage == len(bounds) - 1:
            yield from (e for e in _edges(r, False, True) if e[0] != "vision")

    found: tuple[WeightGroup, ...] = ()
    if model.draft_layers:
        if arch.draft is None:
            raise Refusal(
                "weights_unknown",
                f"model {model.name}: its draft's dimensions are not known (hidden and MLP "
                "sizes, Markov rank, the target layers it reads)",
                facts={"model": model.name, "field": "architecture.draft"},
                hint="load the draft's config.json with the model, or plan spec_tokens=0",
            )
        found = draft_groups(model, arch.draft, deployment, r.dtype)
    return RankWeights(engine="sglang", stage=stage, groups=grouped(entries()), draft_groups=found)
