"""Load a hybrid model from a Hugging Face ``config.json``.

The backbone may sit at the top level (Kimi-Linear, ``model_type: kimi_linear``) or under
``text_config`` (Kimi-K3's multimodal checkpoint). ``linear_attn_config`` lists KDA and MLA
layers **1-based**; a config without it is a pure MLA model (DeepSeek-V3.2, GLM-5.x), whose
``index_head_dim`` adds a DSA index row per attention layer and whose MTP layers
(``num_nextn_predict_layers``) join as draft layers. Fields that do not shape the cache are
ignored; inconsistent ones are refused with ``code="invalid_config"`` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ..constants import DSA_INDEX_BYTES_PER_TOKEN
from ..dtypes import HF_TORCH_DTYPES
from ..errors import Refusal
from .layers import KDALayer, Layer, MLALayer
from .spec import HybridModel


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


class _LinearAttnConfig(_Lenient):
    num_heads: PositiveInt
    head_dim: PositiveInt
    short_conv_kernel_size: Annotated[int, Field(ge=2)]
    kda_layers: tuple[int, ...]
    full_attn_layers: tuple[int, ...] | None = None


class _TextConfig(_Lenient):
    model_type: str | None = None
    num_hidden_layers: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt | None = None
    kv_lora_rank: PositiveInt
    qk_rope_head_dim: PositiveInt
    qk_nope_head_dim: PositiveInt
    v_head_dim: PositiveInt
    q_lora_rank: PositiveInt | None = None
    index_head_dim: PositiveInt | None = None
    num_nextn_predict_layers: Annotated[int, Field(ge=0)] = 0
    torch_dtype: str | None = None
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
    text_config: _TextConfig


def _check_layer_lists(linear: _LinearAttnConfig, num_layers: int) -> None:
    lists = {"kda_layers": linear.kda_layers}
    if linear.full_attn_layers is not None:
        lists["full_attn_layers"] = linear.full_attn_layers
    for field, layers in lists.items():
        outside = sorted({n for n in layers if not 1 <= n <= num_layers})
        if outside:
            raise ValueError(
                f"{field}: layers {outside} are outside 1..num_hidden_layers={num_layers} "
                "(the lists are 1-based)"
            )
        repeated = sorted({n for n in layers if layers.count(n) > 1})
        if repeated:
            raise ValueError(f"{field}: layers {repeated} are listed more than once")
    if linear.full_attn_layers is None:
        return
    overlap = sorted(set(linear.kda_layers) & set(linear.full_attn_layers))
    if overlap:
        raise ValueError(f"kda_layers and full_attn_layers overlap at layers {overlap}")
    missing = sorted(
        set(range(1, num_layers + 1)) - set(linear.kda_layers) - set(linear.full_attn_layers)
    )
    if missing:
        raise ValueError(
            f"layers {missing} are in neither kda_layers nor full_attn_layers "
            f"(together they must cover 1..{num_layers})"
        )


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"


def _refuse(error: ValidationError, source: str) -> Refusal:
    first = error.errors()[0]
    field = _field_path(first["loc"])
    problems = "; ".join(
        f"{_field_path(e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in error.errors()
    )
    return Refusal(
        "invalid_config",
        f"config {source}: {problems}",
        facts={"source": source, "field": field},
        hint="fix the named field of the config.json",
    )


def model_from_config(
    config: Mapping[str, object],
    *,
    name: str | None = None,
    num_draft_layers: int | None = None,
    source: str = "<mapping>",
) -> HybridModel:
    """Build a :class:`HybridModel` from a parsed Hugging Face config.

    ``num_draft_layers`` overrides the config's ``num_nextn_predict_layers`` (K3's DSpark draft
    is not in its config: pass 5). Refuses with ``code="invalid_config"`` naming the field.
    """
    try:
        if isinstance(config.get("text_config"), Mapping):
            text = _Nested.model_validate(config).text_config
        else:
            text = _TextConfig.model_validate(config)
    except ValidationError as error:
        raise _refuse(error, source) from None
    if num_draft_layers is not None and num_draft_layers < 0:
        raise Refusal(
            "invalid_argument",
            f"num_draft_layers={num_draft_layers} must be >= 0",
            facts={"num_draft_layers": num_draft_layers},
        )
    index_bytes = 0
    if text.index_head_dim is not None:
        # fp8 key row + one fp32 scale: 128 + 4 = DSA_INDEX_BYTES_PER_TOKEN for V3.2 / GLM-5.
        index_bytes = text.index_head_dim + (DSA_INDEX_BYTES_PER_TOKEN - 128)
    mla = MLALayer(
        num_heads=text.num_attention_heads,
        kv_lora_rank=text.kv_lora_rank,
        qk_rope_head_dim=text.qk_rope_head_dim,
        qk_nope_head_dim=text.qk_nope_head_dim,
        v_head_dim=text.v_head_dim,
        q_lora_rank=text.q_lora_rank,
        index_bytes_per_token=index_bytes,
    )
    layers: tuple[Layer, ...]
    linear = text.linear_attn_config
    if linear is None:
        layers = (mla,) * text.num_hidden_layers
    else:
        kda = KDALayer(
            num_heads=linear.num_heads,
            head_dim=linear.head_dim,
            conv_kernel=linear.short_conv_kernel_size,
        )
        kda_ids = {n - 1 for n in linear.kda_layers}
        layers = tuple(kda if i in kda_ids else mla for i in range(text.num_hidden_layers))
        if not any(i not in kda_ids for i in range(text.num_hidden_layers)):
            raise Refusal(
                "invalid_config",
                f"config {source}: linear_attn_config.kda_layers covers every layer; "
                "a hybrid model needs at least one MLA layer",
                facts={"source": source, "field": "linear_attn_config.kda_layers"},
            )
    drafts = text.num_nextn_predict_layers if num_draft_layers is None else num_draft_layers
    top_type = config.get("model_type")
    model_type = top_type if isinstance(top_type, str) and top_type else text.model_type
    return HybridModel(
        name=name or model_type or "model",
        model_type=model_type or "unknown",
        layers=layers,
        draft_layers=(mla,) * drafts,
    )


def load_config(
    path: str | Path, *, name: str | None = None, num_draft_layers: int | None = None
) -> HybridModel:
    """Read a Hugging Face ``config.json`` (or a folder holding one) into a :class:`HybridModel`.

    >>> from k3layout import load_config
    >>> load_config("../shared/fixtures/kimi-k3.config.json").num_layers  # doctest: +SKIP
    93
    """
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise Refusal(
            "invalid_config",
            f"config {file}: cannot be read as JSON ({error})",
            facts={"source": str(file), "field": "<file>"},
            hint="pass the path of a Hugging Face config.json",
        ) from None
    if not isinstance(data, dict):
        raise Refusal(
            "invalid_config",
            f"config {file}: the top level must be a JSON object, got {type(data).__name__}",
            facts={"source": str(file), "field": "<root>"},
        )
    stem = file.name.removesuffix(".json").removesuffix(".config")
    default_name = file.parent.name if stem == "config" else stem
    return model_from_config(
        data, name=name or default_name, num_draft_layers=num_draft_layers, source=str(file)
    )
