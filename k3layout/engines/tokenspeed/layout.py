"""Engine layout B: tokenspeed's parent arena (``engine="tokenspeed"``), as its Kimi-K3 recipe
at the followed revision (#1152's head or ``main``, :mod:`.releases`) lays it out
(:mod:`.recipe`).

Groups: ``full_attention`` (MLA layers in module order, then draft layers) and
``linear_attention_0..2``: the KDA layers sorted and split *contiguously* into 3 groups
(K3: 23, 23, 23). Plane ``slot.j`` holds the layer at position ``j`` of every group, so the
state rides inside the MLA planes. The packing ``(p_m, p_l)`` is the revision's rule
(#1152: grown until a plane holds a state; ``main``: 12 MLA pages); ``bind(n)`` and
:meth:`ParentPlan.byte_range` give tokenspeed's own addresses.
"""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar, Literal

from pydantic import NonNegativeInt, PositiveInt, model_validator

from ..._args import expect, expect_int
from ..._derivation import SelfChecked, deriving, is_deriving, mismatch
from ..._frozen import trusted
from ...cache import PartRange
from ...constants import PARENT_PAGE_TOKENS
from ...deployment import Deployment
from ...errors import Refusal
from ...layouts.answer import check_context, least_memory
from ...layouts.groups import Group, GroupKind, Stage
from ...layouts.packing import Packing, RuleCheck
from ...layouts.protocol import ByteRange, LayoutBase, check_non_negative
from ...layouts.recommend import Recommendation, advise, check_workload
from ...limits import checked_bytes
from ...model import HybridModel
from ...sizes import RankSizes
from .capacity import ParentCapacity, parent_capacity, protected_pages
from .launch import tokenspeed_flags
from .recipe import (
    DEFAULT_MAX_PADDING,
    MAX_KERNEL_PAGE_ID,
    Arena,
    field_offsets,
    pack,
    payload_bytes,
    plane_order,
    plane_starts,
    recipe_groups,
)
from .releases import PR1152, TokenspeedRevision, revision_of
from .report import ParentReport


class GroupPages(SelfChecked):
    """How a group's pages are numbered in a bound arena: page 0 is the null page."""

    group: str
    pages_per_parent: PositiveInt
    page_count: PositiveInt

    @model_validator(mode="after")
    def _counts_whole_parents(self) -> GroupPages:
        if (self.page_count - 1) % self.pages_per_parent:
            raise mismatch(
                f"group {self.group}",
                "page_count",
                "the pages are the null page and p_g per parent",
                self.page_count,
                1 + (self.page_count - 1) // self.pages_per_parent * self.pages_per_parent,
            )
        return self


class LayerBinding(SelfChecked):
    """Where one layer's pages live in a bound arena: its plane starts at ``base_offset``
    and repeats every ``parent_stride`` (the plane's bytes) per parent; page ``x`` sits at
    ``base + parent_stride - page_stride + x * page_stride`` (tokenspeed's ``plan.py``)."""

    layer: NonNegativeInt
    group: str
    kind: GroupKind
    plane: NonNegativeInt
    base_offset: NonNegativeInt
    parent_stride: PositiveInt
    page_stride: PositiveInt
    pages_per_parent: PositiveInt

    @model_validator(mode="after")
    def _pages_fit_the_plane(self) -> LayerBinding:
        if self.pages_per_parent * self.page_stride != self.parent_stride:
            raise mismatch(
                f"layer {self.layer}",
                "page_stride",
                "p_g pages tile one plane of a parent",
                self.pages_per_parent * self.page_stride,
                self.parent_stride,
            )
        return self

    def page_offset(self, page: int) -> int:
        """Arena byte offset of page ``page`` of this layer (page 0 is the last slot of the
        null parent)."""
        return self.base_offset + self.parent_stride - self.page_stride + page * self.page_stride


class Binding(SelfChecked):
    """``bind(n)``: ``n`` usable parents plus the null parent, every layer's page addresses.

    Built by hand (or loaded, or ``model_copy``'d), it is refused (``plan_mismatch``) unless
    every address follows from ``(num_parents, plane_bytes)`` and the groups' pages per
    parent, as :meth:`ParentPlan.bind` lays them out: planes in the sorted order of their ids
    as strings, each ``(n + 1) x`` its bytes.
    """

    num_parents: PositiveInt
    plane_bytes: tuple[PositiveInt, ...]
    parent_bytes: PositiveInt
    groups: tuple[GroupPages, ...]
    layers: tuple[LayerBinding, ...]

    @model_validator(mode="after")
    def _addresses_follow(self) -> Binding:
        if is_deriving():
            return self
        thing = "parent binding"
        if self.parent_bytes < sum(self.plane_bytes):
            raise mismatch(
                thing,
                "parent_bytes",
                "a parent holds every plane",
                self.parent_bytes,
                sum(self.plane_bytes),
            )
        per_parent: dict[str, int] = {}
        for index, pages in enumerate(self.groups):
            if pages.page_count != 1 + self.num_parents * pages.pages_per_parent:
                raise mismatch(
                    thing,
                    f"groups[{index}].page_count",
                    "a group numbers the null page and p_g pages per parent",
                    pages.page_count,
                    1 + self.num_parents * pages.pages_per_parent,
                )
            per_parent[pages.group] = pages.pages_per_parent
        starts = plane_starts(self.plane_bytes, self.num_parents)
        previous = -1
        for index, bound in enumerate(self.layers):
            plane = bound.plane if bound.plane < len(self.plane_bytes) else 0
            count = per_parent.get(bound.group, bound.pages_per_parent)
            expected = (
                bound.layer if bound.layer > previous else previous + 1,
                count,
                plane,
                starts[plane],
                self.plane_bytes[plane],
                self.plane_bytes[plane] // count,
            )
            stored = (
                bound.layer,
                bound.pages_per_parent,
                bound.plane,
                bound.base_offset,
                bound.parent_stride,
                bound.page_stride,
            )
            if bound.group not in per_parent or stored != expected:
                raise mismatch(
                    thing,
                    f"layers[{index}]",
                    "layers are listed once in order, in a bound group, on a plane that starts "
                    "where the string-sorted plane order puts it, with p_g pages per plane "
                    "(layer, p_g, plane, base, parent stride, page stride)",
                    stored,
                    expected,
                )
            previous = bound.layer
        return self

    @property
    def num_planes(self) -> int:
        """Planes of one parent."""
        return len(self.plane_bytes)

    @property
    def plane_order(self) -> tuple[int, ...]:
        """Plane indexes in arena order (``slot.0, slot.1, slot.10, ...``)."""
        return plane_order(self.num_planes)

    @property
    def plane_starts(self) -> tuple[int, ...]:
        """Arena offset of every plane, by plane index."""
        return plane_starts(self.plane_bytes, self.num_parents)

    @property
    def arena_bytes(self) -> int:
        """``(n + 1) * parent``: the arena one rank allocates."""
        return (self.num_parents + 1) * self.parent_bytes


class ParentPlan(SelfChecked, LayoutBase):
    """The parent-block layout of one model under one deployment, as tokenspeed's Kimi-K3
    recipe lays it out (:mod:`k3layout.engines.tokenspeed.recipe`) at the revision the
    deployment names (``engine_version``: ``pr1152``, #1152's head, or ``main``).

    ``groups``, ``num_planes`` (one per MLA layer plus one per draft layer), ``packing``
    (the revision's rule, checked in ``packing_rule``), each plane's bytes
    (:attr:`plane_sizes`) and the padding describe one parent; ``stages`` is the one stage
    (tokenspeed has no pipeline parallelism). ``rule_1152`` is the same check where the plan
    follows #1152 (``None`` under ``main``).

    A plan built outside :func:`~k3layout.plan` (by hand, :func:`~k3layout.load_plan`, or
    ``model_copy(update=...)``, which re-validates here) is re-planned from its own ``model``
    and ``deployment`` and refused (``plan_mismatch``) at the first field that differs.
    """

    engine: Literal["tokenspeed"] = "tokenspeed"
    report_type: ClassVar[type[ParentReport]] = ParentReport
    packing: Packing
    max_padding: float | None
    packing_rule: RuleCheck
    """The followed revision's packing rule, its parent and worst padded group."""
    rule_1152: RuleCheck | None
    """``packing_rule`` where the plan follows #1152 (``engine_version="pr1152"``); ``None``
    under another revision (kept under its old name)."""

    @model_validator(mode="after")
    def _is_its_own_derivation(self) -> ParentPlan:
        # Built outside the pipeline (by hand, load_plan, model_copy): re-plan and compare.
        if not is_deriving():
            from ...layouts.rederive import check_plan  # noqa: PLC0415 - rederive imports the pipeline

            check_plan(self)
        return self

    @property
    def revision(self) -> str:
        """The tokenspeed revision this layout follows, in words
        (:attr:`tokenspeed_revision`'s title)."""
        return self.tokenspeed_revision.title

    @property
    def tokenspeed_revision(self) -> TokenspeedRevision:
        """The tokenspeed revision this layout follows (``deployment.engine_version``)."""
        return revision_of(self.deployment)

    @property
    def page_tokens(self) -> int:
        """Tokens per MLA page (128)."""
        return PARENT_PAGE_TOKENS

    @property
    def mla_page_bytes(self) -> int:
        """One 128-token MLA page of the target: 73,728 B fp8 / 147,456 B bf16 for K3."""
        return self.sizes.attention_page_bytes(PARENT_PAGE_TOKENS)

    @property
    def full_attention(self) -> Group:
        """The attention group (MLA layers, then draft)."""
        return self.groups[0]

    @cached_property
    def arena(self) -> Arena:
        """One parent as the recipe packs it: pages per parent, plane bytes, parent bytes."""
        packing = self.packing
        pages = (packing.mla_pages, packing.state_pages)
        return _arena(self.groups, self.sizes, pages, None, self.tokenspeed_revision)

    @property
    def plane_sizes(self) -> tuple[int, ...]:
        """Bytes of every plane of one parent, by plane index (``slot.j``): a draft whose
        cache dtype is wider than the target's has wider planes."""
        return self.arena.plane_bytes

    @property
    def parent_bytes(self) -> int:
        """Bytes of one parent: the planes' sum, aligned (21,233,664 at K3 tp 8 fp8)."""
        return self.arena.parent_bytes

    def layer_payload_bytes(self, layer: int) -> int:
        """Payload of module layer ``layer`` on one of its pages (its own dtype)."""
        expect_int("layer", layer)
        return payload_bytes(self.sizes, layer)

    def payload_bytes(self, group: Group) -> int:
        """Payload of one layer of ``group`` on one page: the group's first layer's (the MLA
        page, or ``S``); :meth:`layer_payload_bytes` for a draft of its own dtype."""
        expect("group", group, Group)
        return payload_bytes(self.sizes, group.layers[0]) if group.layers else 0

    def pages_per_parent(self, group: Group) -> int:
        """``p_g``: pages of ``group`` one parent holds (``p_m`` or ``p_l``)."""
        expect("group", group, Group)
        return self.arena.packing.get(group.name, 1)

    def raw_bytes(self, group: Group) -> int:
        """``raw_g``: the payload of every layer of ``group`` on one page."""
        expect("group", group, Group)
        known = self.arena.raw_bytes.get(group.name)
        if known is not None and group in self.groups:
            return known
        return sum(payload_bytes(self.sizes, layer) for layer in group.layers)

    @property
    def packing_by_group(self) -> dict[str, int]:
        """``p_g`` keyed by group name (K3 TP 8 fp8: ``full_attention`` 12,
        ``linear_attention_*`` 1, at either revision)."""
        return {group.name: self.pages_per_parent(group) for group in self.groups}

    @property
    def padding_fraction(self) -> dict[str, float]:
        """``(parent / p_g - raw_g) / raw_g`` keyed by group name."""
        return {g.name: self.arena.padding(g.name) for g in self.groups if g.layers}

    @property
    def utilization(self) -> dict[str, float]:
        """``p_g * raw_g / parent`` keyed by group name: the share of a parent that is payload."""
        return {
            g.name: self.pages_per_parent(g) * self.raw_bytes(g) / self.parent_bytes
            for g in self.groups
            if g.layers
        }

    def report_fields(self) -> tuple[dict[str, object], str]:
        """The report's engine fields, and the name of a stage's block (parent) bytes."""
        return {
            "mla_page_bytes": self.mla_page_bytes,
            "plane_bytes": self.packing.plane_bytes,
            "parent_bytes": self.parent_bytes,
            "packing": self.packing_by_group,
            "padding_fraction": self.padding_fraction,
            "utilization": self.utilization,
            "max_padding": self.max_padding,
            "packing_rule": self.packing_rule,
            "rule_1152": self.rule_1152,
        }, "parent_bytes"

    @property
    def bytes_per_token(self) -> float:
        """Per-rank parent bytes per MLA token it holds: ``parent / (p_m * 128)``."""
        return self.parent_bytes / (self.packing.mla_pages * PARENT_PAGE_TOKENS)

    def stage_parent_bytes(self, stage: int) -> int:
        """Bytes of one parent on a rank of pipeline stage ``stage`` (the one stage)."""
        self.stage(stage)
        return self.parent_bytes

    def _frame_groups(self, stage: int | None) -> tuple[Group, ...]:
        groups = self.groups if stage is None else self.stage(stage).groups
        return tuple(group for group in groups if group.layers)

    def pages_needed(
        self, group: Group, tokens: int, max_live: int = 1, protected_pages: int = 0
    ) -> int:
        """Pages ``group`` needs: MLA ``ceil(tokens / 128) + max_live - 1`` plus the protected
        pages of overlap scheduling, each state group ``2 * max_live`` (a running and a
        checkpoint slot per request; tokenspeed protects attention pages only)."""
        expect("group", group, Group)
        _check_load(tokens, max_live, protected_pages)
        if group.kind == "attention":
            return -(-tokens // PARENT_PAGE_TOKENS) + max_live - 1 + protected_pages
        return 2 * max_live

    def parents_for(
        self, tokens: int, max_live: int = 1, protected_pages: int = 0, stage: int | None = None
    ) -> int:
        """Parents a load needs: the sum over groups of ``ceil(pages_g / p_g)``
        (tokenspeed's ``parents_needed``).

        K3 tp 8 fp8, one live request of 131,072 tokens: ceil(1024 / 12) + 3 x 2 = 92.
        """
        return sum(
            -(-self.pages_needed(g, tokens, max_live, protected_pages) // self.pages_per_parent(g))
            for g in self._frame_groups(stage)
        )

    def token_capacity(
        self,
        num_parents: int,
        max_live: int = 1,
        protected_pages: int = 0,
        stage: int | None = None,
        upper_bound: int | None = None,
    ) -> int:
        """The most tokens ``num_parents`` parents hold: the inverse of :meth:`parents_for`
        (``parents_for(token_capacity(n)) <= n < parents_for(token_capacity(n) + 1)``), at
        most ``upper_bound`` (default ``n * p_m * 128``, as tokenspeed bounds its search).
        Refuses (``budget_too_small``) parents that cannot admit one token."""
        expect_int("num_parents", num_parents)
        groups = self._frame_groups(stage)
        attention = [g for g in groups if g.kind == "attention"]
        if not attention:
            raise Refusal(
                "invalid_argument",
                f"stage {stage} holds no attention layer: its capacity is not bounded by tokens",
                facts={"stage": stage},
                hint="ask the stages that hold MLA layers",
            )
        state_parents = sum(
            -(-self.pages_needed(g, 0, max_live, protected_pages) // self.pages_per_parent(g))
            for g in groups
            if g.kind == "kda"
        )
        spare = num_parents - state_parents
        extra = max_live - 1 + protected_pages  # attention pages beyond the tokens' own
        per_parent = self.pages_per_parent(attention[0])
        # parents_for is monotone in tokens: the most token pages the spare parents hold.
        pages = spare * per_parent - extra
        bound = num_parents * per_parent * PARENT_PAGE_TOKENS
        if upper_bound is not None:
            bound = min(bound, expect_int("upper_bound", upper_bound))
        tokens = min(max(pages, 0) * PARENT_PAGE_TOKENS, max(bound, 0))
        if num_parents < 1 or tokens < 1:
            raise Refusal(
                "budget_too_small",
                f"num_parents={num_parents} cannot admit one token with max_live={max_live} "
                f"live requests ({state_parents} state parents) (tokenspeed: "
                f"num_lcm_blocks={num_parents} cannot admit one token with the configured "
                "kimi_k3 cache scheduler limits)",
                facts={
                    "num_parents": num_parents,
                    "state_parents": state_parents,
                    "max_live": max_live,
                },
                hint="give the cache more parents or admit fewer live requests",
            )
        return tokens

    def parents_for_budget(self, budget_bytes: int, stage: int | None = None) -> int:
        """Usable parents in ``budget_bytes`` (one parent is the null parent)."""
        check_non_negative("budget_bytes", budget_bytes)
        parent = self.parent_bytes if stage is None else self.stage_parent_bytes(stage)
        return max(0, budget_bytes // parent - 1)

    def bind(self, num_parents: int, stage: int = 0) -> Binding:
        """Lay out ``num_parents`` usable parents (+ the null parent) as tokenspeed binds them.

        Planes in the sorted order of their ids as strings (``slot.0``, ``slot.1``,
        ``slot.10``, ...), each spanning ``(n + 1) x`` its bytes; page ``x`` of a layer on
        plane ``j`` sits at ``start_j + plane_j - plane_j / p_g + x * plane_j / p_g``.
        Refuses ``num_parents < 1`` and page ids past int32, as tokenspeed does.
        """
        expect_int("num_parents", num_parents)
        if num_parents < 1:
            raise Refusal(
                "invalid_argument",
                f"num_parents={num_parents} must be >= 1 (tokenspeed: num_lcm_blocks must be "
                "a positive integer)",
                facts={"num_parents": num_parents},
                hint="bind at least one usable parent",
            )
        held = self.stage(stage)
        arena = self.arena
        for group in held.groups:
            pages = num_parents * self.pages_per_parent(group)
            if group.layers and pages > MAX_KERNEL_PAGE_ID:
                raise Refusal(
                    "size_limit",
                    f"num_parents={num_parents}: group {group.name} would number {pages:,} "
                    f"pages, past the int32 kernel page id {MAX_KERNEL_PAGE_ID:,}",
                    facts={"field": "num_parents", "group": group.name, "pages": pages},
                    hint=f"bind at most {MAX_KERNEL_PAGE_ID // self.pages_per_parent(group):,}"
                    " parents",
                )
        starts = plane_starts(arena.plane_bytes, num_parents)
        layers: list[LayerBinding] = []
        pages_of: list[GroupPages] = []
        for group in held.groups:
            if not group.layers:
                continue
            per_parent = self.pages_per_parent(group)
            pages_of.append(
                GroupPages(
                    group=group.name,
                    pages_per_parent=per_parent,
                    page_count=1 + num_parents * per_parent,
                )
            )
            for position, layer in enumerate(group.layers):
                plane = group.plane_of(position)
                layers.append(
                    LayerBinding(
                        layer=layer,
                        group=group.name,
                        kind=group.kind,
                        plane=plane,
                        base_offset=starts[plane],
                        parent_stride=arena.plane_bytes[plane],
                        page_stride=arena.page_stride(group, plane),
                        pages_per_parent=per_parent,
                    )
                )
        with deriving():  # bind's own layout: its checks are for bindings built by hand
            return Binding(
                num_parents=num_parents,
                plane_bytes=arena.plane_bytes,
                parent_bytes=arena.parent_bytes,
                groups=tuple(pages_of),
                layers=tuple(sorted(layers, key=lambda b: b.layer)),
            )

    # The engine-layout protocol.

    @property
    def block_bytes(self) -> int:
        """The tokenspeed engine's block is its parent: :attr:`parent_bytes`."""
        return self.parent_bytes

    @property
    def state_rides_pages(self) -> bool:
        """False: a parent packs ``p_m`` attention pages and ``p_l`` states per plane, so no
        state is one attention page."""
        return False

    @property
    def packing_label(self) -> str:
        """How the layout packs, in a few characters: ``12/1`` (``p_m / p_l``)."""
        return f"{self.packing.mla_pages}/{self.packing.state_pages}"

    @property
    def worst_padding(self) -> float:
        """The largest group padding."""
        return max(self.padding_fraction.values())

    def tokens_per_page(self, group: Group) -> int:
        """Tokens of one attention page (128); 1 for a state group."""
        return 1 if self.group_spec(group).paging == "slot" else PARENT_PAGE_TOKENS

    def plane_bytes_of(self, group: Group) -> int:
        """Bytes of the plane of ``group``'s first layer (:meth:`plane_bytes_at` per plane)."""
        expect("group", group, Group)
        return self.arena.plane_bytes[group.plane_of(0)]

    def plane_bytes_at(self, plane: int) -> int:
        """Bytes of plane ``plane`` of one parent."""
        return self.arena.plane_bytes[self._plane(plane)]

    def plane_bytes_in(self, group: Group, plane: int) -> int:
        """Bytes of plane ``plane`` (every group on it shares the plane)."""
        expect("group", group, Group)
        return self.plane_bytes_at(plane)

    def page_stride_bytes(self, group: Group) -> int:
        """Bytes between consecutive pages of one layer of ``group``: ``plane / p_g`` (the
        MLA page exactly; for state the plane's share, not ``S``)."""
        expect("group", group, Group)
        return self.arena.page_stride(group, group.plane_of(0))

    def page_stride_at(self, group: Group, plane: int) -> int:
        """Bytes between consecutive pages of ``group``'s layer on plane ``plane``."""
        expect("group", group, Group)
        return self.arena.page_stride(group, self._plane(plane))

    def page_origin_bytes(self, group: Group, plane: int) -> int:
        """Where page 0 of ``group``'s layer on ``plane`` starts inside the plane: the last
        slot of the null parent, ``plane - plane / p_g``."""
        return self.plane_bytes_at(plane) - self.page_stride_at(group, plane)

    def plane_start(self, plane: int, num_blocks: int) -> int:
        """Arena offset of plane ``plane`` in ``bind(num_blocks)`` (string-sorted order)."""
        expect_int("num_blocks", num_blocks)
        return plane_starts(self.arena.plane_bytes, num_blocks)[self._plane(plane)]

    def plane_span_at(self, plane: int, num_blocks: int) -> int:
        """Bytes of plane ``plane`` of ``bind(num_blocks)``: its usable parents and the null."""
        expect_int("num_blocks", num_blocks)
        return (num_blocks + 1) * self.plane_bytes_at(plane)

    def _plane(self, plane: int) -> int:
        if not 0 <= expect_int("plane", plane) < self.num_planes:
            raise Refusal(
                "invalid_argument",
                f"plane={plane} is not one of the {self.num_planes} planes",
                facts={"plane": plane, "num_planes": self.num_planes},
                hint=f"use 0 <= plane < {self.num_planes}",
            )
        return plane

    def page_axes(self, group: Group, num_blocks: int) -> tuple[tuple[int, int], ...]:
        """How one layer's pages repeat on its plane of ``bind(num_blocks)``: ``1 + n * p_g``
        pages at stride ``plane / p_g``, from :meth:`page_origin_bytes`."""
        expect_int("num_blocks", num_blocks)
        return ((1 + num_blocks * self.pages_per_parent(group), self.page_stride_bytes(group)),)

    def page_axes_on(
        self, group: Group, plane: int, num_blocks: int
    ) -> tuple[tuple[int, int], ...]:
        """:meth:`page_axes` of ``group``'s layer on ``plane``: its stride is that plane's."""
        expect_int("num_blocks", num_blocks)
        pages = 1 + num_blocks * self.pages_per_parent(group)
        return ((pages, self.page_stride_at(group, plane)),)

    def plane_span_bytes(self, num_blocks: int) -> int:
        """Bytes of plane 0 of ``bind(num_blocks)`` (:meth:`plane_span_at` per plane)."""
        expect_int("num_blocks", num_blocks)
        return (num_blocks + 1) * self.arena.plane_bytes[0]

    def span_tokens(self, group: Group) -> int:
        """Tokens one page covers: 128 for attention; a state page holds one request."""
        return self.tokens_per_page(group)

    def stage_block_bytes(self, stage: int) -> int:
        """Bytes of one parent on a rank of ``stage``."""
        return self.stage_parent_bytes(stage)

    def blocks_in(self, budget_bytes: int, stage: int | None = None) -> int:
        """Usable parents in ``budget_bytes`` (:meth:`parents_for_budget`)."""
        return self.parents_for_budget(budget_bytes, stage)

    def blocks_bytes(self, num_blocks: int, stage: int | None = None) -> int:
        """Arena bytes of ``num_blocks`` usable parents plus the null parent."""
        _check_load(0, 1, num_blocks)
        parent = self.parent_bytes if stage is None else self.stage_parent_bytes(stage)
        return (num_blocks + 1) * parent

    def part_range_list(self, layer: int) -> tuple[PartRange, ...]:
        """Every part's byte range inside one page of ``layer``, as tokenspeed lays its
        fields: back to back, each aligned to its element."""
        self.sizes.spec_of(layer)
        return tuple(
            trusted(PartRange, part=part, offset_bytes=offset, size_bytes=size)
            for part, offset, size in field_offsets(self.sizes, layer)
        )

    def part_range(self, layer: int, part: str) -> PartRange:
        """Where ``part`` lies inside one page of ``layer``."""
        self.sizes.spec_of(layer).part(part)  # refuses a part the layer does not have
        return next(r for r in self.part_range_list(layer) if r.part == part)

    def byte_range(
        self, layer: int, part: str, block: int, num_blocks: int, stage: int = 0
    ) -> ByteRange:
        """Where ``part`` of page ``block`` of module ``layer`` lies in the arena of
        ``bind(num_blocks)`` (page 0 is the null page): what tokenspeed's
        ``field_page_byte_offset`` gives."""
        expect_int("block", block)
        self.group_of(layer, stage)  # refuses a layer the stage does not hold
        binding = next(b for b in self.bind(num_blocks, stage).layers if b.layer == layer)
        pages = 1 + num_blocks * binding.pages_per_parent
        if not 0 <= block < pages:
            raise Refusal(
                "invalid_argument",
                f"block={block} is not one of the {pages} pages of layer {layer}",
                facts={"block": block, "num_pages": pages},
                hint=f"use 0 <= block < {pages}",
            )
        inner = self.part_range(layer, part)
        return ByteRange(
            layer=layer,
            part=part,
            block=block,
            offset_bytes=binding.page_offset(block) + inner.offset_bytes,
            size_bytes=inner.size_bytes,
        )

    def block_caption(self, num_planes: int) -> str:
        """One parent in words, for pictures."""
        expect_int("num_planes", num_planes)
        packing = self.packing
        widths = sorted(set(self.plane_sizes))
        planes = " + ".join(f"{self.plane_sizes.count(w)} x {w:,} B" for w in widths)
        return (
            f"one parent: packing p_m/p_l {packing.mla_pages}/{packing.state_pages}, "
            f"planes {planes} = {self.parent_bytes:,} B"
        )

    def summary(self) -> list[tuple[str, str]]:
        """The layout's numbers as (label, value) rows."""
        widths = sorted(set(self.plane_sizes))
        rows = [
            ("planes", f"{self.num_planes:,}"),
            ("packing p_m / p_l", f"{self.packing.mla_pages} / {self.packing.state_pages}"),
            ("packing rule", self.tokenspeed_revision.packing_formula),
            (
                "plane bytes",
                ", ".join(f"{w:,} x {self.plane_sizes.count(w)}" for w in widths),
            ),
            ("parent bytes", f"{self.parent_bytes:,}"),
            ("padding limit", "none" if self.max_padding is None else f"{self.max_padding:g}"),
            ("followed revision", self.revision),
        ]
        return rows

    def capacity(
        self,
        kv_memory_bytes: int | None = None,
        max_model_len: int | None = None,
        *,
        max_live: int | None = None,
        overlap_depth: int = 1,
        max_total_tokens: int | None = None,
    ) -> ParentCapacity:
        """What ``kv_memory_bytes`` per rank serves, as tokenspeed's recipe counts it
        (verify workspace included): sized for ``max_live`` live requests (tokenspeed's
        ``max_bs``), or, where ``None``, for the most requests of ``max_model_len`` tokens
        (default: the model's context) it holds at once; overlap scheduling of
        ``overlap_depth`` (0 or 1; 1 is tokenspeed's default) and an optional
        ``--max-total-tokens`` cap (:mod:`k3layout.engines.tokenspeed.capacity`);
        ``kv_memory_bytes=None``: what the GPU gives (:meth:`memory`)."""
        return parent_capacity(
            self,
            self.kv_budget(kv_memory_bytes),
            max_model_len,
            max_live=max_live,
            overlap_depth=overlap_depth,
            max_total_tokens=max_total_tokens,
        )

    def recommend(
        self, requests: int, max_model_len: int | None = None, kv_memory_bytes: int | None = None
    ) -> Recommendation:
        """tokenspeed's flags for ``requests`` requests of ``max_model_len`` tokens at once per
        attention-DP replica: ``--max-num-seqs`` (its ``max_bs`` is that over the attention
        DP), ``--max-total-tokens`` and ``--max-model-len``; the memory is the budget or the
        least that holds them with these flags. tokenspeed turns the token cap into
        ``cap // (p_m * 128)`` parents before it counts the state groups' pages, so the cap is
        the parents the workload needs, in tokens: ``parents_for(N x L) x p_m x 128``.
        Refuses (``budget_too_small``) a budget that cannot hold them, naming the most it
        holds and the memory they need."""
        check_workload(requests, kv_memory_bytes)
        length = check_context(self, max_model_len)
        protected = protected_pages(self, requests, 1)
        parents = self.parents_for(requests * length, requests, protected)
        most = max(self.pages_per_parent(g) for g in self.groups if g.layers)
        tokens = parents * most * PARENT_PAGE_TOKENS

        def sized(memory: int, context: int = length) -> ParentCapacity:
            return self.capacity(memory, context, max_live=requests, max_total_tokens=tokens)

        return advise(
            self,
            (requests, length, kv_memory_bytes),
            least_memory(sized, requests),
            lambda memory: (
                ("--max-num-seqs", str(requests * self.deployment.attn_dp)),
                ("--max-total-tokens", str(tokens)),
                ("--max-model-len", str(length)),
            ),
            sized,
        )

    def launch_flags(self) -> tuple[tuple[str, str], ...]:
        """tokenspeed's launch flags for this deployment (:func:`.launch.tokenspeed_flags`)."""
        return tokenspeed_flags(self.deployment, self.model)

    def capacity_summary(self, budget_bytes: int, max_live: int = 1) -> list[tuple[str, str]]:
        """What ``budget_bytes`` holds at ``max_live`` live requests, as (label, value) rows."""
        return self.capacity(budget_bytes, max_live=max_live).rows()

    def group_columns(self) -> dict[str, dict[str, str]]:
        """Pages per parent, padding and utilization of every group."""
        padding, utilization = self.padding_fraction, self.utilization
        return {
            g.name: {
                "pages / parent": str(self.packing_by_group[g.name]),
                "padding": f"{padding[g.name]:.3f}",
                "utilization": f"{utilization[g.name]:.3f}",
            }
            for g in self.groups
            if g.layers
        }


def _check_load(tokens: int, max_live: int, protected_pages: int) -> None:
    for name, value, least in (
        ("tokens", tokens, 0),
        ("max_live", max_live, 1),
        ("protected_pages", protected_pages, 0),
    ):
        if expect_int(name, value) < least:
            raise Refusal(
                "invalid_argument",
                f"{name}={value} must be >= {least}",
                facts={name: value},
            )


def _arena(
    groups: tuple[Group, ...],
    sizes: RankSizes,
    pages: tuple[int, int],
    max_padding: float | None,
    revision: TokenspeedRevision = PR1152,
) -> Arena:
    """The recipe's parent with ``(p_m, p_l)`` pages per parent for attention and state
    (``revision``, whose rule gave them, names the rule in a refusal)."""
    mla_pages, state_pages = pages
    by_group = {
        g.name: mla_pages if g.kind == "attention" else state_pages for g in groups if g.layers
    }
    return pack(groups, sizes, by_group, max_padding, revision)


def group_tokenspeed(model: HybridModel, sizes: RankSizes) -> tuple[Group, ...]:
    """tokenspeed's groups: ``full_attention`` (target MLA layers, then the draft's) and the
    KDA layers in 3 contiguous runs (K3: 23, 23, 23)."""
    return recipe_groups(model.attention_layer_ids, model.kda_layer_ids)


def default_max_padding(model: HybridModel, deployment: Deployment) -> float | None:
    """The padding limit in force: the deployment's, else 0.25, or none once draft layers join
    (their planes carry no state, so tokenspeed lifts the limit for them)."""
    if deployment.max_padding is not None:
        return deployment.max_padding
    return None if model.draft_layers else DEFAULT_MAX_PADDING


def pack_tokenspeed(
    model: HybridModel,
    deployment: Deployment,
    sizes: RankSizes,
    groups: tuple[Group, ...],
    stages: tuple[Stage, ...],
) -> ParentPlan:
    """The revision's packing, the recipe's planes and its checks; build the plan."""
    revision = revision_of(deployment)
    page = sizes.attention_page_bytes(PARENT_PAGE_TOKENS)
    state = sizes.state_bytes
    mla_pages, state_pages = revision.packing(page, state)
    limit = default_max_padding(model, deployment)
    arena = _arena(groups, sizes, (mla_pages, state_pages), limit, revision)
    packing = trusted(
        Packing, mla_pages=mla_pages, state_pages=state_pages, plane_bytes=arena.plane_bytes[0]
    )
    worst = max(arena.raw_bytes, key=arena.padding)
    rule = trusted(
        RuleCheck,
        mla_pages=mla_pages,
        state_pages=state_pages,
        plane_bytes=arena.plane_bytes[0],
        parent_bytes=arena.parent_bytes,
        exact_stride=True,
        worst_group=worst,
        worst_padding=arena.padding(worst),
        chosen=True,
        reason=None,
    )
    result = ParentPlan(
        model=model,
        deployment=deployment,
        groups=groups,
        stages=stages,
        packing=packing,
        max_padding=limit,
        packing_rule=rule,
        rule_1152=rule if revision is PR1152 else None,
    )
    result.__dict__["arena"] = arena  # the one just laid out (a cached property)
    return checked_bytes(result, "parent_bytes")
