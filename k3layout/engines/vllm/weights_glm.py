"""vLLM's GLM-5.3-Flash classes on one rank (``Glm5NextForConditionalGeneration`` and its
MTP draft), bf16: what their constructors declare, as ``tests/conformance/vllm_glm_weights.py``
finds by building them on ``meta`` (its notes beside the fixture give every rule's source).

- **KDA** (``t`` the attention TP, ``h`` heads of ``k``, ``P = h k``): one merged input GEMM
  whose q, k, v and beta rows split over TP and whose two gate down-projections (``k`` rows
  each) do not, ``((3P + h) / t + 2k, H)``; the gates' up-projections ``(P / t, k)``; three
  fp32 depthwise convolutions ``(P / t, 1, K)`` (0.34: one fused ``conv1d.weight``
  ``(3P / t, 1, K)``, ``VllmRelease.fused_kda_conv``); fp32 ``dt_bias`` and ``A_log``; the output
  norm and projection.
- **MLA** (NoPE): the fused q/kv down-projection replicated, the up- and output projections
  split by heads, four fp32 scale scalars. Its **indexer** is replicated whole: the pool's
  fp32 positional table ``(kpool, d)``, its gate, ``wq_b``, the merged key and head-weight
  projection, an fp32 LayerNorm; one zero-width rotary table, shared by every layer.
- **MoE** over ``m = t x dp`` ranks: the router (and its fp32 score-correction bias under
  ``noaux_tc``) replicated; the experts' intermediate split ``m`` ways, or whole experts
  ``E / m`` a rank with expert parallelism (and an int32 expert map); on SM 10x FlashInfer's
  TRT-LLM MoE pads a rank's intermediate to a multiple of 128. Shared experts and dense MLPs
  split by ``t``, whole on every rank when the MoE runs sequence-parallel.
- **Hyper-connections**: per layer two fp32 mixing maps ``((2 + n) n, n H)``, their biases
  and three scales each (``n = hc_mult``; none on an MTP layer).
- **Vision tower** (first stage): split by the attention TP over its heads (vLLM asserts they
  divide it), the patch embedding, downsample and norms replicated, a merger MLP split by TP,
  and a rotary table ``(max_position_embeddings, head / 2)`` in the model dtype.
- **MTP layer** ``45 + j``: its two norms, a replicated ``(H, 2H)`` projection, the shared
  head's norm and one MLA + indexer + MoE block without hyper-connections (embedding, LM head
  and rotary table shared with the target).
"""

from __future__ import annotations

from ...cache.kda import KDALayer
from ...cache.mla import MLALayer
from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import GPUS
from ...model import HybridModel
from ...model.architecture import Architecture, MergerVisionTower
from ...model.hf_layer_types import TEXT_MAX_POSITIONS
from ...placements import pp_stage_bounds
from ...weights import RankWeights, WeightDtype, WeightGroup, WeightTensor
from ...weights.modules import (
    hyper_connection_tensors,
    mla_projection_tensors,
    vision_block_tensors,
)
from ...weights.records import WeightKind
from .releases import release_of
from .weights_layers import split
from .weights_stack import grouped, padded_vocab

GLM_BUILT = ("Glm5NextForConditionalGeneration",)
"""vLLM's GLM-5.3-Flash classes whose weights are laid out."""

MLA_SCALES = ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")
"""The fp32 scalars each MLA layer's attention registers (no ``_k_scale_float`` buffer)."""

TRTLLM_MOE_ALIGNMENT = 128
"""FlashInfer's TRT-LLM bf16 MoE (vLLM's pick on SM 10x) pads a rank's expert intermediate
to a multiple of this."""

VISION_ROTARY_FRACTION = 2
"""The vision tower's rotary table spans ``head / 2`` (``partial_rotary_factor`` 0.5)."""

_Found = list[tuple[WeightKind, int, tuple[WeightTensor, ...]]]


def _t(name: str, shape: tuple[int, ...], dtype: WeightDtype) -> WeightTensor:
    return WeightTensor(name=name, shape=shape, dtype=dtype)


READ_FIELDS = ("mhc", "mla_use_nope", "topk_method", "scoring_func")
"""The text-config fields vLLM's GLM constructor reads that transformers' config class does not
define (``Architecture.undeclared`` lists those a config leaves out)."""


def check_glm_builds(arch: Architecture, model: HybridModel, deployment: Deployment) -> None:
    """What vLLM refuses when it builds GLM-5.3-Flash's classes: a config without the fields
    its constructor reads (``AttributeError``), vision heads the TP does not divide."""
    undeclared = tuple(name for name in arch.undeclared if name in READ_FIELDS)
    if undeclared:
        raise Refusal(
            "weights_unknown",
            f"model {model.name}: vLLM's {arch.architecture} reads "
            f"{', '.join(undeclared)} from the text config, which this config leaves out "
            "(or sets as vLLM cannot build: mla_use_nope false), so vLLM fails to build the "
            "model (AttributeError)",
            facts={"model": model.name, "field": undeclared[0], "fields": undeclared},
            hint="use the checkpoint's own config.json, which declares them (mhc, "
            "mla_use_nope: true, topk_method, scoring_func), or give the KV budget "
            "(kv_memory_bytes, --kv-memory-gib)",
        )
    vision = arch.merger_vision
    if vision is not None and vision.num_heads % deployment.attn_tp:
        raise Refusal(
            "weights_unknown",
            f"attn_tp={deployment.attn_tp}: vLLM splits {model.name}'s vision tower over its "
            f"{vision.num_heads} heads and asserts the TP divides them",
            facts={"attn_tp": deployment.attn_tp, "field": "attn_tp", "heads": vision.num_heads},
            hint=f"use an attention TP dividing {vision.num_heads}",
        )


class _Ranks:
    """The parallel sizes GLM's modules split over."""

    def __init__(self, deployment: Deployment, arch: Architecture) -> None:
        self.tp = deployment.attn_tp
        self.moe = deployment.attn_tp * deployment.attn_dp
        self.ep = deployment.expert_parallel and self.moe > 1
        # shared experts and dense MLPs whole on every rank (vLLM's sequence-parallel MoE)
        self.dense = (
            1
            if (deployment.expert_parallel and self.tp > 1 and deployment.attn_dp > 1)
            else self.tp
        )
        self.trtllm = GPUS[deployment.gpu].capability[0] == 10
        self.arch = arch
        # 0.34 fuses the q, k and v short convolutions into one column-parallel weight
        self.fused_conv = release_of(deployment).fused_kda_conv


def _kda(layer: KDALayer, hidden: int, ranks: _Ranks, dtype: WeightDtype) -> list[WeightTensor]:
    tp, k = ranks.tp, layer.head_dim
    width = split(layer.num_heads * k, tp, "linear_num_heads x linear_head_dim")
    heads = split(layer.num_heads, tp, "linear_num_heads")
    return [
        _t("self_attn.dt_bias", (width,), "float32"),
        _t("self_attn.A_log", (1, 1, heads, 1), "float32"),
        _t("self_attn.in_proj_qkvbfg_a.weight", (3 * width + heads + 2 * k, hidden), dtype),
        _t("self_attn.f_b_proj.weight", (width, k), dtype),
        *(
            [_t("self_attn.conv1d.weight", (3 * width, 1, layer.conv_kernel), "float32")]
            if ranks.fused_conv
            else [
                _t(f"self_attn.{x}_conv1d.weight", (width, 1, layer.conv_kernel), "float32")
                for x in "qkv"
            ]
        ),
        _t("self_attn.g_b_proj.weight", (width, k), dtype),
        _t("self_attn.o_norm.weight", (k,), dtype),
        _t("self_attn.o_proj.weight", (hidden, width), dtype),
    ]


def _mla(layer: MLALayer, hidden: int, ranks: _Ranks, dtype: WeightDtype) -> list[WeightTensor]:
    heads = split(layer.num_heads, ranks.tp, "num_attention_heads")
    return [
        *mla_projection_tensors(layer, heads, hidden, dtype, "fused_qkv_a_proj"),
        *(_t(f"self_attn.mla_attn.mla_attn.{s}", (), "float32") for s in MLA_SCALES),
    ]


def _indexer(layer: MLALayer, hidden: int, dtype: WeightDtype) -> list[WeightTensor]:
    index = layer.indexer
    assert index is not None  # every MLA layer of this family keeps one
    d, q_lora = index.head_dim, layer.q_lora_rank or 0
    return [
        _t("self_attn.indexer.index_kpool_compress_ape", (index.kpool, d), "float32"),
        _t("self_attn.indexer.index_kpool_compress_gate", (d, hidden), "bfloat16"),
        _t("self_attn.indexer.wq_b.weight", (index.num_heads * d, q_lora), dtype),
        _t("self_attn.indexer.wk_weights_proj.weight", (d + index.num_heads, hidden), dtype),
        _t("self_attn.indexer.k_norm.weight", (d,), "float32"),
        _t("self_attn.indexer.k_norm.bias", (d,), "float32"),
    ]


def _mlp(
    name: str, hidden: int, width: int, ranks: _Ranks, dtype: WeightDtype
) -> tuple[WeightTensor, ...]:
    local = split(width, ranks.dense, f"{name} intermediate size")
    return (
        _t(f"{name}.gate_up_proj.weight", (2 * local, hidden), dtype),
        _t(f"{name}.down_proj.weight", (hidden, local), dtype),
    )


def _moe(hidden: int, ranks: _Ranks, dtype: WeightDtype) -> _Found:
    arch = ranks.arch
    experts, width = arch.num_experts or 0, arch.moe_intermediate_size or 0
    router = [_t("mlp.gate.weight", (experts, hidden), dtype)]
    if arch.router_bias:
        router.append(_t("mlp.gate.e_score_correction_bias", (experts,), "float32"))
    shared = _mlp("mlp.shared_experts", hidden, width * arch.num_shared_experts, ranks, dtype)
    if ranks.ep:
        local, inner = split(experts, ranks.moe, "n_routed_experts"), width
    else:
        local, inner = experts, split(width, ranks.moe, "moe_intermediate_size")
    if ranks.trtllm:
        inner = -(-inner // TRTLLM_MOE_ALIGNMENT) * TRTLLM_MOE_ALIGNMENT
    routed = [
        _t("mlp.experts.routed_experts.w13_weight", (local, 2 * inner, hidden), dtype),
        _t("mlp.experts.routed_experts.w2_weight", (local, hidden, inner), dtype),
    ]
    if ranks.ep:
        routed.append(_t("mlp.experts.routed_experts._expert_map", (experts,), "int32"))
    return [
        ("moe_router", 0, tuple(router)),
        ("shared_experts", 0, shared),
        ("routed_experts", 0, tuple(routed)),
    ]


def _layer(model: HybridModel, i: int, ranks: _Ranks, dtype: WeightDtype, mtp: bool) -> _Found:
    """A decoder layer's modules (an MTP layer's block without hyper-connections)."""
    arch = ranks.arch
    hidden = arch.hidden_size
    layer = (*model.layers, *model.draft_layers)[i]
    found: _Found = []
    if arch.hyper_connections and not mtp:
        found.append(
            ("hyper_connections", i, hyper_connection_tensors(hidden, arch.hyper_connections))
        )
    if isinstance(layer, MLALayer):
        found.append(("mla", i, tuple(_mla(layer, hidden, ranks, dtype))))
        found.append(("indexer", i, tuple(_indexer(layer, hidden, dtype))))
    elif isinstance(layer, KDALayer):
        found.append(("kda", i, tuple(_kda(layer, hidden, ranks, dtype))))
    if arch.is_moe_layer(i):
        found += [(kind, i, tensors) for kind, _, tensors in _moe(hidden, ranks, dtype)]
    else:
        found.append(("dense_mlp", i, _mlp("mlp", hidden, arch.intermediate_size, ranks, dtype)))
    norms = tuple(
        _t(f"{n}.weight", (hidden,), dtype) for n in ("input_layernorm", "post_attention_layernorm")
    )
    found.append(("norm", i, norms))
    return found


def _vision(vision: MergerVisionTower, tp: int, dtype: WeightDtype) -> tuple[WeightTensor, ...]:
    width, head = vision.hidden_size, vision.hidden_size // vision.num_heads
    heads = split(vision.num_heads, tp, "vision num_heads")
    mlp = split(vision.intermediate_size, tp, "vision intermediate_size")
    out = vision.out_hidden_size
    merge, project = (
        vision.spatial_merge_size,
        split(vision.projection_intermediate_size, tp, "vision projection_intermediate_size"),
    )
    tensors = list(vision_block_tensors(vision, heads, mlp, dtype, "qkv"))
    tensors += [
        _t("visual.merger.proj.weight", (split(out, tp, "vision out_hidden_size"), out), dtype),
        _t("visual.merger.post_projection_norm.weight", (out,), dtype),
        _t("visual.merger.post_projection_norm.bias", (out,), dtype),
        _t("visual.merger.gate_up_proj.weight", (2 * project, out), dtype),
        _t("visual.merger.down_proj.weight", (out, project), dtype),
        _t("visual.downsample.weight", (out, width, merge, merge), dtype),
        _t("visual.downsample.bias", (out,), dtype),
        _t("visual.post_layernorm.weight", (width,), dtype),
        _t(
            "visual.rotary_pos_emb.cos_sin_cache",
            (vision.rotary_positions, head // VISION_ROTARY_FRACTION),
            dtype,
        ),
    ]
    return tuple(tensors)


def glm_rank_weights(
    model: HybridModel, deployment: Deployment, stage: int, dtype: WeightDtype
) -> RankWeights:
    """The weights one rank of ``stage`` holds under vLLM 0.33 for a GLM-5.3-Flash model
    (the heaviest rank where experts do not split evenly)."""
    arch = model.architecture
    assert arch is not None
    check_glm_builds(arch, model, deployment)
    ranks = _Ranks(deployment, arch)
    hidden = arch.hidden_size
    start, end = pp_stage_bounds(model.num_layers, deployment.pp, deployment.pp_partition)[stage]
    first, last = stage == 0, stage == deployment.pp - 1
    lm = "language_model."
    vocab = split(padded_vocab(arch.vocab_size), ranks.tp, "vocab_size (padded to 64)")
    once: list[WeightGroup] = []
    if first and arch.merger_vision is not None:
        once.append(
            WeightGroup(kind="vision", tensors=_vision(arch.merger_vision, ranks.tp, dtype))
        )
    if first:
        embedding = _t(f"{lm}model.embed_tokens.weight", (vocab, hidden), dtype)
        once.append(WeightGroup(kind="embedding", tensors=(embedding,)))
    body: _Found = []
    for i in range(start, end):
        body += _layer(model, i, ranks, dtype, mtp=False)
    indexed = [i for i in range(start, end) if isinstance(model.layers[i], MLALayer)]
    if indexed:  # one zero-width rotary table, registered by the first indexed layer
        positions = model.context_tokens or TEXT_MAX_POSITIONS
        table = _t(
            f"{lm}model.layers.{indexed[0]}.self_attn.indexer_rope_emb.cos_sin_cache",
            (positions, 0),
            dtype,
        )
        once.append(WeightGroup(kind="indexer", tensors=(table,)))
    if last:
        once.append(
            WeightGroup(kind="norm", tensors=(_t(f"{lm}model.norm.weight", (hidden,), dtype),))
        )
        once.append(
            WeightGroup(
                kind="lm_head", tensors=(_t(f"{lm}lm_head.weight", (vocab, hidden), dtype),)
            )
        )
    drafts: list[WeightGroup] = []
    if last and model.draft_layers:
        drafts = _mtp(model, ranks, dtype)
    return RankWeights(
        engine="vllm", stage=stage, groups=(*once, *grouped(body)), draft_groups=tuple(drafts)
    )


def _mtp(model: HybridModel, ranks: _Ranks, dtype: WeightDtype) -> list[WeightGroup]:
    hidden = ranks.arch.hidden_size
    head = (
        _t("enorm.weight", (hidden,), dtype),
        _t("hnorm.weight", (hidden,), dtype),
        _t("eh_proj.weight", (hidden, 2 * hidden), dtype),
        _t("shared_head.norm.weight", (hidden,), dtype),
    )
    found: _Found = []
    for i in range(model.num_layers, model.num_layers + len(model.draft_layers)):
        block = tuple(
            WeightTensor(name=f"mtp_block.{t.name}", shape=t.shape, dtype=t.dtype)
            for _, _, tensors in _layer(model, i, ranks, dtype, mtp=True)
            for t in tensors
        )
        found.append(("mtp", i, head + block))
    return grouped(found)
