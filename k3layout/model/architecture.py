"""What a checkpoint's weights are: the dimensions its ``config.json`` gives beyond the cache's,
the checkpoint dtype and its quantization.

The cache reads a layer's heads and latent (:mod:`k3layout.model.layers`); the weights read
the rest of the config: the hidden size, the vocabulary, the dense and MoE MLPs, the vision
tower of a multimodal checkpoint and the ``quantization_config``. :class:`Architecture` holds
them as the engines' own config classes read them: a field the file leaves out takes the
default of the engines' ``KimiLinearConfig`` / ``KimiK3VisionConfig`` (both vLLM 0.33 and
SGLang 0.5.23 build the model from those defaults: the K3 fixture has no
``intermediate_size``, so its dense layer 0 is 11,008 wide in both), and
``tests/conformance/test_conformance_weights.py`` checks that by building the engines' model
classes. Each engine lays these out its own way (:mod:`k3layout.weights`).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, TypeAlias

from pydantic import Field

from .._frozen import Frozen
from ..constants import MAX_MODEL_DIM, MAX_PROMPT_TOKENS

Dim: TypeAlias = Annotated[int, Field(gt=0, le=MAX_MODEL_DIM)]
Count: TypeAlias = Annotated[int, Field(ge=0, le=MAX_MODEL_DIM)]

QuantMethod: TypeAlias = Literal["fp8_block", "int4_w4a16", "mxfp4", "nvfp4"]
"""The quantizations k3layout lays out, by what the checkpoint's ``quantization_config`` says:

- ``fp8_block``: ``quant_method: fp8`` with a ``weight_block_size`` (DeepSeek's block-scaled
  fp8: an fp8 weight and one fp32 scale per block);
- ``int4_w4a16``: ``quant_method: compressed-tensors``, ``pack-quantized`` int4 weights in
  groups (Kimi-K2-Thinking's routed experts);
- ``mxfp4``: ``quant_method: mxfp4``, or compressed-tensors ``mxfp4-pack-quantized`` (e2m1
  weights, one e8m0 scale per 32);
- ``nvfp4``: ``quant_method: modelopt``, ``quant_algo: NVFP4`` (e2m1 weights, an fp8 scale per
  16 and fp32 global scales).
"""

QUANT_METHODS: Final[tuple[QuantMethod, ...]] = ("fp8_block", "int4_w4a16", "mxfp4", "nvfp4")


class Quantization(Frozen):
    """A checkpoint's ``quantization_config``, as far as it decides weight bytes."""

    method: QuantMethod = Field(description="the quantization k3layout lays out")
    quant_method: str = Field(
        description="the config's quant_method as written (fp8, compressed-tensors, mxfp4, "
        "modelopt)"
    )
    weight_block: tuple[Dim, Dim] | None = Field(
        None, description="fp8_block: weight_block_size, rows x columns per fp32 scale"
    )
    group_size: Dim | None = Field(
        None, description="the elements one scale covers (int4: 32, mxfp4: 32, nvfp4: 16)"
    )
    ignore: tuple[str, ...] = Field(
        (),
        description="module names left in the checkpoint dtype, as the config lists them "
        "(ignored_layers, modules_to_not_convert, ignore, exclude_modules); each engine "
        "matches them against its own module names",
    )


class VisionTower(Frozen):
    """A multimodal checkpoint's vision encoder and projector (Kimi-K3's MoonViT and patch
    merger), from ``vision_config`` with ``KimiK3VisionConfig``'s defaults."""

    num_layers: Dim = Field(27, description="vt_num_hidden_layers")
    hidden_size: Dim = Field(1024, description="vt_hidden_size")
    num_heads: Dim = Field(
        12, description="vt_num_attention_heads (TP splits the tower only where they divide)"
    )
    intermediate_size: Dim = Field(4096, description="vt_intermediate_size")
    qkv_hidden_size: Dim = Field(1536, description="qkv_hidden_size: the q, k, v widths")
    patch_size: Dim = Field(14, description="patch_size")
    pos_emb: tuple[Dim, Dim, Dim] = Field(
        (64, 64, 4),
        description="init_pos_emb_height, init_pos_emb_width, init_pos_emb_time",
    )
    merge_kernel: tuple[Dim, Dim] = Field((2, 2), description="merge_kernel_size")
    mm_hidden_size: Dim = Field(
        1024, description="mm_hidden_size (default vt_hidden_size): the projector's input"
    )


class MergerVisionTower(Frozen):
    """A vision transformer with a 3D patch embedding, rotary positions, and a conv downsample
    plus MLP merger as its projector (GLM-5.3-Flash's ``vision_config``)."""

    depth: Dim = Field(description="depth: transformer blocks")
    hidden_size: Dim = Field(description="hidden_size")
    num_heads: Dim = Field(description="num_heads (TP splits the tower by them)")
    intermediate_size: Dim = Field(description="intermediate_size: a block's MLP")
    patch_size: Dim = Field(description="patch_size")
    temporal_patch_size: Dim = Field(description="temporal_patch_size")
    in_channels: Dim = Field(description="in_channels")
    out_hidden_size: Dim = Field(description="out_hidden_size: the merger's width")
    spatial_merge_size: Dim = Field(description="spatial_merge_size: the downsample's kernel")
    projection_intermediate_size: Dim = Field(description="projection_intermediate_size")
    rotary_positions: Dim = Field(
        description="positions of its rotary table: the text model's max_position_embeddings"
    )


class DSparkDraft(Frozen):
    """A DSpark draft model's dimensions beyond its MLA layers (its own ``config.json``)."""

    hidden_size: Dim = Field(description="the draft's hidden_size")
    intermediate_size: Dim = Field(description="its dense MLP's intermediate_size")
    vocab_size: Dim = Field(description="draft_vocab_size, else vocab_size")
    target_hidden_size: Dim | None = Field(
        None,
        description="the target's hidden size it reads (vLLM's and tokenspeed's MLA "
        "draft need it; SGLang's dense draft reads its own hidden size)",
    )
    num_target_layers: Dim = Field(description="target layers whose hidden states it reads")
    markov_rank: Dim = Field(description="the Markov head's rank")
    max_position_embeddings: Annotated[int, Field(gt=0, le=MAX_PROMPT_TOKENS)] = Field(
        description="positions of its rotary cache"
    )


class Architecture(Frozen):
    """The dimensions, dtype and quantization a checkpoint's weights follow (the text
    backbone's fields; K3 nests them under ``text_config``)."""

    architecture: str = Field(
        description="the checkpoint's architectures[0]: the model class an engine builds "
        "(KimiK3ForConditionalGeneration, KimiLinearForCausalLM)"
    )
    hidden_size: Dim = Field(description="hidden_size")
    vocab_size: Dim = Field(description="vocab_size")
    intermediate_size: Dim = Field(
        11008, description="the dense MLP's intermediate_size (KimiLinearConfig's default)"
    )
    num_experts: Dim | None = Field(None, description="routed experts; None: dense")
    num_experts_per_token: Dim | None = Field(
        None, description="routed experts a token goes to (the activations' width)"
    )
    num_shared_experts: Count = Field(0, description="num_shared_experts")
    moe_intermediate_size: Dim | None = Field(None, description="moe_intermediate_size")
    first_k_dense_replace: Count = Field(0, description="leading dense layers")
    moe_layer_freq: Dim = Field(
        1, description="a layer i >= first_k_dense_replace is MoE when i % moe_layer_freq == 0"
    )
    routed_expert_hidden_size: Dim | None = Field(
        None, description="latent MoE: the experts' hidden width (None: hidden_size)"
    )
    latent_moe_use_norm: bool = Field(False, description="latent MoE keeps a norm")
    attn_res_block_size: Dim | None = Field(
        None, description="attention-residual blocks (per-layer residual projections)"
    )
    min_moe_intermediate_per_partition: Dim = Field(
        256, description="the least MoE intermediate a rank holds under TP (padded up to it)"
    )
    mla_output_gate: bool = Field(False, description="mla_use_output_gate: MLA's gate proj")
    num_nextn_predict_layers: Count = Field(0, description="MTP modules in the checkpoint")
    tie_word_embeddings: bool = Field(False, description="tie_word_embeddings")
    torch_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="the checkpoint dtype of what is not quantized"
    )
    quantization: Quantization | None = Field(None, description="quantization_config")
    vision: VisionTower | None = Field(
        None, description="the vision tower of a multimodal checkpoint (None: text only)"
    )
    draft: DSparkDraft | None = Field(None, description="a DSpark draft's own dimensions")
    merger_vision: MergerVisionTower | None = Field(
        None, description="a merger vision tower (GLM-5.3-Flash's), instead of MoonViT"
    )
    mlp_layer_types: tuple[Literal["dense", "sparse"], ...] | None = Field(
        None,
        description="mlp_layer_types: a dense MLP or a MoE per layer, an MTP layer taking the "
        "last (None: first_k_dense_replace and moe_layer_freq decide)",
    )
    hyper_connections: Count = Field(
        0, description="hc_mult: the residual streams of a hyper-connected layer (0: none)"
    )
    router_bias: bool = Field(
        False, description="topk_method noaux_tc: the router's fp32 score-correction bias"
    )
    undeclared: tuple[str, ...] = Field(
        (),
        description="fields an engine's model constructor reads that the config leaves out "
        "(GLM-5.3-Flash's mhc, mla_use_nope, ...): that engine's weights are refused naming "
        "them",
    )
    defaulted: tuple[str, ...] = Field(
        (),
        description="the fields above the config leaves out (or gives as null), filled with "
        "vLLM's and SGLang's KimiLinearConfig defaults (an engine whose config class defaults "
        "them otherwise, such as tokenspeed's, reads its own)",
    )
    unsupported: tuple[tuple[str, str], ...] = Field(
        (),
        description="(field, why) of what the config says that k3layout does not lay out (a "
        "quantization, a vision tower): the weights are refused with it, the cache is planned",
    )

    def is_moe_layer(self, layer: int) -> bool:
        """Whether target layer ``layer`` (0-based) has a routed MoE rather than a dense MLP,
        by ``mlp_layer_types`` where the config gives it (a layer past it, an MTP layer, takes
        the last: vLLM's reading), else as both engines decide it for Kimi."""
        if self.num_experts is None:
            return False
        if self.mlp_layer_types:
            kinds = self.mlp_layer_types
            return kinds[min(layer, len(kinds) - 1)] == "sparse"
        return self.is_moe_by_replace(layer)

    def is_moe_by_replace(self, layer: int) -> bool:
        """Whether layer ``layer`` is MoE by ``first_k_dense_replace`` and ``moe_layer_freq``
        alone (SGLang's reading of GLM-5.3-Flash, which ignores ``mlp_layer_types``)."""
        return (
            self.num_experts is not None
            and layer >= self.first_k_dense_replace
            and layer % self.moe_layer_freq == 0
        )
