"""What two plans differ in: every field, by its path into the plan's JSON, and every derived
number.

A driver and its workers each plan the same deployment; when one worker's plan is not the
driver's, the first question is *where*. :func:`diff` answers it field by field: the plan's
own fields (``deployment.attn_tp``, ``model.layers[3].kind``, ``groups[0].layers[5]``) and the
numbers derived from them (``num_planes``, ``block_bytes``, ``page_bytes``, ``parent_bytes``,
``sizes.state_bytes``, ``stages[0].planes``: the plan's report, :func:`~.report.report`), each
with its value on both sides. It compares what the plans *say*, whatever their engines: a
vLLM plan against a tokenspeed one names the fields only one of them has as absent on the
other side.

>>> from k3layout import Deployment, plan, preset
>>> k3 = preset("kimi-k3")
>>> str(diff(plan(k3, Deployment(attn_tp=8)), plan(k3, Deployment(attn_tp=8))))
'plans equal'
>>> found = diff(plan(k3, Deployment(attn_tp=8)), plan(k3, Deployment(attn_tp=4)))
>>> found.differences[0].path, str(found.differences[0])
('deployment.attn_tp', 'deployment.attn_tp: 8 != 4')
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal, TypeAlias, cast

from .._args import expect_args
from .._frozen import Frozen
from .protocol import EngineLayout, LayoutBase
from .report import report

__all__ = ["Difference", "PlanDiff", "diff"]

Value: TypeAlias = int | float | str | bool | tuple[()] | None
"""A value at the end of a path: a JSON scalar, or ``()`` for an empty list or mapping."""

Side: TypeAlias = Literal["left", "right"]

SHOWN: Final = 5
"""How many differences ``str(PlanDiff)`` spells out before counting the rest."""

DERIVED: Final = (
    "num_planes",
    "block_bytes",
    "bytes_per_token",
    "worst_padding",
    "packing_label",
    "state_span_tokens",
    "state_rides_pages",
    "one_backing",
    "block_outermost",
)
"""The derived numbers every plan answers (:class:`~.protocol.EngineLayout`), compared beside
its report's."""

REPORT_ONLY_SKIPPED: Final = frozenset({"schema_version", "planes"})
"""Report fields not compared: its schema's version, and ``planes`` (``num_planes``)."""


class Difference(Frozen):
    """One path two plans differ at: its value in the left plan and in the right one.

    ``absent`` names the side that has no such path (a field of one engine's plan only, a
    layer or group beyond the other's count); its value there is ``None``."""

    path: str
    left: Value
    right: Value
    absent: Side | None = None

    def __str__(self) -> str:
        return f"{self.path}: {self._shown('left')} != {self._shown('right')}"

    def _shown(self, side: Side) -> str:
        if self.absent == side:
            return "(absent)"
        value = self.left if side == "left" else self.right
        return "[]" if value == () else repr(value)


class PlanDiff(Frozen):
    """Every difference between two plans, in the order of the left plan's JSON (then the
    paths only the right one has, then the derived numbers); empty (and false) for equal
    plans."""

    differences: tuple[Difference, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths that differ, in order."""
        return tuple(found.path for found in self.differences)

    def __len__(self) -> int:
        return len(self.differences)

    def __bool__(self) -> bool:
        return bool(self.differences)

    def __str__(self) -> str:
        count = len(self.differences)
        if not count:
            return "plans equal"
        shown = "; ".join(str(found) for found in self.differences[:SHOWN])
        more = f"; ... and {count - SHOWN} more" if count > SHOWN else ""
        return f"{count} difference{'s' if count > 1 else ''}: {shown}{more}"


def diff(left: EngineLayout, right: EngineLayout) -> PlanDiff:
    """Every field and derived number ``left`` and ``right`` differ in (:class:`PlanDiff`);
    refuses (``invalid_argument``) an argument that is not a plan."""
    expect_args(("left", left, LayoutBase), ("right", right, LayoutBase))
    if left is right:
        return PlanDiff(differences=())
    found = _walk("", _described(cast(LayoutBase, left)), _described(cast(LayoutBase, right)))
    return PlanDiff(differences=tuple(found))


def _described(plan: LayoutBase) -> dict[str, Any]:
    """``plan``'s JSON, then the numbers derived from it that its JSON does not hold: the
    protocol's (:data:`DERIVED`) and its report's, merged in where the plan has no such field
    (a stage's ``planes`` joins the plan's ``stages[i]``)."""
    stored = plan.model_dump(mode="json")
    derived: dict[str, Any] = {name: getattr(plan, name) for name in DERIVED}
    reported = report(cast(EngineLayout, plan)).model_dump(mode="json")
    derived.update(
        (key, value) for key, value in reported.items() if key not in REPORT_ONLY_SKIPPED
    )
    merged: dict[str, Any] = _merged(stored, derived)
    return merged


def _merged(stored: Any, derived: Any) -> Any:
    """``stored`` with what ``derived`` adds: keys it lacks, inside mappings and lists of
    mappings of the same length; where both hold a value, ``stored``'s."""
    if isinstance(stored, dict) and isinstance(derived, dict):
        merged = dict(stored)
        for key, value in derived.items():
            merged[key] = _merged(stored[key], value) if key in stored else value
        return merged
    if isinstance(stored, list) and isinstance(derived, list) and len(stored) == len(derived):
        return [_merged(a, b) for a, b in zip(stored, derived, strict=True)]
    return stored


_MISSING: Final = object()


def _walk(path: str, left: Any, right: Any) -> Iterator[Difference]:
    """The differences under ``path`` (``_MISSING`` on a side without it). A scalar against a
    container is the scalar against nothing and each of the container's scalars against
    nothing (``packing_rule: None`` against a rule's fields)."""
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        for key in {**left, **right}:  # the left's keys in order, then the right's own
            yield from _walk(_key(path, key), left.get(key, _MISSING), right.get(key, _MISSING))
    elif isinstance(left, list) and isinstance(right, list):
        for index in range(max(len(left), len(right))):
            yield from _walk(
                f"{path}[{index}]",
                left[index] if index < len(left) else _MISSING,
                right[index] if index < len(right) else _MISSING,
            )
    elif _container(left) or _container(right) or _MISSING in (left, right):
        yield from _one_sided(path, left, "right")
        yield from _one_sided(path, right, "left")
    elif left != right or isinstance(left, bool) != isinstance(right, bool):  # 1 is not True
        yield Difference(path=path, left=left, right=right)


def _container(value: Any) -> bool:
    return isinstance(value, (Mapping, list))


def _one_sided(path: str, value: Any, absent: Side) -> Iterator[Difference]:
    """Every scalar under ``value`` (``_MISSING``: none) against nothing on side ``absent``."""
    if value is _MISSING:
        return
    for where, leaf in _leaves(path, value):
        if absent == "right":
            yield Difference(path=where, left=leaf, right=None, absent="right")
        else:
            yield Difference(path=where, left=None, right=leaf, absent="left")


def _leaves(path: str, value: Any) -> Iterator[tuple[str, Value]]:
    """Every scalar under ``value`` by its path (an empty container as one ``()``)."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from _leaves(_key(path, key), item)
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _leaves(f"{path}[{index}]", item)
    else:
        yield path, () if _container(value) else value


def _key(path: str, key: str) -> str:
    """``path`` extended by mapping key ``key`` (bracketed where it is not a name)."""
    if key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"
