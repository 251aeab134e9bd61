"""The weights one rank of tokenspeed (#1152's head, a6ee91b3) holds, as its model classes lay
them out. They were recorded at #1152's head only: a deployment of ``main``
(``engine_version="main"``) gets the same weights, which no recording of ``main`` checks.

tokenspeed builds Kimi-K3 as ``KimiK3ForConditionalGeneration`` (its K3 text backbone and,
unless ``--language-model-only``, the MoonViT tower and projector) and the DSpark draft as
``K3DSparkModel``; it has no Kimi-Linear model, and no pipeline stages. Its flags give the
groups: attention TP ``--tp`` (``attn_tp``), ``--data-parallel-size`` (``attn_dp``), the world
``attn_tp x attn_dp``; the dense MLP over the attention TP; the MoE over the whole world, its
experts split whole with ``--enable-expert-parallel`` (``expert_parallel``: EP = the world) or
else each expert's width (MoE TP = the world). Per rank (``tests/test_tokenspeed_weights.py``
compares every tensor with what tokenspeed's own classes built, recorded in
``tests/fixtures/tokenspeed-1152/weights.json``)::

    embed_tokens                       vocab (padded to 64) / attn_tp
    lm_head                            vocab / attn_tp; the full vocabulary, unpadded, under
                                       attention DP
    MLA and KDA projections, state     heads / attn_tp
    dense MLP                          intermediate / attn_tp
    routed experts                     experts / EP, width / MoE TP
    latent up projection, shared MLP   hidden or width / the world (MoE TP x EP)
    router, norms, attention residual,
    latent down projection and norm    replicated
    vision tower                       attention heads / attn_tp (``--mm-encoder-tp-mode
                                       weights``, tokenspeed's default), the rest replicated

The text config is read with tokenspeed's own defaults (``configs/kimi_k3_config.py``: the
real checkpoint's) for every field the ``config.json`` leaves out
(:attr:`~k3layout.model.architecture.Architecture.defaulted`), not vLLM's and SGLang's: a K3
config without them has a 33,792-wide dense layer, a 3,584-wide latent MoE with its norm and
attention residuals (blocks of 12). tokenspeed builds the latent projections and the
attention residuals whatever the config says.

The vision tower: a multimodal checkpoint is planned with its tower, in tokenspeed's default
``--mm-encoder-tp-mode weights`` (refused, as tokenspeed refuses it, where the tower's 12
heads do not split over the attention TP: at 8, 16 and 32); a checkpoint planned without its
tower (``Architecture.vision`` None) is tokenspeed's ``--language-model-only``.
:func:`rank_weights` also lays out ``--mm-encoder-tp-mode data`` (the tower replicated), which
no :class:`~k3layout.Deployment` field selects yet.

Counted: every parameter and every buffer the classes allocate on the GPU at construction (the
vision tower's time embedding, the draft's fp32 rotary cache); not counted: what loading adds
afterwards (MLA's ``w_kc`` / ``w_vc``, kernel repacks) and process singletons. Modelled on
Hopper (H100, H200), where it was recorded: tokenspeed picks other MoE kernels, and pads MXFP4
experts otherwise, elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from ...deployment import Deployment
from ...model import HybridModel, KDALayer, MLALayer
from ...model.architecture import DSparkDraft, VisionTower
from ...weights import RankWeights, WeightDtype, WeightGroup, WeightTensor
from ...weights.records import Entry, grouped
from .weights_checks import (
    VOCAB_PAD,
    Rank,
    VisionMode,
    check_model,
    check_parallel,
    check_vision,
    refuse,
    tokenspeed_text,
    uneven,
    up,
)

KDA_ROW_ALIGN: Final = 16
"""The rows of KDA's merged input projection are padded to 16."""
MXFP4_BLOCK: Final = 32
"""Elements per MXFP4 scale."""


def _t(name: str, shape: tuple[int, ...], dtype: WeightDtype) -> WeightTensor:
    return WeightTensor(name=name, shape=shape, dtype=dtype)


def _mla(
    layer: MLALayer, gate: bool, ranks: int, h: int, dtype: WeightDtype
) -> tuple[WeightTensor, ...]:
    nh, nope, rope, v = (
        layer.num_heads,
        layer.qk_nope_head_dim,
        layer.qk_rope_head_dim,
        layer.v_head_dim,
    )
    q_lora, kv = layer.q_lora_rank, layer.kv_lora_rank
    assert q_lora is not None  # check_model refuses MLA without q-LoRA
    fused = q_lora + kv + rope + (nh * v // ranks if gate else 0)  # q_a | kv_a | gate shard
    return (
        _t("self_attn.fused_qkv_a_proj_with_mqa.weight", (fused, h), dtype),
        _t("self_attn.q_a_layernorm.weight", (q_lora,), dtype),
        _t("self_attn.q_b_proj.weight", (nh * (nope + rope) // ranks, q_lora), dtype),
        _t("self_attn.kv_b_proj.weight", (nh * (nope + v) // ranks, kv), dtype),
        _t("self_attn.o_proj.weight", (h, nh * v // ranks), dtype),
        _t("self_attn.kv_a_layernorm.weight", (kv,), dtype),
    )


def _kda(r: Rank, layer: KDALayer) -> tuple[WeightTensor, ...]:
    h, dtype, tp = r.hidden, r.dtype, r.attn_tp
    heads, dk = layer.num_heads, layer.head_dim
    proj = heads * dk // tp
    merged = up(4 * proj + dk + heads // tp, KDA_ROW_ALIGN)  # q|k|v|g, f_a (whole), b
    conv = (proj, 1, layer.conv_kernel)
    return (
        _t("self_attn.q_conv1d_weight", conv, dtype),
        _t("self_attn.k_conv1d_weight", conv, dtype),
        _t("self_attn.v_conv1d_weight", conv, dtype),
        _t("self_attn.A_log", (heads // tp,), "float32"),
        _t("self_attn.dt_bias", (proj,), "float32"),
        _t("self_attn.qkvgb_proj.weight", (merged, h), dtype),
        _t("self_attn.f_b_proj.weight", (proj, dk), dtype),
        _t("self_attn.o_norm.weight", (dk,), dtype),
        _t("self_attn.o_proj.weight", (h, proj), dtype),
    )


def _experts(r: Rank) -> tuple[WeightTensor, ...]:
    arch = r.arch
    assert arch.num_experts is not None and arch.moe_intermediate_size is not None
    local, width, hid = arch.num_experts // r.ep, arch.moe_intermediate_size // r.moe_tp, r.latent
    at = "block_sparse_moe.experts"
    if arch.quantization is None:
        return (
            _t(f"{at}.w13_weight", (local, 2 * width, hid), r.dtype),
            _t(f"{at}.w2_weight", (local, hid, width), r.dtype),
        )
    width = up(width, MXFP4_BLOCK)  # Hopper's padding (a no-op where the kernels accept it)
    return (
        _t(f"{at}.w13_weight", (local, 2 * width, hid // 2), "uint8"),
        _t(f"{at}.w13_weight_scale", (local, 2 * width, hid // MXFP4_BLOCK), "uint8"),
        _t(f"{at}.w2_weight", (local, hid, width // 2), "uint8"),
        _t(f"{at}.w2_weight_scale", (local, hid, width // MXFP4_BLOCK), "uint8"),
    )


def _mlp(r: Rank, layer_id: int) -> Iterator[tuple[str, tuple[WeightTensor, ...]]]:
    arch, dtype, h = r.arch, r.dtype, r.hidden
    if not arch.is_moe_layer(layer_id):
        width = arch.intermediate_size // r.attn_tp
        yield (
            "dense_mlp",
            (
                _t("mlp.gate_up_proj.weight", (2 * width, h), dtype),
                _t("mlp.down_proj.weight", (h, width), dtype),
            ),
        )
        return
    assert arch.num_experts is not None and arch.moe_intermediate_size is not None
    yield (
        "moe_router",
        (
            _t("block_sparse_moe.gate.weight", (arch.num_experts, h), dtype),
            _t("block_sparse_moe.gate.e_score_correction_bias", (arch.num_experts,), "float32"),
        ),
    )
    up_rows = h // r.world if r.world > 1 and h % r.world == 0 else h  # column over MoE TP x EP
    latent: tuple[WeightTensor, ...] = (
        _t("block_sparse_moe.routed_expert_down_proj.weight", (r.latent, h), dtype),
        _t("block_sparse_moe.routed_expert_up_proj.weight", (up_rows, r.latent), dtype),
    )
    if arch.latent_moe_use_norm:
        latent += (_t("block_sparse_moe.routed_expert_norm.weight", (r.latent,), dtype),)
    yield "routed_experts", (*_experts(r), *latent)
    shared = arch.moe_intermediate_size * arch.num_shared_experts // r.world
    yield (
        "shared_experts",
        (
            _t("block_sparse_moe.shared_experts.gate_up_proj.weight", (2 * shared, h), dtype),
            _t("block_sparse_moe.shared_experts.down_proj.weight", (h, shared), dtype),
        ),
    )


def _layers(r: Rank, model: HybridModel) -> Iterator[Entry]:
    h, dtype = r.hidden, r.dtype
    for i, layer in enumerate(model.layers):
        if isinstance(layer, KDALayer):
            yield "kda", i, _kda(r, layer)
        elif isinstance(layer, MLALayer):
            yield "mla", i, _mla(layer, r.arch.mla_output_gate, r.attn_tp, h, dtype)
        yield (
            "norm",
            i,
            (
                _t("input_layernorm.weight", (h,), dtype),
                _t("post_attention_layernorm.weight", (h,), dtype),
            ),
        )
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
        for kind, tensors in _mlp(r, i):
            yield kind, i, tensors


def _edges(r: Rank) -> Iterator[Entry]:
    arch, dtype, h = r.arch, r.dtype, r.hidden
    rows = up(arch.vocab_size, VOCAB_PAD) // r.attn_tp
    root = "language_model.model."
    yield "embedding", None, (_t(f"{root}embed_tokens.weight", (rows, h), dtype),)
    yield "norm", None, (_t(f"{root}norm.weight", (h,), dtype),)
    yield (
        "attention_residual",
        None,
        (
            _t(f"{root}output_attn_res_norm.weight", (h,), dtype),
            _t(f"{root}output_attn_res_proj.weight", (1, h), dtype),
        ),
    )
    if arch.tie_word_embeddings:
        return  # the LM head is the embedding
    head = (arch.vocab_size, h) if r.deployment.attn_dp > 1 else (rows, h)
    yield "lm_head", None, (_t("language_model.lm_head.weight", head, dtype),)


def vision_tensors(
    v: VisionTower, text_hidden: int, ranks: int, dtype: WeightDtype
) -> tuple[WeightTensor, ...]:
    """MoonViT and the patch-merger projector: attention over ``ranks`` (the vision TP), the
    rest replicated, never quantized; its time embedding is a buffer."""
    hid, p, qkv = v.hidden_size, v.patch_size, v.qkv_hidden_size
    merged = v.mm_hidden_size * v.merge_kernel[0] * v.merge_kernel[1]
    tower, block = "vision.vision_tower", "vision.vision_tower.encoder.blocks"
    found = [
        _t(f"{tower}.patch_embed.proj.weight", (hid, 3, p, p), dtype),
        _t(f"{tower}.patch_embed.pos_emb.weight", (v.pos_emb[0], v.pos_emb[1], hid), dtype),
        _t(f"{tower}.patch_embed.pos_emb.time_weight", (v.pos_emb[2], 1, hid), dtype),
    ]
    for n in range(v.num_layers):
        found += [
            _t(f"{block}.{n}.norm0.weight", (hid,), dtype),
            _t(f"{block}.{n}.norm1.weight", (hid,), dtype),
            _t(f"{block}.{n}.mlp.fc0.weight", (v.intermediate_size, hid), dtype),
            _t(f"{block}.{n}.mlp.fc1.weight", (hid, v.intermediate_size), dtype),
            _t(f"{block}.{n}.attn.qkv_proj.weight", (3 * qkv // ranks, hid), dtype),
            _t(f"{block}.{n}.attn.proj.weight", (hid, qkv // ranks), dtype),
        ]
    return (
        *found,
        _t(f"{tower}.encoder.final_layernorm.weight", (hid,), dtype),
        _t("vision.mm_projector.linear_1.weight", (merged, merged), dtype),
        _t("vision.mm_projector.linear_2.weight", (text_hidden, merged), dtype),
        _t("vision.mm_projector.post_norm.weight", (text_hidden,), dtype),
    )


def draft_groups(r: Rank, model: HybridModel, draft: DSparkDraft) -> tuple[WeightGroup, ...]:
    """tokenspeed's ``K3DSparkModel``: per layer an ungated MLA over the attention TP and a
    dense MLP over the dense TP; once the context projection over the target layers it reads,
    the norms, the Markov head and one fp32 rotary cache. It shares the target's embedding and
    LM head and is not quantized."""
    h, dtype, tp = draft.hidden_size, r.dtype, r.attn_tp
    if draft.intermediate_size % tp:
        raise uneven("draft.intermediate_size", draft.intermediate_size, "attn_tp", tp)
    layer = model.draft_layers[0]
    assert isinstance(layer, MLALayer)  # check_tokenspeed refuses other drafts
    assert draft.target_hidden_size is not None  # the rule refuses a draft without it
    width = draft.intermediate_size // tp
    per_layer = (
        _t("input_layernorm.weight", (h,), dtype),
        *_mla(layer, False, tp, h, dtype),
        _t("post_attention_layernorm.weight", (h,), dtype),
        _t("mlp.gate_up_proj.weight", (2 * width, h), dtype),
        _t("mlp.down_proj.weight", (h, width), dtype),
    )
    once = (
        _t("context_proj.weight", (h, draft.num_target_layers * draft.target_hidden_size), dtype),
        _t("context_norm.weight", (h,), dtype),
        _t("final_norm.weight", (h,), dtype),
        _t("markov_head.markov_w1.weight", (draft.vocab_size, draft.markov_rank), dtype),
        _t("markov_head.markov_w2.weight", (draft.vocab_size, draft.markov_rank), dtype),
        _t(
            "layers.0.self_attn.rotary_emb.cos_sin_cache",
            (draft.max_position_embeddings, layer.qk_rope_head_dim),
            "float32",
        ),
    )
    return (
        WeightGroup(kind="draft", layers=model.draft_layer_ids, tensors=per_layer),
        WeightGroup(kind="draft", tensors=once),
    )


def rank_weights(
    model: HybridModel, deployment: Deployment, stage: int = 0, mode: VisionMode = "weights"
) -> RankWeights:
    """The weights one rank holds under tokenspeed, the vision tower in ``--mm-encoder-tp-mode
    mode`` (every rank holds the same: tokenspeed splits evenly or refuses)."""
    given = model.architecture
    assert given is not None  # weights_per_rank refuses a model without one
    arch = tokenspeed_text(given)
    check_model(model, arch, deployment)
    r = Rank(arch, deployment, mode)
    check_parallel(r, model)
    vision = arch.vision
    check_vision(r)

    def entries() -> Iterator[Entry]:
        yield from _edges(r)
        yield from _layers(r, model)
        if vision is not None:
            yield "vision", None, vision_tensors(vision, r.hidden, r.vision_tp, r.dtype)

    drafted: tuple[WeightGroup, ...] = ()
    if model.draft_layers and deployment.spec_tokens:
        if arch.draft is None or arch.draft.target_hidden_size is None:
            raise refuse(
                "weights_unknown",
                f"model {model.name}: its draft's dimensions are not known (hidden and MLP "
                "sizes, Markov rank, the target layers it reads)",
                "K3DSparkModel reads them from the draft's config.json",
                "load the draft's config.json with the model, or plan spec_tokens=0",
                "architecture.draft",
            )
        drafted = draft_groups(r, model, arch.draft)
    return RankWeights(
        engine="tokenspeed", stage=stage, groups=grouped(entries()), draft_groups=drafted
    )


DEFAULT_VISION_MODE: Final[VisionMode] = "weights"
"""The vision mode the seam plans: tokenspeed's default ``--mm-encoder-tp-mode``."""


def tokenspeed_weights(model: HybridModel, deployment: Deployment, stage: int) -> RankWeights:
    """The ``weights`` seam: :func:`rank_weights` in tokenspeed's default vision mode."""
    return rank_weights(model, deployment, stage, DEFAULT_VISION_MODE)
