"""Argument types of the public functions, refused rather than raised as ``TypeError``.

Every public entry point checks its arguments first, so a wrong type (``plan("kimi-k3", ...)``,
``rank_sizes(None, d)``, ``pp_stage_bounds(93, "8")``) is refused with
``code="invalid_argument"`` naming the parameter and the type it takes, instead of failing
somewhere inside with a ``TypeError`` or ``AttributeError``. ``bool`` is not an ``int`` here.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, cast

from ._validation import describe
from .constants import MAX_ARGUMENT_BITS
from .errors import Refusal

Types: TypeAlias = type | tuple[type, ...]


def expect(name: str, value: object, types: Types) -> None:
    """Refuse (``invalid_argument``) ``value`` for parameter ``name`` unless it is a ``types``.

    >>> expect("pp", 8, int)
    >>> expect("pp", True, int)
    Traceback (most recent call last):
    ...
    k3layout.errors.Refusal: pp=True must be int, got bool; pass pp as int
    """
    if type(value) is types:  # the common case, exactly the type asked for: nothing to refuse
        return
    allowed = types if isinstance(types, tuple) else (types,)
    is_bool_for_int = isinstance(value, bool) and bool not in allowed
    if isinstance(value, allowed) and not is_bool_for_int:
        return
    names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
    raise Refusal(
        "invalid_argument",
        f"{name}={describe(value)} must be {names}, got {type(value).__name__}",
        facts={"field": name, "expected": names, "got": type(value).__name__},
        hint=f"pass {name} as {names}",
    )


def expect_args(*checks: tuple[str, object, Types]) -> None:
    """:func:`expect` each ``(name, value, types)`` in turn."""
    for name, value, types in checks:
        expect(name, value, types)


def expect_int(name: str, value: object) -> int:
    """``value`` for parameter ``name`` if it is an ``int`` (not a ``bool``) of at most
    :data:`~k3layout.constants.MAX_ARGUMENT_BITS` bits; else refuse (``invalid_argument``, or
    ``size_limit`` for a larger one: the checks after this one may print the value)."""
    expect(name, value, int)
    number = cast(int, value)
    if number.bit_length() > MAX_ARGUMENT_BITS:
        raise Refusal(
            "size_limit",
            f"{name}={describe(number)} is beyond any count k3layout takes "
            f"({MAX_ARGUMENT_BITS:,} bits)",
            facts={"field": name, "bits": number.bit_length()},
            hint=f"pass {name} as a count or byte size within int64",
        )
    return number


def _expect_at_least(name: str, value: object, low: int, hint: str | None) -> int:
    """``value`` for parameter ``name`` if it is an ``int`` of ``low`` or more; else refuse
    (``invalid_argument``), with ``hint`` (default: ``pass {name} >= {low}``)."""
    number = expect_int(name, value)
    if number < low:
        raise Refusal(
            "invalid_argument",
            f"{name}={number} must be >= {low}",
            facts={"field": name},
            hint=f"pass {name} >= {low}" if hint is None else hint,
        )
    return number


def expect_positive(name: str, value: object, hint: str | None = None) -> int:
    """``value`` for parameter ``name`` if it is an ``int`` of 1 or more; else refuse
    (``invalid_argument``), with ``hint`` (default: ``pass {name} >= 1``)."""
    return _expect_at_least(name, value, 1, hint)


def expect_non_negative(name: str, value: object, hint: str | None = None) -> int:
    """``value`` for parameter ``name`` if it is an ``int`` of 0 or more; else refuse
    (``invalid_argument``), with ``hint`` (default: ``pass {name} >= 0``)."""
    return _expect_at_least(name, value, 0, hint)


def expect_items(name: str, value: object, item_types: Types, *, optional: bool = False) -> None:
    """Refuse ``value`` unless it is a list or tuple (or ``None`` when ``optional``) of
    ``item_types``; the first wrong item is named ``name[i]``."""
    if optional and value is None:
        return
    expect(name, value, (list, tuple))
    for i, item in enumerate(cast(Sequence[object], value)):
        expect(f"{name}[{i}]", item, item_types)


def expect_bounded_int(name: str, value: object, bound: int) -> int:
    """``value`` for parameter ``name`` if it is an ``int`` with ``|value| <= bound``; refuse
    a wrong type (``invalid_argument``) or a larger value (``size_limit``)."""
    number = expect_int(name, value)
    if abs(number) > bound:
        raise Refusal(
            "size_limit",
            f"{name}={describe(number)} is beyond the bound {bound:,}",
            facts={"field": name, "bound": bound},
            hint=f"pass {name} between 0 and {bound:,}",  # every bounded int is a count
        )
    return number


def expect_sequence(
    name: str, value: object, item_types: Types, *, optional: bool = False
) -> Sequence[object]:
    """``value`` if it is a sequence (a list, tuple, range, ...; not a ``str`` or ``bytes``) of
    ``item_types`` (or ``None`` when ``optional``, returned as ``()``); else refuse, naming the
    first wrong item ``name[i]``."""
    if optional and value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes, bytearray)):
        expect(name, value, (list, tuple))  # refuses, naming what it takes
    items = cast(Sequence[object], value)
    for i, item in enumerate(items):
        expect(f"{name}[{i}]", item, item_types)
    return items


def expect_mapping(name: str, value: object, key_types: Types, value_types: Types) -> None:
    """Refuse ``value`` unless it is a mapping of ``key_types`` to ``value_types``; the first
    wrong entry is named ``name[key]``."""
    if not isinstance(value, Mapping):
        expect(name, value, dict)  # refuses, naming what it takes
    for key, item in cast(Mapping[object, object], value).items():
        expect(f"{name} key", key, key_types)
        expect(f"{name}[{describe(key)}]", item, value_types)


_ABSENT = object()


def engine_attribute(obj: object, path: str, owner: str, *, nullable: bool = False) -> Any:
    """The attribute at dotted ``path`` of an engine's own record ``obj`` (read by attribute,
    never guessed): refuse (``invalid_config``, naming ``owner.path``) where a step is missing,
    or is ``None`` unless ``nullable`` (the engine's own records always have these; an object
    without them is not the engine's, and planning it with a default would plan something
    else, such as TP 1 or bf16, silently).

    >>> from types import SimpleNamespace
    >>> engine_attribute(SimpleNamespace(tp=8), "tp", "server_args")
    8
    >>> engine_attribute(SimpleNamespace(), "parallel_config.tp", "vllm_config")
    Traceback (most recent call last):
    ...
    k3layout.errors.Refusal: vllm_config.parallel_config: missing (...); pass the engine's own ...
    """
    value = obj
    walked = owner
    steps = path.split(".")
    for i, step in enumerate(steps):
        walked = f"{walked}.{step}"
        value = getattr(value, step, _ABSENT)
        last = i == len(steps) - 1
        if value is _ABSENT or (value is None and not (last and nullable)):
            what = "missing" if value is _ABSENT else "None"
            raise Refusal(
                "invalid_config",
                f"{walked}: {what} (a {owner} without {walked.removeprefix(owner + '.')})",
                facts={"field": walked.removeprefix(owner + "."), "owner": owner},
                hint=f"pass the engine's own {owner}",
            )
    return value


def running_version(package: str) -> str | None:
    """The ``__version__`` of engine ``package`` as this process imported it (a bridge reads
    the running engine's release and plans for it); ``None`` where it is not imported (the
    engine's records handed over by other means: the newest release k3layout follows)."""
    module = sys.modules.get(package)
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) and version else None
