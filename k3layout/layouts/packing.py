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
from typing import TypeAlias

from pydantic import NonNegativeInt, PositiveInt

from .._frozen import Frozen, trusted
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
    own_pages: tuple[tuple[str, PositiveInt], ...] = ()
    """Attention groups whose page is not the MLA page (a GQA draft), with their page bytes:
    a plane holds ``plane // page`` of them, and must hold them exactly."""

    def plane_bytes(self, mla_pages: int, state_pages: int) -> int:
        """``align_up(max(p_m * page, p_l * S), 256)``."""
        payload = max(mla_pages * self.mla_page_bytes, state_pages * self.state_bytes)
        return -(-payload // PARENT_ALIGNMENT_BYTES) * PARENT_ALIGNMENT_BYTES

    def payload_bytes(self, group: Group) -> int:
        """Payload of one layer of ``group`` on one page: the MLA page (or the group's own
        page) or the KDA state."""
        own = dict(self.own_pages).get(group.name)
        if own is not None:
            return own
        return self.mla_page_bytes if group.kind == "attention" else self.state_bytes

    def pages_per_plane(self, group: Group, mla_pages: int, state_pages: int) -> int:
        """``p_g`` under ``(p_m, p_l)``: ``p_m``, ``p_l``, or as many of the group's own pages
        as the plane holds."""
        own = dict(self.own_pages).get(group.name)
        if own is not None:
            return self.plane_bytes(mla_pages, state_pages) // own
        return mla_pages if group.kind == "attention" else state_pages

    def raw_bytes(self, group: Group) -> int:
        """Payload of ``group`` on one page: its layers times :meth:`payload_bytes`."""
        return len(group.layers) * self.payload_bytes(group)

    def padding_ratio(self, group: Group, mla_pages: int, state_pages: int) -> tuple[int, int]:
        """The padding of ``group`` under ``(p_m, p_l)`` exactly, as ``(numerator,
        denominator)``: ``(parent - p_g * raw_g, p_g * raw_g)``."""
        parent = self.num_planes * self.plane_bytes(mla_pages, state_pages)
        pages = self.pages_per_plane(group, mla_pages, state_pages)
        payload = pages * self.raw_bytes(group)
        return parent - payload, payload

    def padding(self, group: Group, mla_pages: int, state_pages: int) -> float:
        """``(parent / p_g - raw_g) / raw_g`` of ``group`` under packing ``(p_m, p_l)``
        (rounded once, from the exact :meth:`padding_ratio`)."""
        numerator, denominator = self.padding_ratio(group, mla_pages, state_pages)
        return numerator / denominator

    def worst(self, mla_pages: int, state_pages: int) -> tuple[str, float]:
        """The group with the most padding under a packing, and that padding (compared
        exactly; the first such group on a tie)."""
        plane = self.plane_bytes(mla_pages, state_pages)
        name, numerator, denominator = _worst(
            _loads(self), self.num_planes, plane, mla_pages, state_pages
        )
        return name, numerator / denominator

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


_Load: TypeAlias = tuple[str, int, int]
"""A group with layers, as plain integers: (name, its page bytes or 0 to ride the MLA pages
or -1 for state pages, ``raw_g``)."""

_MLA, _STATE = 0, -1


def _loads(frame: PackingFrame) -> tuple[_Load, ...]:
    """The groups with layers as :data:`_Load` s, in group order: the search's only input."""
    own = dict(frame.own_pages)
    return tuple(
        (
            g.name,
            own.get(g.name, _MLA if g.kind == "attention" else _STATE),
            len(g.layers) * frame.payload_bytes(g),
        )
        for g in frame.groups
        if g.layers
    )


def _worst(
    loads: tuple[_Load, ...], num_planes: int, plane: int, mla_pages: int, state_pages: int
) -> tuple[str, int, int]:
    """``(name, numerator, denominator)`` of the most padded group under ``(p_m, p_l)`` on
    planes of ``plane`` bytes, compared by cross-multiplication (exact at any size); the
    first one on a tie."""
    parent = num_planes * plane
    worst: tuple[str, int, int] | None = None
    for name, page, raw in loads:
        if page == _MLA:
            pages = mla_pages
        elif page == _STATE:
            pages = state_pages
        else:
            pages = plane // page
        payload = pages * raw
        excess = parent - payload
        if worst is None or excess * worst[2] > worst[1] * payload:
            worst = (name, excess, payload)
    if worst is None:
        raise ValueError("a packing frame needs at least one group with layers")
    return worst


def _limit_ratio(limit: float) -> tuple[int, int]:
    """``max_padding`` as an exact ``(numerator, denominator)`` (a float is a dyadic rational)."""
    return float(limit).as_integer_ratio()


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
    worst_group, excess, payload = _worst(
        _loads(frame), frame.num_planes, plane, mla_pages, state_pages
    )
    worst_padding = excess / payload
    is_chosen = (mla_pages, state_pages) == (chosen.mla_pages, chosen.state_pages)
    over_limit = False
    if frame.max_padding is not None:
        limit_num, limit_den = _limit_ratio(frame.max_padding)
        over_limit = excess * limit_den > limit_num * payload
    reason: str | None = None
    if not exact:
        reason = (
            f"plane {plane} B is not {mla_pages} x the {frame.mla_page_bytes} B page: "
            "the exact page stride is lost"
        )
    elif over_limit:
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


def _padding_floor(frame: PackingFrame) -> tuple[str, int, int]:
    """The padding a group approaches as planes grow: ``planes / layers - 1`` for state
    (a state group of 23 on 24 planes never pads under 1/23); 0-ish for MLA. Exact, as
    ``(name, numerator, denominator)`` of the largest (the first on a tie)."""
    floor: tuple[str, int, int] | None = None
    for group in frame.groups:
        layers = len(group.layers)
        if not layers:
            continue
        excess = frame.num_planes - layers
        if floor is None or excess * floor[2] > floor[1] * layers:
            floor = (group.name, excess, layers)
    if floor is None:
        raise ValueError("a packing frame needs at least one group with layers")
    return floor


def _search_bound(frame: PackingFrame) -> int:
    """A ``p_m`` past which every candidate is within the limit (or the search cap).

    With ``x = p_m * page / S``, state padding <= ``planes / n * x / (x - 1) - 1``; it is within
    the limit once ``x >= c / (c - 1)``, ``c = (1 + limit) * n / planes``. Integer arithmetic
    throughout: with ``limit = a / b``, ``c = (b + a) n / (b planes)`` and
    ``x S / page = (b + a) n S / (((b + a) n - b planes) page)``.
    """
    if frame.max_padding is None or not frame.has_state:
        return MAX_PAGES_PER_PLANE
    smallest = min(len(g.layers) for g in frame.groups if g.kind == "kda" and g.layers)
    limit_num, limit_den = _limit_ratio(frame.max_padding)
    grown = (limit_den + limit_num) * smallest
    if grown <= limit_den * frame.num_planes:
        return MAX_PAGES_PER_PLANE  # only an exact p_m * page == p_l * S meets the limit
    pages = -(
        -grown
        * frame.state_bytes
        // ((grown - limit_den * frame.num_planes) * frame.mla_page_bytes)
    )
    align = PARENT_ALIGNMENT_BYTES // math.gcd(PARENT_ALIGNMENT_BYTES, frame.mla_page_bytes)
    return min(pages + 2 * align, MAX_PAGES_PER_PLANE)


def search_packing(frame: PackingFrame) -> Packing:
    """The smallest parent whose plane is exactly ``p_m`` pages and whose groups all pad within
    the limit; for each ``p_m`` the most state pages that fit (least padding at equal parent).

    The search runs over plain integers (each group's ``raw_g`` computed once) and compares
    paddings exactly, by cross-multiplication.

    Refuses ``padding_limit`` when no packing can meet the limit and
    ``packing_search_exhausted`` when the search ends without one.
    """
    limit = frame.max_padding
    limit_num, limit_den = (0, 1) if limit is None else _limit_ratio(limit)
    floor_group, floor_excess, floor_layers = _padding_floor(frame)
    if limit is not None and floor_excess * limit_den > limit_num * floor_layers:
        floor = floor_excess / floor_layers
        raise Refusal(
            "padding_limit",
            f"group {floor_group}: padding can never go below {floor:.3f} "
            f"({floor_layers} layers on {frame.num_planes} planes) > "
            f"max_padding={limit:g}",
            facts={
                "group": floor_group,
                "padding_floor": round(floor, 6),
                "max_padding": limit,
                "layers": floor_layers,
                "planes": frame.num_planes,
            },
            hint=f"max_padding above {floor:.3f} would plan, or engine=vllm",
        )
    bound = _search_bound(frame)
    loads = _loads(frame)
    has_state = any(page == _STATE for _, page, _ in loads)
    own_pages = tuple(page for _, page, _ in loads if page > 0)
    page, state, planes = frame.mla_page_bytes, frame.state_bytes, frame.num_planes
    # p_m * page is 256-aligned (an exact stride) exactly when p_m is a multiple of `step`.
    step = PARENT_ALIGNMENT_BYTES // math.gcd(PARENT_ALIGNMENT_BYTES, page)
    best_near_miss: tuple[str, int, int] | None = None
    for mla_pages in range(step, bound + 1, step):
        plane = mla_pages * page
        state_pages = plane // state if has_state else 0
        if has_state and state_pages == 0:
            continue
        if any(plane % own for own in own_pages):
            continue  # a draft's own pages would not tile the plane: no exact stride for them
        # state_pages * S <= plane and plane is aligned: the plane is exactly p_m pages.
        name, excess, payload = _worst(loads, planes, plane, mla_pages, state_pages)
        if limit is None or excess * limit_den <= limit_num * payload:
            return trusted(Packing, mla_pages=mla_pages, state_pages=state_pages, plane_bytes=plane)
        if best_near_miss is None or excess * best_near_miss[2] < best_near_miss[1] * payload:
            best_near_miss = (name, excess, payload)
    best_padding = None if best_near_miss is None else best_near_miss[1] / best_near_miss[2]
    best = (
        "none had an exact stride"
        if best_near_miss is None
        else (f"best: {best_near_miss[0]} at {best_padding:.6f}")
    )
    raise Refusal(
        "packing_search_exhausted",
        f"no packing of up to {bound} MLA pages per plane keeps every group within "
        f"max_padding={limit} ({best})",
        facts={
            "bound": bound,
            "max_padding": limit,
            "best_padding": best_padding,
        },
        hint="raise max_padding or use engine=vllm",
    )
