"""The rules of the vLLM releases k3layout follows that size and place a hybrid model's KV
cache, in one place.

Everything here was read off vLLM 0.33.0 and 0.34.0 by running their code
(``tests/conformance/`` runs each again on every change); what one release does otherwise is a
field of its record in :mod:`.releases`, passed in here (a default block, a refusal's reason).

- **Attention backends** take kernel blocks of fixed token counts (``FLASHMLA`` 64,
  ``CUTLASS_MLA`` 128, ``FLASHINFER_MLA`` 32 or 64) or any multiple of 16 (``TRITON_MLA``).
  A manager block is split into the largest kernel block that divides it. The dense ones
  serve an MLA layer without an indexer, the sparse ones (:mod:`.sparse`) an indexed one;
  either kind named for the other's layers is refused, as vLLM's selector refuses it
  (``sparse not supported`` / ``non-sparse not supported``).
- **Block alignment** (the platform's ``update_block_size_for_backend``): without a requested
  block the backend's preferred one; then, for a hybrid model, the smallest multiple of
  ``A = max(smallest kernel block, block, 128)`` whose attention page holds one state, rounded
  up to a whole kernel block. A requested block is raised, never lowered.
- **KV-cache layouts** (``VLLM_KV_CACHE_LAYOUT``): ``LBNHC`` (layer-outermost, the default:
  each layer's pages of all blocks are one run) or ``BLHNC`` (block-outermost: each block is
  one run of every layer's page). Block-outermost pages cannot be split into smaller kernel
  blocks, so only a backend whose kernel takes the whole block serves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ..._args import expect_args, expect_int, expect_items, expect_non_negative, expect_positive
from ...constants import MLA_KERNEL_BLOCK_TOKENS
from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import DEFAULT_GPU, GPUS, GpuName
from ...model import HybridModel
from ...settings import (
    ATTENTION_BACKENDS,
    DENSE_ATTENTION_BACKENDS,
    KDA_PREFILL_BACKENDS,
    KV_CACHE_LAYOUTS,
    MAMBA_CACHE_MODES,
    SPARSE_ATTENTION_BACKENDS,
    AttentionBackend,
    KdaPrefillBackend,
    KvCacheLayout,
    MambaCacheMode,
    resolved_mamba_cache_mode,
)
from .releases import VLLM_RELEASES_TEXT, VLLM_VERSIONS, VllmRelease, release_of

VLLM_VERSION: Final = VLLM_VERSIONS[-1]
"""The newest vLLM release k3layout follows, which a deployment naming none plans for."""

PIPELINE_UNSERVED: Final[dict[str, str]] = {
    "glm5_next": "its Glm5NextForCausalLM has no make_empty_intermediate_tensors, which the "
    "model runner of every stage after the first calls when it loads the model "
    "(v1/worker/gpu/model_runner.py: AttributeError); its model code says PP is gated off, "
    "though its registry entry accepts the config",
}
"""The model types vLLM (0.33.0 and 0.34.0) accepts at ``--pipeline-parallel-size`` > 1 but
cannot load on a later stage, and why (read off vLLM's model classes; the GLM conformance
harness runs the lookup the runner does)."""


def check_pipeline(model: HybridModel, deployment: Deployment) -> None:
    """Refuse (``pp_unsupported``) pipeline stages for a model vLLM cannot load on a later
    stage (:data:`PIPELINE_UNSERVED`)."""
    why = PIPELINE_UNSERVED.get(model.model_type)
    # deeper than the layers: refused for its depth (pp_too_deep), whatever the model
    if 1 < deployment.pp <= model.num_layers and why is not None:
        raise Refusal(
            "pp_unsupported",
            f"pp={deployment.pp}: vLLM {release_of(deployment).version} does not start "
            f"{model.name} "
            f"(model_type {model.model_type}) on more than one pipeline stage: {why}",
            facts={"field": "pp", "pp": deployment.pp, "model_type": model.model_type},
            hint="use pp=1 (spread the model over attention TP, DP or expert parallelism)",
        )


KERNEL_BLOCK_TOKENS: Final[dict[AttentionBackend, tuple[int, ...]]] = {
    "FLASHMLA": (64,),
    "CUTLASS_MLA": (128,),
    "FLASHINFER_MLA": (32, 64),
    "TRITON_MLA": (),  # any multiple of KERNEL_MULTIPLE_OF
    "FLASH_ATTN_MLA": (),
    # the sparse backends' MultipleOf (a block is a whole number of them; .sparse)
    "FLASHINFER_MLA_SPARSE_SM90": (64,),
    "FLASHMLA_SPARSE": (64,),
    "FLASHINFER_MLA_SPARSE": (32,),
}
"""The kernel block sizes each backend takes; empty: any multiple of
:data:`KERNEL_MULTIPLE_OF`."""

KERNEL_MULTIPLE_OF: Final[dict[AttentionBackend, int]] = {"TRITON_MLA": 16, "FLASH_ATTN_MLA": 16}


def default_attention_backend(gpu: GpuName, kv_dtype: str) -> AttentionBackend:
    """The dense MLA backend vLLM 0.33's selector picks for Kimi-K3 on ``gpu`` (the first of
    its priorities that the configuration passes; checked by running vLLM's own validation):
    FlashInfer MLA on SM 10x; on SM 90 FlashAttention MLA for a bf16 cache (it takes no fp8)
    and FlashMLA for fp8; Triton MLA on SM 80 and 12x, and on ROCm (AITER MLA, where enabled,
    takes any block as Triton MLA does)."""
    device = GPUS[gpu]
    if device.vendor == "amd":
        return "TRITON_MLA"
    major = device.capability[0]
    if major == 10:
        return "FLASHINFER_MLA"
    if major == 9:
        return "FLASHMLA" if kv_dtype != "bf16" else "FLASH_ATTN_MLA"
    return "TRITON_MLA"


BACKEND_SM_MAJORS: Final[dict[AttentionBackend, tuple[int, ...] | None]] = {
    "FLASHMLA": (9, 10),
    "CUTLASS_MLA": (10,),
    "FLASHINFER_MLA": (10,),
    "FLASH_ATTN_MLA": (9,),
    "TRITON_MLA": None,  # any GPU, ROCm included
    # for a NoPE head of 512, the one k3layout plans sparse backends for (.sparse)
    "FLASHINFER_MLA_SPARSE_SM90": (9,),
    "FLASHMLA_SPARSE": (9,),
    "FLASHINFER_MLA_SPARSE": (10,),
}
"""The CUDA capability majors each MLA backend runs on (``supports_compute_capability``; a
sparse backend: where it takes a head of 512)."""


def runs_on(backend: AttentionBackend, gpu: GpuName) -> bool:
    """Whether vLLM's selector takes ``backend`` on ``gpu``: Triton MLA anywhere, the CUDA
    backends on the NVIDIA GPUs of their capability majors."""
    majors = BACKEND_SM_MAJORS[backend]
    device = GPUS[gpu]
    return majors is None or (device.vendor == "nvidia" and device.capability[0] in majors)


def check_backend_runs(backend: AttentionBackend, gpu: GpuName, kv_dtype: str) -> None:
    """Refuse (``kernel_unsupported``) an MLA backend vLLM's selector rejects on ``gpu`` or
    for the cache dtype: a CUDA backend on ROCm or on another SM, FlashAttention MLA with an
    fp8 cache."""
    if not runs_on(backend, gpu):
        device = GPUS[gpu]
        raise Refusal(
            "kernel_unsupported",
            f"attention_backend={backend!r} does not run on {gpu} (SM {device.sm}, "
            f"{device.vendor}): {VLLM_RELEASES_TEXT}'s selector rejects it",
            facts={"attention_backend": backend, "gpu": gpu, "field": "attention_backend"},
            hint="leave attention_backend unset (vLLM's own pick for the GPU), or TRITON_MLA",
        )
    if backend == "FLASH_ATTN_MLA" and kv_dtype != "bf16":
        raise Refusal(
            "kernel_unsupported",
            f"attention_backend='FLASH_ATTN_MLA' takes no {kv_dtype} cache (bf16 only, in "
            f"{VLLM_RELEASES_TEXT})",
            facts={"attention_backend": backend, "kv_dtype": kv_dtype, "field": "kv_dtype"},
            hint="use kv_dtype='bf16', or FLASHMLA for an fp8 cache",
        )


def check_dense_backend(backend: AttentionBackend, model: HybridModel) -> None:
    """Refuse (``kernel_unsupported``) a sparse MLA backend named for a model whose MLA layers
    have no indexer: vLLM's selector says the backend is not valid for the configuration
    (``non-sparse not supported``)."""
    if backend in SPARSE_ATTENTION_BACKENDS:
        raise Refusal(
            "kernel_unsupported",
            f"attention_backend={backend!r} is a sparse MLA backend and {model.name}'s MLA "
            f"layers have no indexer: {VLLM_RELEASES_TEXT}'s selector refuses it "
            "('non-sparse not supported')",
            facts={"attention_backend": backend, "field": "attention_backend"},
            hint="leave attention_backend unset (vLLM's own pick for the GPU), or name a dense "
            f"one ({', '.join(DENSE_ATTENTION_BACKENDS)})",
        )


def backend_of(deployment: Deployment) -> AttentionBackend:
    """The MLA backend a vLLM deployment runs: its own, else :func:`default_attention_backend`."""
    chosen = deployment.attention_backend
    return (
        chosen
        if chosen is not None
        else default_attention_backend(deployment.gpu, deployment.kv_dtype)
    )


DEFAULT_MAX_MODEL_LEN: Final = 2048
"""vLLM's ``max_model_len`` for a checkpoint that names no context length."""

DENSE_MLA_KV_DTYPES: Final = ("fp8", "bf16")
"""Cache dtypes vLLM 0.33's dense MLA backends accept for Kimi-K3 (not ``fp8_ds_mla``, the
sparse backends' 656-byte layout)."""


def _kernel_sizes(backend: object) -> tuple[int, ...]:
    """``backend``'s kernel block sizes; refuses (``invalid_argument``) a name that is not
    one of :data:`ATTENTION_BACKENDS`."""
    if backend not in ATTENTION_BACKENDS:
        raise Refusal(
            "invalid_argument",
            f"attention_backend={backend!r} is not one of vLLM's MLA backends",
            facts={"field": "attention_backend", "allowed": ATTENTION_BACKENDS},
            hint=f"use one of {', '.join(ATTENTION_BACKENDS)}",
        )
    return KERNEL_BLOCK_TOKENS[backend]


def smallest_kernel_block(backend: AttentionBackend) -> int:
    """The smallest kernel block ``backend`` takes (its multiple for ``TRITON_MLA``)."""
    sizes = _kernel_sizes(backend)
    return min(sizes) if sizes else KERNEL_MULTIPLE_OF[backend]


def supports_block(backend: AttentionBackend, block: int) -> bool:
    """Whether ``backend`` serves manager blocks of ``block`` tokens (a multiple of one of
    its kernel blocks)."""
    return expect_int("block", block) % smallest_kernel_block(backend) == 0


def check_block_supported(backend: AttentionBackend, requested: int) -> None:
    """Refuse (``block_unsupported``) a requested block that is not a multiple of the
    backend's smallest kernel block: vLLM's attention selector refuses the backend for it
    (``block_size not supported``) before any block is raised."""
    if not supports_block(backend, expect_positive("block_tokens", requested)):
        kernel = smallest_kernel_block(backend)
        raise Refusal(
            "block_unsupported",
            f"block_tokens={requested} is not a multiple of {backend}'s {kernel}-token "
            "kernel block: vLLM's attention selector refuses the backend for it ("
            "'block_size not supported')",
            facts={"block_tokens": requested, "attention_backend": backend, "kernel": kernel},
            hint=f"request a multiple of {kernel} (e.g. {kernel * -(-requested // kernel)}), or "
            "leave block_tokens unset",
        )


def preferred_block_tokens(backend: AttentionBackend, default_block: int) -> int:
    """The block vLLM picks for ``backend`` when none is requested: the release's default
    (``VllmRelease.default_block_tokens``: 16 in 0.33, 64 in 0.34) if the backend takes it,
    else its smallest kernel block."""
    if supports_block(backend, expect_positive("default_block", default_block)):
        return default_block
    return smallest_kernel_block(backend)


def kernel_block_tokens(backend: AttentionBackend, block: int) -> int:
    """The kernel block a manager block of ``block`` tokens is split into: the block itself
    if the kernel takes any multiple, else the largest kernel block that divides it."""
    sizes = _kernel_sizes(backend)
    check_block_supported(backend, block)
    if not sizes:
        return block
    return max(size for size in sizes if block % size == 0)


def aligned_block_tokens(
    backend: AttentionBackend,
    requested: int | None,
    state_bytes: int,
    attention_bytes_per_token: int,
    default_block: int,
) -> int:
    """The attention block of a hybrid model: the requested (or preferred,
    :func:`preferred_block_tokens`) block, raised until one attention page holds a
    ``state_bytes`` state (none: 0), on whole kernel blocks.

    >>> aligned_block_tokens("FLASHMLA", None, 832_512, 576, 64)  # K3 TP 8 fp8, 2 spec tokens
    1536
    >>> aligned_block_tokens("CUTLASS_MLA", 256, 832_512, 576, 64)  # 256 x ceil(832,512 / 147,456)
    1536
    """
    if requested is not None:
        expect_positive("requested", requested)
    expect_non_negative("state_bytes", state_bytes, "pass the state's bytes (0 without one)")
    expect_positive("attention_bytes_per_token", attention_bytes_per_token)
    block = preferred_block_tokens(backend, default_block) if requested is None else requested
    kernel = smallest_kernel_block(backend)
    if state_bytes == 0:
        return block
    align = max(kernel, block, MLA_KERNEL_BLOCK_TOKENS)
    raised = align * -(-state_bytes // (align * attention_bytes_per_token))
    raised = kernel * -(-raised // kernel)
    return max(block, raised)


def check_layout_serves(backend: AttentionBackend, layout: KvCacheLayout, block: int) -> None:
    """Refuse (``layout_unsupported``) a block-outermost layout whose blocks ``backend`` would
    have to split into smaller kernel blocks, as vLLM refuses it when it binds the cache."""
    kernel = kernel_block_tokens(backend, block)
    if layout == "BLHNC" and kernel != block:
        raise Refusal(
            "layout_unsupported",
            f"{backend} needs {kernel}-token kernel blocks, which block-outermost (BLHNC) "
            f"{block}-token blocks cannot be split into ({VLLM_RELEASES_TEXT} refuses it when "
            "it binds the cache)",
            facts={
                "kv_cache_layout": layout,
                "attention_backend": backend,
                "kernel_block_tokens": kernel,
                "block_tokens": block,
            },
            hint="use kv_cache_layout='LBNHC', or attention_backend='TRITON_MLA' (its kernel "
            "takes the whole block)",
        )


def check_kv_dtype(kv_dtype: str, backend: AttentionBackend) -> None:
    """Refuse (``dtype_unsupported``) a cache dtype no dense MLA backend of vLLM accepts."""
    if kv_dtype not in DENSE_MLA_KV_DTYPES:
        raise Refusal(
            "dtype_unsupported",
            f"kv_dtype={kv_dtype!r}: {VLLM_RELEASES_TEXT}'s dense MLA backends ({backend} among "
            f"them) accept {', '.join(DENSE_MLA_KV_DTYPES)} for Kimi-K3; fp8_ds_mla is the "
            "sparse backends' layout",
            facts={"kv_dtype": kv_dtype, "attention_backend": backend},
            hint="use kv_dtype='fp8' or 'bf16' with engine='vllm'",
        )


def resolved_kda_prefill_backend(
    requested: KdaPrefillBackend,
    *,
    full_rank_gate: bool,
    gate_lower_bound: float | None,
    head_dim: int,
    gpu: GpuName = DEFAULT_GPU,
    safe_gate: bool = False,
) -> str:
    """The KDA prefill kernel vLLM runs for a KDA layer on ``gpu``, as vLLM 0.33 resolves it
    (``models/kimi_k3/nvidia/kda.py``, ``amd/kda.py``). Refuses (``kernel_unsupported``) an
    explicit kernel the layer or the GPU cannot run, as vLLM does at start-up.

    - Kimi-Linear's KDA (no full-rank gate) has one prefill path: Triton. GLM-5.3-Flash's
      (a safe gate, ``models/glm5next/common/kda.py``) resolves as Kimi-K3's does.
    - CUDA: FlashKDA needs SM 9x, 10x or 12x, ``head_dim`` 128 and a bounded gate; FlashInfer
      SM 100 or 103 and a bf16 recurrent state (Kimi-K3 keeps fp32, so never). ``auto`` takes
      FlashKDA where it runs, else Triton.
    - ROCm: ``fused`` needs gfx950 (MI355X); ``auto`` takes it there, else Triton (aiter's
      Gluon kernel, where installed, keeps no checkpoint either).
    """
    device = GPUS[gpu]
    if device.vendor == "amd":
        if requested in ("flashkda", "flashinfer"):
            _refuse_kernel(requested, f"it is a CUDA kernel; {gpu} runs ROCm (auto, triton, fused)")
        fused = full_rank_gate and device.capability == ROCM_FUSED_KDA_CAPABILITY
        if requested == "fused" and not fused:
            _refuse_kernel(requested, "the fused KDA chunk kernel needs gfx950 (MI355X)")
        if requested == "auto":
            return "fused" if fused else "triton"
        return requested
    if requested == "fused":
        _refuse_kernel(requested, f"it is ROCm's kernel; {gpu} runs CUDA")
    if not (full_rank_gate or safe_gate):
        # Kimi-Linear's layer class has one prefill path and no checkpoint export.
        if requested in ("flashkda", "flashinfer"):
            _refuse_kernel(requested, "the layer has no full-rank or safe gate (Kimi-Linear's KDA)")
        return "triton"
    layer_ok = gate_lower_bound is not None and head_dim == 128
    flashkda = layer_ok and device.capability[0] in FLASHKDA_SM_MAJORS
    if requested == "flashinfer":
        _refuse_kernel(
            requested,
            "FlashInfer's KDA prefill needs a bf16 recurrent state (Kimi-K3 keeps fp32), "
            "SM 100 or 103, head_dim=128 and a bounded gate",
        )
    if requested == "flashkda" and not flashkda:
        _refuse_kernel(
            requested,
            f"it needs SM 9x/10x/12x ({gpu} is SM {device.sm}), a bounded gate and head_dim=128",
        )
    if requested == "auto":
        return "flashkda" if flashkda else "triton"
    return requested


FLASHKDA_SM_MAJORS: Final = (9, 10, 12)
"""CUDA capability majors FlashKDA runs on."""
ROCM_FUSED_KDA_CAPABILITY: Final = (9, 5)
"""gfx950 (MI355X), where ROCm's fused KDA chunk kernel runs."""


def _refuse_kernel(requested: str, why: str) -> None:
    raise Refusal(
        "kernel_unsupported",
        f"kda_prefill_backend={requested!r}: {why} ({VLLM_RELEASES_TEXT} refuses it)",
        facts={"kda_prefill_backend": requested},
        hint="use kda_prefill_backend='auto' or 'triton'",
    )


def prefill_checkpoint_blocks(kda_prefill_backend: str) -> int:
    """Blocks a KDA group holds per request for the prefill's internal state checkpoint
    (``num_prefill_checkpoint_blocks``): one with FlashKDA or ROCm's fused kernel (which
    export their chunk states), none otherwise."""
    return int(kda_prefill_backend in ("flashkda", "fused"))


def mamba_block_tokens(mode: MambaCacheMode, block: int, max_model_len: int) -> int:
    """Tokens one KDA block covers (vLLM's ``mamba_block_size``): the stage's block in
    ``align`` mode (a state checkpoint per block), the whole request in ``none`` mode."""
    return block if mode == "align" else max_model_len


def unaligned_block_tokens(requested: int | None, release: VllmRelease) -> int:
    """The block of a pipeline stage whose worker holds no attention layer: it finds no
    attention backend to align to, so its block stays the requested one, else the release's
    default (16 in 0.33, 64 in 0.34; its KDA layers then checkpoint every that many tokens in
    ``align`` mode)."""
    return release.default_block_tokens if requested is None else requested


def state_blocks_per_request(mode: MambaCacheMode, spec_blocks: int, checkpoint: int) -> int:
    """Blocks one request holds in a KDA group: ``2 + spec + checkpoint`` in ``align`` mode
    (the running state, the last block's checkpoint, one per draft token), ``1 + spec`` in
    ``none`` mode."""
    if mode == "align":
        return 2 + spec_blocks + checkpoint
    return 1 + spec_blocks


def speculative_model(model: HybridModel, deployment: Deployment) -> HybridModel:
    """The model vLLM builds for ``deployment.speculative_method`` (``None``: the model's own
    drafter). ``ngram`` builds no draft model (the draft layers are dropped); ``mtp`` needs
    the checkpoint's MTP modules (:func:`check_mtp_depth`, refused without any); ``dspark``
    needs a DSpark draft. A method other than the model's draft is refused
    (``draft_unsupported``) naming both."""
    method = deployment.speculative_method or model.drafter
    if method is None or deployment.spec_tokens == 0:
        return model
    if method == "ngram":
        return model.without_draft()
    if model.drafter not in (None, method):
        raise Refusal(
            "draft_unsupported",
            f"speculative method {method!r}, but model {model.name}'s draft is "
            f"{model.drafter!r}: {VLLM_RELEASES_TEXT} builds {method} from "
            + ("the checkpoint's MTP modules" if method == "mtp" else "a DSpark draft model"),
            facts={"speculative_method": method, "drafter": model.drafter},
            hint=f"use speculative_method={model.drafter!r} (or leave it unset), or ngram",
        )
    if method == "mtp":
        check_mtp_served(model, release_of(deployment))
        check_mtp_depth(len(model.draft_layers), deployment.spec_tokens)
    elif not model.draft_layers:
        raise Refusal(
            "draft_unsupported",
            f"speculative method 'dspark' with spec_tokens={deployment.spec_tokens}, but model "
            f"{model.name} has no DSpark draft: {VLLM_RELEASES_TEXT} needs the draft model",
            facts={"speculative_method": method, "drafter": None},
            hint="load the draft (load_config(..., draft=) or --draft PATH), or use ngram",
        )
    return model


def check_mtp_served(model: HybridModel, release: VllmRelease) -> None:
    """Refuse (``draft_unsupported``) MTP on a model type whose MTP modules the release does
    not build (``VllmRelease.mtp_unserved``: Kimi-Linear, refused by 0.33 when it reads the
    speculative config and by 0.34 when it loads the draft), with that release's reason."""
    why = release.mtp_unserved.get(model.model_type)
    if why is not None:
        raise Refusal(
            "draft_unsupported",
            f"speculative method 'mtp' on {model.name} (model_type {model.model_type}): vLLM "
            f"{release.version} does not serve it: {why}",
            facts={
                "speculative_method": "mtp",
                "model_type": model.model_type,
                "engine_version": release.version,
            },
            hint="use speculative_method='ngram', or spec_tokens=0",
        )


def check_mtp_depth(num_modules: int, spec_tokens: int) -> None:
    """Refuse a speculative depth MTP modules cannot serve: (``draft_unsupported``) MTP asked
    of a checkpoint with no MTP module (``num_nextn_predict_layers`` 0 or absent), which
    vLLM's ``SpeculativeConfig`` fails on at start-up (it divides the depth by the module
    count); (``spec_tokens``) above ``num_modules`` a depth that is not a multiple of it, as
    ``SpeculativeConfig`` requires (it reuses the modules in turn)."""
    expect_int("num_modules", num_modules)
    expect_int("spec_tokens", spec_tokens)
    if num_modules == 0 and spec_tokens > 0:
        raise Refusal(
            "draft_unsupported",
            f"speculative method 'mtp' with spec_tokens={spec_tokens}, but the checkpoint has "
            "no MTP module (num_nextn_predict_layers is 0 or absent): vLLM "
            f"{VLLM_RELEASES_TEXT}'s SpeculativeConfig fails at start-up (it divides the depth by "
            "the module count; GLM-5.3-Flash's config override reads the absent field)",
            facts={"spec_tokens": spec_tokens, "mtp_modules": 0, "drafter": "mtp"},
            hint="use a checkpoint with MTP modules, a DSpark draft (method 'dspark' with "
            "its draft model), or spec_tokens=0",
        )
    expect_positive("num_modules", num_modules)
    if spec_tokens > num_modules and spec_tokens % num_modules:
        lower = spec_tokens - spec_tokens % num_modules
        raise Refusal(
            "spec_tokens",
            f"spec_tokens={spec_tokens} must be at most the {num_modules} MTP modules or a "
            f"multiple of them ({VLLM_RELEASES_TEXT} reuses the modules in turn)",
            facts={"spec_tokens": spec_tokens, "mtp_modules": num_modules},
            hint=f"use spec_tokens <= {num_modules} or a multiple of {num_modules}, e.g. "
            f"{lower or num_modules}",
        )


def replay_boundary(
    prompt_tokens: int,
    block: int,
    *,
    drop_trailing_block: bool = False,
    hash_lookahead_tokens: int = 0,
) -> int:
    """The one prefix boundary whose KDA state vLLM keeps for a prompt in ``align`` mode (its
    default ``prefix_cache_retention_interval=0``), and so the longest prefix a later request
    can resume from: the last block boundary before the prompt's last token, ``floor((N - 1) /
    B) * B``; one block earlier, ``floor(N / B) * B - B``, with the trailing-block drop (an
    EAGLE / MTP drafter with a KV connector configured). A drafter that hashes ``h > 1``
    lookahead tokens (EAGLE / MTP without a connector) leaves ``h`` tokens, not one.
    ``max_num_batched_tokens`` and the KDA prefill kernel do not move it. 0: no state kept.

    >>> replay_boundary(9415, 1536), replay_boundary(9415, 1536, drop_trailing_block=True)
    (9216, 7680)
    >>> replay_boundary(9216, 1536)  # a resend recomputes the last token
    7680
    """
    expect_positive("prompt_tokens", prompt_tokens)
    expect_positive("block", block)
    expect_args(
        ("drop_trailing_block", drop_trailing_block, bool),
        ("hash_lookahead_tokens", hash_lookahead_tokens, int),
    )
    if drop_trailing_block:
        return max(prompt_tokens // block * block - block, 0)
    return max(prompt_tokens - max(1, hash_lookahead_tokens), 0) // block * block


def restored_prefix(
    prompt_tokens: int, block: int, chunk: int, *, drop_trailing_block: bool = False
) -> int:
    """Tokens a tier restores for a resent prompt: its replay boundary when that boundary lies
    on the offload chunk grid (a chunk of ``chunk`` tokens stores the state at its end), else
    0. Seed 000's 9,415-token prompt at block 1,536: 9,216, or 7,680 with the drop (what its
    probe restored)."""
    boundary = replay_boundary(prompt_tokens, block, drop_trailing_block=drop_trailing_block)
    return boundary if boundary % expect_positive("chunk", chunk) == 0 else 0


def recommended_max_num_batched_tokens(prompt_tokens: Sequence[int], block: int) -> int:
    """A ``max_num_batched_tokens`` for a prompt mix: the 90th-percentile prompt rounded up
    to whole blocks (so most prompts prefill in one pass and every chunk end lies on a block
    boundary, where a state can be written), at least one block. Under vLLM's default
    retention it does not change what a tier restores (:func:`replay_boundary`)."""
    expect_items("prompt_tokens", prompt_tokens, int)
    lengths = sorted(prompt_tokens)
    if not lengths or lengths[0] < 1 or block < 1:
        raise Refusal(
            "invalid_argument",
            "prompt_tokens must be a non-empty list of positive lengths and block >= 1",
            facts={"num_prompts": len(lengths), "block": block},
            hint="pass the prompt lengths of the mix and the plan's block",
        )
    p90 = lengths[min(len(lengths) - 1, (9 * len(lengths)) // 10)]
    return max(block, -(-p90 // block) * block)


__all__ = [
    "ATTENTION_BACKENDS",
    "DEFAULT_MAX_MODEL_LEN",
    "DENSE_ATTENTION_BACKENDS",
    "KDA_PREFILL_BACKENDS",
    "KV_CACHE_LAYOUTS",
    "MAMBA_CACHE_MODES",
    "SPARSE_ATTENTION_BACKENDS",
    "VLLM_VERSION",
    "AttentionBackend",
    "KdaPrefillBackend",
    "KvCacheLayout",
    "MambaCacheMode",
    "aligned_block_tokens",
    "backend_of",
    "check_backend_runs",
    "check_block_supported",
    "check_dense_backend",
    "check_kv_dtype",
    "check_layout_serves",
    "check_mtp_depth",
    "check_mtp_served",
    "default_attention_backend",
    "kernel_block_tokens",
    "mamba_block_tokens",
    "preferred_block_tokens",
    "prefill_checkpoint_blocks",
    "recommended_max_num_batched_tokens",
    "replay_boundary",
    "resolved_kda_prefill_backend",
    "resolved_mamba_cache_mode",
    "restored_prefix",
    "runs_on",
    "smallest_kernel_block",
    "speculative_model",
    "state_blocks_per_request",
    "supports_block",
    "unaligned_block_tokens",
]
