"""Engine layouts, engine-neutral: the protocol every plan answers, groups and planes, the
packing search, the planning pipeline (each engine's seams come from its own package under
:mod:`k3layout.engines`), invariants and reports."""

from .diff import Difference, PlanDiff, diff
from .groups import Group, GroupedLayout, GroupKind, PlaneMember, Stage, project_stages
from .packing import Packing, RuleCheck
from .pipeline import Plan, plan, with_engine
from .protocol import ByteRange, EngineLayout, LayoutBase
from .stored import load_plan, save_plan

__all__ = [
    "ByteRange",
    "Difference",
    "EngineLayout",
    "Group",
    "GroupKind",
    "GroupedLayout",
    "LayoutBase",
    "Packing",
    "Plan",
    "PlanDiff",
    "PlaneMember",
    "RuleCheck",
    "Stage",
    "diff",
    "load_plan",
    "plan",
    "project_stages",
    "save_plan",
    "with_engine",
]
