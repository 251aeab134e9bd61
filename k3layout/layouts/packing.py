"""The parent layout's packing as a value: ``p_m`` MLA pages and ``p_l`` KDA state pages per
plane of a parent, and the followed revision's rule evaluated for it.

tokenspeed's recipe pins the packing to its revision's rule (#1152's head:
``p_m = max(1, ceil(S / page))``; ``main``: ``p_m = 12``; both ``p_l = max(1, p_m * page // S)``,
:mod:`k3layout.engines.tokenspeed.releases`); :mod:`k3layout.engines.tokenspeed.recipe` lays
out the planes and checks the padding.
"""

from __future__ import annotations

from pydantic import NonNegativeInt, PositiveInt

from .._frozen import Frozen


class Packing(Frozen):
    """A chosen packing: ``mla_pages`` (p_m) and ``state_pages`` (p_l) per plane."""

    mla_pages: PositiveInt
    state_pages: NonNegativeInt
    plane_bytes: PositiveInt


class RuleCheck(Frozen):
    """The followed revision's packing rule evaluated: its packing and parent, its worst padded
    group, and whether the plan took it (tokenspeed's recipe always does; ``reason`` says why
    not where a layout does not)."""

    mla_pages: PositiveInt
    state_pages: PositiveInt
    plane_bytes: PositiveInt
    parent_bytes: PositiveInt
    exact_stride: bool
    worst_group: str
    worst_padding: float
    chosen: bool
    reason: str | None
