"""What SGLang 0.5.23 builds beside Kimi's decoder stack: K3's vision tower and SGLang's dense
DSpark draft; what it refuses of a quantization before any shape; and how it pads a
vocabulary (every family's embedding and LM head)."""

from __future__ import annotations

from typing import Final

from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import GPUS, GpuName
from ...model import GQALayer, HybridModel
from ...model.architecture import Architecture, DSparkDraft, VisionTower
from ...weights import WeightDtype, WeightGroup, WeightTensor

VOCAB_PAD: Final = 64
"""``DEFAULT_VOCAB_PADDING_SIZE`` of SGLang's ``vocab_parallel_embedding``."""


def padded_vocab(vocab: int, ranks: int) -> int:
    """SGLang's padded vocabulary over ``ranks``: to 64, or to ``64 x ranks`` when 64's
    padding does not divide (163,840 divides every TP: no padding)."""
    pad = VOCAB_PAD
    if -(-vocab // pad) * pad % ranks:
        pad *= ranks
    return -(-vocab // pad) * pad


def vocab_rows(vocab: int, ranks: int) -> int:
    """The embedding's (or LM head's) rows on one of ``ranks``: the padded vocabulary split."""
    return padded_vocab(vocab, ranks) // ranks


def _t(name: str, shape: tuple[int, ...], dtype: WeightDtype) -> WeightTensor:
    return WeightTensor(name=name, shape=shape, dtype=dtype)


def vision_tensors(
    v: VisionTower, text_hidden: int, dtype: WeightDtype
) -> tuple[WeightTensor, ...]:
    """Kimi-K3's vision tower and projector (``KimiK3VisionTower``,
    ``KimiK3MultiModalProjector``): plain ``nn`` modules, replicated, never quantized, built on
    every pipeline stage; the projector merges ``merge_kernel`` patches (4 x 1024 = 4096)."""
    hid, p = v.hidden_size, v.patch_size
    merged = v.mm_hidden_size * v.merge_kernel[0] * v.merge_kernel[1]
    block = "vision_tower.encoder.blocks"
    found = [
        _t("vision_tower.patch_embed.proj.weight", (hid, 3, p, p), dtype),
        _t("vision_tower.patch_embed.pos_emb.weight", (v.pos_emb[0], v.pos_emb[1], hid), dtype),
    ]
    for n in range(v.num_layers):
        found += [
            _t(f"{block}.{n}.norm0.weight", (hid,), dtype),
            _t(f"{block}.{n}.norm1.weight", (hid,), dtype),
            _t(f"{block}.{n}.mlp.fc0.weight", (v.intermediate_size, hid), dtype),
            _t(f"{block}.{n}.mlp.fc1.weight", (hid, v.intermediate_size), dtype),
            _t(f"{block}.{n}.wqkv.weight", (3 * v.qkv_hidden_size, hid), dtype),
            _t(f"{block}.{n}.wo.weight", (hid, v.qkv_hidden_size), dtype),
        ]
    return (
        *found,
        _t("vision_tower.encoder.final_layernorm.weight", (hid,), dtype),
        _t("mm_projector.proj.0.weight", (merged, merged), dtype),
        _t("mm_projector.proj.2.weight", (text_hidden, merged), dtype),
        _t("mm_projector.post_norm.weight", (text_hidden,), dtype),
    )


def draft_groups(
    model: HybridModel, draft: DSparkDraft, deployment: Deployment, dtype: WeightDtype
) -> tuple[WeightGroup, ...]:
    """SGLang's dense DSpark draft (``DSparkDraftModel``) in the target's TP scope: per layer
    a QKV projection of its GQA heads, the output projection, q/k norms and a dense MLP; once
    the norms, ``fc`` over the target layers it reads, the Markov head and the rotary cache.
    It shares the target's embedding and LM head, and is never quantized."""
    tp, h = deployment.attn_tp * deployment.attn_dp, draft.hidden_size
    layer = model.draft_layers[0]
    assert isinstance(layer, GQALayer)  # check_sglang refuses MLA drafts
    if deployment.attn_dp > 1:
        raise Refusal(
            "draft_unsupported",
            f"attn_dp={deployment.attn_dp}: SGLang 0.5.23 runs a DSpark draft under DP "
            "attention only with --enable-dp-lm-head, which k3layout does not model",
            facts={"engine": "sglang", "attn_dp": deployment.attn_dp},
            hint="use attn_dp=1 with a DSpark draft",
        )
    if (
        layer.num_heads % tp
        or (layer.num_kv_heads >= tp and layer.num_kv_heads % tp)
        or (layer.num_kv_heads < tp and tp % layer.num_kv_heads)
    ):
        raise Refusal(
            "heads_not_divisible",
            f"DSpark draft heads={layer.num_heads} / kv_heads={layer.num_kv_heads} do not split "
            f"over tp={tp} (SGLang 0.5.23 asserts it)",
            facts={"num_heads": layer.num_heads, "num_kv_heads": layer.num_kv_heads, "tp": tp},
            hint="use a TP size that divides the draft's heads",
        )
    heads, kv_heads, hd = layer.num_heads // tp, max(1, layer.num_kv_heads // tp), layer.head_dim
    inter = draft.intermediate_size // tp
    per_layer = (
        _t("self_attn.qkv_proj.weight", ((heads + 2 * kv_heads) * hd, h), dtype),
        _t("self_attn.o_proj.weight", (h, heads * hd), dtype),
        _t("self_attn.q_norm.weight", (hd,), dtype),
        _t("self_attn.k_norm.weight", (hd,), dtype),
        _t("mlp.gate_up_proj.weight", (2 * inter, h), dtype),
        _t("mlp.down_proj.weight", (h, inter), dtype),
        _t("input_layernorm.weight", (h,), dtype),
        _t("post_attention_layernorm.weight", (h,), dtype),
    )
    once = (
        _t("norm.weight", (h,), dtype),
        _t("hidden_norm.weight", (h,), dtype),
        _t("fc.weight", (h, draft.num_target_layers * h), dtype),
        _t("markov_head.markov_w1.weight", (draft.vocab_size, draft.markov_rank), dtype),
        _t("markov_head.markov_w2.weight", (draft.vocab_size, draft.markov_rank), dtype),
        # one rotary cache, shared by every layer (get_rope caches it), kept fp32 on the GPU
        _t(
            "layers.0.self_attn.rotary_emb.cos_sin_cache",
            (draft.max_position_embeddings, hd),
            "float32",
        ),
    )
    return (
        WeightGroup(kind="draft", layers=model.draft_layer_ids, tensors=per_layer),
        WeightGroup(kind="draft", tensors=once),
    )


def refuse_quantization(arch: Architecture, gpu: GpuName) -> None:
    """What SGLang 0.5.23 refuses of a quantization before any shape: NVFP4 experts on
    Hopper, MXFP4 as a plain ``quant_method`` on an MLA model, compressed-tensors MXFP4 on
    Kimi-Linear (no scheme: only K3 switches its experts to the MXFP4 method)."""
    q = arch.quantization
    if q is None:
        return
    if q.method == "nvfp4" and GPUS[gpu].capability[0] < 10:  # Hopper
        raise Refusal(
            "quantization_unsupported",
            f"gpu={gpu}: SGLang 0.5.23's NVFP4 MoE backends need Blackwell (or marlin, which "
            "k3layout does not model)",
            facts={"engine": "sglang", "gpu": gpu, "method": q.method},
            hint="use gpu='b200' for an NVFP4 checkpoint",
        )
    if q.method == "mxfp4" and q.quant_method == "mxfp4":
        raise Refusal(
            "quantization_unsupported",
            "quant_method=mxfp4: SGLang 0.5.23's Mxfp4Config has no method for MLA's attention "
            "modules or an unignored linear",
            facts={"engine": "sglang", "quant_method": q.quant_method},
            hint="use the compressed-tensors mxfp4-pack-quantized format (Kimi-K3)",
        )
    if q.method == "mxfp4" and arch.architecture != "KimiK3ForConditionalGeneration":
        raise Refusal(
            "quantization_unsupported",
            f"{arch.architecture}: SGLang 0.5.23 finds no compressed-tensors scheme for its "
            "MXFP4 layers (only Kimi-K3's MoE switches to the MXFP4 expert method)",
            facts={"engine": "sglang", "architecture": arch.architecture},
            hint="plan an MXFP4 Kimi-K3, or another quantization",
        )
