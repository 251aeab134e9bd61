"""vLLM 0.33's sparse MLA backends and its DSA indexer and tail-ring backends: the rules that
size and place an indexed model's cache (GLM-5.3-Flash), read off vLLM by running its code
(``tests/conformance/test_conformance_glm.py`` runs it again).

- **Selection** (``CudaPlatform`` priorities, every backend's ``validate_configuration``):
  on SM 9x ``FLASHINFER_MLA_SPARSE_SM90`` for an fp8 or bf16 cache without DCP, else
  ``FLASHMLA_SPARSE`` (bf16 or ``fp8_ds_mla``; it refuses a plain fp8 cache of head 512); on
  SM 10x ``FLASHINFER_MLA_SPARSE`` (fp8 or bf16; ``fp8_ds_mla`` refused). Other GPUs have none.
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
from typing import Final, Literal, TypeAlias

from ...cache import DSAIndexer
from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import GPUS
from ...model import HybridModel
from ...settings import KvCacheLayout
from .rules import VLLM_VERSION

SparseBackend: TypeAlias = Literal[
    "FLASHINFER_MLA_SPARSE_SM90", "FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"
]
"""vLLM's sparse MLA backends that take a NoPE head of 512 (an indexed MLA layer's latent)."""

SPARSE_KERNEL_BLOCK: Final[dict[SparseBackend, int]] = {
    "FLASHINFER_MLA_SPARSE_SM90": 64,
    "FLASHMLA_SPARSE": 64,
    "FLASHINFER_MLA_SPARSE": 32,
}
"""Each sparse backend's kernel block (``MultipleOf``): a block is a whole number of them."""

SPARSE_HEAD_SIZES: Final = (512,)
"""The MLA head (``kv_lora_rank + qk_rope_head_dim``) k3layout plans vLLM's sparse backends
for: a NoPE latent of 512 (each backend's ``get_supported_head_sizes`` also lists 576,
DeepSeek-V3.2's RoPE head, which no indexed hybrid here has)."""

INDEXER_KERNEL_ENTRIES: Final = (32, 64)
"""Pooled entries one paged-MQA kernel page holds (DeepGEMM's page sizes on SM 9x / 10x)."""


def sparse_backend_of(deployment: Deployment) -> SparseBackend:
    """The sparse MLA backend vLLM 0.33 selects for an indexed layer of head 512; refuses
    (``kernel_unsupported``) a deployment it finds none for, with vLLM's reasons, and
    (``kernel_unsupported``) an explicit dense ``attention_backend``."""
    chosen = deployment.attention_backend
    if chosen is not None:
        raise Refusal(
            "kernel_unsupported",
            f"attention_backend={chosen!r} is a dense MLA backend; vLLM {VLLM_VERSION} serves "
            "an indexed (DSA) MLA layer only with its sparse backends (the dense ones say "
            "'sparse not supported')",
            facts={"attention_backend": chosen, "field": "attention_backend"},
            hint="leave attention_backend unset: vLLM picks its sparse backend for the GPU",
        )
    device = GPUS[deployment.gpu]
    dtype, dcp = deployment.kv_dtype, deployment.dcp
    major = device.capability[0] if device.vendor == "nvidia" else None
    if major == 9:
        if dtype == "fp8_ds_mla" or (dcp > 1 and dtype == "bf16"):
            return "FLASHMLA_SPARSE"
        if dcp == 1:
            return "FLASHINFER_MLA_SPARSE_SM90"
        raise _refused(
            deployment,
            "FLASHINFER_MLA_SPARSE_SM90: DCP not supported; FLASHMLA_SPARSE: head_size 512 "
            "only with a bf16 or fp8_ds_mla cache on SM90",
            "use kv_dtype='bf16' or 'fp8_ds_mla' with DCP, or dcp=1",
        )
    if major == 10:
        if dtype != "fp8_ds_mla":
            return "FLASHINFER_MLA_SPARSE"
        raise _refused(
            deployment,
            "FLASHINFER_MLA_SPARSE: SM10 does not support the fp8_ds_mla cache; "
            "FLASHMLA_SPARSE: head_size 512 only on SM90",
            "use kv_dtype='fp8' or 'bf16' on SM 10x",
        )
    raise _refused(
        deployment,
        "its sparse MLA backends for a NoPE head of 512 run on SM 9x and 10x (k3layout has "
        "not followed ROCm's)",
        "plan an H100/H200 (SM90) or B200/GB200 (SM100)",
    )


def _refused(deployment: Deployment, why: str, hint: str) -> Refusal:
    return Refusal(
        "kernel_unsupported",
        f"no sparse MLA backend of vLLM {VLLM_VERSION} takes kv_dtype={deployment.kv_dtype!r} "
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
    heads = sorted({layer.latent_dim for layer in model.mla_layers if layer.indexer is not None})
    odd = next((head for head in heads if head not in SPARSE_HEAD_SIZES), None)
    if odd is not None:
        raise Refusal(
            "kernel_unsupported",
            f"an indexed MLA layer's head of {odd} (kv_lora_rank + qk_rope_head_dim): vLLM "
            f"{VLLM_VERSION}'s sparse MLA backends take a head of 512 or 576 ({backend}'s "
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
            f"block: vLLM {VLLM_VERSION}'s selector finds no valid attention backend for it",
            facts={"block_tokens": requested, "attention_backend": backend, "kernel": kernel},
            hint=f"request a multiple of {kernel} (e.g. {kernel * -(-requested // kernel)}), "
            "or leave block_tokens unset",
        )
    if deployment.kv_cache_layout == "LBNHC":
        raise Refusal(
            "layout_unsupported",
            f"kv_cache_layout='LBNHC': the tail ring's backend (KPOOL_TAIL) takes only BLHNC, so "
            f"vLLM {VLLM_VERSION} finds no layout every backend supports",
            facts={"kv_cache_layout": "LBNHC", "field": "kv_cache_layout"},
            hint="leave kv_cache_layout unset (vLLM resolves BLHNC) or set BLHNC",
        )
    if indexer.kpool < 2:
        raise Refusal(
            "invalid_config",
            f"index_kpool={indexer.kpool}: vLLM {VLLM_VERSION}'s indexer key cache and tail "
            "ring assert index_kpool > 1",
            facts={"field": "index_kpool", "index_kpool": indexer.kpool},
            hint="use a checkpoint whose index_kpool is at least 2",
        )
    if not indexer.always_select_tail:
        raise Refusal(
            "invalid_config",
            f"index_kpool_always_select_tail=False: vLLM {VLLM_VERSION}'s GLM-5.3 sparse "
            "indexer requires it (NotImplementedError at start-up)",
            facts={"field": "index_kpool_always_select_tail"},
            hint="use a checkpoint with index_kpool_always_select_tail=true",
        )
