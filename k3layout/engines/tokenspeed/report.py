"""``k3layout plan --engine tokenspeed --json``: a parent plan's report."""

from __future__ import annotations

from typing import Literal

from ...layouts.packing import RuleCheck
from ...layouts.report import PlanReport, StageReport
from .capacity import ParentCapacity


class ParentStageReport(StageReport):
    """One pipeline stage of a ``tokenspeed`` plan, with the bytes of one of its parents."""

    parent_bytes: int


class ParentReport(PlanReport):
    """``k3layout plan --engine tokenspeed --json``."""

    engine: Literal["tokenspeed"] = "tokenspeed"
    mla_page_bytes: int
    plane_bytes: int
    parent_bytes: int
    packing: dict[str, int]
    padding_fraction: dict[str, float]
    utilization: dict[str, float]
    max_padding: float | None
    packing_rule: RuleCheck
    rule_1152: RuleCheck | None
    stages: tuple[ParentStageReport, ...]
    capacity: ParentCapacity | None = None
