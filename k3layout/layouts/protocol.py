"""What every engine layout answers, whatever engine it plans for.

Callers (offload, transfer, the adapter, pictures, the command line, sweeps) are written
against :class:`EngineLayout` and never ask which engine a plan is for. Both plans share
:class:`LayoutBase`: the model, the deployment, the groups and their planes, the stages, and
the per-rank cache specs (:attr:`LayoutBase.sizes`) derived from the model.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import NonNegativeInt

from .._args import expect, expect_int
from .._display import Displayed
from .._validation import describe
from ..cache import LayerCacheSpec, PartRange
from ..deployment import Deployment, EngineFlavour
from ..errors import Refusal
from ..memory import MemoryBudget
from ..model import HybridModel
from ..sizes import RankSizes, rank_sizes
from .answer import RequestCapacity, least_memory
from .display import plan_head, plan_rows
from .groups import Group, GroupedLayout, GroupKind, PlaneMember, Stage, stage_at
from .memory import memory_budget
from .recommendation import Recommendation


class ByteRange(PartRange):
    """``[offset_bytes, offset_bytes + size_bytes)`` of part ``part`` of module layer ``layer``'s
    page of block ``block`` in a rank's cache (offsets from the start of the rank's backing
    allocation, where :class:`PartRange` counts from the page's start)."""

    layer: NonNegativeInt
    block: NonNegativeInt


class LayoutBase(Displayed, GroupedLayout):
    """The fields and answers every engine layout shares, and its short views (``repr``, a
    notebook's HTML table, rich's table: :mod:`k3layout.layouts.display`)."""

    engine: str
    model: HybridModel
    deployment: Deployment
    stages: tuple[Stage, ...]
    report_type: ClassVar[type[Any]]
    """The engine's report record (:func:`k3layout.layouts.report.report` builds it)."""

    @cached_property
    def sizes(self) -> RankSizes:
        """The model's cache specs under the deployment, and their per-rank bytes."""
        return rank_sizes(self.model, self.deployment)

    def stage(self, index: int) -> Stage:
        """Pipeline stage ``index`` (refuses an index that is not a stage)."""
        return stage_at(self.stages, index)

    def display_head(self) -> str:
        """The one-line view: the inputs and the engine's unit of allocation."""
        return plan_head(self)

    def display_rows(self) -> list[tuple[str, str]]:
        """The table: the inputs, the engine's summary and the groups."""
        return plan_rows(self)

    def summary(self) -> list[tuple[str, str]]:
        """The layout's numbers as (label, value) rows (each engine says)."""
        raise NotImplementedError

    def block_caption(self, num_planes: int) -> str:
        """The engine's unit of allocation over ``num_planes`` planes, in one line."""
        raise NotImplementedError

    def groups_of(self, kind: GroupKind, stage: int | None = None) -> tuple[Group, ...]:
        """The groups of ``kind`` that hold layers (of the whole model, or of ``stage``)."""
        return super().groups_of(kind) if stage is None else self.stage(stage).groups_of(kind)

    @property
    def state_span_tokens(self) -> int:
        """Tokens one block of a state group covers: one state checkpoint per block in
        ``align`` mode (the first group's span when the model keeps no state)."""
        state = self.groups_of("kda")
        return self.span_tokens(state[0] if state else self.groups[0])

    def span_tokens(self, group: Group) -> int:
        """Tokens one page of ``group`` covers (each engine says)."""
        raise NotImplementedError

    def group_spec(self, group: Group) -> LayerCacheSpec:
        """The cache spec every layer of ``group`` shares."""
        expect("group", group, Group)
        if group.kind == "ring":
            ring = self.sizes.ring
            if ring is None:
                raise Refusal(
                    "invalid_argument",
                    f"model {self.model.name} keeps no tail ring",
                    facts={"model": self.model.name, "group": group.name},
                )
            return ring
        if not group.layers:
            return self.sizes.attention if group.kind == "attention" else self._state_spec()
        return self.sizes.spec_of(group.layers[0])

    def _state_spec(self) -> LayerCacheSpec:
        state = self.sizes.state
        if state is None:
            raise Refusal(
                "invalid_argument",
                f"model {self.model.name} has no state layers",
                facts={"model": self.model.name},
            )
        return state

    @cached_property
    def positions(self) -> dict[int | None, dict[int, tuple[Group, int]]]:
        """Memo of :meth:`group_of`: for the whole plan (``None``) and each stage asked about,
        every module layer's group and position (filled on first use)."""
        return {}

    @cached_property
    def page_ranges(self) -> dict[int, tuple[PartRange, ...]]:
        """Memo of :meth:`part_range_list`, by the index of the layer's spec in
        ``sizes.specs`` (filled on first use: a few specs, many layers)."""
        return {}

    def group_of(self, layer: int, stage: int | None = None) -> tuple[Group, int]:
        """The group holding module layer ``layer`` and the layer's position in it."""
        held = self.positions.get(stage)
        if held is None:
            expect("stage", stage, (int, type(None)))
            groups = self.groups if stage is None else self.stage(stage).groups
            # A ring group names layers whose pages another group holds: not their group.
            held = {i: (g, j) for g in groups if g.kind != "ring" for j, i in enumerate(g.layers)}
            self.positions[stage] = held
        found = held.get(layer)
        if found is not None:
            return found
        raise Refusal(
            "invalid_argument",
            f"layer={describe(layer)} is in no group"
            + ("" if stage is None else f" of stage {stage}"),
            facts={"layer": layer, "stage": stage},
            hint="use a module layer of the model (of that stage)",
        )

    def part_range(self, layer: int, part: str) -> PartRange:
        """Where part ``part`` of module layer ``layer`` sits inside one of its pages."""
        for found in self.part_range_list(layer):
            if found.part == part:
                return found
        spec = self.group_spec(self.group_of(layer)[0])
        spec.part(part)  # refuses, naming the layer's parts
        raise Refusal("invalid_argument", f"layer {layer} has no part {part!r}")

    def part_range_list(self, layer: int) -> tuple[PartRange, ...]:
        """Every part's byte range inside one of module ``layer``'s pages, in page order."""
        group, _ = self.group_of(layer)
        index = self.sizes.layer_specs[layer]
        ranges = self.page_ranges.get(index)
        if ranges is None:
            spec = self.sizes.specs[index]
            ranges = spec.ranges(self.deployment.attn_tp, self.tokens_per_page(group))
            self.page_ranges[index] = ranges
        return ranges

    def tokens_per_page(self, group: Group) -> int:
        """Tokens one page of an attention group holds on a rank (1 for a state group)."""
        raise NotImplementedError

    @property
    def block_outermost(self) -> bool:
        """Whether a rank's backing is block-outermost (every layer's page of block ``b`` in
        one run: vLLM's ``BLHNC``) rather than layer-outermost (each layer's pages in one
        run); ``False`` unless an engine lays it out so."""
        return False

    @property
    def one_backing(self) -> bool:
        """Whether a rank's planes are one allocation, offsets counted from its start (vLLM's
        backing, the parent's arena); an engine with a tensor per pool says ``False`` and
        counts each part's offsets inside its own tensor."""
        return True

    def memory(self) -> MemoryBudget:
        """What one rank spends of its GPU (weights, the engine's reserve, KV) and the KV
        budget the deployment's memory flag gives, by the engine's own rule
        (:func:`k3layout.memory_budget`)."""
        return memory_budget(self.model, self.deployment)

    def kv_budget(self, kv_memory_bytes: int | None) -> int:
        """``kv_memory_bytes``, or where ``None`` the KV budget the GPU gives
        (:meth:`memory`)."""
        return self.memory().kv_memory_bytes if kv_memory_bytes is None else kv_memory_bytes

    def launch_flags(self) -> tuple[tuple[str, str], ...]:
        """The engine's flags that start this deployment, before the memory flag and the
        workload's limits (an empty value: a switch)."""
        raise NotImplementedError

    def launch_env(self) -> tuple[tuple[str, str], ...]:
        """Environment variables the engine reads this deployment's settings from."""
        return ()

    def memory_for(self, requests: int, max_model_len: int | None = None) -> int:
        """The least KV memory per rank, in bytes, in which the engine holds ``requests``
        requests of ``max_model_len`` tokens at once (default: the model's context); one byte
        less does not (:func:`k3layout.layouts.answer.least_memory`)."""
        capacity = getattr(self, "capacity")  # noqa: B009 - each engine's own
        return least_memory(lambda memory: capacity(memory, max_model_len), requests)

    def plane_bytes_of(self, group: Group) -> int:
        """Bytes of one block's plane under ``group``'s layers: every plane of a block is
        the same size where planes are shared (vLLM); an engine whose layers each have their
        own tensor says per group, and tokenspeed per plane (:meth:`plane_bytes_at`)."""
        expect("group", group, Group)
        block_bytes: int = getattr(self, "block_bytes")  # noqa: B009 - each engine's own
        return block_bytes // self.num_planes

    def plane_bytes_in(self, group: Group, plane: int) -> int:
        """Bytes of plane ``plane`` under ``group``'s layer on it: :meth:`plane_bytes_of`,
        unless an engine's planes differ in size (tokenspeed's draft planes)."""
        expect_int("plane", plane)
        return self.plane_bytes_of(group)

    def layer_payload_bytes(self, layer: int) -> int:
        """Payload of module layer ``layer`` on one of its pages (its group's, unless an
        engine keeps a draft in a dtype of its own)."""
        group, _ = self.group_of(layer)
        payload: int = getattr(self, "payload_bytes")(group)  # noqa: B009 - each engine's own
        return payload

    def page_stride_at(self, group: Group, plane: int) -> int:
        """Bytes between pages of ``group``'s layer on plane ``plane`` (the group's stride,
        unless an engine's planes differ)."""
        expect_int("plane", plane)
        stride: int = getattr(self, "page_stride_bytes")(group)  # noqa: B009 - each engine's own
        return stride

    def page_axes_on(
        self, group: Group, plane: int, num_blocks: int
    ) -> tuple[tuple[int, int], ...]:
        """How the pages of ``group``'s layer on ``plane`` repeat: the group's page axes,
        unless an engine's planes differ in size."""
        expect_int("plane", plane)
        axes: tuple[tuple[int, int], ...] = getattr(self, "page_axes")(group, num_blocks)  # noqa: B009
        return axes

    def page_origin_bytes(self, group: Group, plane: int) -> int:
        """Where page 0 of ``group``'s layer on ``plane`` starts inside the plane (0, unless
        an engine puts it elsewhere: tokenspeed's null page is the null parent's last slot)."""
        expect("group", group, Group)
        expect_int("plane", plane)
        return 0

    def plane_start(self, plane: int, num_blocks: int) -> int:
        """Offset of plane ``plane`` in a rank's one allocation of ``num_blocks`` blocks:
        planes back to back in plane order, unless an engine orders them otherwise."""
        span: int = getattr(self, "plane_span_bytes")(num_blocks)  # noqa: B009 - each engine's own
        return expect_int("plane", plane) * span

    def plane_span_at(self, plane: int, num_blocks: int) -> int:
        """Bytes plane ``plane`` spans in an allocation of ``num_blocks`` blocks."""
        expect_int("plane", plane)
        span: int = getattr(self, "plane_span_bytes")(num_blocks)  # noqa: B009 - each engine's own
        return span


def on_planes(plan: EngineLayout) -> bool:
    """Whether ``plan``'s layers share planes of one page size: not when they keep pooled
    caches and tail rings (an indexed hybrid), packed in blocks of several page sizes."""
    sizes = plan.sizes
    return sizes.ring is None and not any(spec.pooled for spec in sizes.specs)


def check_planes(plan: EngineLayout, what: str) -> None:
    """Refuse (``layout_unsupported``) ``what`` of a plan whose layers keep pooled caches and
    tail rings (an indexed hybrid): they are packed in blocks of several page sizes, not on
    planes (:func:`on_planes`), and ``what`` is not planned for them yet."""
    if on_planes(plan):
        return
    raise Refusal(
        "layout_unsupported",
        f"model {plan.model.name}: its indexed layers keep pooled keys and a tail ring, packed "
        f"in blocks of several page sizes rather than on planes; {what} of such a layout is "
        "not planned yet",
        facts={"model": plan.model.name, "engine": plan.engine, "feature": what},
        hint="plan, size and recommend it (plan, capacity, memory_for, recommend)",
    )


def check_non_negative(name: str, value: int) -> None:
    """Refuse (``invalid_argument``) a count or byte budget ``value`` below 0."""
    if expect_int(name, value) < 0:
        raise Refusal("invalid_argument", f"{name}={value} must be >= 0", facts={name: value})


def check_block(block: int, num_blocks: int) -> None:
    """Refuse (``invalid_argument``) a ``block`` that is not one of ``num_blocks`` (the
    engine's unit of allocation: a vLLM block, an SGLang page or slot)."""
    expect_int("block", block)
    expect_int("num_blocks", num_blocks)
    if not 0 <= block < num_blocks:
        raise Refusal(
            "invalid_argument",
            f"block={block} is not one of num_blocks={num_blocks} blocks",
            facts={"block": block, "num_blocks": num_blocks},
            hint=f"use 0 <= block < {num_blocks}",
        )


@runtime_checkable
class EngineLayout(Protocol):
    """What a plan of any engine answers.

    - ``stages``, ``groups``, ``groups_of(kind)``: the KV-cache groups, whole or per stage;
    - ``payload_bytes(group)``: one layer's payload on one page (an attention page, or ``S``);
    - ``page_stride_bytes(group)``: bytes between consecutive pages of one layer;
    - ``span_tokens(group)``: tokens one page covers (attention: ``block * dcp``);
    - ``blocks_in(budget)`` / ``blocks_bytes(n)``: capacity both ways, in the engine's block of
      allocation (vLLM blocks, parents);
    - ``byte_range(layer, part, block, num_blocks)``: where any part of any layer's page lies
      in a rank's allocation;
    - ``capacity(budget, max_model_len)``, ``memory()``, ``memory_for(n)``, ``recommend(n)``:
      what a budget holds, the GPU's budget, the least memory for ``n`` requests, the flags;
    - ``model_dump_json()``: the plan as JSON (a plan is a frozen record, compared and hashed
      by value; :func:`~k3layout.save_plan`). :func:`k3layout.plan` returns this type, and
      ``plan(..., engine=<name>)`` the engine's own plan type.
    """

    report_type: ClassVar[type[Any]]

    @property
    def engine(self) -> EngineFlavour: ...
    @property
    def model(self) -> HybridModel: ...
    @property
    def deployment(self) -> Deployment: ...
    @property
    def groups(self) -> tuple[Group, ...]: ...
    @property
    def stages(self) -> tuple[Stage, ...]: ...
    @property
    def sizes(self) -> RankSizes: ...
    @property
    def num_planes(self) -> int: ...
    @property
    def planes(self) -> tuple[tuple[PlaneMember, ...], ...]: ...
    @property
    def bytes_per_token(self) -> float: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def packing_label(self) -> str: ...
    @property
    def state_rides_pages(self) -> bool: ...
    @property
    def one_backing(self) -> bool: ...
    @property
    def block_outermost(self) -> bool: ...
    @property
    def worst_padding(self) -> float: ...

    def stage(self, index: int) -> Stage: ...
    def group(self, name: str) -> Group: ...
    def groups_of(self, kind: GroupKind, stage: int | None = None) -> tuple[Group, ...]: ...
    def group_spec(self, group: Group) -> LayerCacheSpec: ...
    def group_of(self, layer: int, stage: int | None = None) -> tuple[Group, int]: ...
    def tokens_per_page(self, group: Group) -> int: ...
    def plane_bytes_of(self, group: Group) -> int: ...
    def plane_bytes_in(self, group: Group, plane: int) -> int: ...
    def layer_payload_bytes(self, layer: int) -> int: ...
    def page_stride_at(self, group: Group, plane: int) -> int: ...
    def page_axes_on(
        self, group: Group, plane: int, num_blocks: int
    ) -> tuple[tuple[int, int], ...]: ...
    def page_origin_bytes(self, group: Group, plane: int) -> int: ...
    def plane_start(self, plane: int, num_blocks: int) -> int: ...
    def plane_span_at(self, plane: int, num_blocks: int) -> int: ...
    def payload_bytes(self, group: Group) -> int: ...
    def page_stride_bytes(self, group: Group) -> int: ...
    def span_tokens(self, group: Group) -> int: ...
    @property
    def state_span_tokens(self) -> int: ...
    def page_axes(self, group: Group, num_blocks: int) -> tuple[tuple[int, int], ...]: ...
    def plane_span_bytes(self, num_blocks: int) -> int: ...
    def stage_block_bytes(self, stage: int) -> int: ...
    def blocks_in(self, budget_bytes: int, stage: int | None = None) -> int: ...
    def blocks_bytes(self, num_blocks: int, stage: int | None = None) -> int: ...
    def part_range(self, layer: int, part: str) -> PartRange: ...
    def part_range_list(self, layer: int) -> tuple[PartRange, ...]: ...
    def byte_range(
        self, layer: int, part: str, block: int, num_blocks: int, stage: int = 0
    ) -> ByteRange: ...
    def summary(self) -> list[tuple[str, str]]: ...
    def block_caption(self, num_planes: int) -> str: ...
    def capacity_summary(self, budget_bytes: int, max_live: int = 1) -> list[tuple[str, str]]: ...
    def capacity(
        self, kv_memory_bytes: int | None = None, max_model_len: int | None = None
    ) -> RequestCapacity: ...
    def memory(self) -> MemoryBudget: ...
    def launch_flags(self) -> tuple[tuple[str, str], ...]: ...
    def launch_env(self) -> tuple[tuple[str, str], ...]: ...
    def memory_for(self, requests: int, max_model_len: int | None = None) -> int: ...
    def recommend(
        self, requests: int, max_model_len: int | None = None, kv_memory_bytes: int | None = None
    ) -> Recommendation: ...
    def group_columns(self) -> dict[str, dict[str, str]]: ...
    def report_fields(self) -> tuple[dict[str, object], str]: ...
    # A plan is a frozen pydantic record: it compares and hashes by value, and round-trips
    # through JSON (k3layout.save_plan / load_plan).
    def model_dump(self, *, mode: Literal["json", "python"] | str = "python") -> dict[str, Any]: ...
    def model_dump_json(self, *, indent: int | None = None) -> str: ...
    def display_head(self) -> str: ...
    def display_rows(self) -> list[tuple[str, str]]: ...
    def _repr_html_(self) -> str: ...
