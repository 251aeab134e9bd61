"""Load a hybrid that declares its layers one by one in ``layer_types``: GLM-5.3-Flash
(``model_type: glm5_next``, the backbone nested under ``text_config`` as ``glm5_next_text``, or
flat, as transformers' ``Glm5NextConfig`` also accepts it).

Each layer is ``linear_attention`` (KDA: ``linear_num_heads`` x ``linear_head_dim``,
``linear_conv_kernel_dim``, the bounded gate ``linear_lower_bound``) or ``indexed_attention``
(NoPE MLA, ``kv_lora_rank`` and ``qk_rope_head_dim`` 0, with a DSA indexer pooling its keys over
``index_kpool`` tokens; ``full_attention`` is read as ``indexed_attention``, as transformers
reads it). ``num_nextn_predict_layers`` MTP layers, when the config declares them, are indexed
MLA layers after the target's. Without ``layer_types`` the layers follow transformers' default
(KDA unless ``i % 4 == 3``); without ``indexer_types`` every indexer is ``full``.

Refused (``invalid_config``, naming the field), as transformers' ``validate_architecture`` and
vLLM refuse them or because the plan would be silently wrong: a RoPE dimension (the indexed
layers are NoPE), query heads other than the KV heads, no ``q_lora_rank``, ``index_topk`` not a
multiple of ``index_kpool``, ``layer_types`` or ``indexer_types`` whose length is not
``num_hidden_layers`` or that hold another value, a ``shared`` indexer with no full one before
it, and no indexed layer at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Final, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictStr,
    ValidationError,
)

from .._validation import describe, refusal_from_validation
from ..cache import DSAIndexer, KDALayer, MLALayer
from ..constants import MAX_CONV_KERNEL, MAX_MODEL_DIM, MAX_MODULE_LAYERS, MAX_PROMPT_TOKENS
from ..errors import Refusal
from ..limits import check_bound
from .architecture import Architecture, MergerVisionTower
from .layers import Layer
from .spec import HybridModel

LAYER_TYPES_FAMILIES: Final = frozenset({"glm5_next", "glm5_next_text"})
"""Model types read by this loader (their layers are declared in ``layer_types``)."""

KDA_LAYER: Final = "linear_attention"
INDEXED_LAYERS: Final = frozenset({"indexed_attention", "full_attention"})
"""``layer_types`` values of an indexed MLA layer (``full_attention`` is read as one)."""

_Dim = Annotated[int, Strict(), Field(gt=0, le=MAX_MODEL_DIM)]


class _LayerTypesText(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    model_type: StrictStr | None = None
    num_hidden_layers: Annotated[int, Strict(), Field(gt=0, le=MAX_MODULE_LAYERS)]
    num_attention_heads: _Dim
    num_key_value_heads: _Dim | None = None
    kv_lora_rank: _Dim
    qk_rope_head_dim: Annotated[int, Strict(), Field(ge=0, le=MAX_MODEL_DIM)]
    qk_nope_head_dim: _Dim
    v_head_dim: _Dim
    q_lora_rank: _Dim
    layer_types: tuple[StrictStr, ...] | None = Field(None, max_length=MAX_MODULE_LAYERS)
    indexer_types: tuple[Literal["full", "shared"], ...] | None = Field(
        None, max_length=MAX_MODULE_LAYERS
    )
    linear_num_heads: _Dim
    linear_head_dim: _Dim
    linear_conv_kernel_dim: Annotated[int, Strict(), Field(ge=2, le=MAX_CONV_KERNEL)]
    linear_lower_bound: Annotated[float, Strict(), Field(lt=0.0, allow_inf_nan=False)] | None = None
    index_head_dim: _Dim
    index_n_heads: _Dim
    index_topk: _Dim
    index_kpool: _Dim
    index_kpool_always_select_tail: StrictBool = True
    num_nextn_predict_layers: Annotated[int, Strict(), Field(ge=0, le=MAX_MODULE_LAYERS)] | None = (
        None
    )
    max_position_embeddings: Annotated[int, Strict(), Field(gt=0, le=MAX_PROMPT_TOKENS)] | None = (
        None
    )
    hidden_size: _Dim
    vocab_size: _Dim
    intermediate_size: _Dim
    n_routed_experts: _Dim | None = None
    num_experts_per_tok: _Dim | None = None
    n_shared_experts: Annotated[int, Strict(), Field(ge=0, le=MAX_MODEL_DIM)] = 0
    moe_intermediate_size: _Dim | None = None
    mlp_layer_types: tuple[Literal["dense", "sparse"], ...] | None = Field(
        None, max_length=MAX_MODULE_LAYERS
    )
    tie_word_embeddings: StrictBool = False
    hc_mult: Annotated[int, Strict(), Field(ge=1, le=MAX_MODEL_DIM)] = 4
    # SGLang decides its MoE layers by these, not by mlp_layer_types (its config's defaults)
    first_k_dense_replace: Annotated[int, Strict(), Field(ge=0, le=MAX_MODULE_LAYERS)] = 3
    moe_layer_freq: Annotated[int, Strict(), Field(gt=0, le=MAX_MODULE_LAYERS)] = 1
    index_kpool_compress: StrictBool | None = None
    # Read by vLLM's model constructor, not by transformers' config class (absent there).
    mhc: StrictBool | None = None
    mla_use_nope: StrictBool | None = None
    topk_method: StrictStr | None = None
    scoring_func: StrictStr | None = None
    indexer_rope_interleave: StrictBool | None = None


class _NestedText(BaseModel):
    """The backbone under ``text_config`` (so that a refusal names ``text_config.<field>``)."""

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    text_config: _LayerTypesText


def declares_layer_types(outer: Mapping[str, object], text: Mapping[str, object]) -> bool:
    """Whether a config is this loader's: a ``glm5_next`` model type, or ``layer_types``
    naming KDA or indexed layers."""
    types = (outer.get("model_type"), text.get("model_type"))
    if any(isinstance(kind, str) and kind in LAYER_TYPES_FAMILIES for kind in types):
        return True
    kinds = text.get("layer_types")
    return isinstance(kinds, list) and any(
        kind in (KDA_LAYER, "indexed_attention") for kind in kinds
    )


def _bad(source: str, field: str, message: str, hint: str) -> Refusal:
    return Refusal(
        "invalid_config",
        f"config {source}: {field}: {message}",
        facts={"source": source, "field": field},
        hint=hint,
    )


def _layer_kinds(text: _LayerTypesText, source: str, prefix: str) -> tuple[bool, ...]:
    """For every target layer, whether it is KDA (else indexed MLA)."""
    count = text.num_hidden_layers
    if text.layer_types is None:  # transformers' default: every 4th layer (3, 7, ..) indexed
        return tuple(i % 4 != 3 for i in range(count))
    field = f"{prefix}layer_types"
    if len(text.layer_types) != count:
        raise _bad(
            source,
            field,
            f"{len(text.layer_types)} entries for num_hidden_layers={count}",
            f"give one layer type per layer ({count})",
        )
    allowed = (KDA_LAYER, *sorted(INDEXED_LAYERS))
    for index, kind in enumerate(text.layer_types):
        if kind not in allowed:
            raise _bad(
                source,
                f"{field}.{index}",
                f"{describe(kind)} is not a layer type of this family",
                f"use one of {', '.join(allowed)}",
            )
    return tuple(kind == KDA_LAYER for kind in text.layer_types)


def _indexer_kinds(
    text: _LayerTypesText, kda: tuple[bool, ...], source: str, prefix: str
) -> tuple[Literal["full", "shared"], ...]:
    """Every layer's ``indexer_types`` entry (all ``full`` where the config has none)."""
    count = text.num_hidden_layers
    full: tuple[Literal["full", "shared"], ...] = ("full",)
    kinds = text.indexer_types or full * count
    field = f"{prefix}indexer_types"
    if len(kinds) != count:
        raise _bad(
            source,
            field,
            f"{len(kinds)} entries for num_hidden_layers={count}",
            f"give one indexer type per layer ({count})",
        )
    indexed = [i for i, is_kda in enumerate(kda) if not is_kda]
    if indexed and kinds[indexed[0]] == "shared":
        raise _bad(
            source,
            f"{field}.{indexed[0]}",
            f"the first indexed layer ({indexed[0]}) is shared, but no full indexer precedes it",
            "make the first indexed layer's indexer full",
        )
    return kinds


def _check_fields(text: _LayerTypesText, source: str, prefix: str) -> None:
    """transformers' ``validate_architecture`` for this family, naming the field."""
    if text.qk_rope_head_dim:
        raise _bad(
            source,
            f"{prefix}qk_rope_head_dim",
            f"{text.qk_rope_head_dim}: the indexed attention layers are NoPE (transformers "
            "refuses a RoPE dimension)",
            "set qk_rope_head_dim to 0",
        )
    heads = text.num_key_value_heads
    if heads is not None and heads != text.num_attention_heads:
        raise _bad(
            source,
            f"{prefix}num_key_value_heads",
            f"{heads} differs from num_attention_heads={text.num_attention_heads}",
            "give as many key-value heads as query heads",
        )
    kinds = text.mlp_layer_types
    if kinds is not None and len(kinds) != text.num_hidden_layers:
        raise _bad(
            source,
            f"{prefix}mlp_layer_types",
            f"{len(kinds)} entries for num_hidden_layers={text.num_hidden_layers}",
            "give one dense or sparse per layer",
        )
    if text.index_topk % text.index_kpool:
        raise _bad(
            source,
            f"{prefix}index_topk",
            f"{text.index_topk} must be a multiple of index_kpool={text.index_kpool}",
            f"use an index_topk divisible by {text.index_kpool}",
        )


def model_from_layer_types(
    config: Mapping[str, object],
    text_config: Mapping[str, object],
    *,
    name: str | None,
    model_type: str | None,
    source: str,
    prefix: str,
    num_draft_layers: int | None = None,
) -> HybridModel:
    """The :class:`HybridModel` of a config declaring its layers in ``layer_types``;
    ``text_config`` is the backbone (``config`` itself when flat, ``prefix`` then ``""``).
    ``num_draft_layers`` overrides ``num_nextn_predict_layers`` (the MTP layers)."""
    text = (
        _validated(_NestedText, {"text_config": text_config}, source).text_config
        if prefix
        else _validated(_LayerTypesText, text_config, source)
    )
    _check_fields(text, source, prefix)
    kda_flags = _layer_kinds(text, source, prefix)
    if all(kda_flags):
        raise _bad(
            source,
            f"{prefix}layer_types",
            "every layer is linear_attention; a hybrid needs at least one indexed layer",
            "declare the attention layers as indexed_attention",
        )
    indexers = _indexer_kinds(text, kda_flags, source, prefix)
    declared = text.num_nextn_predict_layers or 0
    drafts = declared if num_draft_layers is None else num_draft_layers
    check_bound(
        "num_draft_layers" if num_draft_layers is not None else "num_nextn_predict_layers",
        drafts,
        MAX_MODULE_LAYERS - text.num_hidden_layers,
        why=f"{text.num_hidden_layers} target + MTP layers <= {MAX_MODULE_LAYERS:,}",
    )
    kda = KDALayer(
        num_heads=text.linear_num_heads,
        head_dim=text.linear_head_dim,
        conv_kernel=text.linear_conv_kernel_dim,
        gate_lower_bound=text.linear_lower_bound,
        safe_gate=text.linear_lower_bound is not None,
    )

    def mla(kind: Literal["full", "shared"]) -> MLALayer:
        return MLALayer(
            num_heads=text.num_attention_heads,
            kv_lora_rank=text.kv_lora_rank,
            qk_rope_head_dim=0,
            qk_nope_head_dim=text.qk_nope_head_dim,
            v_head_dim=text.v_head_dim,
            q_lora_rank=text.q_lora_rank,
            indexer=DSAIndexer(
                head_dim=text.index_head_dim,
                num_heads=text.index_n_heads,
                topk=text.index_topk,
                kpool=text.index_kpool,
                always_select_tail=text.index_kpool_always_select_tail,
                kind=kind,
            ),
        )

    layers: tuple[Layer, ...] = tuple(
        kda if is_kda else mla(indexers[i]) for i, is_kda in enumerate(kda_flags)
    )
    family = model_type or text.model_type or "unknown"
    return HybridModel(
        name=name or family,
        model_type=family,
        layers=layers,
        draft_layers=(mla("full"),) * drafts,
        drafter="mtp" if drafts else None,
        context_tokens=text.max_position_embeddings,
        architecture=_architecture(config, text, source),
    )


QUANTIZED_WEIGHTS: Final = (
    "k3layout lays out this family's bf16 weights; a quantized checkpoint's are not laid out"
)

TEXT_MAX_POSITIONS: Final = 1_048_576
"""transformers' ``Glm5NextTextConfig.max_position_embeddings`` default."""

ENGINE_FIELDS: Final = (
    "mhc",
    "mla_use_nope",
    "topk_method",
    "scoring_func",
    "index_kpool_compress",
)
"""Fields the engines' GLM-5.3-Flash model constructors read that transformers' config class
does not define: vLLM's (the first four; ``indexer_rope_interleave`` too, read only for a RoPE
indexer, which this family does not have) and SGLang's (``index_kpool_compress``; its own
config class defaults the others). Each engine refuses the weights without the ones it reads."""


def _architecture(config: Mapping[str, object], text: _LayerTypesText, source: str) -> Architecture:
    """What the weights are, as far as the config says (a quantized checkpoint's are said
    :data:`QUANTIZED_WEIGHTS` and refused; the cache is planned)."""
    names = config.get("architectures")
    architecture = (
        names[0]
        if isinstance(names, list) and names and isinstance(names[0], str)
        else "Glm5NextForConditionalGeneration"
    )
    # transformers' default: three dense layers, the rest sparse
    dense = min(3, text.num_hidden_layers)
    kinds = text.mlp_layer_types or ("dense",) * dense + ("sparse",) * (
        text.num_hidden_layers - dense
    )
    undeclared = tuple(name for name in ENGINE_FIELDS if getattr(text, name) is None)
    if text.mla_use_nope is False:  # vLLM then asserts on the RoPE parameters it lacks
        undeclared += ("mla_use_nope",)
    inner = config.get("text_config")
    quantized = "quantization_config" in config or (
        isinstance(inner, Mapping) and "quantization_config" in inner
    )
    return Architecture(
        architecture=architecture,
        hidden_size=text.hidden_size,
        vocab_size=text.vocab_size,
        intermediate_size=text.intermediate_size,
        num_experts=text.n_routed_experts,
        num_experts_per_token=text.num_experts_per_tok,
        num_shared_experts=text.n_shared_experts,
        moe_intermediate_size=text.moe_intermediate_size,
        mlp_layer_types=kinds,
        first_k_dense_replace=text.first_k_dense_replace,
        moe_layer_freq=text.moe_layer_freq,
        num_nextn_predict_layers=text.num_nextn_predict_layers or 0,
        # Absent, the engines read it apart: vLLM's MTP fails on it, SGLang's config class
        # takes 1 (its NEXTN draft then prices one layer).
        defaulted=("num_nextn_predict_layers",) if text.num_nextn_predict_layers is None else (),
        tie_word_embeddings=text.tie_word_embeddings,
        hyper_connections=text.hc_mult if text.mhc is not False else 0,
        router_bias=text.topk_method == "noaux_tc",
        undeclared=undeclared,
        merger_vision=_merger_vision(config, text, source),
        unsupported=(("quantization_config", QUANTIZED_WEIGHTS),) if quantized else (),
    )


class _MergerVision(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    depth: _Dim = 24
    hidden_size: _Dim = 1024
    num_heads: _Dim = 16
    intermediate_size: _Dim = 4096
    patch_size: _Dim = 14
    temporal_patch_size: _Dim = 2
    in_channels: _Dim = 3
    out_hidden_size: _Dim = 1536
    spatial_merge_size: _Dim = 2
    projection_intermediate_size: _Dim = 10240


class _NestedVision(BaseModel):
    """The tower under ``vision_config`` (so that a refusal names ``vision_config.<field>``)."""

    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)

    vision_config: _MergerVision


_Read = TypeVar("_Read", bound=BaseModel)


def _validated(kind: type[_Read], data: Mapping[str, object], source: str) -> _Read:
    """``data`` read as ``kind``; a bad field is refused (``invalid_config``) by its name."""
    try:
        return kind.model_validate(data)
    except ValidationError as error:
        raise refusal_from_validation(
            error,
            f"config {source}",
            code="invalid_config",
            facts={"source": source},
            hint="fix the named field of the config.json",
        ) from None


def _merger_vision(
    config: Mapping[str, object], text: _LayerTypesText, source: str
) -> MergerVisionTower | None:
    """The vision tower of a multimodal checkpoint (one with ``vision_config``), with the
    defaults of transformers' ``Glm5NextVisionConfig`` for what it leaves out."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return None
    fields = _validated(_NestedVision, {"vision_config": vision}, source).vision_config
    return MergerVisionTower(
        **fields.model_dump(),
        rotary_positions=text.max_position_embeddings or TEXT_MAX_POSITIONS,
    )
