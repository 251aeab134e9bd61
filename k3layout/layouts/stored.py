"""A plan stored and read back: the driver plans once and ships the plan; a worker loads it.

:func:`save_plan` writes a plan's JSON to a file; :func:`load_plan` reads a plan from a file,
JSON text, bytes or a dict and re-plans it from its own model and deployment, so a stored
plan the planner would not give is refused (``plan_mismatch``), whatever it came from.

A ``str`` is JSON text when it starts with ``{`` or ``[`` (after JSON's whitespace: a plan
is a JSON object; an array is refused as JSON), else the path of a file:
``load_plan("plan.json")`` and ``load_plan(text)`` both work, and a missing file is refused
naming the path rather than as bad JSON. A file whose name starts with ``{`` or ``[`` is read
through a ``pathlib.Path``.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

from pydantic import ValidationError

from .._args import expect_args
from .._validation import refusal_from_validation, validate_json
from ..errors import Fact, Refusal
from ..limits import checked_bytes
from .pipeline import PLAN_ADAPTER
from .protocol import EngineLayout, LayoutBase

PlanSource: TypeAlias = str | bytes | bytearray | os.PathLike[str] | Mapping[str, Any]
"""What :func:`load_plan` reads: a path (``str`` or ``os.PathLike``), JSON text (a ``str``
starting with ``{`` or ``[``), JSON bytes, or the plan's ``model_dump()`` (either mode)."""

JSON_WHITESPACE = " \t\r\n"
"""The whitespace JSON allows before a value (RFC 8259, section 2)."""

SHOWN_PATH_CHARS = 200
"""A path in a refusal is cut to this many characters (a path too long for the OS is long)."""

LOAD_HINT = "pass the path of a file save_plan wrote, the plan's JSON text, or its model_dump()"
SAVE_HINT = "pass the path of a file in an existing folder this process may write"


def save_plan(plan: EngineLayout, path: str | os.PathLike[str]) -> Path:
    """Write ``plan``'s JSON to the file ``path`` (replacing one there) and return its path:
    ``load_plan(save_plan(p, path)) == p``.

    The file is written whole or not at all (a scratch file beside it, renamed over ``path``),
    so a worker reading it never sees half a plan. Refuses (``invalid_argument``) a ``plan``
    that is not a plan and a ``path`` that is not a path, naming the field, and a path that
    cannot be written (a folder, a missing folder, no permission), naming the path.
    """
    expect_args(("plan", plan, LayoutBase), ("path", path, (str, os.PathLike)))
    target = _path(path)
    text = plan.model_dump_json(indent=2).encode()
    # beside the target (a rename within one folder is atomic), named apart from it (a name
    # near the file system's limit still leaves room)
    scratch = target.with_name(f".k3layout-{uuid.uuid4().hex}.tmp") if target.name else None
    try:
        if scratch is None or target.is_dir():
            raise IsADirectoryError(errno.EISDIR, "is a folder")
        # O_EXCL: never another writer's scratch file; 0o666: the umask decides, as open() does
        handle = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except (OSError, ValueError) as error:  # ValueError: a NUL in the path
        raise _path_refusal(target, error, SAVE_HINT) from None
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(text)
        os.replace(scratch, target)
    except OSError as error:  # the write itself failed: a full disk, a folder in the way
        scratch.unlink(missing_ok=True)
        raise _path_refusal(target, error, SAVE_HINT) from None
    return target


def load_plan(source: PlanSource) -> EngineLayout:
    """A plan back from a file (``save_plan``), its JSON text or bytes
    (``plan.model_dump_json()``) or its dict (``plan.model_dump()``, either mode), re-planned
    from its own model and deployment: a stored number the planner would not give is refused
    (``plan_mismatch``); bad JSON, a bad field or byte counts beyond int64 are refused naming
    the field; a path that is no readable file is refused naming the path.

    >>> from k3layout import Deployment, load_plan, plan, preset
    >>> p = plan(preset("kimi-linear-48b"), Deployment(attn_tp=4))
    >>> load_plan(p.model_dump_json()) == load_plan(p.model_dump()) == p
    True
    """
    expect_args(("source", source, (str, bytes, bytearray, os.PathLike, Mapping)))
    if isinstance(source, Mapping):
        loaded = _validate_python(source)
    elif isinstance(source, os.PathLike) or (isinstance(source, str) and not _is_json(source)):
        target = _path(source)
        content = _read(target)
        try:
            loaded = validate_json(PLAN_ADAPTER, content, "plan")
        except Refusal as refused:  # the file's content: say which file
            raise _in_file(refused, target) from None
    else:
        loaded = validate_json(PLAN_ADAPTER, source, "plan")
    return checked_bytes(loaded, "block_bytes", "parent_bytes")


def _is_json(text: str) -> bool:
    """Whether ``text`` is JSON text rather than a path: it opens an object or an array."""
    return text.lstrip(JSON_WHITESPACE).startswith(("{", "["))


def _validate_python(data: Mapping[str, Any]) -> EngineLayout:
    try:
        return PLAN_ADAPTER.validate_python(dict(data))
    except ValidationError as error:
        raise refusal_from_validation(
            error, "plan", facts={"record": "plan"}, hint="pass the model_dump() of a plan"
        ) from None


def _path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a ``Path``; refuses one ``os.fspath`` does not give as text."""
    try:
        return Path(path)
    except TypeError:  # an os.PathLike giving bytes
        raise Refusal(
            "invalid_argument",
            f"path {type(path).__name__}: its os.fspath() is not text",
            facts={"field": "path", "got": type(path).__name__},
            hint="pass the path as a str or pathlib.Path",
        ) from None


def _read(target: Path) -> bytes:
    """The bytes of the regular file ``target`` (never a device or a pipe, which could be
    read without end); refuses one that cannot be read, naming the path."""
    try:
        if not stat.S_ISREG(target.stat().st_mode):
            raise IsADirectoryError(errno.EISDIR, "is not a regular file")
        return target.read_bytes()
    except (OSError, ValueError) as error:  # ValueError: a NUL in the path
        raise _path_refusal(target, error, LOAD_HINT) from None


def _shown(target: Path) -> str:
    text = str(target)
    return text if len(text) <= SHOWN_PATH_CHARS else f"{text[: SHOWN_PATH_CHARS - 3]}..."


def _path_refusal(target: Path, error: Exception, hint: str) -> Refusal:
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return Refusal(
        "invalid_argument",
        f"plan file {_shown(target)!r}: {reason}",
        facts={"field": "path", "path": _shown(target)},
        hint=hint,
    )


def _in_file(refused: Refusal, target: Path) -> Refusal:
    """``refused`` (of a file's content) with the file named in its message and facts."""
    facts: dict[str, Fact] = {**refused.facts, "path": _shown(target)}
    return Refusal(
        refused.code,
        f"plan file {_shown(target)!r}: {refused.message}",
        facts=facts,
        hint=refused.hint,
    )
