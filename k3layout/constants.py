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

FLASHMLA_ROPE_SLOT: Final = 64
"""The bf16 RoPE elements FlashMLA's fp8_ds_mla row keeps: a NoPE latent (GLM-5.3-Flash,
``qk_rope_head_dim`` 0) keeps the slot, zeroed, so its row is still 656 B (vLLM 0.33's
``state_content_bytes`` for fp8_ds_mla)."""

REPLAYSSM_DEFAULT_CACHE_LEN: Final = 16
"""ATOM ReplaySSM's default record length per slot before the ``2*(s+1)`` floor."""

MAX_PAGES_PER_PLANE: Final = 1 << 16
"""Upper bound of the parent packing search; a packing beyond it is refused, not searched."""

MAX_MODULE_LAYERS: Final = 1 << 16
"""Most module layers (target + draft) a model may have: 65,536. The largest published decoders
have a few hundred layers; a plan keeps several tuples per layer, so an unbounded count (a
``num_hidden_layers`` of 10**9, ``--draft-layers`` of 10**20) would exhaust memory before any
rule could refuse it. Beyond it: ``size_limit``."""

MAX_MODEL_DIM: Final = 1 << 20
"""Largest head count or per-head / latent dimension a layer may have: 1,048,576 (K3: 96 heads,
dims up to 1536). Bounding every factor keeps the per-rank byte products (heads x dim x dim x 4)
within int64 and makes a divisor hint cheap. Beyond it: ``size_limit``."""

MAX_CONV_KERNEL: Final = 1 << 10
"""Largest short-convolution kernel a KDA layer may have (Kimi: 4). Beyond it: ``size_limit``."""

MAX_PADDING_LIMIT: Final = 1000.0
"""Largest ``max_padding`` a deployment may ask for: a group padded to 1001x its payload. A
larger finite limit (1e308) means "no limit", which ``max_padding=None`` with draft layers
already says; refusing it keeps the padding arithmetic far from float overflow."""

INT64_MAX: Final = (1 << 63) - 1
"""Engines index their caches with int64 (torch sizes, strides and offsets); a plan whose byte
counts do not fit is refused (``size_limit``) instead of overflowing in the engine."""

MAX_ARGUMENT_BITS: Final = 4096
"""Most bits an int argument may have, either sign: far beyond any count or byte size, and few
enough digits (1,234) that a refusal can print it (``str()`` of an int stops at 4,300 digits).
Beyond it: ``size_limit``, before any check that would print the value."""

MAX_DIVISOR_HINTS: Final = 8
"""Most values a refusal's hint lists when it suggests divisors (``use dcp in [...]``)."""

MAX_RANKS: Final = (1 << 31) - 1
"""Largest parallel size (``attn_tp``, ``attn_dp``, ``pp``, ``dcp``) a deployment may name:
torch.distributed and NCCL number ranks with int32. Beyond it: ``size_limit``."""

MAX_BLOCK_TOKENS: Final = 1 << 32
"""Largest requested block or DCP interleave, in tokens: above any context length (K3 serves
2**20). Beyond it: ``size_limit``."""

MAX_REPLAY_CACHE_LEN: Final = 1 << 16
"""Largest ReplaySSM record length per slot (ATOM's default is 16); keeps the records' bytes
within int64 for any head count. Beyond it: ``size_limit``."""

MAX_PROMPT_TOKENS: Final = 1 << 32
"""Most prompt tokens one transfer may move: above any context length (K3 serves 2**20), and
keeps a request's byte counts within int64. Beyond it: ``size_limit``."""

MAX_LISTED_ITEMS: Final = 1 << 20
"""Most items an answer lists one by one (a store's chunk boundaries, a transfer segment's
copies): 1,048,576, about 100 MB of Python tuples. Far above what a request needs (K3's whole
context, 2**20 tokens, is 682 boundaries of 1,536 tokens; a DCP 8 transfer of it 131,072
copies per segment), and a count from a huge token number (``store_boundaries(10**18)``) is
refused (``size_limit``) before memory runs out."""

MAX_KV_MEMORY_BYTES: Final = 1 << 62
"""Largest KV memory per rank, in bytes, the capacity answers take (4 EiB, far above any GPU):
keeps their sums within int64 and their ratios finite. Beyond it: ``size_limit``."""

MAX_KV_MEMORY_GIB: Final = float(1 << 30)
"""Largest KV memory per rank the command line accepts, in GiB (an exbibyte): keeps the byte
budget an exact int64. Beyond it (``--kv-memory-gib 1e400`` is infinity): ``size_limit``."""
