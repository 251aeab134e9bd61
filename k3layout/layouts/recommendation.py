"""An engine's recommendation as a value: its flags for a workload, the capacity they give
and the memory left over (:mod:`.recommend` makes one; every plan's ``recommend`` returns
one, so the plan protocol names it)."""

from __future__ import annotations

import shlex

from pydantic import Field, NonNegativeInt, PositiveInt, SerializeAsAny

from .._frozen import Frozen
from ..memory import MemoryBudget, gib
from .answer import RequestCapacity

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
