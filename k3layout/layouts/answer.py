"""The operator's answer, in the same fields for every engine: how many whole requests of
``max_model_len`` tokens a KV budget holds at once, the tokens they hold, the KDA state's share
of the memory, and the memory that holds no request's bytes. Each engine's capacity class
adds its own figures (vLLM's blocks and concurrency, SGLang's pools, tokenspeed's parents).

The shares are defined once, here, over the memory of one rank of every pipeline stage
(``pp x kv_memory_bytes``):

- a request's **payload** is its attention rows (``ceil(L / dcp)`` tokens of every attention
  layer a rank holds, a pooled part's rows included) and one KDA state per KDA layer
  (ReplaySSM records included) and one tail ring per indexed layer;
- ``kda_share`` is the held requests' KDA state over that memory;
- ``waste_fraction`` is one minus the held requests' payload over it: padding, extra state
  slots, null blocks, workspace and whatever no whole request fills.

:func:`least_memory` inverts a capacity: the least ``kv_memory_bytes`` that holds ``requests``
requests, so that one byte less does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pydantic import Field, NonNegativeInt, PositiveInt

from .._args import expect_int, expect_positive
from .._display import Displayed
from .._frozen import Frozen
from .._search import last_holding, unless_too_small
from ..constants import INT64_MAX, MAX_KV_MEMORY_BYTES, MAX_PROMPT_TOKENS
from ..deployment import Deployment
from ..errors import Refusal
from ..limits import check_bound, check_range
from ..memory.records import GIB
from ..model import HybridModel
from ..sizes import RankSizes
from .groups import Group, Stage


class EngineLayout(Protocol):
    """What the answer reads of a plan of any engine (a narrow view of
    :class:`k3layout.layouts.protocol.EngineLayout`, which builds on this module)."""

    @property
    def model(self) -> HybridModel: ...
    @property
    def deployment(self) -> Deployment: ...
    @property
    def sizes(self) -> RankSizes: ...
    @property
    def groups(self) -> tuple[Group, ...]: ...
    @property
    def stages(self) -> tuple[Stage, ...]: ...


class RequestCapacity(Displayed, Frozen):
    """What a KV budget per rank holds, in the fields every engine answers (shown in one line,
    or as a table of :meth:`rows`: :mod:`k3layout._display`)."""

    kv_memory_bytes: NonNegativeInt = Field(
        description="KV-cache memory per rank (every rank of every pipeline stage has it)"
    )
    max_model_len: PositiveInt = Field(description="tokens of one request (its context)")
    max_requests: NonNegativeInt = Field(
        description="whole requests of max_model_len tokens held at once, per attention-DP "
        "replica, as the engine itself admits them"
    )
    tokens_held: NonNegativeInt = Field(description="max_requests x max_model_len")
    attention_payload_bytes: NonNegativeInt = Field(
        description="the held requests' attention rows, over one rank of every stage"
    )
    kda_state_payload_bytes: NonNegativeInt = Field(
        description="the held requests' KDA state (one per KDA layer), over one rank of every stage"
    )
    kda_share: float = Field(
        description="kda_state_payload_bytes / (pp x kv_memory_bytes)", ge=0.0, le=1.0
    )
    waste_fraction: float = Field(
        description="1 - payload / (pp x kv_memory_bytes): memory no held request's bytes "
        "fill (padding, extra state slots, null blocks, workspace, the remainder)",
        ge=0.0,
        le=1.0,
    )

    def rows(self) -> list[tuple[str, str]]:
        """The capacity as (label, value) rows: each engine's own figures, then the answer."""
        return self.answer_rows()

    def display_head(self) -> str:
        """``2 requests of 1,048,576 tokens in 40.00 GiB per rank, KDA share 0.003, waste
        0.182``: the answer every engine gives."""
        return (
            f"{self.max_requests:,} requests of {self.max_model_len:,} tokens in "
            f"{self.kv_memory_bytes / GIB:,.2f} GiB per rank, KDA share {self.kda_share:.3f}, "
            f"waste {self.waste_fraction:.3f}"
        )

    def display_rows(self) -> list[tuple[str, str]]:
        """The table: :meth:`rows`."""
        return self.rows()

    def answer_rows(self) -> list[tuple[str, str]]:
        """The common fields as (label, value) rows, each saying what it counts."""
        return [
            (f"requests of {self.max_model_len:,} tokens held at once", f"{self.max_requests:,}"),
            ("tokens held (requests x context)", f"{self.tokens_held:,}"),
            ("KDA state share of KV memory", f"{self.kda_share:.3f}"),
            ("KV memory no request fills (waste)", f"{self.waste_fraction:.3f}"),
        ]


def check_budget(name: str, value: object) -> int:
    """``value``, a KV budget per rank in bytes, if it is an ``int`` from 0 to
    :data:`~k3layout.constants.MAX_KV_MEMORY_BYTES`; else refuse (``invalid_argument``, or
    ``size_limit`` above the bound) naming ``name``."""
    return check_range(name, value, 0, MAX_KV_MEMORY_BYTES, why="bytes of KV memory per rank")


def check_requests(name: str, value: object, hint: str | None = None) -> int:
    """``value``, a count of requests held at once, if it is an ``int`` of 1 or more within
    int64; else refuse (``invalid_argument``, with ``hint``; ``size_limit`` above int64)."""
    number = expect_positive(name, value, hint)
    return check_bound(name, number, INT64_MAX, why="requests held at once")


def check_context(plan: EngineLayout, max_model_len: int | None) -> int:
    """``max_model_len``, or the model's context where ``None`` (every engine's default);
    refuses a non-int, one below 1, one above the model's context (as vLLM and SGLang refuse
    it) or the token bound."""
    if max_model_len is None:
        context = plan.model.context_tokens
        if context is None:
            raise Refusal(
                "invalid_argument",
                f"model {plan.model.name} does not say its context length "
                "(max_position_embeddings): pass max_model_len",
                facts={"field": "max_model_len"},
                hint="pass max_model_len, the tokens of one request",
            )
        return context
    check_bound(
        "max_model_len",
        expect_int("max_model_len", max_model_len),
        MAX_PROMPT_TOKENS,
        why="tokens of a request",
    )
    if max_model_len < 1:
        raise Refusal(
            "invalid_argument",
            f"max_model_len={max_model_len}: a request holds at least one token",
            facts={"field": "max_model_len"},
            hint="pass max_model_len >= 1",
        )
    longest = plan.model.context_tokens
    if longest is not None and max_model_len > longest:
        raise Refusal(
            "invalid_argument",
            f"max_model_len={max_model_len:,} is over model {plan.model.name}'s context "
            f"({longest:,}, its max_position_embeddings): the engines refuse a longer one",
            facts={"field": "max_model_len", "max_model_len": max_model_len, "bound": longest},
            hint=f"use max_model_len <= {longest:,}",
        )
    return max_model_len


def request_payload(plan: EngineLayout, max_model_len: int) -> tuple[int, int]:
    """One request's ``(attention, KDA state)`` payload bytes over one rank of every stage."""
    tp = plan.deployment.attn_tp
    sizes = plan.sizes
    attention = state = 0
    for group in plan.groups:
        if group.kind == "ring":  # a tail ring per layer: a state the request keeps
            if sizes.ring is not None:
                state += len(group.layers) * sizes.ring.payload_bytes(tp)
            continue
        for layer in group.layers:
            spec = sizes.spec_of(layer)
            if spec.paging == "token":
                ranks = spec.dcp.num_ranks if spec.dcp is not None else 1
                attention += spec.tokens_bytes(tp, -(-max_model_len // ranks))
            else:
                state += spec.payload_bytes(tp)
                if sizes.replay is not None:
                    state += sizes.replay.payload_bytes(tp)
    return attention, state


def answer(
    plan: EngineLayout, kv_memory_bytes: int, max_model_len: int, max_requests: int
) -> dict[str, object]:
    """The common fields of ``max_requests`` requests held in ``kv_memory_bytes`` per rank."""
    attention, state = request_payload(plan, max_model_len)
    memory = len(plan.stages) * kv_memory_bytes
    held_attention, held_state = max_requests * attention, max_requests * state
    used = held_attention + held_state
    return {
        "kv_memory_bytes": kv_memory_bytes,
        "max_model_len": max_model_len,
        "max_requests": max_requests,
        "tokens_held": max_requests * max_model_len,
        "attention_payload_bytes": held_attention,
        "kda_state_payload_bytes": held_state,
        "kda_share": held_state / memory if memory else 0.0,
        "waste_fraction": max(0.0, 1.0 - used / memory) if memory else 0.0,
    }


def least_memory(capacity: Callable[[int], RequestCapacity], requests: int) -> int:
    """The least ``kv_memory_bytes`` whose ``capacity`` holds ``requests`` requests (a budget
    the engine refuses as too small holds none). Refuses ``requests < 1`` and a load no
    int64 byte count holds (``size_limit``)."""
    check_requests("requests", requests, "ask the memory for one request or more")

    def short(memory: int) -> bool:  # the memory does not hold them
        return not unless_too_small(lambda: capacity(memory).max_requests >= requests, False)

    # no memory (0) holds a request; probe from 1 MiB
    most = last_holding(short, 0, 1 << 20, limit=INT64_MAX // 2)
    if most is None:
        raise Refusal(
            "size_limit",
            f"requests={requests:,}: no KV memory an int64 counts holds them",
            facts={"field": "requests", "requests": requests},
            hint="ask for fewer requests or a shorter context",
        )
    return most + 1
