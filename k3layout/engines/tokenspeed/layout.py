"""Engine layout B: parent-block packing (``engine="parent"``; tokenspeed / ATOM native).

Groups: ``full_attention`` (MLA layers in module order, then draft layers) and
``linear_attention_0 ..``: the KDA layers sorted and split *contiguously* into as few groups as
fit one plane each (K3: 69 -> 23, 23, 23). Plane ``slot.i`` holds the layer at position ``i``
of every group, so the state rides inside the MLA planes. A parent is one plane of
``align_up(max(p_m * page, p_l * S), 256)`` bytes per MLA layer (+ draft); the packing
``(p_m, p_l)`` is searched (:mod:`k3layout.layouts.packing`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import NonNegativeInt, PositiveInt, model_validator

from ..._args import expect, expect_int
from ..._derivation import SelfChecked, deriving, is_deriving, mismatch
from ..._frozen import trusted
from ...constants import DEFAULT_MAX_PADDING_FRACTION, PARENT_PAGE_TOKENS
from ...deployment import Deployment
from ...errors import Refusal
from ...layouts.groups import Group, GroupKind, Stage, group_names, num_planes, split_contiguous
from ...layouts.packing import Packing, PackingFrame, RuleCheck, rule_1152, search_packing
from ...layouts.protocol import ByteRange, LayoutBase
from ...layouts.seams import SGLANG_SETTINGS, refuse_settings
from ...limits import checked_bytes
from ...model import HybridModel
from ...sizes import RankSizes
from .capacity import ParentCapacity, parent_capacity
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
    """Where one layer's pages live in a bound arena (planes laid out plane-major)."""

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
        if self.pages_per_parent * self.page_stride > self.parent_stride:
            raise mismatch(
                f"layer {self.layer}",
                "page_stride",
                "p_g pages fit one plane of a parent",
                self.pages_per_parent * self.page_stride,
                self.parent_stride,
            )
        return self

    def page_offset(self, page: int) -> int:
        """Arena byte offset of page ``page`` of this layer (``page // p`` picks the parent)."""
        parent, slot = divmod(page, self.pages_per_parent)
        return self.base_offset + parent * self.parent_stride + slot * self.page_stride


class Binding(SelfChecked):
    """``bind(n)``: ``n`` usable parents plus the null parent, every layer's page addresses.

    Built by hand (or loaded, or ``model_copy``'d), it is refused (``plan_mismatch``) unless
    every address follows from ``(num_parents, num_planes, plane_bytes)`` and the groups' pages
    per parent, as :meth:`ParentPlan.bind` lays them out.
    """

    num_parents: NonNegativeInt
    num_planes: PositiveInt
    plane_bytes: PositiveInt
    groups: tuple[GroupPages, ...]
    layers: tuple[LayerBinding, ...]

    @model_validator(mode="after")
    def _addresses_follow(self) -> Binding:
        if is_deriving():
            return self
        thing = "parent binding"
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
        previous = -1
        for index, bound in enumerate(self.layers):
            expected = (
                bound.layer if bound.layer > previous else previous + 1,
                per_parent.get(bound.group, bound.pages_per_parent),
                bound.plane % self.num_planes,
                bound.plane * (self.num_parents + 1) * self.plane_bytes,
                self.plane_bytes,
                min(bound.page_stride, self.plane_bytes // bound.pages_per_parent),
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
                    "layers are listed once in order, in a bound group, and page p_g fits the "
                    "plane at plane * (n + 1) * plane_bytes + parent * plane_bytes "
                    "(layer, p_g, plane, base, parent stride, page stride)",
                    stored,
                    expected,
                )
            previous = bound.layer
        return self

    @property
    def arena_bytes(self) -> int:
        """``(n + 1) * parent``: the arena one rank allocates."""
        return (self.num_parents + 1) * self.num_planes * self.plane_bytes


class ParentPlan(SelfChecked, LayoutBase):
    """The parent-block layout of one model under one deployment.

    ``groups``, ``num_planes`` (one per MLA layer plus one per draft layer: no state group is
    longer than the attention group), ``packing`` and the padding describe the whole model
    (the packing is solved once so that every stage agrees); each of ``stages`` holds its
    projected groups and allocates one plane per position of its longest group
    (``stage_parent_bytes``).

    A plan built outside :func:`~k3layout.plan` (by hand, :func:`~k3layout.load_plan`, or
    ``model_copy(update=...)``, which re-validates here) is re-planned from its own ``model``
    and ``deployment`` and refused (``plan_mismatch``) at the first field that differs.
    """

    engine: Literal["parent"] = "parent"
    report_type: ClassVar[type[ParentReport]] = ParentReport
    packing: Packing
    max_padding: float | None
    rule_1152: RuleCheck | None

    @model_validator(mode="after")
    def _is_its_own_derivation(self) -> ParentPlan:
        # Built outside the pipeline (by hand, load_plan, model_copy): re-plan and compare.
        if not is_deriving():
            from ...layouts.rederive import check_plan  # noqa: PLC0415 - rederive imports the pipeline

            check_plan(self)
        return self

    @property
    def page_tokens(self) -> int:
        """Tokens per MLA page (128)."""
        return PARENT_PAGE_TOKENS

    @property
    def mla_page_bytes(self) -> int:
        """One 128-token MLA page: 73,728 B fp8 / 147,456 B bf16 for K3."""
        return self.sizes.attention_page_bytes(PARENT_PAGE_TOKENS)

    @property
    def full_attention(self) -> Group:
        """The attention group (MLA layers, then draft)."""
        return self.groups[0]

    @property
    def parent_bytes(self) -> int:
        """Bytes of one parent: ``num_planes * plane_bytes`` (21,233,664 at K3 tp 8 fp8)."""
        return self.num_planes * self.packing.plane_bytes

    @property
    def frame(self) -> PackingFrame:
        """The packing's inputs, for padding and utilization."""
        return PackingFrame(
            mla_page_bytes=self.mla_page_bytes,
            state_bytes=self.sizes.state_bytes,
            num_planes=self.num_planes,
            groups=self.groups,
            max_padding=self.max_padding,
            own_pages=own_pages(self.groups, self.sizes),
        )

    def payload_bytes(self, group: Group) -> int:
        """Payload of one layer of ``group`` on one of its pages: the MLA page or ``S``."""
        expect("group", group, Group)
        return self.frame.payload_bytes(group)

    def pages_per_parent(self, group: Group) -> int:
        """``p_g``: pages of ``group`` one parent holds (``p_m``, ``p_l``, or as many of a
        draft's own pages as a plane holds)."""
        expect("group", group, Group)
        packing = self.packing
        return self.frame.pages_per_plane(group, packing.mla_pages, packing.state_pages)

    @property
    def packing_by_group(self) -> dict[str, int]:
        """``p_g`` keyed by group name (``full_attention``: 12, ``linear_attention_*``: 1)."""
        return {group.name: self.pages_per_parent(group) for group in self.groups}

    @property
    def padding_fraction(self) -> dict[str, float]:
        """``(parent / p_g - raw_g) / raw_g`` keyed by group name."""
        frame = self.frame
        return {
            g.name: frame.padding(g, self.packing.mla_pages, self.packing.state_pages)
            for g in self.groups
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
            "rule_1152": self.rule_1152,
        }, "parent_bytes"

    @property
    def utilization(self) -> dict[str, float]:
        """``p_g * raw_g / parent`` keyed by group name: the share of a parent that is payload."""
        frame = self.frame
        return {
            g.name: self.pages_per_parent(g) * frame.raw_bytes(g) / self.parent_bytes
            for g in self.groups
        }

    @property
    def bytes_per_token(self) -> float:
        """Per-rank parent bytes per MLA token it holds: ``parent / (p_m * 128)``."""
        return self.parent_bytes / (self.packing.mla_pages * PARENT_PAGE_TOKENS)

    def stage_parent_bytes(self, stage: int) -> int:
        """Bytes of one parent on a rank of pipeline stage ``stage``."""
        return self.stage(stage).num_planes * self.packing.plane_bytes

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
        """Parents a load needs: the sum over groups of ``ceil(pages_g / p_g)``.

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
    ) -> int:
        """The most tokens ``num_parents`` parents hold: the inverse of :meth:`parents_for`
        (``parents_for(token_capacity(n)) <= n < parents_for(token_capacity(n) + 1)``)."""
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
        per_parent = [self.pages_per_parent(g) for g in attention]

        def attention_parents(pages: int) -> int:
            return sum(-(-(pages + extra) // p) for p in per_parent)

        if spare < 0 or attention_parents(0) > spare:
            raise Refusal(
                "budget_too_small",
                f"num_parents={num_parents} cannot hold the state of max_live={max_live} "
                f"requests ({state_parents} state parents) and their first MLA pages",
                facts={
                    "num_parents": num_parents,
                    "state_parents": state_parents,
                    "max_live": max_live,
                },
                hint="give the cache more parents or admit fewer live requests",
            )
        # The most token pages every attention group still has parents for: one group in K3
        # (``spare * p_m - extra``); with a draft of its own pages, searched (monotone).
        low, high = 0, spare * max(per_parent)
        while low < high:
            middle = (low + high + 1) // 2
            if attention_parents(middle) <= spare:
                low = middle
            else:
                high = middle - 1
        pages = low
        return pages * PARENT_PAGE_TOKENS

    def parents_for_budget(self, budget_bytes: int, stage: int | None = None) -> int:
        """Usable parents in ``budget_bytes`` (one parent is the null parent)."""
        if expect_int("budget_bytes", budget_bytes) < 0:
            raise Refusal(
                "invalid_argument",
                f"budget_bytes={budget_bytes} must be >= 0",
                facts={"budget_bytes": budget_bytes},
            )
        parent = self.parent_bytes if stage is None else self.stage_parent_bytes(stage)
        return max(0, budget_bytes // parent - 1)

    def bind(self, num_parents: int, stage: int = 0) -> Binding:
        """Lay out ``num_parents`` usable parents (+ the null parent 0) plane-major.

        Plane ``k`` spans ``[k, k+1) * (n+1) * plane_bytes``; page ``x`` of a layer on plane
        ``k`` sits at ``k*(n+1)*plane + (x // p_g)*plane + (x % p_g)*payload``, the payload
        being the MLA page (exact stride: MLA page ``x`` is at ``x * page``) or the state ``S``.
        """
        if num_parents < 0:
            raise Refusal(
                "invalid_argument",
                f"num_parents={num_parents} must be >= 0",
                facts={"num_parents": num_parents},
            )
        held = self.stage(stage)
        plane = self.packing.plane_bytes
        plane_span = (num_parents + 1) * plane
        layers: list[LayerBinding] = []
        pages: list[GroupPages] = []
        for group in held.groups:
            if not group.layers:
                continue
            per_parent = self.pages_per_parent(group)
            payload = self.payload_bytes(group)
            pages.append(
                GroupPages(
                    group=group.name,
                    pages_per_parent=per_parent,
                    page_count=1 + num_parents * per_parent,
                )
            )
            layers.extend(
                LayerBinding(
                    layer=layer,
                    group=group.name,
                    kind=group.kind,
                    plane=group.plane_of(position),
                    base_offset=group.plane_of(position) * plane_span,
                    parent_stride=plane,
                    page_stride=payload,
                    pages_per_parent=per_parent,
                )
                for position, layer in enumerate(group.layers)
            )
        with deriving():  # bind's own layout: its checks are for bindings built by hand
            return Binding(
                num_parents=num_parents,
                num_planes=held.num_planes,
                plane_bytes=plane,
                groups=tuple(pages),
                layers=tuple(sorted(layers, key=lambda b: b.layer)),
            )

    # The engine-layout protocol.

    @property
    def block_bytes(self) -> int:
        """The parent engine's block is its parent: :attr:`parent_bytes`."""
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

    def page_stride_bytes(self, group: Group) -> int:
        """Bytes between consecutive pages of one layer inside a parent: its payload (the exact
        page stride of MLA pages, ``S`` for state)."""
        return self.payload_bytes(group)

    def page_axes(self, group: Group, num_blocks: int) -> tuple[tuple[int, int], ...]:
        """How one layer's pages repeat on its plane of ``bind(num_blocks)``: attention pages
        at the exact page stride (``1 + n * p_g`` of them, parents back to back), state pages
        ``p_l`` per parent at stride ``S``."""
        expect_int("num_blocks", num_blocks)
        payload = self.payload_bytes(group)
        per_parent = self.pages_per_parent(group)
        if self.group_spec(group).paging == "token":
            return ((1 + num_blocks * per_parent, payload),)
        return ((num_blocks + 1, self.packing.plane_bytes), (per_parent, payload))

    def plane_span_bytes(self, num_blocks: int) -> int:
        """Bytes of one plane of ``bind(num_blocks)``: the usable parents and the null one."""
        expect_int("num_blocks", num_blocks)
        return (num_blocks + 1) * self.packing.plane_bytes

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

    def byte_range(
        self, layer: int, part: str, block: int, num_blocks: int, stage: int = 0
    ) -> ByteRange:
        """Where ``part`` of page ``block`` of module ``layer`` lies in the arena of
        ``bind(num_blocks)`` on a rank of ``stage`` (page 0 is the null page)."""
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
        return (
            f"one parent: packing p_m/p_l {packing.mla_pages}/{packing.state_pages}, "
            f"{packing.plane_bytes:,} B planes x {num_planes} = "
            f"{num_planes * packing.plane_bytes:,} B"
        )

    def summary(self) -> list[tuple[str, str]]:
        """The layout's numbers as (label, value) rows."""
        rows = [
            ("planes", f"{self.num_planes:,}"),
            ("packing p_m / p_l", f"{self.packing.mla_pages} / {self.packing.state_pages}"),
            ("plane bytes", f"{self.packing.plane_bytes:,}"),
            ("parent bytes", f"{self.parent_bytes:,}"),
            ("padding limit", "none" if self.max_padding is None else f"{self.max_padding:g}"),
        ]
        rule = self.rule_1152
        if rule is not None:
            verdict = "chosen" if rule.chosen else f"passed over: {rule.reason}"
            rows.append(("#1152 rule", f"{rule.mla_pages}/{rule.state_pages}, {verdict}"))
        return rows

    def capacity(
        self,
        budget_bytes: int,
        max_live: int = 1,
        overlap_depth: int = 1,
        max_total_tokens: int | None = None,
    ) -> ParentCapacity:
        """What ``budget_bytes`` per rank serves at ``max_live`` live requests (tokenspeed's
        ``max_bs``), with overlap scheduling of ``overlap_depth`` (1, tokenspeed's default) and
        an optional ``max_total_tokens`` cap, as tokenspeed's recipe counts it
        (:mod:`k3layout.engines.tokenspeed.capacity`)."""
        return parent_capacity(self, budget_bytes, max_live, overlap_depth, max_total_tokens)

    def capacity_summary(self, budget_bytes: int, max_live: int = 1) -> list[tuple[str, str]]:
        """What ``budget_bytes`` holds, as (label, value) rows."""
        parents = self.parents_for_budget(budget_bytes)
        return [
            ("parents in budget (+1 null)", f"{parents:,}"),
            (
                f"token capacity (max_live {max_live})",
                f"{self.token_capacity(parents, max_live):,}",
            ),
        ]

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
        }


def _check_load(tokens: int, max_live: int, protected_pages: int) -> None:
    for name, value, least in (
        ("tokens", tokens, 0),
        ("max_live", max_live, 1),
        ("protected_pages", protected_pages, 0),
    ):
        if value < least:
            raise Refusal(
                "invalid_argument",
                f"{name}={value} must be >= {least}",
                facts={name: value},
            )


def own_pages(groups: tuple[Group, ...], sizes: RankSizes) -> tuple[tuple[str, int], ...]:
    """The attention groups whose 128-token page is not the target attention's (a GQA
    draft), with their page bytes."""
    primary = sizes.attention
    pages: list[tuple[str, int]] = []
    for group in groups:
        if group.kind != "attention" or not group.layers:
            continue
        spec = sizes.spec_of(group.layers[0])
        if spec != primary:
            pages.append((group.name, spec.payload_bytes(sizes.attn_tp, PARENT_PAGE_TOKENS)))
    return tuple(pages)


def group_parent(model: HybridModel, sizes: RankSizes) -> tuple[Group, ...]:
    """``full_attention`` (MLA then draft) and the KDA layers split contiguously into
    ``ceil(kda / planes)`` groups (K3: 69 over 24 planes -> 23, 23, 23).

    Draft layers of another attention kind (a GQA draft) form a group of their own,
    ``full_attention_<kind>``, on the planes after the target's: one plane per attention
    layer, as tokenspeed lays out draft planes."""
    attention = model.attention_layer_ids
    primary = sizes.attention
    target = tuple(i for i in attention if sizes.spec_of(i) == primary)
    # Module layer ids and tokenspeed's names: built here, nothing to re-validate.
    groups = [trusted(Group, name="full_attention", kind="attention", layers=target)]
    first_plane = len(target)
    others: dict[str, list[int]] = {}
    for layer in attention:
        spec = sizes.spec_of(layer)
        if spec != primary:
            others.setdefault(spec.kind, []).append(layer)
    for kind, layers in others.items():
        groups.append(
            trusted(
                Group,
                name=f"full_attention_{kind}",
                kind="attention",
                layers=tuple(layers),
                first_plane=first_plane,
            )
        )
        first_plane += len(layers)
    kda = model.kda_layer_ids
    if kda:
        splits = split_contiguous(kda, -(-len(kda) // len(attention)))
        names = group_names("kda", len(splits))
        groups.extend(
            trusted(Group, name=n, kind="kda", layers=s) for n, s in zip(names, splits, strict=True)
        )
    return tuple(groups)


def default_max_padding(model: HybridModel, deployment: Deployment) -> float | None:
    """The padding limit in force: the deployment's, else 0.25, or none once draft layers join
    (their planes carry no state, so tokenspeed lifts the limit for them)."""
    if deployment.max_padding is not None:
        return deployment.max_padding
    return None if model.draft_layers else DEFAULT_MAX_PADDING_FRACTION


def check_parent(model: HybridModel, deployment: Deployment) -> HybridModel:
    """Refuse what the parent engine does not run: decode context parallel, and vLLM's own
    settings (an attention backend or KV-cache layout other than the defaults), which would
    otherwise be ignored silently."""
    refuse_settings(deployment, SGLANG_SETTINGS, "SGLang")
    for name, default in (("attention_backend", "FLASHMLA"), ("kv_cache_layout", "LBNHC")):
        value = getattr(deployment, name)
        if value != default:
            raise Refusal(
                "engine_setting",
                f"{name}={value!r} is a vLLM setting; engine=parent lays out its own pages "
                f"(FlashMLA 64-token pages, layer-outermost)",
                facts={"engine": "parent", "field": name, name: value},
                hint=f"leave {name} at {default!r} for engine=parent, or use engine=vllm",
            )
    if deployment.dcp > 1:
        raise Refusal(
            "dcp_unsupported",
            f"engine=parent has no decode context parallel (dcp={deployment.dcp})",
            facts={"engine": "parent", "dcp": deployment.dcp},
            hint="use dcp=1, or engine=vllm for a DCP decode",
        )
    return model


def pack_parent(
    model: HybridModel,
    deployment: Deployment,
    sizes: RankSizes,
    groups: tuple[Group, ...],
    stages: tuple[Stage, ...],
) -> ParentPlan:
    """Search the packing for the whole model, report #1152's beside it, build the plan."""
    # Sizes and groups the pipeline already validated: nothing to re-validate.
    frame = trusted(
        PackingFrame,
        mla_page_bytes=sizes.attention_page_bytes(PARENT_PAGE_TOKENS),
        state_bytes=sizes.state_bytes,
        num_planes=num_planes(groups),
        groups=groups,
        max_padding=default_max_padding(model, deployment),
        own_pages=own_pages(groups, sizes),
    )
    packing = search_packing(frame)
    return checked_bytes(
        ParentPlan(
            model=model,
            deployment=deployment,
            groups=groups,
            stages=stages,
            packing=packing,
            max_padding=frame.max_padding,
            rule_1152=rule_1152(frame, packing),
        ),
        "parent_bytes",
    )
