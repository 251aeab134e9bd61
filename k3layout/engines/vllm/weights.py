"""vLLM 0.33's weights on one rank of a pipeline stage: its ``weights`` seam.

The model classes vLLM builds (``KimiK3ForConditionalGeneration``, ``KimiLinearForCausalLM``,
the DSpark draft ``K3DSparkForCausalLM`` and the MTP draft ``KimiK3MTP``) declare per rank
what :mod:`.weights_layers` and :mod:`.weights_quant` lay out; this module places them:

- **Parallel sizes.** Attention, embeddings, norms, KDA and dense MLPs split over the attention
  TP ``t`` (one DP engine's world); the MoE spans ``m = t x attn_dp`` ranks
  (``FusedMoEParallelConfig``, flattened): without expert parallelism each expert's
  intermediate splits ``m`` ways, with it (``--enable-expert-parallel``) each rank holds
  ``ceil(E / m)`` whole experts (rank 0 the heaviest, ``determine_expert_map``) and an int32
  expert map. The MoE intermediate is padded to ``min_moe_intermediate_per_partition x t``
  when ``I / t`` falls below it, without expert parallelism, by the **attention** ``t`` (K3's
  rule in ``KimiMoE``): Kimi-Linear at TP 8 holds 2 x 256 columns per expert, not 2 x 128.
- **Sequence parallel** (``pp == 1``, expert parallelism, ``t > 1`` and ``attn_dp > 1``):
  shared experts and dense MLPs are whole on every rank.
- **Vocabulary.** Embedding and LM head ``ceil(V / 64) x 64 / t`` rows.
- **Pipeline stages** (``get_pp_indices``, :func:`~k3layout.placements.pp_stage_bounds`):
  the embedding and the vision tower on stage 0 (Model Runner V2 builds the tower on the first
  stage only), the final norm and LM head on the last, where the draft lives too; a DSpark
  drafter makes the last stage build the target's embedding as well (it reads it), an MTP
  drafter at ``pp > 1`` builds its own.
- **Vision tower** (K3): whole on every rank unless its heads divide ``t``
  (``is_vit_use_data_parallel``), the projector always whole; in the checkpoint's
  quantization but compressed-tensors' (``_maybe_ignore_quant_config``).
- **Buffers.** A rank's GPU buffers count as the harness counts them (every registered
  buffer, persistent or not): MLA's five scale scalars, K3 KDA's fused-decode copies, the EP
  expert map, the vision position-embedding's fp32 time table, DSpark's fp32 rotary
  cos/sin cache ``[max_position_embeddings, qk_rope_head_dim]``. Not counted: RecoverSSM's
  verify records and other tensors held as plain attributes, activation workspaces, and what
  ``process_weights_after_loading`` adds (MLA's absorbed ``W_UK_T`` / ``W_UV``, repacks).

The model dtype is the checkpoint's (a float32 checkpoint runs in bf16: vLLM's ``auto``
dtype downcasts it). ROCm GPUs run vLLM's ``amd`` Kimi classes, whose layout is not modelled.
"""

from __future__ import annotations

from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import GPUS
from ...model import HybridModel
from ...model.architecture import Architecture
from ...placements import pp_stage_bounds
from ...weights import RankWeights, WeightDtype, WeightGroup, WeightTensor
from ...weights.records import WeightKind
from .weights_draft import draft_groups
from .weights_glm import GLM_BUILT, glm_rank_weights
from .weights_layers import split
from .weights_quant import Linear, QuantContext, Split, linear_tensors, vllm_ignore
from .weights_stack import grouped, layer_groups, padded_vocab

ENGINE = "vllm"
MULTIMODAL = "KimiK3ForConditionalGeneration"
BUILT = (MULTIMODAL, "KimiLinearForCausalLM", *GLM_BUILT)
"""The model classes whose weights are laid out."""


def model_dtype(arch: Architecture) -> WeightDtype:
    """vLLM's ``auto`` dtype on CUDA: the checkpoint's, a float32 checkpoint's downcast to bf16."""
    return "bfloat16" if arch.torch_dtype == "float32" else arch.torch_dtype


def _check_builds(model: HybridModel, deployment: Deployment) -> Architecture:
    arch = model.architecture
    assert arch is not None  # weights_per_rank refuses a model without one
    if arch.architecture not in BUILT:
        raise Refusal(
            "weights_unknown",
            f"model {model.name}: vLLM's {arch.architecture} is not laid out by k3layout "
            f"(laid out: {', '.join(BUILT)})",
            facts={
                "model": model.name,
                "field": "architectures",
                "architecture": arch.architecture,
            },
            hint="plan a Kimi-K3, Kimi-Linear or GLM-5.3-Flash checkpoint",
        )
    if GPUS[deployment.gpu].vendor != "nvidia":
        raise Refusal(
            "weights_unknown",
            f"gpu={deployment.gpu}: vLLM builds its ROCm Kimi classes there, whose weights "
            "k3layout does not lay out",
            facts={"gpu": deployment.gpu, "field": "gpu"},
            hint="plan the weights on an NVIDIA GPU, or give kv_memory_bytes",
        )
    return arch


def vision_tensors(arch: Architecture, ctx: QuantContext) -> tuple[WeightTensor, ...]:
    """K3's MoonViT encoder and patch-merger projector on a rank."""
    vision = arch.vision
    assert vision is not None
    quant = ctx.quantization
    if quant is not None and quant.quant_method == "compressed-tensors":
        ctx = QuantContext(None, ctx.dtype, ctx.attn_tp, ())
    encoder_quantized = quant is None or quant.method != "nvfp4"  # ModelOpt skips the tower
    tp = ctx.attn_tp if vision.num_heads % ctx.attn_tp == 0 else 1
    vctx = QuantContext(ctx.quantization, ctx.dtype, tp, ctx.ignore)
    width, qkv = vision.hidden_size, split(vision.qkv_hidden_size, tp, "vision qkv_hidden_size")
    mlp = split(vision.intermediate_size, tp, "vision intermediate_size")
    col: Split = "col" if tp > 1 else "rep"
    row: Split = "row" if tp > 1 else "rep"
    out = [
        WeightTensor(
            name="vision_tower.patch_embed.proj.weight",
            shape=(width, 3, vision.patch_size, vision.patch_size),
            dtype=ctx.dtype,
        ),
        WeightTensor(
            name="vision_tower.patch_embed.pos_emb.weight",
            shape=(vision.pos_emb[0], vision.pos_emb[1], width),
            dtype=ctx.dtype,
        ),
        WeightTensor(
            name="vision_tower.patch_embed.pos_emb.time_weight",
            shape=(vision.pos_emb[2], 1, width),
            dtype="float32",
        ),
    ]
    for block in range(vision.num_layers):
        name = f"vision_tower.encoder.blocks.{block}"
        for linear in (
            Linear(f"{name}.wqkv", f"{name}.wqkv", (qkv, qkv, qkv), width, col, encoder_quantized),
            Linear(f"{name}.wo", f"{name}.wo", (width,), qkv, row, encoder_quantized),
            Linear(f"{name}.mlp.fc0", f"{name}.mlp.fc0", (mlp,), width, col, encoder_quantized),
            Linear(f"{name}.mlp.fc1", f"{name}.mlp.fc1", (width,), mlp, row, encoder_quantized),
        ):
            out += linear_tensors(linear, vctx)
        out += [
            WeightTensor(name=f"{name}.norm0.weight", shape=(width,), dtype=ctx.dtype),
            WeightTensor(name=f"{name}.norm1.weight", shape=(width,), dtype=ctx.dtype),
        ]
    out.append(
        WeightTensor(
            name="vision_tower.encoder.final_layernorm.weight", shape=(width,), dtype=ctx.dtype
        )
    )
    merged = vision.mm_hidden_size * vision.merge_kernel[0] * vision.merge_kernel[1]
    out += linear_tensors(
        Linear("mm_projector.linear_1", "mm_projector.linear_1", (merged,), merged, "rep"), ctx
    )
    out += linear_tensors(
        Linear(
            "mm_projector.linear_2", "mm_projector.linear_2", (arch.hidden_size,), merged, "rep"
        ),
        ctx,
    )
    out.append(
        WeightTensor(
            name="mm_projector.post_norm.weight", shape=(arch.hidden_size,), dtype=ctx.dtype
        )
    )
    return tuple(out)


def rank_weights(model: HybridModel, deployment: Deployment, stage: int) -> RankWeights:
    """The weights one rank of pipeline stage ``stage`` holds under vLLM 0.33 (the heaviest rank
    where experts do not split evenly). ``model`` is the model vLLM builds (a draft only with
    speculative tokens: ``weights_per_rank`` passes the engine check's answer)."""
    arch = _check_builds(model, deployment)
    if arch.architecture in GLM_BUILT:
        return glm_rank_weights(model, deployment, stage, model_dtype(arch))
    multimodal = arch.architecture == MULTIMODAL
    lm = "language_model." if multimodal else ""
    dtype = model_dtype(arch)
    ctx = QuantContext(
        arch.quantization, dtype, deployment.attn_tp, vllm_ignore(arch.quantization, multimodal)
    )
    bounds = pp_stage_bounds(model.num_layers, deployment.pp, deployment.pp_partition)
    start, end = bounds[stage]
    first, last = stage == 0, stage == deployment.pp - 1
    hidden = arch.hidden_size
    vocab = split(padded_vocab(arch.vocab_size), deployment.attn_tp, "vocab_size (padded to 64)")
    found: list[tuple[WeightKind, int, tuple[WeightTensor, ...]]] = []
    if multimodal and arch.vision is not None and first:
        found.append(("vision", 0, vision_tensors(arch, ctx)))
    reads_embedding = model.drafter == "dspark" and deployment.pp > 1 and last
    if first or reads_embedding:
        embedding = WeightTensor(
            name=f"{lm}model.embed_tokens.weight", shape=(vocab, hidden), dtype=dtype
        )
        found.append(("embedding", 0, (embedding,)))
    body = layer_groups(
        model, deployment, layer_ids=range(start, end), ctx=ctx, prefix=f"{lm}model.layers."
    )
    if last:
        found.append(
            (
                "norm",
                0,
                (WeightTensor(name=f"{lm}model.norm.weight", shape=(hidden,), dtype=dtype),),
            )
        )
        if arch.attn_res_block_size is not None:
            found.append(
                (
                    "attention_residual",
                    0,
                    (
                        WeightTensor(
                            name=f"{lm}model.output_attn_res_norm.weight",
                            shape=(hidden,),
                            dtype=dtype,
                        ),
                        WeightTensor(
                            name=f"{lm}model.output_attn_res_proj.weight",
                            shape=(1, hidden),
                            dtype=dtype,
                        ),
                    ),
                )
            )
        head = Linear(f"{lm}lm_head", f"{lm}lm_head", (vocab,), hidden, "col", lm_head=True)
        found.append(("lm_head", 0, linear_tensors(head, ctx)))
    once = [WeightGroup(kind=kind, tensors=tensors) for kind, _, tensors in found]
    groups = (*once, *grouped(body))
    drafts = draft_groups(model, deployment, ctx) if last and model.draft_layers else ()
    return RankWeights(engine=ENGINE, stage=stage, groups=groups, draft_groups=tuple(drafts))
