"""What a plan shows of itself (:class:`~k3layout._display.Displayed`): one line, and a table.

The line names the plan's inputs (the model, the engine and its release, the deployment's
settings that differ from their defaults, the cache dtype) and the engine's own caption of
its unit of allocation (``block_caption``)::

    VllmPlan(kimi-k3-dspark, vllm 0.34.0, attn_tp=8, spec_tokens=2, fp8; one block: 1,536
    tokens, a 884,736 B page per layer on each of 29 planes = 25,657,344 B)

The table adds the engine's summary rows and one row per group. Both read only what every
engine's plan answers, so an engine registered from another package shows itself the same way.
"""

from __future__ import annotations

from typing import Protocol

from .._display import listed
from ..deployment import Deployment
from ..model import HybridModel
from .groups import Group

SHOWN_APART = frozenset({"engine", "engine_version", "kv_dtype"})
"""Deployment fields the line shows on their own (``vllm 0.34.0``, ``fp8``), not as
``name=value``."""


class ShownPlan(Protocol):
    """What the views read of a plan."""

    @property
    def model(self) -> HybridModel: ...
    @property
    def deployment(self) -> Deployment: ...
    @property
    def groups(self) -> tuple[Group, ...]: ...
    @property
    def num_planes(self) -> int: ...
    def block_caption(self, num_planes: int) -> str: ...
    def summary(self) -> list[tuple[str, str]]: ...


def settings(deployment: Deployment) -> list[str]:
    """The deployment's fields that differ from their defaults, as ``name=value`` (text
    unquoted), in field order; the engine, its release and the cache dtype left out."""
    shown = []
    for name, info in Deployment.model_fields.items():
        value = getattr(deployment, name)
        if name in SHOWN_APART or value == info.get_default(call_default_factory=True):
            continue
        shown.append(f"{name}={value}")
    return shown


def engine_release(deployment: Deployment) -> str:
    """``vllm 0.34.0``: the engine and the release planned for (where the plan names one)."""
    version = deployment.engine_version
    return deployment.engine if version is None else f"{deployment.engine} {version}"


def plan_head(plan: ShownPlan) -> str:
    """The one-line view (see the module)."""
    deployment = plan.deployment
    inputs = [plan.model.name, engine_release(deployment), *settings(deployment)]
    return f"{', '.join(inputs)}, {deployment.kv_dtype}; {plan.block_caption(plan.num_planes)}"


def plan_rows(plan: ShownPlan) -> list[tuple[str, str]]:
    """The table: the inputs, the engine's summary, and each group's kind and layers."""
    deployment = plan.deployment
    chosen = ", ".join([*settings(deployment), f"kv_dtype={deployment.kv_dtype}"])
    return [
        ("model", f"{plan.model.name} ({plan.model.num_layers} layers)"),
        ("engine", engine_release(deployment)),
        ("deployment", chosen),
        *plan.summary(),
        *(
            (f"group {group.name}", f"{group.kind}, layers {listed(group.layers)}")
            for group in plan.groups
        ),
    ]
