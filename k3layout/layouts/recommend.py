"""From the answer to the flags: the engine settings that serve a target workload of
``requests`` requests of ``max_model_len`` tokens at once.

Each engine recommends in its own CLI's spelling (its plan's ``recommend``); what is shared
lives here: the budget rule, and the :class:`Recommendation` value (:mod:`.recommendation`).
Given a KV budget per rank, the flags use it, and a budget that cannot hold the workload is
refused (``budget_too_small``) naming the most requests it holds and the memory the workload
needs. Without a budget, the recommendation takes the least memory that holds the workload
(``memory_for``).
"""

from __future__ import annotations

from collections.abc import Callable

from .._args import expect_args
from .._search import last_holding, unless_too_small
from ..deployment import Deployment
from ..errors import Refusal
from ..memory import MemoryBudget, gib, gpu_total
from ..model import HybridModel
from ..registry import facts_of
from .answer import RequestCapacity, check_budget, check_requests
from .memory import least_budget, memory_budget
from .pipeline import plan
from .protocol import EngineLayout
from .recommendation import DRAFT_PATH, MODEL_PATH, Recommendation

__all__ = [  # the record and the launch line's placeholders, re-exported for the engines
    "DRAFT_PATH",
    "MODEL_PATH",
    "Recommendation",
    "advise",
    "budget_for",
    "check_workload",
    "gpu_budget",
    "most_held",
    "most_served",
    "recommend",
]


def check_workload(requests: int, kv_memory_bytes: int | None) -> None:
    """Refuse a request count that is not an int of 1 or more (:func:`.answer.check_requests`)
    and a budget that is not a byte count (:func:`.answer.check_budget`)."""
    check_requests("requests", requests, "ask for one request or more")
    if kv_memory_bytes is not None:
        check_budget("kv_memory_bytes", kv_memory_bytes)


def most_held(
    capacity: Callable[[int, int], RequestCapacity], kv_memory_bytes: int | None, length: int
) -> int:
    """The requests of ``length`` tokens a budget holds (0 without a budget, or where the
    engine refuses it as too small)."""
    if kv_memory_bytes is None:
        return 0
    return unless_too_small(lambda: capacity(kv_memory_bytes, length).max_requests, 0)


def budget_for(
    engine: str,
    requests: int,
    max_model_len: int,
    *,
    needed: int,
    kv_memory_bytes: int | None,
    most: int,
) -> int:
    """The memory the flags use: the budget, refused (``budget_too_small``) where it is under
    ``needed`` (``most``: the requests it holds), else ``needed``."""
    if kv_memory_bytes is None:
        return needed
    if kv_memory_bytes < needed:
        raise Refusal(
            "budget_too_small",
            f"kv_memory_bytes={kv_memory_bytes:,} holds {most:,} requests of "
            f"{max_model_len:,} tokens on engine={engine}, not {requests:,}: they need "
            f"{needed:,} B per rank",
            facts={
                "engine": engine,
                "requests": requests,
                "max_model_len": max_model_len,
                "max_requests": most,
                "needed_bytes": needed,
                "kv_memory_bytes": kv_memory_bytes,
            },
            hint=f"give {needed:,} B of KV memory per rank, or ask for {most:,} requests",
        )
    return kv_memory_bytes


def advise(
    result: EngineLayout,
    workload: tuple[int, int, int | None],
    needed: int,
    flags: Callable[[int], tuple[tuple[str, str], ...]],
    capacity: Callable[[int], RequestCapacity],
) -> Recommendation:
    """An engine's recommendation for ``workload`` (requests, context, budget or ``None``):
    the GPU's budget (:func:`gpu_budget`: the given KV budget, the deployment's memory flag,
    else the least flag that holds the workload, each checked against the GPU), the memory it
    gives (:func:`budget_for`, refusing one under ``needed``), the engine's launch flags, its
    memory flag and ``flags`` of that memory, ``capacity`` of it, and what is left unused."""
    requests, length, kv_memory_bytes = workload
    budget = gpu_budget(result, needed, kv_memory_bytes)
    given = budget.kv_memory_bytes if budget is not None else kv_memory_bytes
    if given is None:  # the engine's weights are not modelled: the deployment's KV budget
        given = result.deployment.kv_memory_bytes
    memory = budget_for(
        result.engine,
        requests,
        length,
        needed=needed,
        kv_memory_bytes=given,
        most=most_held(result.capacity, given, length),
    )
    memory_flag = () if budget is None else (budget.memory_flag,)
    return Recommendation(
        engine=result.engine,
        engine_version=result.deployment.version_run,
        requests=requests,
        max_model_len=length,
        kv_memory_bytes=memory,
        needed_bytes=needed,
        unused_bytes=memory - needed,
        flags=(*result.launch_flags(), *memory_flag, *flags(memory)),
        env=result.launch_env(),
        launch=f"{facts_of(result.engine).launch} {MODEL_PATH}".strip(),
        memory=budget,
        capacity=capacity(memory),
    )


def gpu_budget(
    result: EngineLayout, needed: int | None, kv_memory_bytes: int | None = None
) -> MemoryBudget | None:
    """The GPU's budget an answer stands on: ``kv_memory_bytes`` where given (refused over the
    GPU with the weights), the deployment's own memory flag or KV budget where it sets one,
    the least memory flag that holds ``needed`` bytes of KV where that is asked (refused where
    the engine's default flag leaves less), else the engine's default flag. ``None`` where the
    engine's weights are not modelled and the KV budget is given: then the GPU's whole memory
    bounds it."""
    deployment = result.deployment
    if kv_memory_bytes is not None:
        fields = {
            **dict(deployment),
            "kv_memory_bytes": kv_memory_bytes,
            "gpu_memory_utilization": None,
            "mem_fraction_static": None,
        }
        deployment = Deployment.model_validate(fields)
    try:
        if needed is None or _sets_memory(deployment):
            return memory_budget(result.model, deployment)
        return least_budget(result.model, deployment, needed)
    except Refusal as refusal:
        if refusal.code != "weights_unknown" or deployment.kv_memory_bytes is None:
            raise
    total = gpu_total(deployment)
    if deployment.kv_memory_bytes > total:
        raise Refusal(
            "memory_exceeded",
            f"kv_memory_bytes={deployment.kv_memory_bytes:,} is over the {deployment.gpu}'s "
            f"{gib(total)}",
            facts={"kv_memory_bytes": deployment.kv_memory_bytes, "gpu_memory_bytes": total},
            hint="give a KV budget the GPU holds beside the weights",
        )
    return None


def _sets_memory(deployment: Deployment) -> bool:
    return any(
        getattr(deployment, name) is not None
        for name in ("kv_memory_bytes", "gpu_memory_utilization", "mem_fraction_static")
    )


def recommend(
    model: HybridModel,
    deployment: Deployment,
    *,
    requests: int,
    max_model_len: int | None = None,
    kv_memory_bytes: int | None = None,
) -> Recommendation:
    """The flags with which ``deployment.engine`` serves ``requests`` requests of
    ``max_model_len`` tokens at once (default: the model's context), in ``kv_memory_bytes``
    per rank or, where ``None``, in the least memory that holds them; refuses
    (``budget_too_small``) a budget that cannot, naming the most it holds and the memory the
    workload needs (each engine's plan's ``recommend``)."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    result = plan(model, deployment)
    answer: Recommendation = result.recommend(requests, max_model_len, kv_memory_bytes)
    return answer


def most_served(
    result: EngineLayout, max_model_len: int, kv_memory_bytes: int
) -> Recommendation | None:
    """The recommendation for the most requests of ``max_model_len`` tokens that
    ``kv_memory_bytes`` per rank serves with the engine's recommended flags (SGLang's state
    pool sized for the requests serves more than its default split); ``None`` where not one
    fits."""

    found: dict[int, Recommendation] = {}

    def served(requests: int) -> bool:
        def advised() -> bool:
            found[requests] = result.recommend(requests, max_model_len, kv_memory_bytes)
            return True

        return unless_too_small(advised, False)

    if not served(1):
        return None
    return found[last_holding(served, 1, 2)]  # each request takes memory: this ends
