"""The rules of SGLang 0.5.23 that size Kimi-K3's pools, in one place.

Read off SGLang 0.5.23 by running its code on CPU (``tests/conformance/`` runs it again on
every change): its configuration resolution, its ``KVCacheConfigurator`` and its pools.

- **Attention backend and page** (resolved from the GPU): Hopper (H100, H200) runs MLA on
  ``fa3`` with 1-token pages; Blackwell (B200, GB200) runs Kimi-K3 on ``trtllm_mla`` with
  64-token pages (a K3 override; other models keep ``flashinfer``, 1-token pages).
- **Cell size** (bytes per token per rank): ``576 * elem`` per MLA layer of the stage, the
  latent replicated over TP; a draft's K/V rows are added (DSpark's pool shares the budget).
- **State slot**: per KDA layer the conv state ``[K-1, q|k|v]`` bf16 and the temporal state
  ``[H/tp, K, V]`` fp32; no speculative rows (a verify scratch holds the draft steps).
- **Budget split**: ``mamba_full_memory_ratio`` ``r`` (0.9) gives the state pool
  ``rest * r / (1 + r)``; each pool keeps one padding slot, the token pool one padding page.
- **Running requests**: ``min(clamp(tokens / context * 512, 2048, 4096), tokens // 2,
  slots // ratio)``, ``ratio`` the state slots a request holds (5 with the radix cache:
  3 plus 2 ``extra_buffer`` tracking slots under the overlap scheduler, 1 under PP, which
  runs without it; 1 without the radix cache).
- **An indexed hybrid (DSA, GLM-5.3-Flash)** runs SGLang's ``dsa`` attention: the page is
  forced to ``64 * index_kpool`` tokens (a pooled key never spans pages); fp8 runs
  ``flashmla_kv`` on SM90 (the scaled 528-byte row) and ``trtllm`` on SM100, bf16
  ``flashmla_sparse`` prefill with ``fa3`` (SM90) or ``trtllm`` (SM100) decode; the cell
  budgets the pooled keys at ``ceil(132 / index_kpool)`` bytes per token per layer; DCP is
  refused, and so is an ``index_head_dim`` other than 128 (its pool asserts it); the radix
  cache's track interval must be a multiple of the page (SGLang's default 256 is not, and it
  fails on a bare assertion).
"""

from __future__ import annotations

from typing import Final

from ...errors import Refusal
from ...gpus import GPUS, GpuName

SGLANG_VERSION: Final = "0.5.23"
"""The SGLang release whose rules the ``sglang`` engine follows."""

MAMBA_FULL_MEMORY_RATIO: Final = 0.9
"""``--mamba-full-memory-ratio``'s default: state pool over token pool."""

STATE_SLOTS_BASE: Final = 3
"""Slots a running request holds with the radix cache before tracking slots: the running
state and two for the prefill -> decode hand-over (``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_
RATIO``)."""

TRACKING_SLOTS: Final = {True: 2, False: 1}
"""``extra_buffer`` tracking slots by whether the overlap scheduler runs (it does not under
pipeline parallelism, which SGLang finds incompatible with it)."""

STATE_SLOTS_NO_RADIX: Final = 1
"""Slots a running request holds with ``--disable-radix-cache``."""

SPEC_MAX_RUNNING_REQUESTS: Final = 48
"""``--max-running-requests`` SGLang sets when speculative decoding is on and none is given."""

MULTIMODAL_RESERVATION_BYTES: Final = 100 << 20
"""``SGLANG_VLM_CACHE_SIZE_MB``: what SGLang holds back from a multimodal model's budget."""

MULTIMODAL_MODEL_TYPES: Final = frozenset({"kimi_k3", "glm5_next"})
"""Model types SGLang serves with a multimodal class (K3: ``KimiK3ForConditionalGeneration``;
GLM-5.3-Flash: ``Glm5NextForConditionalGeneration``)."""

BLACKWELL_PAGE_TOKENS: Final = 64
"""``trtllm_mla``'s page (SGLang's MLA backend constraint)."""

KV_DTYPE_NAMES: Final = {"fp8": "fp8_e4m3", "bf16": "bf16"}
"""Our cache dtypes by SGLang's ``--kv-cache-dtype`` names (no ``fp8_ds_mla`` there)."""

SERVED_GPUS: Final[tuple[GpuName, ...]] = ("h100", "h200", "b200", "gb200")
"""The GPUs whose resolution was read off SGLang (CUDA SM90 and SM100)."""

PD_REFUSAL_NOTE: Final = (
    "SGLang 0.5.23 starts, then fails every request: a decode rank asks the bootstrap "
    "server for a prefill rank that does not exist ('Bootstrap info not found'), or prefill "
    "ranks no decode rank contacts time out in KVPoll.Bootstrapping"
)
"""What SGLang does with a prefill / decode TP pair where neither divides the other
(``common/conn.py``'s rank mapping has no divisibility check)."""

CONTEXT_ESTIMATE_TOKENS: Final = 512
"""``resolve_max_num_reqs``: requests estimated per context length of tokens, x 512 ..."""

ESTIMATED_REQUESTS: Final = (2048, 4096)
"""... clamped to this range."""


def attention_backends(
    gpu: GpuName,
    model_type: str,
    dcp: int = 1,
    kv_dtype: str = "fp8",
    index_kpool: int | None = None,
) -> tuple[str, str, int]:
    """The prefill and decode MLA backends and the page (tokens) SGLang resolves on ``gpu``
    for ``model_type``; refuses (``engine_setting``) a GPU not read off SGLang.

    Hopper: ``fa3`` both ways, 1-token pages. Blackwell: Kimi-K3 runs ``trtllm_mla`` on
    64-token pages, and with DCP decodes on ``cutedsl_mla`` (other models keep
    ``flashinfer``, 1-token pages). An indexed hybrid (``index_kpool`` given) runs DSA's
    backends on ``64 * index_kpool``-token pages (:data:`DSA_BACKENDS`)."""
    if gpu not in SERVED_GPUS:
        raise Refusal(
            "engine_setting",
            f"gpu={gpu}: engine=sglang follows SGLang {SGLANG_VERSION} as resolved on CUDA "
            f"SM90 / SM100 ({', '.join(SERVED_GPUS)}); {gpu} was not read off it",
            facts={"engine": "sglang", "field": "gpu", "gpu": gpu, "allowed": SERVED_GPUS},
            hint=f"use gpu in {list(SERVED_GPUS)}",
        )
    hopper = GPUS[gpu].capability[0] < 10
    if index_kpool is not None:
        prefill, decode = DSA_BACKENDS[(kv_dtype, hopper)]
        return prefill, decode, DSA_PAGE_POOLS * index_kpool
    if hopper:
        return "fa3", "fa3", 1
    if model_type in MULTIMODAL_MODEL_TYPES:  # SGLang's Kimi-K3 override on SM100
        decode = "cutedsl_mla" if dcp > 1 else "trtllm_mla"
        return "trtllm_mla", decode, BLACKWELL_PAGE_TOKENS
    return "flashinfer", "flashinfer", 1


DSA_BACKENDS: Final[dict[tuple[str, bool], tuple[str, str]]] = {
    ("fp8", True): ("flashmla_kv", "flashmla_kv"),
    ("fp8", False): ("trtllm", "trtllm"),
    ("bf16", True): ("flashmla_sparse", "fa3"),
    ("bf16", False): ("flashmla_sparse", "trtllm"),
}
"""SGLang's DSA prefill and decode backends by (cache dtype, Hopper) (its
``_dsa_split_backend_resolution``)."""

DSA_PAGE_POOLS: Final = 64
"""Pooled index entries in one DSA page: the page is ``64 * index_kpool`` tokens."""

DSA_INDEX_HEAD_DIMS: Final = (128,)
"""The ``index_head_dim`` SGLang's DSA pool takes on CUDA: one index head of 128 fp8 values
(its ``DSATokenToKVPool`` asserts it when the pools are built, after the configurator has
sized them)."""

DEFAULT_TRACK_INTERVAL: Final = 256
"""``--mamba-track-interval``'s default: tokens between the KDA states the radix cache
tracks; it must be a multiple of the page."""


def track_interval(page: int, requested: int | None, draft_tokens: int = 0) -> int | None:
    """The ``--mamba-track-interval`` that starts SGLang's radix cache on ``page``-token
    pages: the requested one, else its default 256 where the page divides it (``None``: no
    flag needed), else the page; refuses (``engine_setting``) a requested interval that is
    not a multiple of the page or is under the verify window (``draft_tokens``), as SGLang's
    ``validate_mamba_extra_buffer`` asserts (a bare ``AssertionError``)."""
    if requested is None:
        if DEFAULT_TRACK_INTERVAL % page == 0 and draft_tokens <= DEFAULT_TRACK_INTERVAL:
            return None
        return page * max(1, -(-draft_tokens // page))
    if requested % page or requested < draft_tokens:
        least = page * max(1, -(-draft_tokens // page))
        raise Refusal(
            "engine_setting",
            f"mamba_track_interval={requested} must be a multiple of the {page}-token page "
            f"and at least the {draft_tokens} verify tokens: SGLang {SGLANG_VERSION} fails "
            "at start-up on a bare AssertionError (arg_groups/mamba_hook.py)",
            facts={
                "engine": "sglang",
                "field": "mamba_track_interval",
                "mamba_track_interval": requested,
                "page_tokens": page,
            },
            hint=f"use mamba_track_interval={least} (or a multiple of {page})",
        )
    return requested


def state_slots_per_request(radix_cache: bool, overlap: bool = True) -> int:
    """State slots one running request holds (SGLang's ``_calculate_mamba_ratio``): 5 with
    the radix cache and the overlap scheduler, 4 without the overlap scheduler (PP), 1
    without the radix cache."""
    return STATE_SLOTS_BASE + TRACKING_SLOTS[overlap] if radix_cache else STATE_SLOTS_NO_RADIX


def estimated_requests(tokens: int, context_tokens: int) -> int:
    """SGLang's first estimate of running requests: ``tokens / context * 512`` in
    ``[2048, 4096]``."""
    low, high = ESTIMATED_REQUESTS
    return max(min(int(tokens / context_tokens * CONTEXT_ESTIMATE_TOKENS), high), low)
