"""Is a live layout the plan's, in another order? A permutation named as one.

A check of live tensors finds each registered part at some byte offset of the rank's backing
and the plan says where it should start. When one layer is off, the check names it. When the
engine published whole planes in another order (tokenspeed's ids sorted as numbers where its
recipe sorts them as strings; vLLM's planes reversed or rotated), or exchanged layers between
planes, every layer it moved is off: naming the first of them ("KDA layer model.layers.0 starts
on no plane") blames a layer that is where the engine put it on purpose. This module says
what happened instead:

- ``planes``: every layer of plan plane ``j`` moved by the same amount, the planes still
  disjoint: the backing holds whole planes in another order (``order[k]`` is the plan's plane
  that backing plane ``k`` holds);
- ``layers``: every moved layer starts at another plan plane's start plus its own offset, and
  each group still fills its planes once each: the layers are exchanged across planes;
- ``shift``: every layer moved by the same amount: the backing starts elsewhere.

Pure arithmetic over offsets, so the adapter (torch tensors) and the vLLM bridge (tensors read
by attribute) share it.

>>> items = [Placed(name=f"l{j}", group="g", position=j, plane=j, offset_bytes=0,
...                 expected_bytes=j * 8, actual_bytes=(2 - j) * 8) for j in range(3)]
>>> found = reordering(items, plane_starts=(0, 8, 16), plane_extents=(8, 8, 8))
>>> found.kind, found.order, found.moved
('planes', (2, 1, 0), ('l0', 'l2'))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

Kind: TypeAlias = Literal["planes", "layers", "shift"]

MOVED_NAMED = 4
"""How many moved layers a refusal names."""


@dataclass(frozen=True)
class Placed:
    """One registered part: the layer's name, group, position and plan plane, the part's
    offset inside its page (``offset_bytes``), and where it starts in the backing, planned
    (``expected_bytes``) and found (``actual_bytes``)."""

    name: str
    group: str
    position: int
    plane: int
    offset_bytes: int
    expected_bytes: int
    actual_bytes: int


@dataclass(frozen=True)
class Reordering:
    """What a live layout is, against the plan: the plan's planes or layers in another
    order (``kind``) and the layers moved (in the plan's order). For ``planes``, ``order``
    lists the plan's planes as the backing holds them, first to last, and ``planned`` as
    the plan lays them out (``0, 1, 2, ...`` on vLLM; tokenspeed sorts its ids as strings)."""

    kind: Kind
    moved: tuple[str, ...]
    order: tuple[int, ...] = ()
    planned: tuple[int, ...] = ()
    shift_bytes: int = 0
    moves: tuple[tuple[str, int, int], ...] = ()
    """``(layer, plan plane, plane found)`` of each moved layer (``layers``)."""

    @property
    def sentence(self) -> str:
        """The finding in words, for a refusal's message."""
        named = ", ".join(self.moved[:MOVED_NAMED]) + (" ..." if len(self.moved) > 4 else "")
        if self.kind == "shift":
            return (
                f"every layer starts {abs(self.shift_bytes):,} B "
                f"{'after' if self.shift_bytes > 0 else 'before'} where the plan puts it: the "
                "backing is not where the planes start"
            )
        if self.kind == "planes":
            return f"the planes are published in another order: {self._planes_said()}; " + (
                f"the first layers it moves: {named}"
            )
        said = ", ".join(f"{name} (plane {j}) sits on plane {k}" for name, j, k in self.moves[:3])
        more = f", ... ({len(self.moves)} layers moved)" if len(self.moves) > 3 else ""
        return f"the layers are published in another order across planes: {said}{more}"

    def _planes_said(self) -> str:
        held = [(k, j, i) for k, (j, i) in enumerate(zip(self.order, self.planned, strict=True))]
        moved = [(k, j, i) for k, j, i in held if j != i]
        more = f", ... ({len(moved)} of {len(held)} planes moved)" if len(moved) > 3 else ""
        if self.planned == tuple(sorted(self.planned)):  # planes laid out by their numbers
            said = ", ".join(
                f"plane {k} {'holds what' if n == 0 else 'what'} the plan puts in plane {j}"
                for n, (k, j, _) in enumerate(moved[:3])
            )
        else:
            said = ", ".join(
                f"the backing's plane {k} is plane {j}, where the plan lays out plane {i}"
                for k, j, i in moved[:3]
            )
        return said + more


def _disjoint(bases: dict[int, int], extents: Sequence[int]) -> bool:
    ordered = sorted(bases, key=lambda j: bases[j])
    ends = [bases[j] + extents[j] for j in ordered]
    return bases[ordered[0]] >= 0 and all(
        end <= bases[after] for end, after in zip(ends, ordered[1:], strict=False)
    )


def _planes(
    items: Sequence[Placed], starts: Sequence[int], extents: Sequence[int]
) -> Reordering | None:
    """Whole planes moved: one shift per plan plane, the planes disjoint."""
    shifts: dict[int, set[int]] = {}
    for item in items:
        shifts.setdefault(item.plane, set()).add(item.actual_bytes - item.expected_bytes)
    if any(len(found) != 1 for found in shifts.values()):
        return None
    bases = {j: starts[j] + next(iter(found)) for j, found in shifts.items()}
    if not _disjoint(bases, extents):
        return None
    amounts = {next(iter(found)) for found in shifts.values()}
    if len(amounts) == 1:
        names = tuple(dict.fromkeys(item.name for item in items))
        return Reordering(kind="shift", moved=names, shift_bytes=amounts.pop())
    planned = sorted(bases, key=lambda j: starts[j])
    held = sorted(bases, key=lambda j: bases[j])
    if held == planned:  # planes spaced apart in the plan's order: not a permutation
        return None
    moved = tuple(dict.fromkeys(i.name for i in items if i.actual_bytes != i.expected_bytes))
    return Reordering(kind="planes", moved=moved, order=tuple(held), planned=tuple(planned))


def _layers(items: Sequence[Placed], starts: Sequence[int]) -> Reordering | None:
    """Layers exchanged across planes: each moved part at another plane's start plus its own
    offset, one plane per layer, and each group's layers on the group's planned planes once."""
    plane_at = {start: j for j, start in enumerate(starts)}
    found: dict[str, int] = {}
    for item in items:
        plane = plane_at.get(item.actual_bytes - item.offset_bytes)
        if plane is None or found.setdefault(item.name, plane) != plane:
            return None
    groups: dict[str, tuple[list[int], list[int]]] = {}
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            continue
        seen.add(item.name)
        planned, held = groups.setdefault(item.group, ([], []))
        planned.append(item.plane)
        held.append(found[item.name])
    if any(sorted(planned) != sorted(held) for planned, held in groups.values()):
        return None
    moves = tuple(
        dict.fromkeys(
            (item.name, item.plane, found[item.name])
            for item in items
            if found[item.name] != item.plane
        )
    )
    return Reordering(kind="layers", moved=tuple(name for name, _, _ in moves), moves=moves)


def reordering(
    items: Sequence[Placed], plane_starts: Sequence[int], plane_extents: Sequence[int]
) -> Reordering | None:
    """The plan's layout in another order, if that is what ``items`` are (``None`` when
    nothing moved, or when what moved is not a reordering: a layer alone is then named).

    ``plane_starts`` and ``plane_extents`` are where each plan plane starts in the backing
    and the bytes it covers (the page, on a block-outermost backing)."""
    if all(item.actual_bytes == item.expected_bytes for item in items):
        return None
    return _planes(items, plane_starts, plane_extents) or _layers(items, plane_starts)
