"""SGLang 0.5.23's GLM-5.3-Flash classes on one rank (``Glm5NextForConditionalGeneration`` and
its NEXTN draft), bf16: what their constructors declare, as
``tests/conformance/sglang_glm_weights.py`` finds by building them on ``meta`` (its notes beside
the fixture give every rule's source). ``a`` is the attention TP, ``t = a x dp`` SGLang's TP,
``e`` its EP size (``t`` with expert parallelism), ``m = t / e`` the MoE's TP.

- **KDA**, heads over ``a``: one fused input GEMM (q, k, v, beta split; the two gate
  down-projections repeated on every rank), the gates' up-projections batched ``(2, P / a, k)``,
  one fp32 q|k|v convolution, fp32 ``dt_bias`` and ``A_log``, the output norm and projection.
- **MLA** (NoPE), heads over ``a``: the fused down-projection replicated; no scale buffers. Its
  **indexer** replicated: the pool's fp32 positional table, its gate, ``wq_b``, ``wk``, the
  fp32 head weights and an fp32 LayerNorm.
- **MoE** where ``first_k_dense_replace`` and ``moe_layer_freq`` say (SGLang reads them, not
  ``mlp_layer_types``): the router (its fp32 score-correction bias under ``noaux_tc``, SGLang's
  default) replicated; experts ``E / e`` a rank, their intermediate ``I / m`` (FlashInfer's
  TRT-LLM runner, SGLang's pick on SM 10x, pads it to 128). On other CUDA GPUs without expert
  parallelism the shared expert is fused in as one more expert; else it is its own MLP over
  ``t``, as the dense MLPs are.
- **Hyper-connections** only when the config says ``mhc: true`` (SGLang's config defaults it
  off and builds none).
- **Vision tower** on every stage, split over ``a``; the merger's first projection replicated,
  its norm fp32; a fixed 8,192-position fp32 rotary table.
- **NEXTN** (one layer, whatever the config declares): two norms, a replicated ``(H, 2H)``
  projection, the shared head's norm and one DeepSeek decoder layer (MLA, indexer, MoE whose
  shared expert is never fused; no hyper-connections). Its embedding and LM head are swapped
  for the target's after loading, except the embedding under PP (the last stage has none).
"""

from __future__ import annotations

from typing import Final

from ...cache.kda import KDALayer
from ...cache.mla import MLALayer
from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import GPUS
from ...layouts.groups import stage_bounds
from ...model import HybridModel
from ...model.architecture import Architecture, MergerVisionTower
from ...weights import RankWeights, WeightDtype, WeightGroup, WeightTensor
from ...weights.modules import (
    hyper_connection_tensors,
    mla_projection_tensors,
    vision_block_tensors,
)
from ...weights.records import Entry, grouped
from .weights_extra import vocab_rows

GLM_CLASS: Final = "Glm5NextForConditionalGeneration"
"""SGLang's GLM-5.3-Flash class whose weights are laid out."""

READ_FIELDS: Final = ("index_kpool_compress",)
"""Text-config fields SGLang's GLM constructor reads that neither transformers' config class nor
SGLang's own defines (its indexer asserts ``index_kpool_compress``)."""

VISION_ROTARY_POSITIONS: Final = 8192
"""The vision tower's rotary table: a fixed 8,192 positions of ``head / 2``, fp32."""

TRTLLM_MOE_ALIGNMENT: Final = 128
"""FlashInfer's TRT-LLM MoE pads a rank's expert intermediate to a multiple of this."""


def _t(name: str, shape: tuple[int, ...], dtype: WeightDtype) -> WeightTensor:
    return WeightTensor(name=name, shape=shape, dtype=dtype)


def _split(extent: int, ranks: int, what: str) -> int:
    if extent % ranks:
        raise Refusal(
            "weights_unknown",
            f"{what}={extent} does not split over {ranks} ranks: SGLang 0.5.23 asserts it",
            facts={"field": what, "extent": extent, "ranks": ranks},
            hint=f"use a parallel size dividing {extent}",
        )
    return extent // ranks


class _Rank:
    def __init__(self, model: HybridModel, arch: Architecture, deployment: Deployment) -> None:
        self.model, self.arch = model, arch
        self.a = deployment.attn_tp
        self.t = deployment.attn_tp * deployment.attn_dp
        self.e = self.t if deployment.expert_parallel else 1
        self.m = self.t // self.e
        self.trtllm = GPUS[deployment.gpu].capability[0] == 10
        self.fused = not self.trtllm and self.e == 1
        self.dtype: WeightDtype = arch.torch_dtype
        self.router_bias = arch.router_bias or "topk_method" in arch.undeclared
        self.streams = arch.hyper_connections if "mhc" not in arch.undeclared else 0


def _kda(r: _Rank, layer: KDALayer) -> tuple[WeightTensor, ...]:
    k, dtype = layer.head_dim, r.dtype
    width = _split(layer.num_heads * k, r.a, "linear_num_heads x linear_head_dim")
    heads = _split(layer.num_heads, r.a, "linear_num_heads")
    return (
        _t(
            "self_attn.fused_qkvbfg_a_proj.weight",
            (3 * width + heads + 2 * k, r.arch.hidden_size),
            dtype,
        ),
        _t("self_attn.fused_fg_b_proj.weight", (2, width, k), dtype),
        _t("self_attn.qkv_conv1d.weight", (3 * width, 1, layer.conv_kernel), "float32"),
        _t("self_attn.dt_bias", (width,), "float32"),
        _t("self_attn.A_log", (1, 1, heads, 1), "float32"),
        _t("self_attn.o_norm.weight", (k,), dtype),
        _t("self_attn.o_proj.weight", (r.arch.hidden_size, width), dtype),
    )


def _mla(r: _Rank, layer: MLALayer) -> tuple[WeightTensor, ...]:
    hidden, dtype = r.arch.hidden_size, r.dtype
    heads = _split(layer.num_heads, r.a, "num_attention_heads")
    q_lora = layer.q_lora_rank or 0
    index = layer.indexer
    assert index is not None  # every MLA layer of this family keeps one
    d = index.head_dim
    return (
        *mla_projection_tensors(layer, heads, hidden, dtype, "fused_qkv_a_proj_with_mqa"),
        _t("self_attn.indexer.index_kpool_compress_ape", (index.kpool, d), "float32"),
        _t("self_attn.indexer.index_kpool_compress_gate", (d, hidden), "bfloat16"),
        _t("self_attn.indexer.wq_b.weight", (index.num_heads * d, q_lora), dtype),
        _t("self_attn.indexer.wk.weight", (d, hidden), dtype),
        _t("self_attn.indexer.weights_proj.weight", (index.num_heads, hidden), "float32"),
        _t("self_attn.indexer.k_norm.weight", (d,), "float32"),
        _t("self_attn.indexer.k_norm.bias", (d,), "float32"),
    )


def _mlp(r: _Rank, name: str, width: int) -> tuple[WeightTensor, ...]:
    local, hidden = _split(width, r.t, f"{name} intermediate size"), r.arch.hidden_size
    return (
        _t(f"{name}.gate_up_proj.weight", (2 * local, hidden), r.dtype),
        _t(f"{name}.down_proj.weight", (hidden, local), r.dtype),
    )


def _moe(r: _Rank, fused: bool) -> list[tuple[str, tuple[WeightTensor, ...]]]:
    arch, hidden = r.arch, r.arch.hidden_size
    experts, width = arch.num_experts or 0, arch.moe_intermediate_size or 0
    router = [_t("mlp.gate.weight", (experts, hidden), r.dtype)]
    if r.router_bias:
        router.append(_t("mlp.gate.e_score_correction_bias", (experts,), "float32"))
    inner = _split(width, r.m, "moe_intermediate_size")
    if r.trtllm:
        inner = -(-inner // TRTLLM_MOE_ALIGNMENT) * TRTLLM_MOE_ALIGNMENT
    local = _split(experts, r.e, "n_routed_experts") + (1 if fused else 0)
    routed = (
        _t("mlp.experts.w13_weight", (local, 2 * inner, hidden), r.dtype),
        _t("mlp.experts.w2_weight", (local, hidden, inner), r.dtype),
    )
    found = [("moe_router", tuple(router)), ("routed_experts", routed)]
    if not fused and arch.num_shared_experts:
        shared = _mlp(r, "mlp.shared_experts", width * arch.num_shared_experts)
        found.append(("shared_experts", shared))
    return found


def _layer(r: _Rank, i: int, draft: bool) -> list[tuple[str, tuple[WeightTensor, ...]]]:
    """A decoder layer's modules (the NEXTN's DeepSeek layer: no hyper-connections, its
    shared expert never fused)."""
    arch, hidden = r.arch, r.arch.hidden_size
    layer = (*r.model.layers, *r.model.draft_layers)[i]
    found: list[tuple[str, tuple[WeightTensor, ...]]] = []
    if r.streams and not draft:
        found.append(("hyper_connections", hyper_connection_tensors(hidden, r.streams)))
    if isinstance(layer, MLALayer):
        found.append(("mla", _mla(r, layer)))
    elif isinstance(layer, KDALayer):
        found.append(("kda", _kda(r, layer)))
    if draft or arch.is_moe_by_replace(i):
        found += _moe(r, fused=r.fused and not draft)
    else:
        found.append(("dense_mlp", _mlp(r, "mlp", arch.intermediate_size)))
    norms = tuple(
        _t(f"{n}.weight", (hidden,), r.dtype)
        for n in ("input_layernorm", "post_attention_layernorm")
    )
    found.append(("norm", norms))
    return found


def _vision(r: _Rank, vision: MergerVisionTower) -> tuple[WeightTensor, ...]:
    dtype, width = r.dtype, vision.hidden_size
    head = width // vision.num_heads
    heads = _split(vision.num_heads, r.a, "vision num_heads")
    mlp = _split(vision.intermediate_size, r.a, "vision intermediate_size")
    out, merge = vision.out_hidden_size, vision.spatial_merge_size
    project = _split(
        vision.projection_intermediate_size, r.a, "vision projection_intermediate_size"
    )
    tensors = list(vision_block_tensors(vision, heads, mlp, dtype, "qkv_proj"))
    return (
        *tensors,
        _t("visual.post_layernorm.weight", (width,), dtype),
        _t("visual.rotary_pos_emb.cos_sin_cache", (VISION_ROTARY_POSITIONS, head // 2), "float32"),
        _t("visual.downsample.weight", (out, width, merge, merge), dtype),
        _t("visual.downsample.bias", (out,), dtype),
        _t("visual.merger.proj.weight", (out, out), dtype),
        _t("visual.merger.post_projection_norm.weight", (out,), "float32"),
        _t("visual.merger.post_projection_norm.bias", (out,), "float32"),
        _t("visual.merger.gate_up_proj.weight", (2 * project, out), dtype),
        _t("visual.merger.down_proj.weight", (out, project), dtype),
    )


def glm_sglang_weights(model: HybridModel, deployment: Deployment, stage: int) -> RankWeights:
    """The weights one rank of ``stage`` holds under SGLang 0.5.23 for GLM-5.3-Flash."""
    arch = model.architecture
    assert arch is not None
    undeclared = tuple(name for name in arch.undeclared if name in READ_FIELDS)
    if undeclared:
        raise Refusal(
            "weights_unknown",
            f"model {model.name}: SGLang's {arch.architecture} reads {', '.join(undeclared)} "
            "from the text config, which this config leaves out, so SGLang fails to build the "
            "model (AttributeError)",
            facts={"model": model.name, "field": undeclared[0], "fields": undeclared},
            hint="use the checkpoint's own config.json, which declares index_kpool_compress, "
            "or give the KV budget (kv_memory_bytes, --kv-memory-gib)",
        )
    r = _Rank(model, arch, deployment)
    hidden = arch.hidden_size
    bounds = stage_bounds(model, deployment)
    start, end = bounds[stage]
    first, last = stage == 0, stage == len(bounds) - 1
    entries: list[Entry] = []
    if arch.merger_vision is not None:  # every stage builds the tower
        entries.append(("vision", None, _vision(r, arch.merger_vision)))
    if first:
        embedding = _t(
            "model.embed_tokens.weight",
            (vocab_rows(arch.vocab_size, r.a), hidden),
            r.dtype,
        )
        entries.append(("embedding", None, (embedding,)))
    for i in range(start, end):
        entries += [(kind, i, tensors) for kind, tensors in _layer(r, i, draft=False)]
    if last:
        entries.append(("norm", None, (_t("model.norm.weight", (hidden,), r.dtype),)))
        head = _t("lm_head.weight", (vocab_rows(arch.vocab_size, r.t), hidden), r.dtype)
        entries.append(("lm_head", None, (head,)))
    drafts: tuple[WeightGroup, ...] = ()
    if last and model.draft_layers:
        drafts = _nextn(r, pp=len(bounds) > 1)
    return RankWeights(engine="sglang", stage=stage, groups=grouped(entries), draft_groups=drafts)


def _nextn(r: _Rank, pp: bool) -> tuple[WeightGroup, ...]:
    hidden, dtype = r.arch.hidden_size, r.dtype
    tensors = [
        _t("model.enorm.weight", (hidden,), dtype),
        _t("model.hnorm.weight", (hidden,), dtype),
        _t("model.eh_proj.weight", (hidden, 2 * hidden), dtype),
        _t("model.shared_head.norm.weight", (hidden,), dtype),
    ]
    if pp:  # the last stage has no target embedding: the draft keeps its own
        tensors.append(
            _t(
                "model.embed_tokens.weight",
                (vocab_rows(r.arch.vocab_size, r.a), hidden),
                dtype,
            )
        )
    layer = r.model.num_layers  # SGLang builds one NEXTN layer
    tensors += [
        WeightTensor(name=f"model.decoder.{t.name}", shape=t.shape, dtype=t.dtype)
        for _, group in _layer(r, layer, draft=True)
        for t in group
    ]
    return (WeightGroup(kind="mtp", tensors=tuple(tensors)),)
