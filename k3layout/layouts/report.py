"""The plan report: every number of a plan, flat and JSON-ready, in a stable schema.

A plan stores its decisions and derives the rest; a report spells the derived numbers out for
operators, dashboards and ``k3layout plan --json``. Reports are data only: build one with
:func:`report`, read one back with :data:`REPORT_ADAPTER`. ``schema_version`` changes only when
a field is renamed or removed; new fields may be added.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BeforeValidator, SerializeAsAny, TypeAdapter

from .._frozen import Frozen
from ..cache import LayerCacheSpec
from ..deployment import Deployment
from ..memory import MemoryBudget
from ..sizes import RankSizes
from .groups import Group, Stage
from .protocol import EngineLayout
from .seams import rules_for

SCHEMA_VERSION: Literal[1] = 1


class PartReport(Frozen):
    """One part of a layer's cache on one rank: the engine's tensor shape (per token for an
    attention part, per slot for a state part), dtype and bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    tokens_per_row: int = 1


class SpecReport(Frozen):
    """One layer cache spec on one rank: its kind, paging, bytes (of ``tokens`` tokens, the
    fewest a page of it holds whole rows of: 1 unless a part is pooled; or of a slot) and
    parts, in page order."""

    kind: str
    paging: str
    bytes: int
    parts: tuple[PartReport, ...]
    tokens: int = 1

    @classmethod
    def of(cls, spec: LayerCacheSpec, tp: int) -> SpecReport:
        """Spell out ``spec`` at attention TP ``tp``."""
        parts = tuple(
            PartReport(
                name=p.name,
                dtype=p.dtype,
                shape=p.engine_shape(tp),
                bytes=p.local_bytes(tp),
                tokens_per_row=p.tokens_per_row,
            )
            for p in spec.parts
        )
        tokens = spec.page_tokens_multiple
        return cls(
            kind=spec.kind,
            paging=spec.paging,
            bytes=spec.payload_bytes(tp, tokens),
            parts=parts,
            tokens=tokens,
        )


class SizesReport(Frozen):
    """Per-rank, per-layer sizes: every distinct layer cache spec, ReplaySSM's records and an
    indexer's tail ring."""

    attention_bytes_per_token: int
    attention_page_bytes: int
    state_bytes: int
    specs: tuple[SpecReport, ...]
    replay: SpecReport | None
    ring: SpecReport | None = None

    @classmethod
    def of(cls, sizes: RankSizes) -> SizesReport:
        """Spell out ``sizes``."""
        tp = sizes.attn_tp
        return cls(
            attention_bytes_per_token=sizes.attention_bytes_per_token,
            attention_page_bytes=sizes.attention_page_bytes(),
            state_bytes=sizes.state_bytes,
            specs=tuple(SpecReport.of(spec, tp) for spec in sizes.specs),
            replay=None if sizes.replay is None else SpecReport.of(sizes.replay, tp),
            ring=None if sizes.ring is None else SpecReport.of(sizes.ring, tp),
        )


class StageReport(Frozen):
    """One pipeline stage: its module layers, projected groups and plane count."""

    index: int
    layers: tuple[int, ...]
    groups: tuple[Group, ...]
    planes: int


class PlanReport(Frozen):
    """What a report of every engine holds (each engine's report adds its own fields)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    model: str
    deployment: Deployment
    kda_state_bytes: int
    sizes: SizesReport
    groups: tuple[Group, ...]
    planes: int
    bytes_per_token: float
    memory: MemoryBudget | None = None
    """The GPU's budget the capacity stands on (weights, the engine's reserve, KV), where a
    capacity was asked and the engine's weights are modelled."""


def _engine_report(value: Any) -> Any:
    """A report's record (a mapping tagged by ``engine``) validated as that engine's report."""
    if isinstance(value, dict) and "engine" in value:
        return rules_for(value["engine"]).plan_type.report_type.model_validate(value)
    return value


Report: TypeAlias = Annotated[SerializeAsAny[PlanReport], BeforeValidator(_engine_report)]
"""A report of any registered engine, tagged by ``engine``."""

REPORT_ADAPTER: TypeAdapter[PlanReport] = TypeAdapter(Report)


def _stage_fields(stage: Stage) -> dict[str, object]:
    return {
        "index": stage.index,
        "layers": stage.layers,
        "groups": stage.groups,
        "planes": stage.num_planes,
    }


def report(
    plan: EngineLayout, capacity: Frozen | None = None, memory: MemoryBudget | None = None
) -> PlanReport:
    """Every number of ``plan`` under its documented JSON name, in its engine's report type
    (and the engine's ``capacity`` of a budget, with the GPU's ``memory`` budget behind it,
    when given)."""
    fields, stage_key = plan.report_fields()
    if capacity is not None:
        fields = {**fields, "capacity": capacity}
    if memory is not None:
        fields = {**fields, "memory": memory}
    made: PlanReport = plan.report_type.model_validate(
        {
            "engine": plan.engine,
            "model": plan.model.name,
            "deployment": plan.deployment,
            "kda_state_bytes": plan.sizes.state_bytes,
            "sizes": SizesReport.of(plan.sizes),
            "groups": plan.groups,
            "planes": plan.num_planes,
            "bytes_per_token": plan.bytes_per_token,
            "stages": [
                {**_stage_fields(s), stage_key: plan.stage_block_bytes(s.index)}
                for s in plan.stages
            ],
            **fields,
        }
    )
    return made
