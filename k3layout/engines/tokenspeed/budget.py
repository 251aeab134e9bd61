"""tokenspeed's KV budget (#1152's head ``a6ee91b3``; ``main`` has the same rule):
``--gpu-memory-utilization`` of the memory free before the weights load, less the weights.

tokenspeed measures the free memory ``F0`` after its communicators start and ``F1`` after the
weights load, and takes ``F1 - F0 x (1 - util)`` for its cache
(``runtime/layers/attention/utils.py``, ``profile_available_cache_memory_bytes``), that is
``util x F0 - weights``; its default ``util`` follows the world size
(``runtime/utils/server_args.py``, ``resolve_memory_and_scheduling``:
:func:`default_utilization`). ``F0`` is the GPU less what is in use at start-up (a named
estimate, :func:`k3layout.memory.estimates.startup`, or ``reserve_bytes``); what the fraction
leaves, ``(1 - util) x F0``, is the engine's headroom for activations and CUDA graphs.
"""

from __future__ import annotations

import math

from ...deployment import Deployment
from ...memory import BudgetRule, MemoryBudget, ReserveTerm, checked, gpu_total, source_of
from ...memory.estimates import startup
from ...memory.rule import within_default
from ...model import HybridModel

_DEFAULTS = ((16, 0.79), (8, 0.81), (4, 0.95), (2, 0.87), (1, 0.88))
"""tokenspeed's default utilization by world size: the first whose size the world reaches."""

FRACTION_STEP = 1000
"""A fraction k3layout recommends is rounded up to 1/1000."""


def default_utilization(world_size: int) -> float:
    """tokenspeed's default ``--gpu-memory-utilization`` for ``world_size`` ranks."""
    return next(util for size, util in _DEFAULTS if world_size >= size)


def _budget(deployment: Deployment, weights: int, util: float, source: str) -> MemoryBudget:
    total = gpu_total(deployment)
    start = startup(deployment)
    free = total - start.bytes
    headroom = free - math.floor(free * util)
    return checked(
        MemoryBudget(
            engine="tokenspeed",
            gpu=deployment.gpu,
            gpu_memory_bytes=total,
            memory_flag=("--gpu-memory-utilization", f"{util:g}"),
            flag_source=source,
            weights_bytes=weights,
            reserve=(
                start,
                ReserveTerm(
                    name="headroom",
                    bytes=headroom,
                    derivation=f"(1 - {util:g}) x the free memory at start-up, for "
                    "activations and CUDA graphs",
                ),
            ),
            kv_memory_bytes=free - headroom - weights,
            rule=f"{util:g} x (GPU - startup) - weights",
        )
    )


def _default(deployment: Deployment) -> float:
    given = deployment.gpu_memory_utilization
    return default_utilization(deployment.world_size) if given is None else given


def tokenspeed_budget(model: HybridModel, deployment: Deployment, weights: int) -> MemoryBudget:
    """The KV budget of ``deployment``'s utilization, or its ``kv_memory_bytes`` (checked
    against what the default utilization leaves)."""
    util = deployment.gpu_memory_utilization
    if deployment.kv_memory_bytes is not None:
        return tokenspeed_least(model, deployment, weights, deployment.kv_memory_bytes)
    source = source_of(util, f"tokenspeed's default for {deployment.world_size} ranks")
    return _budget(deployment, weights, _default(deployment), source)


def tokenspeed_least(
    model: HybridModel, deployment: Deployment, weights: int, kv_bytes: int
) -> MemoryBudget:
    """The least utilization (in thousandths) whose budget holds ``kv_bytes``, refused
    (``memory_exceeded``) beyond what the default (or given) utilization leaves."""
    ceiling = _budget(deployment, weights, _default(deployment), "the default")
    within_default(ceiling, kv_bytes)
    free = gpu_total(deployment) - startup(deployment).bytes
    steps = max(1, math.ceil((kv_bytes + weights) * FRACTION_STEP / free))
    while True:  # ends: the ceiling's fraction holds kv_bytes
        util = min(steps / FRACTION_STEP, _default(deployment))
        found = _budget(deployment, weights, util, "the least that holds the workload")
        if found.kv_memory_bytes >= kv_bytes:
            return found
        steps += 1


TOKENSPEED_BUDGET = BudgetRule(budget=tokenspeed_budget, least=tokenspeed_least)
