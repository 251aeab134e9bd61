"""Engine layouts: the vLLM hybrid allocator and parent-block packing, one pipeline for both."""

from .bound import BoundView, vllm_bound_views
from .groups import Group, GroupedLayout, GroupKind, PlaneMember, Stage, project_stages
from .packing import Packing, PackingFrame, RuleCheck
from .parent import Binding, GroupPages, LayerBinding, ParentPlan
from .pipeline import Plan, load_plan, plan, plan_parent, plan_vllm, with_engine
from .protocol import ByteRange, EngineLayout, LayoutBase
from .vllm import VllmPlan, block_tokens_for, built_model

__all__ = [
    "Binding",
    "BoundView",
    "ByteRange",
    "EngineLayout",
    "Group",
    "GroupKind",
    "GroupPages",
    "GroupedLayout",
    "LayerBinding",
    "LayoutBase",
    "Packing",
    "PackingFrame",
    "ParentPlan",
    "Plan",
    "PlaneMember",
    "RuleCheck",
    "Stage",
    "VllmPlan",
    "block_tokens_for",
    "built_model",
    "load_plan",
    "plan",
    "plan_parent",
    "plan_vllm",
    "project_stages",
    "vllm_bound_views",
    "with_engine",
]
