"""tokenspeed's parent-block packing as ``engine="parent"`` (seed 001, tokenspeed #1152):
contiguous groups, searched packing with an exact page stride, the arena binding and its
capacity (:class:`ParentPlan`), registered by :mod:`.engine`."""

from .capacity import ParentCapacity
from .engine import PARENT, plan_parent
from .layout import Binding, GroupPages, LayerBinding, ParentPlan

__all__ = [
    "PARENT",
    "Binding",
    "GroupPages",
    "LayerBinding",
    "ParentCapacity",
    "ParentPlan",
    "plan_parent",
]
