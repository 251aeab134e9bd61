"""A plan checks itself: it must equal what the pipeline derives from its model and deployment.

``load_plan`` of a tampered plan, or a plan built by hand, is re-planned
from its own ``(model, deployment)`` and refused (``plan_mismatch``) at the first stored field
the planner would not give; a ``(model, deployment)`` the planner refuses is refused with the
planner's own refusal. The pipeline builds its plans inside
:func:`~k3layout._derivation.deriving`, so planning never derives twice.
"""

from __future__ import annotations

from .._derivation import as_fact, check_derivation
from ..errors import Refusal
from .pipeline import plan
from .protocol import LayoutBase

PLAN_HINT = "re-plan from the model and deployment (k3layout.plan)"


def check_plan(stored: LayoutBase) -> None:
    """Refuse ``stored`` unless it is ``plan(stored.model, stored.deployment)``, field by field."""
    derived = plan(stored.model, stored.deployment)
    thing = f"{stored.engine} plan of {stored.model.name}"
    if not isinstance(derived, type(stored)):  # the deployment names another engine
        raise Refusal(
            "plan_mismatch",
            f"{thing}: engine is not what the planner derives from the plan's own inputs "
            f"(stored={stored.engine}, derived={derived.engine}: deployment.engine)",
            facts={"field": "engine", "stored": stored.engine, "derived": as_fact(derived.engine)},
            hint=PLAN_HINT,
        )
    check_derivation(thing, stored, derived, hint=PLAN_HINT)
