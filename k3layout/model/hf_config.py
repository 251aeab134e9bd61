"""Load a hybrid model from a Hugging Face ``config.json``.

The backbone may sit at the top level (Kimi-Linear, ``model_type: kimi_linear``) or under
``text_config`` (Kimi-K3's multimodal checkpoint). ``linear_attn_config`` lists KDA and MLA
layers **1-based**; a config without it is a pure MLA model (DeepSeek-V3.2, GLM-5.x), whose
``index_head_dim`` adds a DSA index row per attention layer and whose MTP layers
(``num_nextn_predict_layers``) join as draft layers. Fields that do not shape the cache are
ignored; inconsistent ones are refused with ``code="invalid_config"`` naming the field
(``size_limit`` for a size above the bounds of :mod:`k3layout.constants`).

The loader never guesses. It refuses:

- a value of the wrong JSON type: integers are strict, so ``true``, ``128.0`` or ``NaN`` where
  an integer belongs is refused, a float (``gate_lower_bound``) takes a finite JSON number only,
  and a non-string ``model_type`` is refused;
- a top-level ``model_type`` that is ``null``, or absent above a ``text_config``: the top-level
  type names the checkpoint (``kimi_k3`` selects the engines' multimodal rules), the nested one
  only its backbone (``kimi_linear``), so neither may stand in for it. vLLM 0.33 refuses such a
  checkpoint too (``get_config`` finds no model type to build);
- a Kimi config (``model_type`` ``kimi_k3`` or ``kimi_linear``, at the top level or under
  ``text_config``) without ``linear_attn_config``: it would plan as a pure MLA model;
- a field given both at the top level and under ``text_config`` with different values;
- layer lists that do not tile ``1..num_hidden_layers``. With ``full_attn_layers`` given, the
  two lists must be disjoint and cover every layer. Without it, the MLA layers would be
  whatever ``kda_layers`` leaves out, so a shifted or emptied list, or a ``num_hidden_layers``
  changed beside an unchanged list, would silently add or move MLA layers: the loader then
  takes the complement only when ``kda_layers`` is exactly Kimi's published 3:1 pattern for
  ``num_hidden_layers`` (MLA at every 4th layer and the last) and otherwise asks for
  ``full_attn_layers``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Annotated, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from .._args import expect_args
from .._validation import describe, refusal_from_validation
from ..constants import (
    DSA_INDEX_BYTES_PER_TOKEN,
    MAX_CONV_KERNEL,
    MAX_MODEL_DIM,
    MAX_MODULE_LAYERS,
    MAX_PROMPT_TOKENS,
)
from ..dtypes import HF_TORCH_DTYPES
from ..errors import Refusal
from ..limits import check_bound
from .architecture import Architecture
from .hf_layer_types import declares_layer_types, model_from_layer_types
from .hf_weights import architecture_of, dspark_draft_of
from .layers import KDALayer, Layer, MLALayer
from .presets import is_kimi_mla_layer
from .spec import HybridModel

KIMI_MODEL_TYPES: Final = frozenset({"kimi_k3", "kimi_linear"})
"""Model types whose checkpoints are hybrid: a config of theirs must carry linear attention."""

_Dim = Annotated[int, Strict(), Field(gt=0, le=MAX_MODEL_DIM)]
_Layers = Annotated[int, Strict(), Field(gt=0, le=MAX_MODULE_LAYERS)]
_LayerIds = Annotated[tuple[Annotated[int, Strict()], ...], Field(max_length=MAX_MODULE_LAYERS)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


class _LinearAttnConfig(_Lenient):
    num_heads: _Dim
    head_dim: _Dim
    short_conv_kernel_size: Annotated[int, Strict(), Field(ge=2, le=MAX_CONV_KERNEL)]
    use_full_rank_gate: StrictBool = False
    gate_lower_bound: Annotated[float, Strict(), Field(lt=0.0, allow_inf_nan=False)] | None = None
    kda_layers: _LayerIds
    full_attn_layers: _LayerIds | None = None


class _TextConfig(_Lenient):
    model_type: StrictStr | None = None
    num_hidden_layers: _Layers
    num_attention_heads: _Dim
    num_key_value_heads: _Dim | None = None
    kv_lora_rank: _Dim
    qk_rope_head_dim: _Dim
    qk_nope_head_dim: _Dim
    v_head_dim: _Dim
    q_lora_rank: _Dim | None = None
    index_head_dim: _Dim | None = None
    num_nextn_predict_layers: Annotated[int, Strict(), Field(ge=0, le=MAX_MODULE_LAYERS)] = 0
    torch_dtype: StrictStr | None = None
    max_position_embeddings: Annotated[int, Strict(), Field(gt=0, le=MAX_PROMPT_TOKENS)] | None = (
        None
    )
    linear_attn_config: _LinearAttnConfig | None = None

    @field_validator("torch_dtype")
    @classmethod
    def _known_dtype(cls, value: str | None) -> str | None:
        if value is not None and value not in HF_TORCH_DTYPES:
            raise ValueError(
                f"{value!r} is not a known dtype (allowed: {', '.join(sorted(HF_TORCH_DTYPES))})"
            )
        return value

    @field_validator("num_key_value_heads")
    @classmethod
    def _heads_divide(cls, value: int | None, info: ValidationInfo) -> int | None:
        heads = info.data.get("num_attention_heads")
        if value is not None and isinstance(heads, int) and heads % value:
            raise ValueError(
                f"num_attention_heads={heads} must be divisible by num_key_value_heads={value}"
            )
        return value

    @field_validator("linear_attn_config")
    @classmethod
    def _layer_lists(
        cls, value: _LinearAttnConfig | None, info: ValidationInfo
    ) -> _LinearAttnConfig | None:
        num_layers = info.data.get("num_hidden_layers")
        if value is not None and isinstance(num_layers, int):
            _check_layer_lists(value, num_layers)
        return value


class _Nested(_Lenient):
    model_type: StrictStr | None = None
    text_config: _TextConfig


def _mla_of(text: _TextConfig, index_bytes: int = 0) -> MLALayer:
    """The MLA layer a text config describes."""
    return MLALayer(
        num_heads=text.num_attention_heads,
        kv_lora_rank=text.kv_lora_rank,
        qk_rope_head_dim=text.qk_rope_head_dim,
        qk_nope_head_dim=text.qk_nope_head_dim,
        v_head_dim=text.v_head_dim,
        q_lora_rank=text.q_lora_rank,
        index_bytes_per_token=index_bytes,
    )


def _invalid(error: ValidationError, source: str, hint: str) -> Refusal:
    """A config's validation error as the refusal naming its field."""
    return refusal_from_validation(
        error, f"config {source}", code="invalid_config", facts={"source": source}, hint=hint
    )


def _check_family(outer: Mapping[str, object], text: object, source: str) -> None:
    """Refuse (``invalid_config``) by name a model that is neither MLA nor hybrid MLA + KDA
    (a Llama: no ``kv_lora_rank``, no ``linear_attn_config``), rather than listing the MLA
    fields it lacks."""
    if not isinstance(text, Mapping) or "linear_attn_config" in text:
        return
    if "kv_lora_rank" in text:
        return
    model_type = text.get("model_type") or outer.get("model_type")
    if not isinstance(model_type, str):
        return  # no family named: the fields it lacks are the message
    raise Refusal(
        "invalid_config",
        f"config {source}: model_type {model_type} is not a hybrid MLA + KDA model (it has no "
        "kv_lora_rank and no linear_attn_config)",
        facts={"source": source, "field": "model_type", "model_type": model_type},
        hint="plan a Kimi-K3 / Kimi-Linear config (or an MLA model such as DeepSeek-V3.2)",
    )


def _config_error(field: str, message: str, hint: str | None = None) -> Refusal:
    return Refusal("invalid_config", message, facts={"field": field}, hint=hint)


def _check_layer_lists(linear: _LinearAttnConfig, num_layers: int) -> None:
    lists = {"kda_layers": linear.kda_layers}
    if linear.full_attn_layers is not None:
        lists["full_attn_layers"] = linear.full_attn_layers
    for field, layers in lists.items():
        outside = sorted({n for n in layers if not 1 <= n <= num_layers})
        if outside:
            raise _config_error(
                field,
                f"{field}: layers {_few(outside)} are outside 1..num_hidden_layers={num_layers} "
                "(the lists are 1-based)",
            )
        repeated = sorted(n for n, count in Counter(layers).items() if count > 1)
        if repeated:
            raise _config_error(
                field, f"{field}: layers {_few(repeated)} are listed more than once"
            )
    if linear.full_attn_layers is None:
        _check_kimi_pattern(linear.kda_layers, num_layers)
        return
    overlap = sorted(set(linear.kda_layers) & set(linear.full_attn_layers))
    if overlap:
        raise _config_error(
            "kda_layers", f"kda_layers and full_attn_layers overlap at layers {_few(overlap)}"
        )
    missing = sorted(
        set(range(1, num_layers + 1)) - set(linear.kda_layers) - set(linear.full_attn_layers)
    )
    if missing:
        raise _config_error(
            "full_attn_layers",
            f"layers {_few(missing)} are in neither kda_layers nor full_attn_layers "
            f"(together they must cover 1..{num_layers})",
        )


def _check_kimi_pattern(kda_layers: tuple[int, ...], num_layers: int) -> None:
    """Without ``full_attn_layers`` the MLA layers are the complement of ``kda_layers``: take
    it only when ``kda_layers`` is Kimi's 3:1 pattern for ``num_layers``."""
    kimi = {i + 1 for i in range(num_layers) if not is_kimi_mla_layer(i, num_layers)}
    if set(kda_layers) == kimi:
        return
    mla = sorted(set(range(1, num_layers + 1)) - set(kda_layers))
    raise _config_error(
        "full_attn_layers",
        "full_attn_layers is absent and kda_layers is not Kimi's 3:1 pattern for "
        f"num_hidden_layers={num_layers} (it would make layers {_few(mla)} the "
        f"{len(mla)} MLA layers)",
        hint="list the MLA layers in linear_attn_config.full_attn_layers (1-based), so that "
        "the two lists are checked to cover every layer",
    )


def _few(values: list[int], most: int = 12) -> str:
    shown = ", ".join(str(v) if abs(v) < 10**30 else describe(v) for v in values[:most])
    more = f", ... ({len(values)} in all)" if len(values) > most else ""
    return f"[{shown}{more}]"


def _check_flat_against_nested(config: Mapping[str, object], source: str) -> None:
    """A field at the top level and under ``text_config`` must agree (``model_type`` names the
    checkpoint at the top and the backbone beneath, so it may differ)."""
    text = config["text_config"]
    if not isinstance(text, Mapping):  # refused by the caller before
        return
    for field in _TextConfig.model_fields:
        if field == "model_type" or field not in config or field not in text:
            continue
        if config[field] != text[field]:
            raise Refusal(
                "invalid_config",
                f"config {source}: {field}={describe(config[field])} at the top level "
                f"conflicts with text_config.{field}={describe(text[field])}",
                facts={"source": source, "field": field, "nested_field": f"text_config.{field}"},
                hint=f"keep one {field}, under text_config",
            )


def model_from_config(
    config: Mapping[str, object],
    *,
    name: str | None = None,
    num_draft_layers: int | None = None,
    draft: Mapping[str, object] | None = None,
    source: str = "<mapping>",
) -> HybridModel:
    """Build a :class:`HybridModel` from a parsed Hugging Face config.

    ``num_draft_layers`` overrides the config's ``num_nextn_predict_layers`` (K3's DSpark draft
    is not in its config: pass 5, and its layers copy the target's MLA layer). ``draft`` is a
    draft model's own parsed ``config.json`` (K3's DSpark: 5 MLA layers of 64 query heads):
    its layers, heads and latent come from it. Refuses with ``code="invalid_config"`` naming
    the field.
    """
    expect_args(
        ("config", config, Mapping),
        ("name", name, (str, type(None))),
        ("num_draft_layers", num_draft_layers, (int, type(None))),
        ("draft", draft, (Mapping, type(None))),
        ("source", source, str),
    )
    try:
        model = _model_from_config(config, name, num_draft_layers, source)
        if draft is None:
            return model
        layers = draft_layers(draft, f"{source} draft")
        if num_draft_layers is not None and num_draft_layers != len(layers):
            raise Refusal(
                "invalid_argument",
                f"num_draft_layers={num_draft_layers}, but the draft config has "
                f"{len(layers)} layers",
                facts={"field": "num_draft_layers", "draft_layers": len(layers)},
                hint="leave num_draft_layers unset when a draft config is given",
            )
        fields = {field: getattr(model, field) for field in HybridModel.model_fields}
        architecture = model.architecture
        if architecture is not None:
            dspark = dspark_draft_of(draft, f"{source} draft")
            architecture = Architecture.model_validate({**dict(architecture), "draft": dspark})
        return HybridModel(
            **{
                **fields,
                "draft_layers": layers,
                "drafter": "dspark",
                "architecture": architecture,
            }
        )
    except RecursionError:
        raise Refusal(
            "invalid_config",
            f"config {source}: nested too deeply (or refers to itself)",
            facts={"source": source, "field": "<root>"},
            hint="pass the parsed config.json of a Hugging Face checkpoint",
        ) from None


def _check_top_model_type(config: Mapping[str, object], nested: bool, source: str) -> None:
    """Refuse (``invalid_config``, field ``model_type``) a top-level ``model_type`` that is
    ``null``, or absent above a ``text_config``: the loader would otherwise plan the checkpoint
    as its backbone's type (a Kimi-K3 as ``kimi_linear``), under other engine rules."""
    given = "model_type" in config
    if config.get("model_type") is not None or (not given and not nested):
        return
    text = config["text_config"] if nested else None
    beneath = (
        f" (text_config.model_type={describe(text.get('model_type'))} names only the backbone)"
        if isinstance(text, Mapping)
        else ""
    )
    raise Refusal(
        "invalid_config",
        f"config {source}: the top-level model_type is {'null' if given else 'missing'}"
        f"{beneath}; it names the checkpoint, and the engines' rules follow it",
        facts={"source": source, "field": "model_type"},
        hint="restore the top-level model_type of the checkpoint's config.json (kimi_k3 for "
        "Kimi-K3)",
    )


def _model_from_config(
    config: Mapping[str, object], name: str | None, num_draft_layers: int | None, source: str
) -> HybridModel:
    nested = "text_config" in config and config["text_config"] is not None
    _check_top_model_type(config, nested, source)
    if num_draft_layers is not None and num_draft_layers < 0:
        raise Refusal(
            "invalid_argument",
            f"num_draft_layers={num_draft_layers} must be >= 0",
            facts={"num_draft_layers": num_draft_layers, "field": "num_draft_layers"},
        )
    backbone = config["text_config"] if nested else config
    if isinstance(backbone, Mapping) and declares_layer_types(config, backbone):
        if nested:
            _check_flat_against_nested(config, source)
        top = config.get("model_type")
        model = model_from_layer_types(
            config,
            backbone,
            name=name,
            model_type=top if isinstance(top, str) else None,
            source=source,
            prefix="text_config." if nested else "",
            num_draft_layers=num_draft_layers,
        )
        return model
    _check_family(config, backbone, source)
    try:
        if nested:
            if not isinstance(config["text_config"], Mapping):
                raise Refusal(
                    "invalid_config",
                    f"config {source}: text_config must be an object, got "
                    f"{describe(config['text_config'])}",
                    facts={"source": source, "field": "text_config"},
                )
            outer = _Nested.model_validate(config)
            _check_flat_against_nested(config, source)
            text, top_type = outer.text_config, outer.model_type
        else:
            text = _TextConfig.model_validate(config)
            top_type = text.model_type
    except ValidationError as error:
        raise _invalid(error, source, "fix the named field of the config.json") from None
    drafts = text.num_nextn_predict_layers if num_draft_layers is None else num_draft_layers
    check_bound(
        "num_draft_layers" if num_draft_layers is not None else "num_nextn_predict_layers",
        drafts,
        MAX_MODULE_LAYERS - text.num_hidden_layers,
        why=f"{text.num_hidden_layers} target + draft layers <= {MAX_MODULE_LAYERS:,}",
    )
    model_type = top_type or text.model_type
    prefix = "text_config." if nested else ""
    linear = text.linear_attn_config
    if linear is None and {top_type, text.model_type} & KIMI_MODEL_TYPES:
        raise Refusal(
            "invalid_config",
            f"config {source}: model_type={model_type} is a hybrid Kimi model but "
            f"{prefix}linear_attn_config is missing (it would plan as "
            f"{text.num_hidden_layers} MLA layers)",
            facts={"source": source, "field": f"{prefix}linear_attn_config"},
            hint="restore linear_attn_config from the checkpoint's config.json",
        )
    index_bytes = 0
    if text.index_head_dim is not None:
        # fp8 key row + one fp32 scale: 128 + 4 = DSA_INDEX_BYTES_PER_TOKEN for V3.2 / GLM-5.
        index_bytes = text.index_head_dim + (DSA_INDEX_BYTES_PER_TOKEN - 128)
    mla = _mla_of(text, index_bytes)
    layers: tuple[Layer, ...]
    if linear is None:
        layers = (mla,) * text.num_hidden_layers
    else:
        kda = KDALayer(
            num_heads=linear.num_heads,
            head_dim=linear.head_dim,
            conv_kernel=linear.short_conv_kernel_size,
            full_rank_gate=linear.use_full_rank_gate,
            gate_lower_bound=linear.gate_lower_bound,
        )
        kda_ids = {n - 1 for n in linear.kda_layers}
        layers = tuple(kda if i in kda_ids else mla for i in range(text.num_hidden_layers))
        if not any(i not in kda_ids for i in range(text.num_hidden_layers)):
            raise Refusal(
                "invalid_config",
                f"config {source}: linear_attn_config.kda_layers covers every layer; "
                "a hybrid model needs at least one MLA layer",
                facts={"source": source, "field": f"{prefix}linear_attn_config.kda_layers"},
            )
    assert isinstance(backbone, Mapping)  # validated above
    return HybridModel(
        name=name or model_type or "model",
        model_type=model_type or "unknown",
        layers=layers,
        draft_layers=(mla,) * drafts,
        drafter=None if not drafts else "dspark" if num_draft_layers is not None else "mtp",
        context_tokens=text.max_position_embeddings,
        architecture=architecture_of(config, backbone, model_type or "unknown", source, prefix),
    )


DSPARK_DRAFT_DEFAULTS: Final[Mapping[str, int]] = {
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
}
"""What a DSpark draft's MLA dimensions are when its ``config.json`` leaves them out, as vLLM
0.33 reads them: its draft config class (``K3DSparkConfig``,
``vllm/transformers_utils/configs/k3_dspark.py``) is transformers' ``DeepseekV3Config``, whose
class defaults (transformers 5.x, ``configuration_deepseek_v3.py``) fill a missing field with
these, DeepSeek-V3's MLA, which is also K3's. ``tests/conformance/test_conformance_draft.py``
runs vLLM's own loader on drafts with each field removed. The layer count and the query heads
are not taken from it (its defaults, DeepSeek-V3's 61 layers of 128 heads, are not a DSpark
draft's): a draft without them is refused."""


def draft_layers(config: Mapping[str, object], source: str = "<draft>") -> tuple[MLALayer, ...]:
    """A draft model's layers from its own parsed ``config.json``: ``num_hidden_layers`` dense
    MLA layers with its query heads, latent and q LoRA rank (K3's DSpark: 5 x 64 heads). A
    missing MLA dimension is read as vLLM reads it (:data:`DSPARK_DRAFT_DEFAULTS`); a ``null``
    ``q_lora_rank`` is refused, as vLLM's DSpark refuses it."""
    expect_args(("config", config, Mapping), ("source", source, str))
    if "q_lora_rank" in config and config["q_lora_rank"] is None:
        raise Refusal(
            "draft_unsupported",
            f"config {source}: q_lora_rank is null; a DSpark draft's queries take the LoRA "
            "path (vLLM 0.33 refuses q_lora_rank=None for DSpark)",
            facts={"source": source, "field": "q_lora_rank"},
            hint="give the draft's q_lora_rank, or leave it out for DeepSeek-V3's 1536",
        )
    try:
        text = _TextConfig.model_validate({**DSPARK_DRAFT_DEFAULTS, **config})
    except ValidationError as error:
        raise _invalid(error, source, "pass the draft model's own config.json") from None
    if text.linear_attn_config is not None:
        raise Refusal(
            "draft_unsupported",
            f"config {source}: a draft with KDA layers keeps a state; drafts are dense MLA",
            facts={"source": source, "field": "linear_attn_config"},
            hint="pass a dense MLA draft's config.json",
        )
    check_bound("num_hidden_layers", text.num_hidden_layers, MAX_MODULE_LAYERS, why="layers")
    return (_mla_of(text),) * text.num_hidden_layers


def config_of(hf_config: object, field: str, owner: str) -> Mapping[str, object]:
    """The mapping an engine's Hugging Face config object holds (``to_dict()``); refuses
    (``invalid_config``, naming ``field`` of the engine's ``owner`` record) an object without
    one."""
    expect_args(("field", field, str), ("owner", owner, str))
    to_dict = getattr(hf_config, "to_dict", None)
    config = to_dict() if callable(to_dict) else None
    if not isinstance(config, Mapping):
        raise Refusal(
            "invalid_config",
            f"{owner}.{field}: no Hugging Face config (an object whose to_dict() is a mapping)",
            facts={"field": field},
            hint=f"pass the engine's own {owner}",
        )
    return config


def load_config(
    path: str | PathLike[str],
    *,
    name: str | None = None,
    num_draft_layers: int | None = None,
    draft: str | PathLike[str] | None = None,
) -> HybridModel:
    """Read a Hugging Face ``config.json`` (or a folder holding one) into a :class:`HybridModel`;
    ``draft`` names a draft model's ``config.json`` (or folder), whose layers join the model.

    >>> from k3layout import load_config
    >>> load_config("../shared/fixtures/kimi-k3.config.json").num_layers  # doctest: +SKIP
    93
    """
    expect_args(("path", path, (str, PathLike)), ("draft", draft, (str, PathLike, type(None))))
    file, data = _read_json(path)
    stem = file.name.removesuffix(".json").removesuffix(".config")
    default_name = file.parent.name if stem == "config" else stem
    drafted = None if draft is None else _read_json(draft)[1]
    return model_from_config(
        data,
        name=name or default_name,
        num_draft_layers=num_draft_layers,
        draft=drafted,
        source=_short(file),
    )


def _read_json(path: str | PathLike[str]) -> tuple[Path, dict[str, object]]:
    """A config file (or a folder's ``config.json``) and its top-level JSON object."""
    file = Path(path)
    try:
        if file.is_dir():
            file = file / "config.json"
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        # ValueError: bad JSON, an integer above Python's 4,300-digit limit, a NUL in the path;
        # RecursionError: JSON nested deeper than the parser's stack.
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise Refusal(
            "invalid_config",
            f"config {_short(file)}: cannot be read as JSON ({_short(reason)})",
            facts={"source": _short(file), "field": "<file>"},
            hint="pass the path of a Hugging Face config.json",
        ) from None
    if not isinstance(data, dict):
        raise Refusal(
            "invalid_config",
            f"config {_short(file)}: the top level must be a JSON object, got "
            f"{type(data).__name__}",
            facts={"source": _short(file), "field": "<root>"},
        )
    return file, data


def _short(text: object, most: int = 200) -> str:
    """A path or reason cut to ``most`` characters (a path too long for the OS is long)."""
    value = str(text)
    return value if len(value) <= most else f"{value[: most - 3]}..."
