"""Pydantic's ``ValidationError`` as a :class:`~k3layout.Refusal` naming the field.

Every public record (:class:`~k3layout._frozen.Frozen`), ``load_plan`` and the config loader
turn a failed validation into one refusal: ``code`` ``invalid_argument`` (``size_limit`` when a
value is above a bound the record sets), ``facts`` with the record and the dotted ``field`` of
the first error, and a message listing the errors with pydantic's constraint and the value
given. A :class:`~k3layout.Refusal` raised by a validator inside keeps its own code.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from .errors import Fact, Refusal, RefusalCode

T = TypeVar("T")

SIZE_ERRORS = frozenset({"less_than_equal", "less_than", "too_long"})
"""Pydantic error types that mean "above a bound": refused as ``size_limit``."""

UNION_TAGS: tuple[str, ...] = ()
"""Tags of tagged unions, which pydantic puts in an error's location where they name no
field, so a refusal's field leaves them out (plans of every engine validate through the
registry, not a tagged union: none today)."""

MAX_LISTED = 3
"""Errors named in one message; the rest are counted."""

_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxstring = 40
_REPR.maxother = 40
_REPR.maxlong = 40


def describe(value: object) -> str:
    """A short, safe ``repr`` of a value given: never raises, never prints megabytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<an integer of {value.bit_length():,} bits>"
    try:
        return _REPR.repr(value)
    except (ValueError, RecursionError, TypeError):
        return f"<a {type(value).__name__}>"


def field_path(loc: Sequence[int | str]) -> str:
    """``("layers", 3, "mla", "num_heads")`` -> ``"layers.3.mla.num_heads"``."""
    return ".".join(str(part) for part in loc) or "<root>"


def _problem(error: ErrorDetails) -> str:
    message = error["msg"].removeprefix("Value error, ")
    # The value given, except for a missing field or a whole record (a root check).
    shown = (
        ""
        if error["type"] == "missing" or not error["loc"]
        else f" (got {describe(error.get('input'))})"
    )
    return f"{field_path(error['loc'])}: {message}{shown}"


def validate_json(
    adapter: TypeAdapter[T],
    data: str | bytes | bytearray,
    subject: str,
    *,
    tags: tuple[str, ...] = UNION_TAGS,
) -> T:
    """``adapter.validate_json(data)``, a failure refused (``invalid_argument``) naming the
    field. Pydantic's JSON parser bounds nesting depth, so deep JSON is refused too. ``tags``
    are tagged unions' tags, which name no field: they are left out of the field."""
    try:
        return adapter.validate_json(data)
    except ValidationError as error:
        raise refusal_from_validation(
            error,
            subject,
            facts={"record": subject},
            hint=f"pass the JSON of a {subject}",
            tags=tags,
        ) from None


def refusal_from_validation(
    error: ValidationError,
    subject: str,
    *,
    code: RefusalCode = "invalid_argument",
    facts: Mapping[str, Fact] | None = None,
    hint: str | None = None,
    tags: tuple[str, ...] = UNION_TAGS,
) -> Refusal:
    """One refusal for ``error``, its message prefixed with ``subject`` (what was validated);
    tagged unions' ``tags`` are left out of the field."""
    details = error.errors(include_url=False)
    if not details:  # pragma: no cover - pydantic always reports at least one error
        return Refusal(code, f"{subject}: invalid", facts=facts, hint=hint)
    first = details[0]
    field = field_path(tuple(part for part in first["loc"] if part not in tags))
    inner: Any = (first.get("ctx") or {}).get("error")
    if isinstance(inner, Refusal):
        # The inner refusal's field is relative to where its validator ran.
        where = "" if field == "<root>" else f"{field}: "
        own = inner.facts.get("field")
        if own is not None:
            field = str(own) if field == "<root>" else f"{field}.{own}"
        return Refusal(
            inner.code,
            f"{subject}: {where}{inner.message}",
            facts={**(facts or {}), **inner.facts, "field": field},
            hint=inner.hint or hint,
        )
    problems = "; ".join(_problem(e) for e in details[:MAX_LISTED])
    if len(details) > MAX_LISTED:
        problems += f"; and {len(details) - MAX_LISTED} more"
    all_facts: dict[str, Fact] = {**(facts or {}), "field": field}
    if first["type"] in SIZE_ERRORS:
        code = "size_limit"
        bound = next(iter((first.get("ctx") or {}).values()), None)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            all_facts["bound"] = bound
    return Refusal(code, f"{subject}: {problems}", facts=all_facts, hint=hint)
