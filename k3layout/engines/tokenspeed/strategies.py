"""tokenspeed's own deployment settings for :func:`k3layout.testing.deployments`: the values a
sweep draws its padding limit from, and the synthetic models it draws for tokenspeed's K3
recipe. Which combinations plan (the fixed 12:1 packing of ``main`` refuses many TPs, #1152's
search fewer) is the planner's verdict (:mod:`k3layout._deployment_space` plans each
candidate), so nothing here restates a rule of :mod:`.recipe` or :mod:`.rules`."""

from __future__ import annotations

from typing import Final

from ...constants import DEFAULT_MAX_PADDING_FRACTION
from ...errors import Refusal
from ...model import HybridModel
from .recipe import STATE_GROUPS
from .rules import check_model

MAX_PADDINGS: Final = (
    None,
    DEFAULT_MAX_PADDING_FRACTION / 2,
    DEFAULT_MAX_PADDING_FRACTION,
    4 * DEFAULT_MAX_PADDING_FRACTION,
)
"""``max_padding`` values drawn: unset (the recipe's own), its 0.25, half and four times it
(a limit of 1 lets a page stride twice its payload)."""


def serves(model: HybridModel) -> bool:
    """Whether tokenspeed's K3 recipe groups ``model`` at attention TP 1 (both layer kinds, KDA
    layers in 3 equal groups, MLA drafts only)."""
    try:
        check_model(model, 1)
    except Refusal:
        return False
    return True


def domains(model: HybridModel, layouts: tuple[str, ...]) -> dict[str, tuple[object, ...]]:
    """The values tokenspeed's padding limit is drawn from."""
    return {"max_padding": MAX_PADDINGS}


def model_shapes(layouts: tuple[str, ...]) -> tuple[dict[str, object], ...]:
    """The keyword arguments of :func:`k3layout.testing.hybrid_models` whose models the K3
    recipe groups: KDA layers in its state groups, MLA drafts only, no indexer."""
    return ({"indexed": False, "kda_groups": STATE_GROUPS, "gqa_drafts": False},)
