"""Numbers the engines hard-code, each with where it comes from.

Everything else in k3layout is derived from a model and a deployment; these are the few
values that are the engines' own choices rather than facts of the model.
"""

from __future__ import annotations

from typing import Final

MLA_KERNEL_BLOCK_TOKENS: Final = 128
"""Smallest attention block the MLA decode kernels accept (vLLM raises every MLA block to a
multiple of it before sizing the hybrid page; FlashMLA pages by 64, the fp8 kernels by 128)."""

PARENT_PAGE_TOKENS: Final = 128
"""Tokens per MLA page in the parent-block layout (tokenspeed's ``logical_block_tokens``)."""

PARENT_ALIGNMENT_BYTES: Final = 256
"""Planes of a parent are aligned up to this (tokenspeed ``solve_cache_layout(alignment=256)``)."""

DEFAULT_MAX_PADDING_FRACTION: Final = 0.25
"""Parent layout's padding limit per group (tokenspeed's K3 recipe, ``max_padding_fraction``)."""

VLLM_GROUP_SIZE_RATIO: Final = (3, 2)
"""vLLM's hybrid grouping: the largest bucket sets the group size when it is under 3/2 of the
smallest (``_get_kv_cache_groups_uniform_page_size``); otherwise the smallest does."""

DSA_INDEX_BYTES_PER_TOKEN: Final = 132
"""A DSA indexer's ``index_cache`` row: 128 fp8 key elements + one fp32 scale (DeepSeek-V3.2,
GLM-5.x). Used when a config names ``index_head_dim`` = 128."""

FLASHMLA_FP8_SCALE_GROUP: Final = 128
"""FlashMLA's fp8 latent layout keeps one fp32 scale per 128 latent elements (656 B/token for
K3: 512 fp8 + 4 fp32 scales + 64 bf16 rope)."""

REPLAYSSM_DEFAULT_CACHE_LEN: Final = 16
"""ATOM ReplaySSM's default record length per slot before the ``2*(s+1)`` floor."""

MAX_PAGES_PER_PLANE: Final = 1 << 16
"""Upper bound of the parent packing search; a packing beyond it is refused, not searched."""
