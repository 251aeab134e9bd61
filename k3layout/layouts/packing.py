"""The parent layout's packing: how many pages of each group one plane of a parent holds.

A packing ``(p_m, p_l)`` puts ``p_m`` MLA pages or ``p_l`` KDA state pages on a plane of
``align_up(max(p_m * page, p_l * S), 256)`` bytes. The MLA kernel walks pages by an implicit
payload-sized stride, so the plane must be *exactly* ``p_m`` pages (exact page stride). The
padding of group ``g`` is ``(parent / p_g - raw_g) / raw_g``, ``raw_g`` the group's payload on
one page (MLA: ``n x page``; state: ``n x S``), and must stay within a limit (0.25).

The packing is searched: the smallest parent with an exact stride and every group's padding
within the limit, ties broken by least padding. #1152's one formula, ``p_m = ceil(S / page)``,
``p_l = max(1, p_m * page // S)``, is evaluated beside it and reported.
"""

from __future__ import annotations

import math

from pydantic import NonNegativeInt, PositiveInt

from .._frozen import Frozen
from ..constants import MAX_PAGES_PER_PLANE, PARENT_ALIGNMENT_BYTES
from ..errors import Refusal
from .groups import Group


class PackingFrame(Frozen):
    """What a packing is chosen against: the pages, the planes and the groups riding them."""

    mla_page_bytes: PositiveInt
    state_bytes: NonNegativeInt
    num_planes: PositiveInt
    groups: tuple[Group, ...]
    max_padding: float | None

    def plane_bytes(self, mla_pages: int, state_pages: int) -> int:
        """``align_up(max(p_m * page, p_l * S), 256)``."""
        payload = max(mla_pages * self.mla_page_bytes, state_pages * self.state_bytes)
        return -(-payload // PARENT_ALIGNMENT_BYTES) * PARENT_ALIGNMENT_BYTES

    def unit_bytes(self, group: Group) -> int:
        """Payload of one layer of ``group`` on one page: the MLA page or the KDA state."""
        return self.mla_page_bytes if group.kind == "attention" else self.state_bytes

    def raw_bytes(self, group: Group) -> int:
        """Payload of ``group`` on one page: its layers times :meth:`unit_bytes`."""
        return len(group.layers) * self.unit_bytes(group)

    def padding(self, group: Group, mla_pages: int, state_pages: int) -> float:
        """``(parent / p_g - raw_g) / raw_g`` of ``group`` under packing ``(p_m, p_l)``."""
        parent = self.num_planes * self.plane_bytes(mla_pages, state_pages)
        pages = mla_pages if group.kind == "attention" else state_pages
        raw = self.raw_bytes(group)
        return (parent / pages - raw) / raw

    def worst(self, mla_pages: int, state_pages: int) -> tuple[str, float]:
        """The group with the most padding under a packing, and that padding."""
        return max(
            ((g.name, self.padding(g, mla_pages, state_pages)) for g in self.groups if g.layers),
            key=lambda item: item[1],
        )

    @property
    def has_state(self) -> bool:
        """Whether any KDA group rides the planes."""
        return any(g.kind == "kda" and g.layers for g in self.groups)


class Packing(Frozen):
    """A chosen packing: ``mla_pages`` (p_m) and ``state_pages`` (p_l) per plane."""

    mla_pages: PositiveInt
    state_pages: NonNegativeInt
    plane_bytes: PositiveInt


class RuleCheck(Frozen):
    """#1152's packing, evaluated beside the searched one: was it chosen, and if not, why."""

    mla_pages: PositiveInt
    state_pages: PositiveInt
    plane_bytes: PositiveInt
    parent_bytes: PositiveInt
    exact_stride: bool
    worst_group: str
    worst_padding: float
    chosen: bool
    reason: str | None


def rule_1152(frame: PackingFrame, chosen: Packing) -> RuleCheck | None:
    """Evaluate ``p_m = ceil(S / page)``, ``p_l = max(1, p_m * page // S)`` (None without KDA).

    fp8 tp 8: ceil(814,080 / 73,728) = 12; bf16 tp 32: p_m 2, p_l 1, padding 0.512.
    """
    if not frame.has_state:
        return None
    mla_pages = -(-frame.state_bytes // frame.mla_page_bytes)
    state_pages = max(1, mla_pages * frame.mla_page_bytes // frame.state_bytes)
    plane = frame.plane_bytes(mla_pages, state_pages)
    exact = plane == mla_pages * frame.mla_page_bytes
    worst_group, worst_padding = frame.worst(mla_pages, state_pages)
    is_chosen = (mla_pages, state_pages) == (chosen.mla_pages, chosen.state_pages)
    reason: str | None = None
    if not exact:
        reason = (
            f"plane {plane} B is not {mla_pages} x the {frame.mla_page_bytes} B page: "
            "the exact page stride is lost"
        )
    elif frame.max_padding is not None and worst_padding > frame.max_padding:
        reason = (
            f"padding {worst_padding:.3f} of {worst_group} exceeds "
            f"max_padding {frame.max_padding:g}"
        )
    elif not is_chosen:
        reason = (
            f"packing {chosen.mla_pages}/{chosen.state_pages} has the same parent with less padding"
        )
    return RuleCheck(
        mla_pages=mla_pages,
        state_pages=state_pages,
        plane_bytes=plane,
        parent_bytes=frame.num_planes * plane,
        exact_stride=exact,
        worst_group=worst_group,
        worst_padding=worst_padding,
        chosen=is_chosen,
        reason=reason,
    )


def _padding_floor(frame: PackingFrame) -> tuple[str, float]:
    """The padding a group approaches as planes grow: ``planes / layers - 1`` for state
    (a state group of 23 on 24 planes never pads under 1/23); 0-ish for MLA."""
    return max(
        ((g.name, frame.num_planes / len(g.layers) - 1) for g in frame.groups if g.layers),
        key=lambda item: item[1],
    )


def _search_bound(frame: PackingFrame) -> int:
    """A ``p_m`` past which every candidate is within the limit (or the search cap).

    With ``x = p_m * page / S``, state padding <= ``planes / n * x / (x - 1) - 1``; it is within
    the limit once ``x >= c / (c - 1)``, ``c = (1 + limit) * n / planes``.
    """
    if frame.max_padding is None or not frame.has_state:
        return MAX_PAGES_PER_PLANE
    smallest = min(len(g.layers) for g in frame.groups if g.kind == "kda" and g.layers)
    c = (1 + frame.max_padding) * smallest / frame.num_planes
    if c <= 1:
        return MAX_PAGES_PER_PLANE  # only an exact p_m * page == p_l * S meets the limit
    x = c / (c - 1)
    align = PARENT_ALIGNMENT_BYTES // math.gcd(PARENT_ALIGNMENT_BYTES, frame.mla_page_bytes)
    bound = math.ceil(x * frame.state_bytes / frame.mla_page_bytes) + 2 * align
    return min(bound, MAX_PAGES_PER_PLANE)


def search_packing(frame: PackingFrame) -> Packing:
    """The smallest parent whose plane is exactly ``p_m`` pages and whose groups all pad within
    the limit; for each ``p_m`` the most state pages that fit (least padding at equal parent).

    Refuses ``padding_limit`` when no packing can meet the limit and
    ``packing_search_exhausted`` when the search ends without one.
    """
    limit = frame.max_padding
    floor_group, floor = _padding_floor(frame)
    if limit is not None and floor > limit:
        group = next(g for g in frame.groups if g.name == floor_group)
        raise Refusal(
            "padding_limit",
            f"group {floor_group}: padding can never go below {floor:.3f} "
            f"({len(group.layers)} layers on {frame.num_planes} planes) > "
            f"max_padding={limit:g}",
            facts={
                "group": floor_group,
                "padding_floor": round(floor, 6),
                "max_padding": limit,
                "layers": len(group.layers),
                "planes": frame.num_planes,
            },
            hint=f"max_padding above {floor:.3f} would plan, or engine=vllm",
        )
    bound = _search_bound(frame)
    best_near_miss: tuple[str, float] | None = None
    for mla_pages in range(1, bound + 1):
        plane = mla_pages * frame.mla_page_bytes
        if frame.plane_bytes(mla_pages, 0) != plane:
            continue  # the page count is not 256-aligned: the stride would not be exact
        state_pages = plane // frame.state_bytes if frame.has_state else 0
        if frame.has_state and state_pages == 0:
            continue
        worst_group, worst = frame.worst(mla_pages, state_pages)
        if limit is None or worst <= limit:
            return Packing(mla_pages=mla_pages, state_pages=state_pages, plane_bytes=plane)
        if best_near_miss is None or worst < best_near_miss[1]:
            best_near_miss = (worst_group, worst)
    best = (
        "none had an exact stride"
        if best_near_miss is None
        else (f"best: {best_near_miss[0]} at {best_near_miss[1]:.6f}")
    )
    raise Refusal(
        "packing_search_exhausted",
        f"no packing of up to {bound} MLA pages per plane keeps every group within "
        f"max_padding={limit} ({best})",
        facts={
            "bound": bound,
            "max_padding": limit,
            "best_padding": None if best_near_miss is None else best_near_miss[1],
        },
        hint="raise max_padding or use engine=vllm",
    )
