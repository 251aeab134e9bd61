"""What tokenspeed (#1152's head, a6ee91b3) refuses of a model's weights, in the order its
constructors meet it, and how it reads a config (its own defaults) and splits a rank.

The weights were recorded at #1152's head only (``tests/fixtures/tokenspeed-1152/
weights.json``); a deployment of either followed revision (``engine_version`` ``pr1152`` or
``main``) gets this same rule, and its refusals name #1152's head, where it was read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, TypeAlias

from ...deployment import Deployment
from ...errors import Refusal, RefusalCode
from ...gpus import GPUS
from ...model import HybridModel, MLALayer
from ...model.architecture import Architecture
from ...weights import WeightDtype
from .recipe import REVISION_NAME

K3_CLASS: Final = "KimiK3ForConditionalGeneration"
VOCAB_PAD: Final = 64
"""tokenspeed pads the vocabulary to 64 rows, then divides it exactly by the attention TP."""
MOE_ISPP_ALIGN: Final = 32
"""Hopper's SiTU MoE kernels (Triton bf16 and MXFP4, Marlin MXFP4) take an expert width per
rank that is a multiple of 32."""
TEXT_DEFAULTS: Final[Mapping[str, object]] = {
    "hidden_size": 7168,
    "intermediate_size": 33792,
    "num_experts": 896,
    "num_experts_per_token": 16,
    "num_shared_experts": 2,
    "moe_intermediate_size": 3072,
    "routed_expert_hidden_size": 3584,
    "latent_moe_use_norm": True,
    "first_k_dense_replace": 1,
    "attn_res_block_size": 12,
    "mla_output_gate": True,
}
"""tokenspeed's ``KimiLinearConfig`` defaults where they differ from vLLM's and SGLang's (the
real Kimi-K3 checkpoint's values)."""

VisionMode: TypeAlias = Literal["weights", "data"]
"""tokenspeed's ``--mm-encoder-tp-mode``."""


def up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


def refuse(
    code: RefusalCode, ours: str, theirs: str, hint: str, field: str, **facts: int | str
) -> Refusal:
    return Refusal(
        code,
        f"{ours} (tokenspeed: {theirs})",
        facts={"engine": "tokenspeed", "revision": REVISION_NAME, "field": field, **facts},
        hint=hint,
    )


def tokenspeed_text(arch: Architecture) -> Architecture:
    """``arch`` as tokenspeed's config class reads the same file: its own defaults for the
    fields the file leaves out."""
    update = {name: TEXT_DEFAULTS[name] for name in arch.defaulted if name in TEXT_DEFAULTS}
    kept = tuple(name for name in arch.defaulted if name not in TEXT_DEFAULTS)
    return arch.model_copy(update={**update, "defaulted": kept})


class Rank:
    """One rank's parallel sizes and the model facts the rule reads."""

    def __init__(self, arch: Architecture, deployment: Deployment, mode: VisionMode) -> None:
        self.arch, self.deployment = arch, deployment
        self.attn_tp = deployment.attn_tp
        self.world = deployment.attn_tp * deployment.attn_dp
        self.ep = self.world if deployment.expert_parallel else 1
        self.moe_tp = self.world // self.ep
        self.vision_tp = deployment.attn_tp if mode == "weights" else 1
        self.dtype: WeightDtype = arch.torch_dtype
        self.hidden = arch.hidden_size
        self.latent = arch.routed_expert_hidden_size or arch.hidden_size


def check_model(model: HybridModel, arch: Architecture, deployment: Deployment) -> None:
    """What tokenspeed refuses of the model and the GPU before any shape."""
    if arch.architecture != K3_CLASS:
        raise refuse(
            "weights_unknown",
            f"model {model.name}: tokenspeed has no {arch.architecture} model (it builds "
            f"{K3_CLASS} only)",
            f"Model architectures ['{arch.architecture}'] are not supported for now",
            "plan a Kimi-K3 checkpoint, or use engine=vllm or engine=sglang",
            "architecture",
            architecture=arch.architecture,
        )
    gpu = GPUS[deployment.gpu]
    if (gpu.vendor, gpu.capability[0]) != ("nvidia", 9):
        raise refuse(
            "weights_unknown",
            f"gpu={deployment.gpu}: tokenspeed's weights are modelled on Hopper (H100, H200), "
            "where they were recorded",
            "other GPUs take other MoE kernels and MXFP4 paddings",
            "use gpu='h200' or gpu='h100' for engine=tokenspeed's weights",
            "gpu",
            gpu=deployment.gpu,
        )
    if arch.attn_res_block_size is None:
        raise refuse(
            "weights_unknown",
            "attn_res_block_size=null: tokenspeed's Kimi-K3 layer always builds the attention "
            "residuals and needs their block size",
            "TypeError at construction",
            "leave attn_res_block_size out (tokenspeed's default is 12) or give a block size",
            "attn_res_block_size",
        )
    for layer in model.kda_layers:
        if not layer.full_rank_gate:
            raise refuse(
                "weights_unknown",
                "a KDA layer with a low-rank output gate: tokenspeed's KDA has the full-rank "
                "gate only",
                "KimiLinearKDA only implements the full-rank output gate",
                "plan a Kimi-K3 checkpoint",
                "linear_attn_config.use_full_rank_gate",
            )
    for attention in (*model.mla_layers, *model.draft_layers):
        if isinstance(attention, MLALayer) and attention.q_lora_rank is None:
            raise refuse(
                "weights_unknown",
                "an MLA layer without q_lora_rank: tokenspeed's K3 and DSpark MLA are laid out "
                "with the q-LoRA path only",
                "gated MLA assumes the q-lora path",
                "plan a Kimi-K3 checkpoint (q_lora_rank 1536)",
                "q_lora_rank",
            )


def check_parallel(r: Rank, model: HybridModel) -> None:
    """tokenspeed's refusals of the split, in the order its constructors meet them."""
    arch = r.arch
    padded = up(arch.vocab_size, VOCAB_PAD)
    if padded % r.attn_tp:
        raise refuse(
            "uneven_split",
            f"vocab_size={arch.vocab_size} (padded to {padded}) does not split over "
            f"attn_tp={r.attn_tp}",
            f"{padded} is not divisible by {r.attn_tp}",
            f"use an attn_tp that divides {padded}",
            "vocab_size",
            vocab_size=arch.vocab_size,
            attn_tp=r.attn_tp,
        )
    for layer in model.mla_layers:
        if layer.num_heads % r.attn_tp:
            raise refuse(
                "heads_not_divisible",
                f"MLA num_heads={layer.num_heads} must be divisible by attn_tp={r.attn_tp}",
                f"num_heads={layer.num_heads} must be divisible by attn_tp_size={r.attn_tp}.",
                "pick an attention TP that divides the MLA heads",
                "num_heads",
                num_heads=layer.num_heads,
                attn_tp=r.attn_tp,
            )
    dense = [i for i in range(model.num_layers) if not arch.is_moe_layer(i)]
    if dense and arch.intermediate_size % r.attn_tp:
        raise uneven("intermediate_size", arch.intermediate_size, "attn_tp", r.attn_tp)
    if arch.num_experts is None or arch.moe_intermediate_size is None:
        return
    if arch.num_experts % r.ep:
        raise uneven("num_experts", arch.num_experts, "ep", r.ep)
    _check_experts(r, arch.moe_intermediate_size // r.moe_tp)
    shared = arch.moe_intermediate_size * arch.num_shared_experts
    if shared % r.world:
        raise uneven("shared_intermediate", shared, "moe_tp x ep", r.world)


def uneven(field: str, size: int, group: str, ranks: int) -> Refusal:
    return refuse(
        "uneven_split",
        f"{field}={size} does not split over {group}={ranks}",
        f"{size} is not divisible by {ranks}",
        f"use a {group} that divides {size}",
        field,
        **{field: size, group: ranks},
    )


def _check_experts(r: Rank, per_rank: int) -> None:
    """Which SiTU MoE kernel builds the experts on Hopper: Triton bf16 (no EP), Triton or
    Marlin MXFP4 (Marlin with EP); none for fp8, int4 or NVFP4 experts."""
    quant = r.arch.quantization
    method = "bf16" if quant is None else quant.method
    if method not in ("bf16", "mxfp4"):
        raise refuse(
            "quantization_unsupported",
            f"quantization {method}: tokenspeed has no SiTU MoE kernel for {method} experts on "
            "Hopper (Kimi-K3's experts run bf16 or MXFP4 there)",
            f"No kernel found for moe.apply with traits weight_dtype={method} activation=situ",
            "use a bf16 or MXFP4 checkpoint of Kimi-K3",
            "quantization",
            method=method,
        )
    if quant is not None and quant.quant_method == "compressed-tensors" and not quant.ignore:
        raise refuse(
            "quantization_unsupported",
            "compressed-tensors MXFP4 with an empty ignore list: tokenspeed quantizes the "
            "routed experts only, every other Linear must be ignored",
            "'CompressedTensorsConfig' object has no attribute 'get_quant_method'",
            "ignore the attention, MLP, shared-expert, LM-head and vision modules",
            "quantization_config.ignore",
        )
    if method == "bf16" and r.ep > 1:
        raise refuse(
            "engine_setting",
            f"expert_parallel with bf16 experts: tokenspeed's only bf16 SiTU MoE kernel (Triton) "
            f"has no expert parallelism (ep={r.ep})",
            "No kernel found for moe.apply with traits weight_dtype=unquant activation=situ "
            "supports_ep=True",
            "use expert_parallel=False (MoE TP) for bf16 experts, or an MXFP4 checkpoint",
            "expert_parallel",
            ep=r.ep,
        )
    if per_rank % MOE_ISPP_ALIGN:
        raise refuse(
            "kernel_unsupported",
            f"moe_intermediate_size / moe_tp = {per_rank} rows a rank: tokenspeed's Hopper SiTU "
            f"MoE kernels take a multiple of {MOE_ISPP_ALIGN}",
            f"No kernel found for moe.apply with traits ispp={per_rank}",
            "use fewer MoE TP ranks (a smaller world), or expert_parallel with MXFP4",
            "moe_intermediate_size",
            moe_tp=r.moe_tp,
            per_rank=per_rank,
        )


def check_vision(r: Rank) -> None:
    """The vision tower's attention heads over the vision TP (the attention TP in
    ``--mm-encoder-tp-mode weights``)."""
    vision = r.arch.vision
    if vision is not None and vision.num_heads % r.vision_tp:
        raise refuse(
            "heads_not_divisible",
            f"the vision tower's {vision.num_heads} attention heads do not split over "
            f"attn_tp={r.attn_tp} (tokenspeed's default --mm-encoder-tp-mode weights shards "
            "the tower over attention TP)",
            f"Vision attention has {vision.num_heads} heads, which is not divisible by vision "
            f"TP size {r.vision_tp}",
            f"use an attn_tp that divides {vision.num_heads}, or plan the checkpoint without "
            "its vision tower (tokenspeed's --language-model-only); tokenspeed's "
            "--mm-encoder-tp-mode data is not a k3layout setting",
            "vision.num_heads",
            num_heads=vision.num_heads,
            attn_tp=r.attn_tp,
        )
