"""vLLM 0.33's KV budget: ``--gpu-memory-utilization`` of the GPU less what the worker measures
(weights, the profile run's activation peak, memory outside torch, CUDA graphs), or
``--kv-cache-memory-bytes`` as given.

The rule is ``Worker.determine_available_memory``'s: ``ceil(total x util) - weights -
activation peak - non-torch growth - CUDA graph estimate`` (``request_memory`` takes the ceiling
of the float product); with ``--kv-cache-memory-bytes`` the budget is that figure, which vLLM
does not check against the GPU (k3layout does). ``tests/conformance/test_conformance_budget.py``
runs vLLM's own worker code on the same figures. The profile run covers
:data:`MAX_NUM_BATCHED_TOKENS` tokens and :data:`MAX_NUM_SEQS` sequences, the scheduler limits
vLLM 0.33 resolves for these models by default.
"""

from __future__ import annotations

import math
from typing import Final

from ...deployment import Deployment
from ...memory import BudgetRule, MemoryBudget, checked, gpu_total, source_of
from ...memory.estimates import activation_peak, cuda_graphs, given, non_torch
from ...memory.records import ReserveTerm
from ...memory.rule import within_default
from ...model import HybridModel

GPU_MEMORY_UTILIZATION: Final = 0.92
"""vLLM 0.33's default ``--gpu-memory-utilization`` (``CacheConfig``)."""

MAX_NUM_BATCHED_TOKENS: Final = 2048
"""The tokens of vLLM 0.33's profile run by default (its scheduler's max_num_batched_tokens)."""

MAX_NUM_SEQS: Final = 128
"""The sequences of its dummy sampler run by default (the scheduler's max_num_seqs)."""


def _reserve(model: HybridModel, deployment: Deployment) -> tuple[ReserveTerm, ...]:
    return given(deployment) or (
        activation_peak(model, deployment, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS),
        cuda_graphs(),
        non_torch(deployment),
    )


def _budget(
    model: HybridModel,
    deployment: Deployment,
    weights: int,
    kv_bytes: int | None,
    source: str,
) -> MemoryBudget:
    total = gpu_total(deployment)
    reserve = _reserve(model, deployment)
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
    fraction = GPU_MEMORY_UTILIZATION if util is None else util
    requested = math.ceil(total * fraction)
    spent = weights + sum(term.bytes for term in reserve)
    return checked(
        MemoryBudget(
            engine="vllm",
            gpu=deployment.gpu,
            gpu_memory_bytes=total,
            memory_flag=("--gpu-memory-utilization", f"{fraction:g}"),
            flag_source=source_of(util, "vLLM 0.33's default"),
            weights_bytes=weights,
            reserve=reserve,
            kv_memory_bytes=requested - spent,
            rule=f"ceil(GPU x {fraction:g}) - weights - reserve",
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
