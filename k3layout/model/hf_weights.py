"""Read what a ``config.json`` says of the weights (:class:`~.architecture.Architecture`).

The engines' config classes fill what a file leaves out; this reads those defaults the same way
(:class:`~.architecture.Architecture`'s field defaults). What would lay the weights out wrongly
is said (``Architecture.unsupported``, the field and why) and refused when weights are asked:
a quantization k3layout does not lay out (``quantization_config.quant_method`` and the values
it takes), a vision tower with biases or another projector than Kimi-K3's; the cache is planned
regardless. A field of the wrong type is refused at load (``invalid_config``), and integers are
strict, as in the cache's loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictStr, ValidationError

from .._validation import describe, refusal_from_validation
from ..constants import MAX_MODEL_DIM, MAX_PROMPT_TOKENS
from ..errors import Refusal
from .architecture import Architecture, DSparkDraft, Quantization, VisionTower

_Dim = Annotated[int, Strict(), Field(gt=0, le=MAX_MODEL_DIM)]
_Count = Annotated[int, Strict(), Field(ge=0, le=MAX_MODEL_DIM)]

ARCHITECTURE_OF_TYPE: Final[Mapping[str, str]] = {
    "kimi_k3": "KimiK3ForConditionalGeneration",
    "kimi_linear": "KimiLinearForCausalLM",
}
"""The model class a checkpoint without ``architectures`` is built as, by its model_type (what
the engines' registries map the type to)."""

MULTIMODAL_ARCHITECTURES: Final = frozenset({"KimiK3ForConditionalGeneration"})
"""Classes that build a vision tower (from ``vision_config``, or its defaults without one)."""


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


class _Weights(_Lenient):
    hidden_size: _Dim = 4096
    vocab_size: _Dim = 163840
    intermediate_size: _Dim = 11008
    num_experts: _Dim | None = None
    num_experts_per_token: _Dim | None = None
    num_shared_experts: _Count | None = 0
    moe_intermediate_size: _Dim | None = None
    first_k_dense_replace: _Count = 0
    moe_layer_freq: _Dim = 1
    routed_expert_hidden_size: _Dim | None = None
    latent_moe_use_norm: StrictBool = False
    attn_res_block_size: _Dim | None = None
    min_moe_intermediate_per_partition: _Dim = 256
    mla_use_output_gate: StrictBool = False
    num_nextn_predict_layers: _Count = 0
    tie_word_embeddings: StrictBool = False


_ARCHITECTURE_FIELD: Final[Mapping[str, str]] = {
    **{key: key for key in _Weights.model_fields},
    "mla_use_output_gate": "mla_output_gate",
}
"""Each config key of :class:`_Weights` -> the :class:`Architecture` field it sets."""


class _Vision(_Lenient):
    vt_num_hidden_layers: _Dim = 27
    vt_hidden_size: _Dim = 1024
    vt_num_attention_heads: _Dim = 12
    vt_intermediate_size: _Dim = 4096
    qkv_hidden_size: _Dim = 1536
    patch_size: _Dim = 14
    init_pos_emb_height: _Dim = 64
    init_pos_emb_width: _Dim = 64
    init_pos_emb_time: _Dim = 4
    merge_kernel_size: tuple[_Dim, _Dim] = (2, 2)
    mm_hidden_size: _Dim | None = None
    attn_bias: StrictBool = False
    linear_bias: StrictBool = False
    patch_embed_proj_bias: StrictBool = False
    mm_projector_type: StrictStr = "patchmergerv2"
    mlp_type: StrictStr = "mlp2"
    norm_type: StrictStr = "rmsnorm"


class _Draft(_Lenient):
    hidden_size: _Dim
    intermediate_size: _Dim
    vocab_size: _Dim
    draft_vocab_size: _Dim | None = None
    target_hidden_size: _Dim | None = None
    target_layer_ids: tuple[Annotated[int, Strict()], ...] = Field(min_length=1)
    markov_rank: _Dim
    max_position_embeddings: Annotated[int, Strict(), Field(gt=0, le=MAX_PROMPT_TOKENS)]


_VISION_LAYOUT: Final[Mapping[str, object]] = {
    "attn_bias": False,
    "linear_bias": False,
    "patch_embed_proj_bias": False,
    "mm_projector_type": "patchmergerv2",
    "mlp_type": "mlp2",
    "norm_type": "rmsnorm",
}
"""Kimi-K3's vision tower as k3layout lays it out (no biases, the patch-merger projector)."""


def _refused(error: ValidationError, source: str, prefix: str) -> Refusal:
    refusal = refusal_from_validation(
        error,
        f"config {source}",
        code="invalid_config",
        facts={"source": source},
        hint="fix the named field of the config.json",
    )
    field = refusal.facts.get("field")
    if prefix and isinstance(field, str) and not field.startswith("<"):
        return Refusal(
            refusal.code,
            refusal.message.replace(f"{field}:", f"{prefix}{field}:", 1),
            facts={**refusal.facts, "field": f"{prefix}{field}"},
            hint=refusal.hint,
        )
    return refusal


def _bad(source: str, field: str, message: str, hint: str) -> Refusal:
    return Refusal(
        "invalid_config",
        f"config {source}: {field}: {message}",
        facts={"source": source, "field": field},
        hint=hint,
    )


def architecture_of(
    outer: Mapping[str, object],
    text: Mapping[str, object],
    model_type: str,
    source: str,
    prefix: str = "",
) -> Architecture:
    """The :class:`Architecture` of a checkpoint: ``outer`` is its whole ``config.json``,
    ``text`` the text backbone's fields (``outer`` itself when flat, ``prefix`` then ``""``,
    else ``"text_config."``); ``model_type`` the checkpoint's."""
    try:
        fields = _Weights.model_validate(text)
    except ValidationError as error:
        raise _refused(error, source, prefix) from None
    unsupported: list[tuple[str, str]] = []
    architectures = outer.get("architectures")
    if architectures is None:
        name = ARCHITECTURE_OF_TYPE.get(model_type, "unknown")
        if name == "unknown":
            unsupported.append(
                (
                    "architectures",
                    f"config {source}: architectures: missing, and model_type "
                    f"{describe(model_type)} names no model class an engine builds",
                )
            )
    elif isinstance(architectures, list) and architectures:
        for index, item in enumerate(architectures):
            if not isinstance(item, str):
                raise _bad(
                    source,
                    f"architectures.{index}",
                    f"{describe(item)} is not a class name",
                    "give the checkpoint's architectures list",
                )
        name = architectures[0]
    else:
        raise _bad(
            source,
            "architectures",
            "must be a non-empty list of class names",
            "give the checkpoint's architectures list",
        )
    dtype = text.get("torch_dtype", text.get("dtype", outer.get("torch_dtype", "bfloat16")))
    quant_config = text.get("quantization_config", outer.get("quantization_config"))
    if dtype not in ("bfloat16", "float16", "float32", None, "auto"):
        field = f"{prefix}torch_dtype"
        unsupported.append(
            (
                field,
                f"config {source}: {field}: {describe(dtype)} is not a checkpoint dtype k3layout "
                "lays out (allowed: bfloat16, float16, float32)",
            )
        )
        dtype = None
    quantization = vision = None
    try:  # the cache plans whatever the weights are: what is not laid out is said, not refused
        if quant_config is not None:
            quantization = quantization_of(quant_config, source)
        if name in MULTIMODAL_ARCHITECTURES:
            vision = _vision(outer, source)
    except Refusal as refusal:
        unsupported.append((str(refusal.facts["field"]), str(refusal)))
    return Architecture(
        architecture=name,
        hidden_size=fields.hidden_size,
        vocab_size=fields.vocab_size,
        intermediate_size=fields.intermediate_size,
        num_experts=fields.num_experts,
        num_experts_per_token=fields.num_experts_per_token,
        num_shared_experts=fields.num_shared_experts or 0,
        moe_intermediate_size=fields.moe_intermediate_size,
        first_k_dense_replace=fields.first_k_dense_replace,
        moe_layer_freq=fields.moe_layer_freq,
        routed_expert_hidden_size=fields.routed_expert_hidden_size,
        latent_moe_use_norm=fields.latent_moe_use_norm,
        attn_res_block_size=fields.attn_res_block_size,
        min_moe_intermediate_per_partition=fields.min_moe_intermediate_per_partition,
        mla_output_gate=fields.mla_use_output_gate,
        num_nextn_predict_layers=fields.num_nextn_predict_layers,
        tie_word_embeddings=fields.tie_word_embeddings,
        torch_dtype="bfloat16" if dtype in (None, "auto") else dtype,
        quantization=quantization,
        vision=vision,
        defaulted=tuple(
            field for key, field in _ARCHITECTURE_FIELD.items() if text.get(key) is None
        ),  # a null reads as the field left out
        unsupported=tuple(unsupported),
    )


def _vision(outer: Mapping[str, object], source: str) -> VisionTower:
    config = outer.get("vision_config")
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise _bad(source, "vision_config", "must be an object", "fix vision_config")
    try:
        fields = _Vision.model_validate(config)
    except ValidationError as error:
        raise _refused(error, source, "vision_config.") from None
    for field, laid_out in _VISION_LAYOUT.items():
        if getattr(fields, field) != laid_out:
            raise _bad(
                source,
                f"vision_config.{field}",
                f"{describe(getattr(fields, field))} is not Kimi-K3's vision tower (k3layout "
                f"lays out {field}={laid_out!r})",
                f"plan a checkpoint whose vision tower has {field}={laid_out!r}",
            )
    return VisionTower(
        num_layers=fields.vt_num_hidden_layers,
        hidden_size=fields.vt_hidden_size,
        num_heads=fields.vt_num_attention_heads,
        intermediate_size=fields.vt_intermediate_size,
        qkv_hidden_size=fields.qkv_hidden_size,
        patch_size=fields.patch_size,
        pos_emb=(fields.init_pos_emb_height, fields.init_pos_emb_width, fields.init_pos_emb_time),
        merge_kernel=fields.merge_kernel_size,
        mm_hidden_size=fields.mm_hidden_size or fields.vt_hidden_size,
    )


_QUANT_HINT = (
    "plan a checkpoint quantized as fp8 (block-scaled), compressed-tensors int4 or mxfp4 "
    "(pack-quantized), mxfp4 or modelopt NVFP4, or without quantization_config"
)


def quantization_of(config: object, source: str) -> Quantization:
    """The :class:`Quantization` a ``quantization_config`` describes; one k3layout does not lay
    out is refused naming the field and what it takes (so that it is never planned as bf16)."""
    if not isinstance(config, Mapping):
        raise _bad(source, "quantization_config", "must be an object", _QUANT_HINT)
    method = config.get("quant_method")
    if method == "fp8":
        return _fp8(config, source)
    if method == "compressed-tensors":
        return _compressed(config, source)
    if method == "mxfp4":
        return Quantization(
            method="mxfp4",
            quant_method="mxfp4",
            group_size=32,
            ignore=_names(config, source, "modules_to_not_convert"),
        )
    if method == "modelopt":
        algo = config.get("quant_algo")
        if algo != "NVFP4":
            raise _bad(
                source,
                "quantization_config.quant_algo",
                f"{describe(algo)}: modelopt is laid out for NVFP4 only",
                _QUANT_HINT,
            )
        group = config.get("group_size", 16)
        return Quantization(
            method="nvfp4",
            quant_method="modelopt",
            group_size=_group(group, source),
            ignore=_names(config, source, "exclude_modules"),
        )
    raise _bad(
        source,
        "quantization_config.quant_method",
        f"{describe(method)} is not a quantization k3layout lays out (allowed: fp8, "
        "compressed-tensors, mxfp4, modelopt)",
        _QUANT_HINT,
    )


def _fp8(config: Mapping[str, object], source: str) -> Quantization:
    block = config.get("weight_block_size")
    if not (
        isinstance(block, list)
        and len(block) == 2
        and all(type(b) is int and 0 < b <= MAX_MODEL_DIM for b in block)
    ):
        raise _bad(
            source,
            "quantization_config.weight_block_size",
            f"{describe(block)}: k3layout lays out block-scaled fp8 only (two positive ints, "
            "such as [128, 128])",
            _QUANT_HINT,
        )
    ignore = _names(config, source, "ignored_layers") + _names(
        config, source, "modules_to_not_convert"
    )
    return Quantization(
        method="fp8_block", quant_method="fp8", weight_block=(block[0], block[1]), ignore=ignore
    )


def _compressed(config: Mapping[str, object], source: str) -> Quantization:
    groups = config.get("config_groups")
    if not isinstance(groups, Mapping) or len(groups) != 1:
        raise _bad(
            source,
            "quantization_config.config_groups",
            "k3layout lays out one config group (the weights of every targeted Linear)",
            _QUANT_HINT,
        )
    (group,) = groups.values()
    weights: Any = group.get("weights") if isinstance(group, Mapping) else None
    fmt = config.get("format")
    if not isinstance(weights, Mapping) or weights.get("num_bits") != 4:
        raise _bad(
            source,
            "quantization_config.config_groups.weights.num_bits",
            "k3layout lays out 4-bit compressed-tensors weights only",
            _QUANT_HINT,
        )
    kind = weights.get("type")
    size = _group(weights.get("group_size"), source)
    if fmt == "pack-quantized" and kind == "int" and weights.get("strategy") == "group":
        method = "int4_w4a16"
    elif fmt == "mxfp4-pack-quantized" and kind == "float" and size == 32:
        method = "mxfp4"
    else:
        raise _bad(
            source,
            "quantization_config.format",
            f"{describe(fmt)} with {describe(kind)} weights: k3layout lays out pack-quantized "
            "int4 in groups and mxfp4-pack-quantized",
            _QUANT_HINT,
        )
    if weights.get("actorder") not in (None, False):
        raise _bad(
            source,
            "quantization_config.config_groups.weights.actorder",
            f"{describe(weights.get('actorder'))}: act-order int4 is not laid out",
            _QUANT_HINT,
        )
    return Quantization(
        method=method,
        quant_method="compressed-tensors",
        group_size=size,
        ignore=_names(config, source, "ignore"),
    )


def _group(value: object, source: str) -> int:
    if type(value) is not int or not 0 < value <= MAX_MODEL_DIM:
        raise _bad(
            source,
            "quantization_config.group_size",
            f"{describe(value)} is not a positive group size",
            _QUANT_HINT,
        )
    return value


def _names(config: Mapping[str, object], source: str, key: str) -> tuple[str, ...]:
    value = config.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(
            source, f"quantization_config.{key}", "must be a list of module names", _QUANT_HINT
        )
    return tuple(value)


def dspark_draft_of(config: Mapping[str, object], source: str) -> DSparkDraft | None:
    """A DSpark draft's dimensions from its ``config.json``; ``None`` where it does not give
    them all (its cache is planned regardless; its weights are then refused by name)."""
    needed = ("markov_rank", "target_layer_ids", "intermediate_size")
    if any(config.get(key) is None for key in needed):
        return None
    try:
        fields = _Draft.model_validate(config)
    except ValidationError as error:
        raise _refused(error, source, "") from None
    return DSparkDraft(
        hidden_size=fields.hidden_size,
        intermediate_size=fields.intermediate_size,
        vocab_size=fields.draft_vocab_size or fields.vocab_size,
        target_hidden_size=fields.target_hidden_size,
        num_target_layers=len(fields.target_layer_ids),
        markov_rank=fields.markov_rank,
        max_position_embeddings=fields.max_position_embeddings,
    )
