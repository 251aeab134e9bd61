"""tokenspeed's parent-block packing registered as ``engine="parent"``: its seams for the
planning pipeline."""

from __future__ import annotations

from ...deployment import Deployment
from ...layouts.pipeline import plan_with
from ...layouts.seams import EngineRules, register_engine
from ...model import HybridModel
from ...registry import EngineFacts
from .invariants import parent_violations
from .layout import ParentPlan, check_parent, group_parent, pack_parent

PARENT = register_engine(
    EngineRules(
        facts=EngineFacts(
            name="parent",
            spec_conv_rows=False,  # tokenspeed keeps K - 1 conv rows; drafts verify elsewhere
            package=__package__ or "",
            listing_order=1,
        ),
        plan_type=ParentPlan,
        check=check_parent,
        group=group_parent,
        pack=pack_parent,
        violations=parent_violations,
    )
)


def plan_parent(model: HybridModel, deployment: Deployment) -> ParentPlan:
    """:func:`k3layout.plan` with ``engine="parent"`` whatever the deployment names."""
    result: ParentPlan = plan_with(PARENT, model, deployment)
    return result
