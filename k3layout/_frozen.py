"""The base of every k3layout record: frozen, closed, validated on construction.

Validation failures are refused, never raised as pydantic's ``ValidationError``: building a
record (``Deployment(attn_tp=0)``) or validating one (``Deployment.model_validate``,
``model_validate_json``, ``model_validate_strings``) raises :class:`~k3layout.Refusal` with
``code="invalid_argument"`` (``size_limit`` above a bound) and ``facts`` naming the record and
the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import Self

from ._validation import refusal_from_validation
from .errors import Refusal


class Frozen(BaseModel):
    """A frozen pydantic record with no extra fields (hashable, JSON round-trips)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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
