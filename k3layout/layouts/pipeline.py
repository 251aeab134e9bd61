"""The planning pipeline, written once: check -> sizes -> groups -> stages -> pack.

An engine supplies its seams (its own refusals, its grouping rule, its packing) through the
registry (:class:`~k3layout.registry.EngineRules`) and never restates the order. Every step is
a pure function over frozen values.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

from pydantic import BeforeValidator, SerializeAsAny, TypeAdapter

from .._args import expect_args
from .._derivation import deriving
from .._divisors import divisors_near
from ..deployment import Deployment, EngineFlavour
from ..errors import Refusal
from ..model import HybridModel
from ..registry import canonical_name
from ..sizes import rank_sizes
from .groups import projected_stages
from .protocol import EngineLayout, LayoutBase
from .seams import EngineRules, rules_for


def _engine_plan(value: Any) -> Any:
    """A plan's record (a mapping tagged by ``engine``) validated as that engine's plan."""
    if isinstance(value, dict) and "engine" in value:
        rules = rules_for(value["engine"])  # an alias (a plan stored as "parent") resolved
        return rules.plan_type.model_validate({**value, "engine": rules.facts.name})
    return value


if TYPE_CHECKING:
    Plan: TypeAlias = EngineLayout
else:
    Plan = Annotated[SerializeAsAny[LayoutBase], BeforeValidator(_engine_plan)]
"""A plan of any registered engine, tagged by ``engine`` (each engine's plan type validates
its own record); type checkers see the :class:`EngineLayout` protocol."""

PLAN_ADAPTER: TypeAdapter[EngineLayout] = TypeAdapter(Plan)


def check_parallelism(model: HybridModel, deployment: Deployment) -> None:
    """Refusals common to both engines: DCP must divide attention TP."""
    if deployment.attn_tp % deployment.dcp:
        good = divisors_near(deployment.attn_tp, deployment.dcp)
        raise Refusal(
            "dcp_not_dividing_tp",
            f"dcp={deployment.dcp} must divide attn_tp={deployment.attn_tp} "
            "(DCP ranks are drawn from the attention TP group)",
            facts={"dcp": deployment.dcp, "attn_tp": deployment.attn_tp},
            hint=f"use dcp in {good}",
        )


def plan(
    model: HybridModel, deployment: Deployment, *, engine: EngineFlavour | None = None
) -> EngineLayout:
    """Plan ``model``'s KV cache under ``deployment`` for ``deployment.engine``, or for
    ``engine`` where given (the same deployment for that engine: :func:`with_engine`).

    Returns a frozen, JSON-serialisable plan of the engine's own type (``VllmPlan``,
    ``ParentPlan``, ``SglangPlan``), or raises :class:`~k3layout.Refusal`. A type checker
    sees the :class:`~k3layout.EngineLayout` protocol, what every engine's plan answers; with
    ``engine="vllm"`` (``"tokenspeed"``, ``"sglang"``) it sees that engine's plan type, as
    ``k3layout``'s own signature says (the core names no engine), and so does
    ``plan_<engine>``.

    >>> from k3layout import Deployment, plan, preset
    >>> p = plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2), engine="vllm")
    >>> p.block_tokens, p.page_bytes, p.num_planes, p.block_bytes
    (1536, 884736, 29, 25657344)
    """
    expect_args(
        ("model", model, HybridModel),
        ("deployment", deployment, Deployment),
        ("engine", engine, (str, type(None))),
    )
    if engine is not None:
        deployment = with_engine(deployment, engine)
    result: EngineLayout = run_pipeline(model, deployment, rules_for(deployment.engine))
    return result


PLANS_KEPT = 256
"""How many recent plans :func:`run_pipeline` keeps (a bounded memo: a sweep of thousands of
deployments keeps the last few hundred, not all)."""


class _Inputs:
    """A plan's inputs as a memo key: the model by identity (a model's facts are cached on
    the object; an equal model built anew is planned anew), the deployment by value."""

    __slots__ = ("deployment", "hash", "model", "rules")

    def __init__(self, model: HybridModel, deployment: Deployment, rules: EngineRules) -> None:
        self.model, self.deployment, self.rules = model, deployment, rules
        self.hash = hash((id(model), deployment, rules.facts.name))

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Inputs)
            and other.model is self.model
            and other.rules is self.rules
            and other.deployment == self.deployment
        )


@lru_cache(maxsize=PLANS_KEPT)
def _planned(inputs: _Inputs) -> Any:
    return _run(inputs.model, inputs.deployment, inputs.rules)


def run_pipeline(model: HybridModel, deployment: Deployment, rules: EngineRules) -> Any:
    """The pipeline with ``rules``' seams (each engine's own ``plan_<engine>`` calls this with
    its rules, typed by its plan). A plan is an immutable value of its inputs: planning the
    same model object and an equal deployment again returns the plan already made (the last
    :data:`PLANS_KEPT` are kept; a refusal is not kept, it is raised again)."""
    return _planned(_Inputs(model, deployment, rules))


def _run(model: HybridModel, deployment: Deployment, rules: EngineRules) -> Any:
    if deployment.engine_version is None:  # the plan says which release it planned for
        deployment = deployment.model_copy(update={"engine_version": deployment.version_run})
    check_parallelism(model, deployment)
    model = rules.check(model, deployment)
    sizes = rank_sizes(model, deployment)
    groups = rules.group(model, sizes)
    stages = projected_stages(model, deployment, groups)
    with deriving():  # the plan is its own derivation: its validator need not re-plan
        result = rules.pack(model, deployment, sizes, groups, stages)
    # plan.sizes derives exactly these from (model, deployment): keep the ones just derived
    # (a cached property keeps its value in the instance dict, so it is seeded there).
    result.__dict__["sizes"] = sizes
    return result


def plan_with(rules: EngineRules, model: HybridModel, deployment: Deployment) -> Any:
    """:func:`plan` with ``rules``' engine whatever the deployment names (each engine's
    ``plan_<engine>`` is this, typed by its plan)."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    return run_pipeline(model, with_engine(deployment, rules.facts.name), rules)


def with_engine(deployment: Deployment, engine: EngineFlavour) -> Deployment:
    """The same deployment for another engine (built anew, so it is validated)."""
    expect_args(("deployment", deployment, Deployment), ("engine", engine, str))
    if canonical_name(engine) == deployment.engine:
        return deployment
    fields = {name: getattr(deployment, name) for name in Deployment.model_fields}
    # a release is one engine's: the other engine plans for its own newest
    return Deployment.model_validate({**fields, "engine": engine, "engine_version": None})
