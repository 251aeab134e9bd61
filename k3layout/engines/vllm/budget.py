"""vLLM's KV budget: ``--gpu-memory-utilization`` of the GPU less what the worker measures
(weights, the profile run's activation peak, memory outside torch, CUDA graphs), or
``--kv-cache-memory-bytes`` as given.

The rule is ``Worker.determine_available_memory``'s: ``ceil(total x util) - weights -
activation peak - non-torch growth - CUDA graph estimate`` (``request_memory`` takes the ceiling
of the float product); with ``--kv-cache-memory-bytes`` the budget is that figure, which vLLM
does not check against the GPU (k3layout does). ``tests/conformance/test_conformance_budget.py``
runs vLLM's own worker code on the same figures. The profile run covers
:data:`MAX_NUM_BATCHED_TOKENS` tokens and :data:`MAX_NUM_SEQS` sequences, the scheduler limits
vLLM resolves for these models by default.

vLLM 0.34's **extensible KV cache** (on by default unless ``--kv-cache-memory-bytes`` is given;
``Deployment.extensible_kv_cache``) changes three things: the default utilization is 1.0, no
CUDA-graph estimate is reserved before the cache is sized (``kv_reserved_bytes``, vLLM's cap),
and after warm-up the worker shrinks the cache to what it measured
(``measure_kv_cache_bytes``): the requested share less everything the engine holds, but never
closer to the GPU's end than a margin of ``max(1 GiB, 0.75 x activation peak)`` beyond the
memory in use at start-up, less the activation peak kept free. That size, an estimate from
k3layout's reserve terms, is ``kv_memory_bytes``.
"""

from __future__ import annotations

import math
from typing import Final

from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import GPUS
from ...memory import BudgetRule, MemoryBudget, checked, gpu_total, source_of
from ...memory.estimates import activation_peak, cuda_graphs, given, non_torch, startup
from ...memory.records import GIB, ReserveTerm
from ...memory.rule import within_default
from ...model import HybridModel
from .releases import VllmRelease, release_of

GPU_MEMORY_UTILIZATION: Final = 0.92
"""vLLM's ``--gpu-memory-utilization`` without the extensible KV cache (0.33's default)."""

MAX_NUM_BATCHED_TOKENS: Final = 2048
"""The tokens of vLLM's profile run by default (its scheduler's max_num_batched_tokens)."""

MAX_NUM_SEQS: Final = 128
"""The sequences of its dummy sampler run by default (the scheduler's max_num_seqs)."""

WARMUP_MARGIN_FLOOR: Final = GIB
"""The least an extensible cache leaves free after warm-up on CUDA
(``KV_CACHE_MARGIN_FLOOR_BYTES``)."""

WARMUP_MARGIN_FLOOR_ROCM: Final = 3 * GIB
"""The same on ROCm, where kernel scratch is mapped outside the allocator."""

WARMUP_MARGIN_FRACTION: Final = 0.75
"""The margin's share of the transient peak (``KV_CACHE_MARGIN_FRACTION``)."""


def extensible(deployment: Deployment, release: VllmRelease) -> bool:
    """Whether the extensible KV cache is on: the deployment's switch, else the release's
    default (on where the release has it, unless ``kv_memory_bytes`` is given). Refuses
    (``invalid_argument``) the switch on a release without it, and turning it on beside
    ``kv_memory_bytes``, as vLLM 0.34 refuses it (the given budget overrides the measure)."""
    wanted = deployment.extensible_kv_cache
    if wanted is not None and not release.extensible_kv_cache:
        raise Refusal(
            "invalid_argument",
            f"extensible_kv_cache={wanted}: vLLM {release.version} has no extensible KV cache "
            "(vLLM 0.34.0 brought it)",
            facts={
                "field": "extensible_kv_cache",
                "engine_version": release.version,
                "allowed": ("unset",),
            },
            hint="leave extensible_kv_cache unset, or plan engine_version='0.34.0'",
        )
    if wanted and deployment.kv_memory_bytes is not None:
        raise Refusal(
            "invalid_argument",
            f"extensible_kv_cache=True with kv_memory_bytes={deployment.kv_memory_bytes}: vLLM "
            f"{release.version} refuses it (the extensible cache sizes itself from measured "
            "memory, which --kv-cache-memory-bytes overrides)",
            facts={
                "field": "extensible_kv_cache",
                "kv_memory_bytes": deployment.kv_memory_bytes,
                "allowed": ("unset", "False"),
            },
            hint="leave extensible_kv_cache unset (off with kv_memory_bytes), or drop "
            "kv_memory_bytes",
        )
    if wanted is not None:
        return wanted
    return release.extensible_kv_cache and deployment.kv_memory_bytes is None


def _reserve(
    model: HybridModel, deployment: Deployment, graphs_first: bool
) -> tuple[ReserveTerm, ...]:
    """The reserve terms; ``graphs_first``: the CUDA-graph estimate is taken before the cache
    is sized (without the extensible cache), else measured after warm-up."""
    graphs = cuda_graphs()
    if not graphs_first:
        graphs = graphs.model_copy(
            update={"derivation": f"{graphs.derivation}, measured after warm-up"}
        )
    return given(deployment) or (
        activation_peak(model, deployment, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS),
        graphs,
        non_torch(deployment),
    )


def _warmup_margin(
    deployment: Deployment, reserve: tuple[ReserveTerm, ...], total: int, requested: int
) -> ReserveTerm:
    """What the extensible cache leaves free beyond the requested share's end: the margin
    ``max(floor, 0.75 x activation peak)`` beyond the memory in use at start-up, less what the
    share already leaves (``total - requested``), never below 0."""
    peak = sum(term.bytes for term in reserve if term.name == "activation_peak")
    rocm = GPUS[deployment.gpu].vendor == "amd"
    floor = WARMUP_MARGIN_FLOOR_ROCM if rocm else WARMUP_MARGIN_FLOOR
    margin = max(floor, int(peak * WARMUP_MARGIN_FRACTION))
    at_start = startup(deployment)
    kept = max(0, margin + at_start.bytes - (total - requested))
    return ReserveTerm(
        name="warmup_margin",
        bytes=kept,
        derivation=f"max({floor // GIB} GiB, 0.75 x activation peak) + start-up "
        f"{at_start.bytes / GIB:.2f} GiB - (GPU - requested share), at least 0 (estimate)",
    )


def _budget(
    model: HybridModel,
    deployment: Deployment,
    weights: int,
    kv_bytes: int | None,
    source: str,
) -> MemoryBudget:
    total = gpu_total(deployment)
    release = release_of(deployment)
    grows = extensible(deployment, release) and kv_bytes is None
    reserve = _reserve(model, deployment, graphs_first=not grows)
    if kv_bytes is not None:
        return checked(
            MemoryBudget(
                engine="vllm",
                gpu=deployment.gpu,
                gpu_memory_bytes=total,
                memory_flag=("--kv-cache-memory-bytes", str(kv_bytes)),
                flag_source=source,
                weights_bytes=weights,
                reserve=reserve,
                kv_memory_bytes=kv_bytes,
                rule="the KV budget as given (vLLM does not check it against the GPU)",
            )
        )
    util = deployment.gpu_memory_utilization
    default = release.extensible_utilization if grows else release.default_utilization
    fraction = default if util is None else util
    requested = math.ceil(total * fraction)
    kept = requested - weights - sum(term.bytes for term in reserve)
    sized: int | None = None  # what an extensible cache is sized to before warm-up
    rule = f"ceil(GPU x {fraction:g}) - weights - reserve"
    source = f"vLLM {release.version}'s default"
    if grows:
        if deployment.reserve_bytes is not None:  # the user's figure: all beside the KV
            margin = ReserveTerm(name="warmup_margin", bytes=0, derivation="in the reserve given")
            graphs = 0
        else:
            margin = _warmup_margin(deployment, reserve, total, requested)
            graphs = sum(term.bytes for term in reserve if term.name == "cuda_graphs")
        reserve, sized, kept = (*reserve, margin), kept + graphs, kept - margin.bytes
        source += " with the extensible KV cache"
        rule += (
            f" (vLLM {release.version}'s extensible KV cache: sized before warm-up without the "
            "CUDA graphs, then shrunk to what the worker measures)"
        )
    return checked(
        MemoryBudget(
            engine="vllm",
            gpu=deployment.gpu,
            gpu_memory_bytes=total,
            memory_flag=("--gpu-memory-utilization", f"{fraction:g}"),
            flag_source=source_of(util, source),
            weights_bytes=weights,
            reserve=reserve,
            kv_memory_bytes=kept,
            kv_reserved_bytes=sized,
            rule=rule,
        )
    )


def vllm_budget(model: HybridModel, deployment: Deployment, weights: int) -> MemoryBudget:
    """The KV budget of ``deployment``'s memory flag (module docstring)."""
    return _budget(model, deployment, weights, deployment.kv_memory_bytes, "given")


def vllm_least(
    model: HybridModel, deployment: Deployment, weights: int, kv_bytes: int
) -> MemoryBudget:
    """``--kv-cache-memory-bytes kv_bytes``, refused (``memory_exceeded``) beyond what the
    default utilization leaves for the KV."""
    within_default(_budget(model, deployment, weights, None, ""), kv_bytes)
    return _budget(model, deployment, weights, kv_bytes, "the least that holds the workload")


VLLM_BUDGET = BudgetRule(budget=vllm_budget, least=vllm_least)
