"""From the answer to the flags: the engine settings that serve a target workload of
``requests`` requests of ``max_model_len`` tokens at once.

Each engine recommends in its own CLI's spelling (its plan's ``recommend``); what is shared
lives here: the :class:`Recommendation` value and the budget rule. Given a KV budget per rank,
the flags use it, and a budget that cannot hold the workload is refused (``budget_too_small``)
naming the most requests it holds and the memory the workload needs. Without a budget, the
recommendation takes the least memory that holds the workload (``memory_for``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from pydantic import Field, NonNegativeInt, PositiveInt, SerializeAsAny

from .._args import expect_args
from .._frozen import Frozen
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

MODEL_PATH = "MODEL"
"""Where the launch line names the checkpoint (its directory or hub id)."""

DRAFT_PATH = "DRAFT"
"""Where the launch line names a DSpark draft checkpoint."""


class Recommendation(Frozen):
    """An engine's flags for a workload, the capacity they give and the memory left over."""

    engine: str = Field(description="the engine the flags are for")
    engine_version: str = Field(description="the engine release the flags are for")
    requests: PositiveInt = Field(description="requests of max_model_len tokens held at once")
    max_model_len: PositiveInt = Field(description="tokens of one request")
    kv_memory_bytes: NonNegativeInt = Field(
        description="the KV memory per rank the flags give: the given budget, the memory "
        "flag's, else the least that holds the workload"
    )
    needed_bytes: NonNegativeInt = Field(
        description="the least KV memory per rank that holds the workload with these flags"
    )
    unused_bytes: NonNegativeInt = Field(
        description="kv_memory_bytes - needed_bytes: memory the workload leaves unused"
    )
    flags: tuple[tuple[str, str], ...] = Field(
        description="the engine's own flags, as its command line spells them, with values "
        "(an empty value: a switch)"
    )
    env: tuple[tuple[str, str], ...] = Field(
        (), description="environment variables the engine reads the deployment's settings from"
    )
    launch: str = Field("", description="the command that starts the engine (before the model)")
    memory: MemoryBudget | None = Field(
        None,
        description="the GPU's budget the flags give: weights, the engine's reserve and KV "
        "(None: the engine's weights are not modelled; the KV budget was given)",
    )
    capacity: SerializeAsAny[RequestCapacity] = Field(
        description="the capacity the flags give in kv_memory_bytes (the engine's own figures "
        "and the common answer)"
    )

    @property
    def command_line(self) -> str:
        """The flags as a ready command-line fragment (``--max-num-seqs 64 ...``)."""
        return " ".join(
            flag if value == "" else f"{flag} {shlex.quote(value)}" for flag, value in self.flags
        )

    @property
    def launch_line(self) -> str:
        """The whole command: environment, the engine's launcher, the checkpoint
        (:data:`MODEL_PATH`; a draft: :data:`DRAFT_PATH`) and the flags."""
        env = " ".join(f"{name}={shlex.quote(value)}" for name, value in self.env)
        return " ".join(part for part in (env, self.launch, self.command_line) if part)

    def rows(self) -> list[tuple[str, str]]:
        """The recommendation as (label, value) rows, each saying what it counts."""
        rows = [
            ("engine", f"{self.engine} {self.engine_version}"),
            ("workload", f"{self.requests:,} requests x {self.max_model_len:,} tokens"),
            ("KV memory per rank", gib(self.kv_memory_bytes)),
            ("least KV memory for the workload", gib(self.needed_bytes)),
            ("KV memory left unused", gib(self.unused_bytes)),
        ]
        if self.memory is not None:
            rows += [
                (label, value)
                for label, value in self.memory.rows()
                if label != "KV memory per rank"
            ]
        return [*rows, *self.capacity.rows()]


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
