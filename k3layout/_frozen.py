"""The base of every k3layout record: frozen, closed, validated on construction.

Validation failures are refused, never raised as pydantic's ``ValidationError``: building a
record (``Deployment(attn_tp=0)``) or validating one (``Deployment.model_validate``,
``model_validate_json``, ``model_validate_strings``) raises :class:`~k3layout.Refusal` with
``code="invalid_argument"`` (``size_limit`` above a bound) and ``facts`` naming the record and
the field.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import Self

from ._validation import refusal_from_validation
from .errors import Refusal


class Frozen(BaseModel):
    """A frozen pydantic record with no extra fields (hashable, JSON round-trips)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    def __init__(self, /, *args: Any, **data: Any) -> None:
        name = type(self).__name__
        if args:
            raise Refusal(
                "invalid_argument",
                f"{name} takes its fields by keyword, got {len(args)} positional argument(s)",
                facts={"record": name, "field": "<positional>"},
                hint=f"write {name}(field=value, ...)",
            )
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise _refused(name, error) from None

    # Nested records are still validated by pydantic-core directly, without this __init__.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as error:
            raise _refused(type(self).__name__, error) from None

    @classmethod
    def model_validate(cls, *args: Any, **kwargs: Any) -> Self:
        """Pydantic's ``model_validate``, refusing (:class:`~k3layout.Refusal`) bad input."""
        try:
            return super().model_validate(*args, **kwargs)
        except ValidationError as error:
            raise _refused(cls.__name__, error) from None

    @classmethod
    def model_validate_json(cls, *args: Any, **kwargs: Any) -> Self:
        """Pydantic's ``model_validate_json``, refusing (:class:`~k3layout.Refusal`) bad input."""
        try:
            return super().model_validate_json(*args, **kwargs)
        except ValidationError as error:
            raise _refused(cls.__name__, error) from None

    @classmethod
    def model_validate_strings(cls, *args: Any, **kwargs: Any) -> Self:
        """Pydantic's ``model_validate_strings``, refusing bad input."""
        try:
            return super().model_validate_strings(*args, **kwargs)
        except ValidationError as error:
            raise _refused(cls.__name__, error) from None


def _refused(record: str, error: ValidationError) -> Refusal:
    return refusal_from_validation(
        error, record, facts={"record": record}, hint=f"fix the named field of {record}"
    )


FrozenT = TypeVar("FrozenT", bound=Frozen)

_DEFAULTS: dict[type[Frozen], dict[str, Any]] = {}
_set_slot = object.__setattr__


def _defaults(cls: type[Frozen]) -> dict[str, Any]:
    defaults = _DEFAULTS.get(cls)
    if defaults is None:
        defaults = {
            name: info.get_default(call_default_factory=True)
            for name, info in cls.model_fields.items()
            if not info.is_required()
        }
        _DEFAULTS[cls] = defaults
    return defaults


def trusted(cls: type[FrozenT], /, **fields: Any) -> FrozenT:
    """A ``cls`` record built by the planner itself from parts that were already validated,
    made without running validation again (about 3x cheaper than ``cls(**fields)``).

    The one place where internal records skip validation: public constructors validate, and
    only planner code that derives every value from validated inputs calls this. ``fields``
    must be the values validation would store (right types, already canonical); omitted
    fields take their (immutable) defaults, as with validation. A record with private attributes
    or a ``model_post_init`` hook is built the validated way.
    """
    if cls.__private_attributes__ or cls.__pydantic_post_init__:
        return cls(**fields)
    record = cls.__new__(cls)
    _set_slot(record, "__dict__", {**_defaults(cls), **fields})
    _set_slot(record, "__pydantic_fields_set__", set(fields))
    _set_slot(record, "__pydantic_extra__", None)
    _set_slot(record, "__pydantic_private__", None)
    return record
