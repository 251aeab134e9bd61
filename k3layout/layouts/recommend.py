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
from ..model import HybridModel
from .answer import RequestCapacity, check_budget, check_requests
from .pipeline import plan
from .protocol import EngineLayout


class Recommendation(Frozen):
    """An engine's flags for a workload, the capacity they give and the memory left over."""

    engine: str = Field(description="the engine the flags are for")
    requests: PositiveInt = Field(description="requests of max_model_len tokens held at once")
    max_model_len: PositiveInt = Field(description="tokens of one request")
    kv_memory_bytes: NonNegativeInt = Field(
        description="the KV memory per rank the flags use: the given budget, else the least "
        "that holds the workload"
    )
    needed_bytes: NonNegativeInt = Field(
        description="the least KV memory per rank that holds the workload with these flags"
    )
    unused_bytes: NonNegativeInt = Field(
        description="kv_memory_bytes - needed_bytes: memory the workload leaves unused"
    )
    flags: tuple[tuple[str, str], ...] = Field(
        description="the engine's own flags, as its command line spells them, with values"
    )
    capacity: SerializeAsAny[RequestCapacity] = Field(
        description="the capacity the flags give in kv_memory_bytes (the engine's own figures "
        "and the common answer)"
    )

    @property
    def command_line(self) -> str:
        """The flags as a ready command-line fragment (``--max-num-seqs 64 ...``)."""
        return " ".join(f"{flag} {shlex.quote(value)}" for flag, value in self.flags)

    def rows(self) -> list[tuple[str, str]]:
        """The recommendation as (label, value) rows, each saying what it counts."""
        return [
            ("workload", f"{self.requests:,} requests x {self.max_model_len:,} tokens"),
            ("flags", self.command_line),
            ("KV memory per rank", f"{self.kv_memory_bytes:,} B"),
            ("least KV memory for the workload", f"{self.needed_bytes:,} B"),
            ("KV memory left unused", f"{self.unused_bytes:,} B"),
            *self.capacity.rows(),
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
    the memory (:func:`budget_for`, the engine's capacity naming the most a short budget
    holds), ``flags`` and ``capacity`` of that memory, and what the workload leaves unused."""
    requests, length, kv_memory_bytes = workload
    memory = budget_for(
        result.engine,
        requests,
        length,
        needed=needed,
        kv_memory_bytes=kv_memory_bytes,
        most=most_held(result.capacity, kv_memory_bytes, length),
    )
    return Recommendation(
        engine=result.engine,
        requests=requests,
        max_model_len=length,
        kv_memory_bytes=memory,
        needed_bytes=needed,
        unused_bytes=memory - needed,
        flags=flags(memory),
        capacity=capacity(memory),
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
