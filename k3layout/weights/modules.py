"""Modules whose per-rank tensors two engines name and shape alike, so that their layouts are
written once: a hyper-connected layer's mixing parameters, a latent attention layer's
unquantized projections and a merger vision tower's transformer blocks (GLM-5.3-Flash's, in
vLLM's and SGLang's classes)."""

from __future__ import annotations

from ..cache.mla import MLALayer
from ..model.architecture import MergerVisionTower
from .records import WeightDtype, WeightTensor


def _t(name: str, shape: tuple[int, ...], dtype: WeightDtype) -> WeightTensor:
    return WeightTensor(name=name, shape=shape, dtype=dtype)


def hyper_connection_tensors(hidden: int, streams: int) -> tuple[WeightTensor, ...]:
    """A hyper-connected layer's fp32 mixing maps, biases and scales, before its attention and
    its MLP (``hc_mult`` = ``streams`` residual streams), replicated on every rank."""
    mixes = (2 + streams) * streams
    return tuple(
        tensor
        for site in ("attn", "ffn")
        for tensor in (
            _t(f"hc_{site}_fn", (mixes, streams * hidden), "float32"),
            _t(f"hc_{site}_base", (mixes,), "float32"),
            _t(f"hc_{site}_scale", (3,), "float32"),
        )
    )


def mla_projection_tensors(
    layer: MLALayer, heads: int, hidden: int, dtype: WeightDtype, fused: str
) -> tuple[WeightTensor, ...]:
    """An MLA layer's unquantized projections and norms on a rank holding ``heads`` of its
    heads: the fused q/kv down-projection (the engine calls it ``fused``) replicated, the
    up- and output projections split by heads."""
    q_lora, rope = layer.q_lora_rank or 0, layer.qk_rope_head_dim
    nope, rank = layer.qk_nope_head_dim, layer.kv_lora_rank
    return (
        _t(f"self_attn.{fused}.weight", (q_lora + rank + rope, hidden), dtype),
        _t("self_attn.q_a_layernorm.weight", (q_lora,), dtype),
        _t("self_attn.q_b_proj.weight", (heads * (nope + rope), q_lora), dtype),
        _t("self_attn.kv_a_layernorm.weight", (rank,), dtype),
        _t("self_attn.kv_b_proj.weight", (heads * (nope + layer.v_head_dim), rank), dtype),
        _t("self_attn.o_proj.weight", (hidden, heads * layer.v_head_dim), dtype),
    )


def vision_block_tensors(
    vision: MergerVisionTower, heads: int, mlp: int, dtype: WeightDtype, qkv: str
) -> tuple[WeightTensor, ...]:
    """The patch embedding and every transformer block of a merger vision tower on a rank
    holding ``heads`` of its heads and ``mlp`` of its MLP width (the engine calls the fused
    q|k|v projection ``qkv``)."""
    width = vision.hidden_size
    head = width // vision.num_heads
    patch = (
        width,
        vision.in_channels,
        vision.temporal_patch_size,
        vision.patch_size,
        vision.patch_size,
    )
    tensors = [
        _t("visual.patch_embed.proj.weight", patch, dtype),
        _t("visual.patch_embed.proj.bias", (width,), dtype),
    ]
    for block in range(vision.depth):
        b = f"visual.blocks.{block}"
        tensors += [
            _t(f"{b}.norm1.weight", (width,), dtype),
            _t(f"{b}.norm2.weight", (width,), dtype),
            _t(f"{b}.attn.q_norm.weight", (head,), dtype),
            _t(f"{b}.attn.k_norm.weight", (head,), dtype),
            _t(f"{b}.attn.{qkv}.weight", (3 * heads * head, width), dtype),
            _t(f"{b}.attn.{qkv}.bias", (3 * heads * head,), dtype),
            _t(f"{b}.attn.proj.weight", (width, heads * head), dtype),
            _t(f"{b}.attn.proj.bias", (width,), dtype),
            _t(f"{b}.mlp.gate_up_proj.weight", (2 * mlp, width), dtype),
            _t(f"{b}.mlp.gate_up_proj.bias", (2 * mlp,), dtype),
            _t(f"{b}.mlp.down_proj.weight", (width, mlp), dtype),
            _t(f"{b}.mlp.down_proj.bias", (width,), dtype),
        ]
    return tuple(tensors)
