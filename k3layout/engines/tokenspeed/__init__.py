"""tokenspeed's Kimi-K3 cache recipe as ``engine="tokenspeed"`` (seed 001, tokenspeed #1152),
followed at #1152's head ``a6ee91b3``: its refusals (:mod:`.rules`), groups, #1152's packing
and the arena's planes and addresses (:mod:`.recipe`, :class:`ParentPlan`), and what a budget
serves (:mod:`.capacity`), registered by :mod:`.engine`."""

from .capacity import ParentCapacity
from .engine import PARENT, TOKENSPEED, plan_parent, plan_tokenspeed
from .layout import Binding, GroupPages, LayerBinding, ParentPlan
from .recipe import REVISION, REVISION_NAME

__all__ = [
    "PARENT",
    "REVISION",
    "REVISION_NAME",
    "TOKENSPEED",
    "Binding",
    "GroupPages",
    "LayerBinding",
    "ParentCapacity",
    "ParentPlan",
    "plan_parent",
    "plan_tokenspeed",
]
