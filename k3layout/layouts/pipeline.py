"""The planning pipeline, written once: check -> sizes -> groups -> stages -> pack.

An engine flavour supplies its seams (its own refusals, its grouping rule, its packing) and
never restates the order. Every step is a pure function over frozen values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Generic, TypeAlias, TypeVar

from pydantic import ConfigDict, Field, TypeAdapter

from .._args import expect_args
from .._derivation import deriving
from .._divisors import divisors_near
from .._validation import validate_json
from ..deployment import Deployment, EngineFlavour
from ..errors import Refusal
from ..limits import checked_bytes
from ..model import HybridModel
from ..sizes import RankSizes, rank_sizes
from .groups import Group, Stage, projected_stages
from .parent import ParentPlan, check_parent, group_parent, pack_parent
from .vllm import VllmPlan, check_vllm, group_vllm, pack_vllm

Plan: TypeAlias = Annotated[VllmPlan | ParentPlan, Field(discriminator="engine")]
"""A plan of either engine, tagged by ``engine``."""

PLAN_ADAPTER: TypeAdapter[VllmPlan | ParentPlan] = TypeAdapter(
    Plan, config=ConfigDict(defer_build=True)
)


PlanT = TypeVar("PlanT", VllmPlan, ParentPlan)


@dataclass(frozen=True)
class EngineSeams(Generic[PlanT]):
    """What an engine flavour adds to the pipeline: its refusals (returning the model the
    engine builds: vLLM builds no drafter without speculative tokens), grouping rule and
    packing."""

    check: Callable[[HybridModel, Deployment], HybridModel]
    group: Callable[[HybridModel, RankSizes], tuple[Group, ...]]
    pack: Callable[
        [HybridModel, Deployment, RankSizes, tuple[Group, ...], tuple[Stage, ...]], PlanT
    ]


VLLM_SEAMS = EngineSeams[VllmPlan](check=check_vllm, group=group_vllm, pack=pack_vllm)
PARENT_SEAMS = EngineSeams[ParentPlan](check=check_parent, group=group_parent, pack=pack_parent)


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


def plan(model: HybridModel, deployment: Deployment) -> VllmPlan | ParentPlan:
    """Plan ``model``'s KV cache under ``deployment`` for ``deployment.engine``.

    Returns a frozen, JSON-serialisable plan, or raises :class:`~k3layout.Refusal`.

    >>> from k3layout import Deployment, plan, preset
    >>> p = plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2))
    >>> p.block_tokens, p.page_bytes, p.num_planes, p.block_bytes
    (1536, 884736, 29, 25657344)
    """
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    if deployment.engine == "parent":
        return _run(model, deployment, PARENT_SEAMS)
    return _run(model, deployment, VLLM_SEAMS)


def _run(model: HybridModel, deployment: Deployment, seams: EngineSeams[PlanT]) -> PlanT:
    check_parallelism(model, deployment)
    model = seams.check(model, deployment)
    sizes = rank_sizes(model, deployment)
    groups = seams.group(model, sizes)
    stages = projected_stages(model, deployment, groups)
    with deriving():  # the plan is its own derivation: its validator need not re-plan
        result = seams.pack(model, deployment, sizes, groups, stages)
    # plan.sizes derives exactly these from (model, deployment): keep the ones just derived
    # (a cached property keeps its value in the instance dict, so it is seeded there).
    result.__dict__["sizes"] = sizes
    return result


def plan_vllm(model: HybridModel, deployment: Deployment) -> VllmPlan:
    """:func:`plan` with ``engine="vllm"`` whatever the deployment names."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    return _run(model, with_engine(deployment, "vllm"), VLLM_SEAMS)


def plan_parent(model: HybridModel, deployment: Deployment) -> ParentPlan:
    """:func:`plan` with ``engine="parent"`` whatever the deployment names."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    return _run(model, with_engine(deployment, "parent"), PARENT_SEAMS)


def with_engine(deployment: Deployment, engine: EngineFlavour) -> Deployment:
    """The same deployment for another engine (built anew, so it is validated)."""
    expect_args(("deployment", deployment, Deployment), ("engine", engine, str))
    if deployment.engine == engine:
        return deployment
    fields = {name: getattr(deployment, name) for name in Deployment.model_fields}
    return Deployment.model_validate({**fields, "engine": engine})


def load_plan(data: str | bytes) -> VllmPlan | ParentPlan:
    """A plan back from its JSON (``plan.model_dump_json()``), re-planned from its own model and
    deployment: a stored number the planner would not give is refused (``plan_mismatch``);
    bad JSON, a bad field or byte counts beyond int64 are refused naming the field."""
    expect_args(("data", data, (str, bytes, bytearray)))
    loaded = validate_json(PLAN_ADAPTER, data, "plan")
    return checked_bytes(loaded, "block_bytes", "parent_bytes")
