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

_MISSING = object()
_LAYOUTS: dict[type[Frozen], tuple[tuple[str, Any], ...]] = {}
_set_slot = object.__setattr__


def _layout(cls: type[Frozen]) -> tuple[tuple[str, Any], ...]:
    """``cls``'s fields in declaration order (the order validation stores and serialises them
    in), each with its default or ``_MISSING``."""
    layout = tuple(
        (name, _MISSING if info.is_required() else info.get_default(call_default_factory=True))
        for name, info in cls.__pydantic_fields__.items()
    )
    _LAYOUTS[cls] = layout
    return layout


def trusted(cls: type[FrozenT], /, **fields: Any) -> FrozenT:
    """A ``cls`` record built by the planner itself from parts that were already validated,
    made without running validation again (cheaper than ``cls(**fields)``, the more so the
    more fields and validators a record has).

    The one place where internal records skip validation (with :func:`trusted_variant`):
    public constructors validate, and only planner code that derives every value from
    validated inputs calls this. ``fields`` must be the values validation would store (right
    types, already canonical); omitted fields take their (immutable) defaults and the record
    stores its fields in declaration order, as validation does. A record with private
    attributes or a ``model_post_init`` hook is built the validated way.
    """
    layout = _LAYOUTS.get(cls)
    if layout is None:
        if cls.__private_attributes__ or cls.__pydantic_post_init__:
            return cls(**fields)
        layout = _layout(cls)
    values: dict[str, Any] = {}
    given = 0
    for name, default in layout:
        value = fields.get(name, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise TypeError(f"{cls.__name__}: field {name!r} is required")
            value = default
        else:
            given += 1
        values[name] = value
    if given != len(fields):
        unknown = sorted(set(fields) - set(cls.__pydantic_fields__))
        raise TypeError(f"{cls.__name__}: no fields {unknown}")
    record = cls.__new__(cls)
    _set_slot(record, "__dict__", values)
    _set_slot(record, "__pydantic_fields_set__", set(fields))
    _set_slot(record, "__pydantic_extra__", None)
    _set_slot(record, "__pydantic_private__", None)
    return record


def trusted_variant(record: FrozenT, /, **changes: Any) -> FrozenT:
    """``record`` with ``changes`` applied, made the :func:`trusted` way (no re-validation):
    for the planner's many records that differ from one built and checked just before only
    in a field the checks do not read (the module layers a segment names)."""
    cls = type(record)
    values = record.__dict__.copy()
    if len(values) != len(cls.__pydantic_fields__):  # a cached property's value: leave it out
        values = {name: values[name] for name in cls.__pydantic_fields__}
    values.update(changes)
    fields_set = set(record.__pydantic_fields_set__)
    fields_set.update(changes)
    variant = cls.__new__(cls)
    _set_slot(variant, "__dict__", values)
    _set_slot(variant, "__pydantic_fields_set__", fields_set)
    _set_slot(variant, "__pydantic_extra__", None)
    _set_slot(variant, "__pydantic_private__", None)
    return variant
