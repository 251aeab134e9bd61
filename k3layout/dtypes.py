"""Dtype names and their byte widths: the one table the planner uses (no torch here)."""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

DTypeName: TypeAlias = Literal["float8_e4m3fn", "bfloat16", "float16", "float32", "int32"]
"""Element dtypes of cache tensors, spelled as torch spells them."""

DTYPE_BYTES: Final[dict[DTypeName, int]] = {
    "float8_e4m3fn": 1,
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "int32": 4,
}

KvCacheDtype: TypeAlias = Literal["fp8", "bf16", "fp8_ds_mla"]
"""The attention cache dtype an engine is started with.

``fp8`` and ``bf16`` store the 576-element latent at 1 or 2 bytes per element; ``fp8_ds_mla``
is FlashMLA's packed fp8 row (fp8 latent, fp32 scales, bf16 rope)."""

KV_CACHE_DTYPES: Final[tuple[KvCacheDtype, ...]] = ("fp8", "bf16", "fp8_ds_mla")

KV_ELEMENT_DTYPE: Final[dict[KvCacheDtype, DTypeName]] = {
    "fp8": "float8_e4m3fn",
    "bf16": "bfloat16",
    "fp8_ds_mla": "float8_e4m3fn",
}

HF_TORCH_DTYPES: Final[frozenset[str]] = frozenset(
    {"bfloat16", "float16", "float32", "float8_e4m3fn", "auto"}
)
"""Values a Hugging Face ``torch_dtype`` may take for the models k3layout plans."""
