"""Records that check themselves against their derivation.

A plan is valid when it equals what its planner derives from the plan's own inputs: a
``VllmPlan`` is ``plan(model, deployment)``, a ``RidePlan`` is ``plan_ride(plan, options, ..)``,
a ``TransferPlan`` is ``plan_transfer(model, prefill, decode, ..)``. So a plan built by hand, or
loaded from tampered JSON, is re-derived on construction and refused (``plan_mismatch``) at the
first stored field that differs, naming both values::

    vllm plan of kimi-k3-dspark: page_bytes is not what the planner derives from the plan's
    own inputs (stored=12345, derived=884736); re-plan from the model and deployment

A planner marks the plan it is building with :func:`deriving`, so the hot path never derives
twice: only a plan built outside its planner pays for one re-derivation.

pydantic's ``model_copy(update=...)`` skips validation; :class:`SelfChecked` records rebuild the
copy through ``model_validate`` instead, so a changed copy is checked like a new one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from pydantic import BaseModel

from ._frozen import Frozen
from .errors import Fact, Refusal

_DERIVING: ContextVar[bool] = ContextVar("k3layout_deriving", default=False)

_MAX_FACT_CHARS = 200

CheckedT = TypeVar("CheckedT", bound="SelfChecked")


@contextmanager
def deriving() -> Iterator[None]:
    """Mark records built inside the block as their planner's own derivation (not re-derived)."""
    token = _DERIVING.set(True)
    try:
        yield
    finally:
        _DERIVING.reset(token)


def is_deriving() -> bool:
    """Whether a planner is building the record being validated (so it needs no re-derivation)."""
    return _DERIVING.get()


def first_difference(
    stored: object, derived: object, path: str = ""
) -> tuple[str, Any, Any] | None:
    """The first place ``stored`` and ``derived`` differ: ``(path, stored, derived)``, or ``None``.

    Records are walked field by field and tuples of records item by item, so the path names the
    innermost field that differs (``groups[1].layers``, ``packing.mla_pages``, or
    ``len(pairs)`` when a tuple of records is longer on one side); a tuple of plain values (a
    group's layers) is reported whole.
    """
    if stored == derived:
        return None
    if isinstance(stored, BaseModel) and type(stored) is type(derived):
        for name in type(stored).model_fields:
            found = first_difference(
                getattr(stored, name), getattr(derived, name), f"{path}.{name}" if path else name
            )
            if found is not None:
                return found
    elif (
        isinstance(stored, tuple)
        and isinstance(derived, tuple)
        and any(isinstance(item, BaseModel) for item in stored + derived)
    ):
        for index, (mine, theirs) in enumerate(zip(stored, derived, strict=False)):
            found = first_difference(mine, theirs, f"{path}[{index}]")
            if found is not None:
                return found
        return (f"len({path})", len(stored), len(derived))
    return (path or "value", stored, derived)


def as_fact(value: object) -> Fact:
    """``value`` as a refusal fact: plain values as they are, anything else as a short repr."""
    if value is None or isinstance(value, int | float | str):
        return value
    if isinstance(value, tuple) and (
        all(isinstance(item, int) and not isinstance(item, bool) for item in value)
        or all(isinstance(item, str) for item in value)
    ):
        return value
    return _short(value, repr)


def check_derivation(thing: str, stored: BaseModel, derived: BaseModel, hint: str) -> None:
    """Refuse (``plan_mismatch``) ``stored`` unless it equals ``derived``, naming the first
    field that differs with both values."""
    found = first_difference(stored, derived)
    if found is None:
        return
    field, mine, theirs = found
    raise Refusal(
        "plan_mismatch",
        f"{thing}: {field} is not what the planner derives from the plan's own inputs "
        f"(stored={_short(mine)}, derived={_short(theirs)})",
        facts={"field": field, "stored": as_fact(mine), "derived": as_fact(theirs)},
        hint=hint,
    )


def mismatch(thing: str, field: str, rule: str, stored: object, derived: object) -> Refusal:
    """The ``plan_mismatch`` refusal of a record whose stored ``field`` breaks ``rule`` (for
    records that do not store their inputs, so are checked against their rules instead)."""
    return Refusal(
        "plan_mismatch",
        f"{thing}: {field} breaks the rule that {rule} "
        f"(stored={_short(stored)}, derived={_short(derived)})",
        facts={"field": field, "stored": as_fact(stored), "derived": as_fact(derived)},
        hint="build the record with its planner function instead of by hand",
    )


def _short(value: object, show: Callable[[object], str] = str) -> str:
    try:
        text = show(value)
    except ValueError:  # an integer past Python's 4,300-digit printing limit
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "?"
    return text if len(text) <= _MAX_FACT_CHARS else text[: _MAX_FACT_CHARS - 3] + "..."


class SelfChecked(Frozen):
    """A record whose ``model_copy`` is validated like a new one.

    pydantic's own ``model_copy(update=...)`` copies the fields without validation (so a copy
    could carry a stored number its inputs do not give); here the copy is rebuilt through
    ``model_validate``, so the record's checks (a plan's re-derivation) run on it.
    """

    def model_copy(
        self: CheckedT, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> CheckedT:
        """A validated copy with ``update`` applied (refused like a new record when invalid)."""
        fields: dict[str, Any] = {name: getattr(self, name) for name in type(self).model_fields}
        fields.update(update or {})
        if deep:
            fields = copy.deepcopy(fields)
        return self.model_validate(fields)
