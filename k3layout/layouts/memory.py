"""The GPU's budget of a deployment, by its engine's rule (the ``budget`` seam) over the
weights its engine lays out: what the memory flag gives for the KV, and the least flag that
gives a KV budget. A weight figure the GPU cannot hold is refused naming what would fit."""

from __future__ import annotations

from .._args import expect_args
from ..constants import MAX_KV_MEMORY_BYTES
from ..deployment import Deployment
from ..errors import Refusal
from ..limits import check_range
from ..memory import BudgetRule, MemoryBudget, gpu_total
from ..model import HybridModel
from ..registry import lookup
from .weights import weights_per_rank


def _rule(deployment: Deployment) -> BudgetRule:
    rule: BudgetRule | None = getattr(lookup(deployment.engine), "budget", None)
    if rule is None:
        raise Refusal(
            "weights_unknown",
            f"engine={deployment.engine}: its memory rule is not modelled",
            facts={"engine": deployment.engine},
            hint="give the KV budget itself (kv_memory_bytes)",
        )
    return rule


def memory_budget(model: HybridModel, deployment: Deployment) -> MemoryBudget:
    """What one rank of ``deployment`` (its heaviest pipeline stage) spends of its GPU, and
    the KV budget its memory flag gives (``gpu_memory_utilization``, ``mem_fraction_static``,
    ``kv_memory_bytes``, else the engine's default), by the engine's own rule.

    Refuses (``weights_do_not_fit``) weights over the GPU, naming the parallel settings that
    would fit them, and (``memory_exceeded``) weights + reserve + KV over the GPU.
    """
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    return _rule(deployment).budget(model, deployment, _weights(model, deployment))


def least_budget(model: HybridModel, deployment: Deployment, kv_bytes: int) -> MemoryBudget:
    """The engine's memory flag that gives at least ``kv_bytes`` of KV per rank with the least
    memory, refused (``memory_exceeded``) where that takes more than the engine's default (or
    the given) flag leaves for the KV."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    check_range("kv_bytes", kv_bytes, 1, MAX_KV_MEMORY_BYTES, why="bytes of KV memory per rank")
    return _rule(deployment).least(model, deployment, _weights(model, deployment), kv_bytes)


def _weights(model: HybridModel, deployment: Deployment) -> int:
    """The weights of the heaviest rank, refused (``weights_do_not_fit``) over the GPU with
    the deployments that would fit them."""
    weights = weights_per_rank(model, deployment).max_bytes
    total = gpu_total(deployment)
    if weights <= total:
        return weights
    fits = next(
        (label for label, other in _alternatives(deployment) if _fits(model, other, total)),
        None,
    )
    raise Refusal(
        "weights_do_not_fit",
        f"model {model.name} on {deployment.gpu} with engine={deployment.engine}: one rank "
        f"holds {weights / (1 << 30):,.1f} GiB of weights ({weights:,} B), over the GPU's "
        f"{total / (1 << 30):,.1f} GiB ({total:,} B)",
        facts={
            "engine": deployment.engine,
            "gpu": deployment.gpu,
            "weights_bytes": weights,
            "gpu_memory_bytes": total,
            "attn_tp": deployment.attn_tp,
            "attn_dp": deployment.attn_dp,
            "pp": deployment.pp,
            "expert_parallel": deployment.expert_parallel,
            "fits": fits,
        },
        hint=f"the fewest more ranks whose weights fit: {fits}"
        if fits
        else "no deployment up to 32x the attention-DP replicas or 4x the stages fits the "
        "weights: use a quantized (fp8 or 4-bit) checkpoint or a larger GPU",
    )


def _alternatives(deployment: Deployment) -> list[tuple[str, Deployment]]:
    """Deployments that spread the weights further, the fewest ranks first: expert
    parallelism, then 2x to 32x the attention-DP replicas with it (the experts split over
    every rank; attention stays at its TP), then 2x and 4x the pipeline stages with it."""
    fields = dict(deployment)
    changes: list[tuple[str, dict[str, object]]] = [
        ("expert_parallel=True", {"expert_parallel": True})
    ]
    for factor in (2, 4, 8, 16, 32):
        dp = factor * deployment.attn_dp
        changes.append(
            (f"expert_parallel=True, attn_dp={dp}", {"expert_parallel": True, "attn_dp": dp})
        )
    for factor in (2, 4):
        pp = factor * deployment.pp
        changes.append(
            (
                f"expert_parallel=True, pp={pp}",
                {"expert_parallel": True, "pp": pp, "pp_partition": None},
            )
        )
    found: list[tuple[str, Deployment]] = []
    for label, change in changes:
        if all(fields.get(k) == v for k, v in change.items()):
            continue
        try:
            found.append((label, Deployment.model_validate({**fields, **change})))
        except Refusal:
            continue
    return found


def _fits(model: HybridModel, deployment: Deployment, total: int) -> bool:
    try:
        return weights_per_rank(model, deployment).max_bytes <= total
    except Refusal:
        return False
