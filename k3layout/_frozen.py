"""The base of every k3layout record: frozen, closed, validated on construction."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """A frozen pydantic record with no extra fields (hashable, JSON round-trips)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
