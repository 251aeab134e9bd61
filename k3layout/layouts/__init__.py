"""Engine layouts, engine-neutral: the protocol every plan answers, groups and planes, the
packing search, the planning pipeline (each engine's seams come from its own package under
:mod:`k3layout.engines`), invariants and reports."""

from .groups import Group, GroupedLayout, GroupKind, PlaneMember, Stage, project_stages
from .packing import Packing, RuleCheck
from .pipeline import Plan, load_plan, plan, with_engine
from .protocol import ByteRange, EngineLayout, LayoutBase

__all__ = [
    "ByteRange",
    "EngineLayout",
    "Group",
    "GroupKind",
    "GroupedLayout",
    "LayoutBase",
    "Packing",
    "Plan",
    "PlaneMember",
    "RuleCheck",
    "Stage",
    "load_plan",
    "plan",
    "project_stages",
    "with_engine",
]
