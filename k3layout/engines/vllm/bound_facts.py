"""How a refusal of vLLM's bound caches names its layer, in the checks' one facts schema
(:class:`~k3layout.errors.CheckFacts`), and how a bound tensor is read (by attribute: no torch,
no vLLM)."""

from __future__ import annotations

from typing import Any

from ...errors import CheckName, Fact, Refusal, check_refusal
from .bound import BoundView
from .layout import VllmPlan

Reading = tuple[str, tuple[int, ...], tuple[int, ...], int, int]
"""A bound tensor as the caches check reads it: dtype, shape, strides, storage offset, element
size."""


def where_bound(result: VllmPlan, view: BoundView, stage: int, check: CheckName) -> dict[str, Any]:
    """The layer a view binds, as the checks' facts name it (and its kind, for the message)."""
    group, position = result.group_of(view.module_layer, stage)
    return {
        "kind": "KDA" if view.kind == "kda" else "attention",
        "check": check,
        "stage": stage,
        "layer_name": view.name,
        "layer": view.module_layer,
        "group": group.name,
        "position": position,
        "plane": position,
    }


def refuse_bound(
    code: Any,
    where: dict[str, Any],
    message: str,
    hint: str,
    *,
    field: str,
    expected: Fact,
    actual: Fact,
    part: str | None = None,
    block: int | None = None,
    **extras: Fact,
) -> Refusal:
    return check_refusal(
        code,
        f"{where['kind']} layer {where['layer_name']} (module layer {where['layer']}, group "
        f"{where['group']}, plane {where['plane']}): {message}",
        check=where["check"],
        field=field,
        stage=where["stage"],
        expected=expected,
        actual=actual,
        hint=hint,
        layer=where["layer"],
        layer_name=where["layer_name"],
        group=where["group"],
        position=where["position"],
        plane=where["plane"],
        part=part,
        block=block,
        extra_facts=extras,
    )
