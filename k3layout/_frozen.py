"""The base of every k3layout record: frozen, closed, validated on construction.

Validation failures are refused, never raised as pydantic's ``ValidationError``: building a
record (``Deployment(attn_tp=0)``) or validating one (``Deployment.model_validate``,
``model_validate_json``, ``model_validate_strings``) raises :class:`~k3layout.Refusal` with
``code="invalid_argument"`` (``size_limit`` above a bound) and ``facts`` naming the record and
the field.

Scalars are never converted (one rule for every record and every public function, as
:mod:`k3layout._args` checks arguments): an ``int`` field takes an ``int`` and refuses
``True``, ``"8"`` and ``8.0``; a ``bool`` field refuses ``1`` and ``"true"``; a ``float``
field takes an ``int`` or a ``float``, never a ``bool`` or a string. Containers still take
any sequence (``pp_partition=[46, 47]``), their items held to the same rule. Text is
converted where text enters: the command line parses ``--attn-tp 8`` by the option's type.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from functools import cache
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Strict, ValidationError
from pydantic._internal._model_construction import ModelMetaclass
from typing_extensions import Self

from ._validation import refusal_from_validation
from .errors import Refusal

_SHOWN_BASE_MEMBERS: frozenset[str] = frozenset({"model_config", "model_fields"})
"""pydantic ``BaseModel`` members a record's ``dir()`` (and so ``help()``) still lists."""

_PLUMBING: frozenset[str] = frozenset(
    {
        "__abstractmethods__",
        "__annotations__",
        "__class_vars__",
        "__private_attributes__",
        "__signature__",
        "__slots__",
        "__weakref__",
    }
)
"""Attributes pydantic's metaclass sets on every record class."""


class _RecordMeta(ModelMetaclass):
    """pydantic's metaclass, with a ``dir()`` that leaves out ``BaseModel``'s own members and
    the plumbing pydantic sets on each class (``__pydantic_validator__``, the deprecated v1
    methods, ...), which ``help()`` would otherwise print in full for every record. They stay
    reachable by name; the record's own fields, methods and properties are listed."""

    def __dir__(cls) -> list[str]:
        return [name for name in super().__dir__() if _listed(name)]


@cache
def _base_members() -> frozenset[str]:
    """Every name ``BaseModel`` and its bases define (``object`` aside)."""
    return frozenset(
        name for klass in BaseModel.__mro__ if klass is not object for name in vars(klass)
    )


@cache
def _listed(name: str) -> bool:
    """Whether a record's ``dir()`` lists ``name``."""
    if name in _SHOWN_BASE_MEMBERS:
        return True
    plumbing = name.startswith("__pydantic") or name in _PLUMBING
    return not plumbing and name not in _base_members()


_SCALARS: frozenset[type] = frozenset({int, float, bool})


def strict_scalars(annotation: Any) -> Any:
    """``annotation`` with every ``int``, ``float`` and ``bool`` in it made strict (inside
    unions, tuples and ``Annotated``, whose own constraints are kept): pydantic then refuses
    ``True`` or ``"8"`` for an ``int`` instead of converting it. Containers stay lax, so a
    list still fills a tuple field.

    >>> strict_scalars(tuple[int, ...] | None)
    typing.Optional[tuple[typing.Annotated[int, Strict(strict=True)], ...]]
    """
    if annotation in _SCALARS:
        return Annotated[annotation, Strict()]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return Annotated[(strict_scalars(args[0]), *annotation.__metadata__)]
    if origin in (Union, types.UnionType):
        return Union[tuple(strict_scalars(arg) for arg in args)]  # noqa: UP007 - built here
    if origin is tuple:
        items = tuple(arg if arg is Ellipsis else strict_scalars(arg) for arg in args)
        return tuple.__class_getitem__(items)
    return annotation


class Frozen(BaseModel, metaclass=_RecordMeta):
    """A frozen pydantic record with no extra fields (hashable, JSON round-trips), whose
    scalar fields are strict (:func:`strict_scalars`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # Before the (deferred) schema is built: every record's scalars are strict.
        super().__pydantic_init_subclass__(**kwargs)
        for info in cls.__pydantic_fields__.values():
            info.annotation = strict_scalars(info.annotation)

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


class _Layout:
    """What :func:`trusted` needs of a record class, read once: its field names in
    declaration order (the order validation stores and serialises them in), each with its
    default or ``_MISSING``."""

    __slots__ = ("all_set", "defaults", "names")

    def __init__(self, cls: type[Frozen]) -> None:
        self.defaults = tuple(
            (name, _MISSING if info.is_required() else info.get_default(call_default_factory=True))
            for name, info in cls.__pydantic_fields__.items()
        )
        self.names = tuple(name for name, _ in self.defaults)
        # The fields set of a record given every field: one set shared by all such records
        # of the class (a frozen record's fields set is never changed; copies copy it).
        self.all_set = set(self.names)


_LAYOUTS: dict[type[Frozen], _Layout] = {}

# The four slots every pydantic record has, set through their descriptors (the cheapest way
# to fill a record made without its __init__).
_new_record = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _layout(cls: type[Frozen]) -> _Layout | None:
    """``cls``'s :class:`_Layout`, or ``None`` for a record that must be built the validated
    way (private attributes, a ``model_post_init`` hook or its own ``__new__``)."""
    if cls.__private_attributes__ or cls.__pydantic_post_init__ or cls.__new__ is not _new_record:
        return None
    layout = _LAYOUTS[cls] = _Layout(cls)
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
    layout = _LAYOUTS.get(cls) or _layout(cls)
    if layout is None:
        return cls(**fields)
    if tuple(fields) == layout.names:  # every field, in order: the keywords are the record
        return _filled(cls, fields, layout.all_set)
    return _filled(cls, _with_defaults(cls, layout, fields), set(fields))


def trusted_record(cls: type[FrozenT], values: dict[str, Any], /) -> FrozenT:
    """:func:`trusted` for the planner's hot loops: ``values`` holds every field of ``cls``,
    in declaration order, and becomes the record's own (the caller gives it up).

    >>> from k3layout.layouts.groups import Group
    >>> trusted_record(Group, {"name": "g", "kind": "kda", "layers": (0, 4), "first_plane": 0})
    Group(name='g', kind='kda', layers=(0, 4), first_plane=0)
    """
    layout = _LAYOUTS.get(cls) or _layout(cls)
    if layout is None or len(values) != len(layout.names):
        return trusted(cls, **values)
    return _filled(cls, values, layout.all_set)


def trusted_maker(cls: type[FrozenT], /) -> Callable[[dict[str, Any]], FrozenT]:
    """:func:`trusted_record` for ``cls`` resolved once, for a loop that makes many records
    of one class: each call takes every field, in declaration order, as a dict it keeps."""
    layout = _LAYOUTS.get(cls) or _layout(cls)
    if layout is None:
        return lambda values: trusted(cls, **values)
    all_set = layout.all_set

    def make(values: dict[str, Any]) -> FrozenT:
        record = _new_record(cls)
        _set_dict(record, values)
        _set_fields_set(record, all_set)
        _set_extra(record, None)
        _set_private(record, None)
        return record

    return make


def trusted_filler(
    cls: type[FrozenT], field: str, /
) -> Callable[[tuple[dict[str, Any], ...], Any], list[FrozenT]]:
    """:func:`trusted_maker` for records made from templates: the function returned makes,
    from each of ``templates`` (every field of ``cls``, in declaration order), a record whose
    ``field`` is ``value`` (the templates are left as they are)."""
    layout = _LAYOUTS.get(cls) or _layout(cls)
    if layout is None or field not in layout.names:
        raise TypeError(f"{cls.__name__}: no trusted records with field {field!r}")
    all_set = layout.all_set

    def fill(templates: tuple[dict[str, Any], ...], value: Any) -> list[FrozenT]:
        made: list[FrozenT] = []
        for template in templates:
            values = template.copy()
            values[field] = value
            record = _new_record(cls)
            _set_dict(record, values)
            _set_fields_set(record, all_set)
            _set_extra(record, None)
            _set_private(record, None)
            made.append(record)
        return made

    return fill


def _filled(cls: type[FrozenT], values: dict[str, Any], fields_set: set[str]) -> FrozenT:
    record = _new_record(cls)
    _set_dict(record, values)
    _set_fields_set(record, fields_set)
    _set_extra(record, None)
    _set_private(record, None)
    return record


def _with_defaults(cls: type[Frozen], layout: _Layout, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` in declaration order, omitted ones at their defaults (refusing a missing
    required field or an unknown one with ``TypeError``: a planner bug, not bad input)."""
    values: dict[str, Any] = {}
    given = 0
    for name, default in layout.defaults:
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
    return values


def trusted_variant(record: FrozenT, /, **changes: Any) -> FrozenT:
    """``record`` with ``changes`` applied, made the :func:`trusted` way (no re-validation):
    for the planner's many records that differ from one built and checked just before only
    in a field the checks do not read (the module layers a segment names)."""
    return trusted_variants((record,), **changes)[0]


def trusted_variants(records: Iterable[FrozenT], /, **changes: Any) -> tuple[FrozenT, ...]:
    """:func:`trusted_variant` of each of ``records``, with the same ``changes``."""
    made: list[FrozenT] = []
    for record in records:
        cls = type(record)
        layout = _LAYOUTS.get(cls) or _layout(cls)
        values = record.__dict__.copy()
        if layout is None or len(values) != len(layout.names):  # a cached property's value
            values = {name: values[name] for name in cls.__pydantic_fields__}
        values.update(changes)
        fields_set = record.__pydantic_fields_set__
        if not fields_set.issuperset(changes):  # else shared, as trusted() shares it
            fields_set = fields_set.union(changes)
        made.append(_filled(cls, values, fields_set))
    return tuple(made)
