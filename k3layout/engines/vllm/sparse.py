"""vLLM's sparse MLA backends and its DSA indexer and tail-ring backends: the rules that size
and place an indexed model's cache (GLM-5.3-Flash), read off vLLM 0.33.0 and 0.34.0 by running
their code (``tests/conformance/test_conformance_glm.py`` and
``test_conformance_glm_backends.py`` run it again).

- **Selection** (``CudaPlatform`` priorities, every backend's ``validate_configuration``;
  :data:`SPARSE_RULES`): on SM 9x ``FLASHINFER_MLA_SPARSE_SM90`` for an fp8 or bf16 cache
  without DCP, else ``FLASHMLA_SPARSE`` (bf16 or ``fp8_ds_mla``; it refuses a plain fp8 cache
  of head 512); on SM 10x ``FLASHINFER_MLA_SPARSE`` (fp8 or bf16; ``fp8_ds_mla`` refused).
  Other GPUs have none. ``--attention-backend`` names one of them, which vLLM takes under the
  same rules or refuses ("not valid for this configuration"); a dense backend is refused
  ("sparse not supported").
- **Kernel blocks**: the indexer's paged-MQA kernel reads 32 or 64 pooled entries
  (``index_kpool * (32, 64)`` tokens), the first backend in layer order, so it sets the
  alignment ``A``; the tail ring takes any block; the sparse MLA kernels 64 (SM 9x) or 32
  (SM 10x) tokens.
- **Block stride alignment** (``customize_spec``): each cache's blocks must start whole kernel
  pages apart: one latent row (``FLASHINFER_MLA_SPARSE_SM90``, ``FLASHMLA_SPARSE`` bf16), 32
  rows (``FLASHINFER_MLA_SPARSE``), a 64-token page when the block spans several
  (``FLASHMLA_SPARSE`` quantized, off SM 10x); the indexer a ``64 * kpool``-token page when the
  block spans several.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, TypeAlias

from ...cache import DSAIndexer
from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import GPU_NAMES
from ...model import HybridModel
from ...settings import SPARSE_ATTENTION_BACKENDS, KvCacheLayout, SparseAttentionBackend
from .releases import release_of
from .rules import KERNEL_BLOCK_TOKENS, runs_on

SparseBackend: TypeAlias = SparseAttentionBackend
"""vLLM's sparse MLA backends that take a NoPE head of 512 (an indexed MLA layer's latent)."""

SPARSE_KERNEL_BLOCK: Final[dict[SparseBackend, int]] = {
    backend: KERNEL_BLOCK_TOKENS[backend][0] for backend in SPARSE_ATTENTION_BACKENDS
}
"""Each sparse backend's kernel block (``MultipleOf``): a block is a whole number of them."""

SPARSE_HEAD_SIZES: Final = (512,)
"""The MLA head (``kv_lora_rank + qk_rope_head_dim``) k3layout plans vLLM's sparse backends
for: a NoPE latent of 512 (each backend's ``get_supported_head_sizes`` also lists 576,
DeepSeek-V3.2's RoPE head, which no indexed hybrid here has)."""

INDEXER_KERNEL_ENTRIES: Final = (32, 64)
"""Pooled entries one paged-MQA kernel page holds (DeepGEMM's page sizes on SM 9x / 10x)."""


@dataclass(frozen=True)
class SparseRule:
    """What one sparse backend's ``validate_configuration`` takes for a NoPE head of 512: the
    cache dtypes (k3layout's names), whether DCP > 1, and the reason vLLM gives for a cache
    dtype it refuses. Its GPUs are :data:`~.rules.BACKEND_SM_MAJORS`."""

    kv_dtypes: tuple[str, ...]
    dcp: bool
    dtype_reason: str


SPARSE_RULES: Final[dict[SparseBackend, SparseRule]] = {
    "FLASHINFER_MLA_SPARSE_SM90": SparseRule(
        ("fp8", "bf16"), False, "kv_cache_dtype not supported"
    ),
    "FLASHMLA_SPARSE": SparseRule(
        ("bf16", "fp8_ds_mla"),
        True,
        "head_size 512 only with a bf16 or fp8_ds_mla cache on SM90 (NoPE)",
    ),
    "FLASHINFER_MLA_SPARSE": SparseRule(
        ("fp8", "bf16"), True, "SM10 does not support the fp8_ds_mla cache"
    ),
}
"""Each sparse backend's rules, read off vLLM 0.33.0 and 0.34.0 by running their selector
(``tests/conformance/test_conformance_glm_backends.py`` runs it again for every backend and
cache dtype); the order is CUDA's priority order (the first that validates is vLLM's pick)."""


def sparse_reasons(backend: SparseBackend, deployment: Deployment) -> tuple[str, ...]:
    """Why vLLM's selector refuses ``backend`` for an indexed layer of head 512 under
    ``deployment`` (its GPU, cache dtype and DCP), in vLLM's words; empty: it takes it."""
    rule = SPARSE_RULES[backend]
    reasons: list[str] = []
    if not runs_on(backend, deployment.gpu):
        reasons.append("compute capability not supported")
    if deployment.kv_dtype not in rule.kv_dtypes:
        reasons.append(rule.dtype_reason)
    if deployment.dcp > 1 and not rule.dcp:
        reasons.append("DCP not supported")
    return tuple(reasons)


def serving_backends(deployment: Deployment) -> tuple[SparseBackend, ...]:
    """The sparse backends vLLM's selector takes for ``deployment``, in its priority order
    (the first is its own pick)."""
    return tuple(b for b in SPARSE_RULES if not sparse_reasons(b, deployment))


def sparse_backend_of(deployment: Deployment) -> SparseBackend:
    """The sparse MLA backend vLLM selects for an indexed layer of head 512: the deployment's
    ``attention_backend`` where it names one vLLM takes, else the first of CUDA's priorities
    that takes the GPU, cache dtype and DCP. Refuses (``kernel_unsupported``) an explicit
    dense backend, an explicit sparse one vLLM refuses, and a deployment vLLM finds none for,
    each with vLLM's reasons and what would work."""
    chosen = deployment.attention_backend
    version = release_of(deployment).version
    named = next((b for b in SPARSE_RULES if b == chosen), None)
    if chosen is not None and named is None:
        raise Refusal(
            "kernel_unsupported",
            f"attention_backend={chosen!r} is a dense MLA backend; vLLM {version} serves "
            "an indexed (DSA) MLA layer only with its sparse backends (the dense ones say "
            "'sparse not supported')",
            facts={"attention_backend": chosen, "field": "attention_backend"},
            hint="leave attention_backend unset (vLLM picks its sparse backend for the GPU), "
            f"or name a sparse one ({', '.join(SPARSE_RULES)})",
        )
    if named is not None:
        reasons = sparse_reasons(named, deployment)
        if reasons:
            raise _refused_backend(deployment, named, reasons, version)
        return named
    serving = serving_backends(deployment)
    if serving:
        return serving[0]
    on_gpu = [b for b in SPARSE_RULES if runs_on(b, deployment.gpu)]
    if not on_gpu:
        raise _refused(
            deployment,
            "its sparse MLA backends for a NoPE head of 512 run on SM 9x and 10x (k3layout has "
            "not followed ROCm's)",
            f"plan {_gpus_text(tuple(SPARSE_RULES))}",
            version,
        )
    why = "; ".join(f"{b}: {', '.join(sparse_reasons(b, deployment))}" for b in on_gpu)
    raise _refused(deployment, why, _what_works(deployment, None), version)


def _gpus_text(backends: tuple[SparseBackend, ...]) -> str:
    """The GPUs k3layout knows that ``backends`` run on, in words."""
    names = [g for g in GPU_NAMES if any(runs_on(b, g) for b in backends)]
    runs = "it runs" if len(backends) == 1 else "they run"
    return f"a GPU {runs} on ({', '.join(names)})"


def _what_works(deployment: Deployment, backend: SparseBackend | None) -> str:
    """A hint: what ``backend`` (or any sparse backend) takes on the deployment's GPU, and
    which backend takes the deployment's cache dtype there."""
    options: list[str] = []
    gpu, dtype, dcp = deployment.gpu, deployment.kv_dtype, deployment.dcp
    for candidate in (backend,) if backend is not None else tuple(SPARSE_RULES):
        if not runs_on(candidate, gpu):
            continue
        rule = SPARSE_RULES[candidate]
        dtypes = " or ".join(repr(d) for d in rule.kv_dtypes)
        dcp_text = "" if rule.dcp or dcp == 1 else " and dcp=1"
        options.append(f"kv_dtype={dtypes}{dcp_text} with {candidate}")
    others = [b for b in serving_backends(deployment) if b != backend]
    if others:
        names = " or ".join(repr(other) for other in others)
        options.append(f"attention_backend={names} for kv_dtype={dtype!r} (or leave it unset)")
    if backend is not None and not runs_on(backend, gpu):
        options.append(f"{backend} on {_gpus_text((backend,))}")
    return "use " + ", or ".join(options) if options else "plan a GPU with a sparse backend"


def _refused_backend(
    deployment: Deployment, backend: SparseBackend, reasons: tuple[str, ...], version: str
) -> Refusal:
    """vLLM refuses the named sparse ``backend`` (``Selected backend ... is not valid for this
    configuration``), for ``reasons``."""
    return Refusal(
        "kernel_unsupported",
        f"attention_backend={backend!r} with kv_dtype={deployment.kv_dtype!r}, "
        f"dcp={deployment.dcp} on {deployment.gpu}: vLLM {version}'s selector says it is not "
        f"valid for an indexed MLA layer of head 512 ({'; '.join(reasons)})",
        facts={
            "attention_backend": backend,
            "kv_dtype": deployment.kv_dtype,
            "gpu": deployment.gpu,
            "dcp": deployment.dcp,
            "field": "attention_backend",
        },
        hint=_what_works(deployment, backend),
    )


def _refused(deployment: Deployment, why: str, hint: str, version: str) -> Refusal:
    return Refusal(
        "kernel_unsupported",
        f"no sparse MLA backend of vLLM {version} takes kv_dtype={deployment.kv_dtype!r} "
        f"with dcp={deployment.dcp} on {deployment.gpu} for an indexed MLA layer: {why}",
        facts={
            "gpu": deployment.gpu,
            "kv_dtype": deployment.kv_dtype,
            "dcp": deployment.dcp,
            "field": "kv_dtype",
        },
        hint=hint,
    )


def indexer_alignment_tokens(indexer: DSAIndexer) -> int:
    """``A``'s floor: the indexer's smallest kernel page, in tokens (``32 * index_kpool``)."""
    return INDEXER_KERNEL_ENTRIES[0] * indexer.kpool


def indexed_block_tokens(
    indexer: DSAIndexer,
    backend: SparseBackend,
    requested: int | None,
    state_bytes: int,
    latent_bytes_per_token: int,
) -> int:
    """vLLM's block for an indexed hybrid: ``A = max(32 * kpool, requested, 128)``; the
    smallest multiple of ``A`` whose latent page holds one KDA state, rounded up to the lcm
    of every backend's smallest kernel block (``latent_bytes_per_token``: the latent's
    elements times the cache dtype's bytes, as vLLM counts it; the pooled keys and
    ``fp8_ds_mla``'s scales are not counted)."""
    floor = indexer_alignment_tokens(indexer)
    align = max(floor, requested or 0, 128)
    raised = align * max(1, -(-state_bytes // (align * latent_bytes_per_token)))
    unit = math.lcm(floor, SPARSE_KERNEL_BLOCK[backend])
    return unit * -(-raised // unit)


def latent_alignment_bytes(
    backend: SparseBackend, block: int, row_bytes: int, quantized: bool, sm_major: int
) -> int:
    """The latent cache's block stride alignment (bytes) under ``backend``."""
    if backend == "FLASHINFER_MLA_SPARSE":
        return SPARSE_KERNEL_BLOCK[backend] * row_bytes
    if backend == "FLASHMLA_SPARSE" and quantized and sm_major != 10:
        kernel = math.gcd(SPARSE_KERNEL_BLOCK[backend], block)
        return 1 if kernel == block else kernel * row_bytes
    return row_bytes


def indexer_alignment_bytes(indexer: DSAIndexer, block: int) -> int:
    """The key cache's block stride alignment: a ``64 * kpool``-token kernel page when the
    block spans several (1 when the block is within one)."""
    kernel = math.gcd(INDEXER_KERNEL_ENTRIES[-1] * indexer.kpool, block)
    return 1 if kernel == block else kernel // indexer.kpool * indexer.entry_bytes


def resolved_kv_cache_layout(deployment: Deployment, model: HybridModel) -> KvCacheLayout:
    """The layout vLLM runs: ``VLLM_KV_CACHE_LAYOUT`` where set, else what it resolves from
    its backends: ``BLHNC`` when an indexed layer's tail ring (whose backend takes only
    ``BLHNC``) is planned, ``LBNHC`` otherwise."""
    if deployment.kv_cache_layout is not None:
        return deployment.kv_cache_layout
    return "BLHNC" if model.indexer is not None else "LBNHC"


def check_indexed(model: HybridModel, deployment: Deployment, indexer: DSAIndexer) -> None:
    """What vLLM 0.33 refuses of an indexed hybrid before planning it: no sparse backend
    (:func:`sparse_backend_of`), a layer-outermost layout (the tail ring's backend takes only
    BLHNC), a key pool of one token (its indexer caches assert ``index_kpool > 1``), an
    indexer that does not always attend its tail pool (``NotImplementedError``), a requested
    block the sparse backend's kernels do not take (its selector finds no backend)."""
    backend = sparse_backend_of(deployment)
    version = release_of(deployment).version
    heads = sorted({layer.latent_dim for layer in model.mla_layers if layer.indexer is not None})
    odd = next((head for head in heads if head not in SPARSE_HEAD_SIZES), None)
    if odd is not None:
        raise Refusal(
            "kernel_unsupported",
            f"an indexed MLA layer's head of {odd} (kv_lora_rank + qk_rope_head_dim): vLLM "
            f"{version}'s sparse MLA backends take a head of 512 or 576 ({backend}'s "
            "selector finds no valid attention backend for another), and k3layout plans the "
            "NoPE 512",
            facts={"field": "kv_lora_rank", "head_size": odd, "attention_backend": backend},
            hint="plan a checkpoint whose indexed layers have kv_lora_rank 512",
        )
    requested = deployment.block_tokens
    kernel = SPARSE_KERNEL_BLOCK[backend]
    if requested is not None and requested % kernel:
        raise Refusal(
            "block_unsupported",
            f"block_tokens={requested} is not a multiple of {backend}'s {kernel}-token kernel "
            f"block: vLLM {version}'s selector finds no valid attention backend for it",
            facts={"block_tokens": requested, "attention_backend": backend, "kernel": kernel},
            hint=f"request a multiple of {kernel} (e.g. {kernel * -(-requested // kernel)}), "
            "or leave block_tokens unset",
        )
    if deployment.kv_cache_layout == "LBNHC":
        raise Refusal(
            "layout_unsupported",
            f"kv_cache_layout='LBNHC': the tail ring's backend (KPOOL_TAIL) takes only BLHNC, so "
            f"vLLM {version} finds no layout every backend supports",
            facts={"kv_cache_layout": "LBNHC", "field": "kv_cache_layout"},
            hint="leave kv_cache_layout unset (vLLM resolves BLHNC) or set BLHNC",
        )
    if indexer.kpool < 2:
        raise Refusal(
            "invalid_config",
            f"index_kpool={indexer.kpool}: vLLM {version}'s indexer key cache and tail "
            "ring assert index_kpool > 1",
            facts={"field": "index_kpool", "index_kpool": indexer.kpool},
            hint="use a checkpoint whose index_kpool is at least 2",
        )
    if not indexer.always_select_tail:
        raise Refusal(
            "invalid_config",
            f"index_kpool_always_select_tail=False: vLLM {version}'s GLM-5.3 sparse "
            "indexer requires it (NotImplementedError at start-up)",
            facts={"field": "index_kpool_always_select_tail"},
            hint="use a checkpoint with index_kpool_always_select_tail=true",
        )
