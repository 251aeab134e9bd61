"""The plan report: every number of a plan, flat and JSON-ready, in a stable schema.

A plan stores its decisions and derives the rest; a report spells the derived numbers out for
operators, dashboards and ``k3layout plan --json``. Reports are data only: build one with
:func:`report`, read one back with :data:`REPORT_ADAPTER`. ``schema_version`` changes only when
a field is renamed or removed; new fields may be added.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import ConfigDict, Field, TypeAdapter

from .._frozen import Frozen
from ..deployment import Deployment
from ..sizes import RankSizes
from .groups import Group, Stage
from .packing import RuleCheck
from .parent import ParentPlan
from .vllm import VllmPlan

SCHEMA_VERSION: Literal[1] = 1


class SizesReport(Frozen):
    """Per-rank, per-layer sizes (``kda_*`` and ``replay_*`` are 0 / empty without KDA)."""

    mla_bytes_per_token: int
    index_bytes_per_token: int
    attention_bytes_per_token: int
    mla_page_bytes: int
    kda_conv_bytes: int
    kda_recurrent_bytes: int
    kda_state_bytes: int
    kda_conv_shape_channel_major: tuple[int, ...]
    kda_conv_shape_time_major: tuple[int, ...]
    kda_recurrent_shape: tuple[int, ...]
    replay_record_bytes: int

    @classmethod
    def of(cls, sizes: RankSizes) -> SizesReport:
        """Spell out ``sizes``."""
        kda = sizes.kda
        return cls(
            mla_bytes_per_token=sizes.attention.latent_bytes_per_token,
            index_bytes_per_token=sizes.attention.index_bytes_per_token,
            attention_bytes_per_token=sizes.attention.bytes_per_token,
            mla_page_bytes=sizes.attention.page_bytes(),
            kda_conv_bytes=0 if kda is None else kda.conv_bytes,
            kda_recurrent_bytes=0 if kda is None else kda.recurrent_bytes,
            kda_state_bytes=sizes.kda_state_bytes,
            kda_conv_shape_channel_major=() if kda is None else kda.conv_shape("channel_major"),
            kda_conv_shape_time_major=() if kda is None else kda.conv_shape("time_major"),
            kda_recurrent_shape=() if kda is None else kda.recurrent_shape,
            replay_record_bytes=0 if sizes.replay is None else sizes.replay.layer_bytes,
        )


class StageReport(Frozen):
    """One pipeline stage: its module layers, projected groups and plane count."""

    index: int
    layers: tuple[int, ...]
    groups: tuple[Group, ...]
    planes: int


class VllmStageReport(StageReport):
    """One pipeline stage of a ``vllm`` plan, with the bytes one block costs on it."""

    block_bytes: int


class ParentStageReport(StageReport):
    """One pipeline stage of a ``parent`` plan, with the bytes of one of its parents."""

    parent_bytes: int


class PlanReport(Frozen):
    """What a report of either engine holds."""

    schema_version: Literal[1] = SCHEMA_VERSION
    model: str
    deployment: Deployment
    kda_state_bytes: int
    sizes: SizesReport
    groups: tuple[Group, ...]
    planes: int
    bytes_per_token: float


class VllmReport(PlanReport):
    """``k3layout plan --engine vllm --json``."""

    engine: Literal["vllm"] = "vllm"
    block_tokens: int
    page_bytes: int
    block_bytes: int
    kda_page_padding_bytes: int
    attention_span_tokens: int
    kda_span_tokens: int
    stages: tuple[VllmStageReport, ...]


class ParentReport(PlanReport):
    """``k3layout plan --engine parent --json``."""

    engine: Literal["parent"] = "parent"
    mla_page_bytes: int
    plane_bytes: int
    parent_bytes: int
    packing: dict[str, int]
    padding_fraction: dict[str, float]
    utilization: dict[str, float]
    max_padding: float | None
    rule_1152: RuleCheck | None
    stages: tuple[ParentStageReport, ...]


Report: TypeAlias = Annotated[VllmReport | ParentReport, Field(discriminator="engine")]
REPORT_ADAPTER: TypeAdapter[VllmReport | ParentReport] = TypeAdapter(
    Report, config=ConfigDict(defer_build=True)
)


def _stage_fields(stage: Stage) -> dict[str, object]:
    return {
        "index": stage.index,
        "layers": stage.layers,
        "groups": stage.groups,
        "planes": stage.num_planes,
    }


def report(plan: VllmPlan | ParentPlan) -> VllmReport | ParentReport:
    """Every number of ``plan`` under its documented JSON name."""
    common = {
        "model": plan.model.name,
        "deployment": plan.deployment,
        "kda_state_bytes": plan.sizes.kda_state_bytes,
        "sizes": SizesReport.of(plan.sizes),
        "groups": plan.groups,
        "planes": plan.num_planes,
        "bytes_per_token": plan.bytes_per_token,
    }
    if isinstance(plan, VllmPlan):
        return VllmReport.model_validate(
            {
                **common,
                "block_tokens": plan.block_tokens,
                "page_bytes": plan.page_bytes,
                "block_bytes": plan.block_bytes,
                "kda_page_padding_bytes": plan.kda_page_padding_bytes,
                "attention_span_tokens": plan.attention_span_tokens,
                "kda_span_tokens": plan.kda_span_tokens,
                "stages": [
                    {**_stage_fields(s), "block_bytes": plan.stage_block_bytes(s.index)}
                    for s in plan.stages
                ],
            }
        )
    return ParentReport.model_validate(
        {
            **common,
            "mla_page_bytes": plan.mla_page_bytes,
            "plane_bytes": plan.packing.plane_bytes,
            "parent_bytes": plan.parent_bytes,
            "packing": plan.packing_by_group,
            "padding_fraction": plan.padding_fraction,
            "utilization": plan.utilization,
            "max_padding": plan.max_padding,
            "rule_1152": plan.rule_1152,
            "stages": [
                {**_stage_fields(s), "parent_bytes": plan.stage_parent_bytes(s.index)}
                for s in plan.stages
            ],
        }
    )
