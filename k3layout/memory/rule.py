"""An engine's budget rule (its ``budget`` seam), and what every rule's answer must pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..deployment import Deployment
from ..errors import Fact, Refusal
from ..gpus import GPUS
from ..model import HybridModel
from .records import MemoryBudget, gib


@dataclass(frozen=True)
class BudgetRule:
    """How an engine turns a GPU into a KV budget.

    - ``budget(model, deployment, weights_bytes)``: the KV budget the deployment's memory flag
      (or its default) gives, or the one it gives (``kv_memory_bytes``);
    - ``least(model, deployment, weights_bytes, kv_bytes)``: the memory flag that gives at
      least ``kv_bytes`` of KV with the least memory, refused (``memory_exceeded``) where it
      would leave less than the engine's default does for everything beside the KV.
    """

    budget: Callable[[HybridModel, Deployment, int], MemoryBudget]
    least: Callable[[HybridModel, Deployment, int, int], MemoryBudget]


def gpu_total(deployment: Deployment) -> int:
    """The GPU's total as the driver reports it: ``gpu_memory_bytes``, else the table's."""
    if deployment.gpu_memory_bytes is not None:
        return deployment.gpu_memory_bytes
    return GPUS[deployment.gpu].memory_bytes


def source_of(given: object, default: str) -> str:
    """``'given'`` where the flag was given, else ``default`` (the engine's rule)."""
    return "given" if given is not None else default


def checked(budget: MemoryBudget) -> MemoryBudget:
    """``budget``, refused where the GPU cannot hold it: weights over the GPU
    (``weights_do_not_fit``), no KV left, or weights + reserve + KV over the GPU
    (``memory_exceeded``), each naming every term."""
    facts: dict[str, Fact] = {
        "engine": budget.engine,
        "gpu": budget.gpu,
        "gpu_memory_bytes": budget.gpu_memory_bytes,
        "weights_bytes": budget.weights_bytes,
        "reserve_bytes": budget.reserve_bytes,
        "kv_memory_bytes": budget.kv_memory_bytes,
    }
    if budget.weights_bytes > budget.gpu_memory_bytes:
        raise Refusal(
            "weights_do_not_fit",
            f"engine={budget.engine} on {budget.gpu}: the weights of one rank, "
            f"{gib(budget.weights_bytes)}, exceed the GPU's {gib(budget.gpu_memory_bytes)}",
            facts=facts,
            hint="spread the weights over more ranks (expert parallelism, a larger attention "
            "TP or PP) or use a quantized (fp8) checkpoint",
        )
    flag, value = budget.memory_flag
    if budget.kv_memory_bytes <= 0 or budget.used_bytes > budget.gpu_memory_bytes:
        raise Refusal(
            "memory_exceeded",
            f"engine={budget.engine} on {budget.gpu} with {flag} {value}: weights "
            f"{gib(budget.weights_bytes)} + reserve {gib(budget.reserve_bytes)} + KV "
            f"{gib(budget.kv_memory_bytes)} do not fit in the GPU's "
            f"{gib(budget.gpu_memory_bytes)}",
            facts=facts,
            hint="a smaller KV budget (fewer requests or a shorter context), more ranks for the "
            "weights (expert parallelism, TP, PP), or an fp8 checkpoint",
        )
    return budget


def within_default(default: MemoryBudget, kv_bytes: int) -> None:
    """Refuse (``memory_exceeded``) a KV budget of ``kv_bytes`` over what the engine's default
    memory flag (``default``) leaves for the KV: more would take what the engine keeps for
    everything beside weights and KV."""
    if kv_bytes <= default.kv_memory_bytes:
        return
    flag, value = default.memory_flag
    raise Refusal(
        "memory_exceeded",
        f"engine={default.engine} on {default.gpu}: the workload needs {gib(kv_bytes)} of KV per "
        f"rank; with {flag} {value} ({default.flag_source}) the GPU's "
        f"{gib(default.gpu_memory_bytes)} less weights {gib(default.weights_bytes)} and "
        f"reserve {gib(default.reserve_bytes)} leaves {gib(max(0, default.kv_memory_bytes))}",
        facts={
            "engine": default.engine,
            "gpu": default.gpu,
            "gpu_memory_bytes": default.gpu_memory_bytes,
            "weights_bytes": default.weights_bytes,
            "reserve_bytes": default.reserve_bytes,
            "kv_memory_bytes": default.kv_memory_bytes,
            "needed_bytes": kv_bytes,
        },
        hint="fewer requests or a shorter context, more ranks for the weights (expert "
        "parallelism, TP, PP), a larger GPU, or an fp8 checkpoint",
    )
