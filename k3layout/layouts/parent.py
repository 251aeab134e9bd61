"""Engine layout B: parent-block packing (``engine="parent"``; tokenspeed / ATOM native).

Groups: ``full_attention`` (MLA layers in module order, then draft layers) and
``linear_attention_0 ..``: the KDA layers sorted and split *contiguously* into as few groups as
fit one plane each (K3: 69 -> 23, 23, 23). Plane ``slot.i`` holds the layer at position ``i``
of every group, so the state rides inside the MLA planes. A parent is one plane of
``align_up(max(p_m * page, p_l * S), 256)`` bytes per MLA layer (+ draft); the packing
``(p_m, p_l)`` is searched (:mod:`k3layout.layouts.packing`).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import NonNegativeInt, PositiveInt, model_validator

from .._derivation import SelfChecked, deriving, is_deriving, mismatch
from ..constants import DEFAULT_MAX_PADDING_FRACTION, PARENT_PAGE_TOKENS
from ..deployment import Deployment
from ..errors import Refusal
from ..model import HybridModel
from ..sizes import RankSizes
from .groups import (
    Group,
    GroupedLayout,
    GroupKind,
    Stage,
    group_names,
    split_contiguous,
    stage_at,
)
from .packing import Packing, PackingFrame, RuleCheck, rule_1152, search_packing


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


class ParentPlan(SelfChecked, GroupedLayout):
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
    model: HybridModel
    deployment: Deployment
    sizes: RankSizes
    stages: tuple[Stage, ...]
    packing: Packing
    max_padding: float | None
    rule_1152: RuleCheck | None

    @model_validator(mode="after")
    def _is_its_own_derivation(self) -> ParentPlan:
        # Built outside the pipeline (by hand, load_plan, model_copy): re-plan and compare.
        if not is_deriving():
            from .rederive import check_plan  # noqa: PLC0415 - rederive imports the pipeline

            check_plan(self)
        return self

    @property
    def page_tokens(self) -> int:
        """Tokens per MLA page (128)."""
        return PARENT_PAGE_TOKENS

    @property
    def mla_page_bytes(self) -> int:
        """One 128-token MLA page: 73,728 B fp8 / 147,456 B bf16 for K3."""
        return self.sizes.attention.page_bytes(PARENT_PAGE_TOKENS)

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
            state_bytes=self.sizes.kda_state_bytes,
            num_planes=self.num_planes,
            groups=self.groups,
            max_padding=self.max_padding,
        )

    def unit_bytes(self, group: Group) -> int:
        """Payload of one layer of ``group`` on one of its pages: the MLA page or ``S``."""
        return self.frame.unit_bytes(group)

    def pages_per_parent(self, group: Group) -> int:
        """``p_g``: pages of ``group`` one parent holds."""
        return self.packing.mla_pages if group.kind == "attention" else self.packing.state_pages

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
        return stage_at(self.stages, stage).num_planes * self.packing.plane_bytes

    def _frame_groups(self, stage: int | None) -> tuple[Group, ...]:
        groups = self.groups if stage is None else stage_at(self.stages, stage).groups
        return tuple(group for group in groups if group.layers)

    def pages_needed(
        self, group: Group, tokens: int, max_live: int = 1, protected_pages: int = 0
    ) -> int:
        """Pages ``group`` needs: MLA ``ceil(tokens / 128) + max_live - 1``, each state group
        ``2 * max_live`` (a running and a checkpoint slot per request), plus protected pages."""
        _check_load(tokens, max_live, protected_pages)
        if group.kind == "attention":
            return -(-tokens // PARENT_PAGE_TOKENS) + max_live - 1 + protected_pages
        return 2 * max_live + protected_pages

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
        pages = spare * self.packing.mla_pages - (max_live - 1) - protected_pages
        if spare < 0 or pages < 0:
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
        return pages * PARENT_PAGE_TOKENS

    def parents_for_budget(self, budget_bytes: int, stage: int | None = None) -> int:
        """Usable parents in ``budget_bytes`` (one parent is the null parent)."""
        if budget_bytes < 0:
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
        ``k`` sits at ``k*(n+1)*plane + (x // p_g)*plane + (x % p_g)*unit``, ``unit`` being the
        MLA page (exact stride: MLA page ``x`` is at ``x * page``) or the state ``S``.
        """
        if num_parents < 0:
            raise Refusal(
                "invalid_argument",
                f"num_parents={num_parents} must be >= 0",
                facts={"num_parents": num_parents},
            )
        held = stage_at(self.stages, stage)
        plane = self.packing.plane_bytes
        plane_span = (num_parents + 1) * plane
        layers: list[LayerBinding] = []
        pages: list[GroupPages] = []
        for group in held.groups:
            if not group.layers:
                continue
            per_parent = self.pages_per_parent(group)
            unit = self.unit_bytes(group)
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
                    plane=position,
                    base_offset=position * plane_span,
                    parent_stride=plane,
                    page_stride=unit,
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


def group_parent(model: HybridModel) -> tuple[Group, ...]:
    """``full_attention`` (MLA then draft) and the KDA layers split contiguously into
    ``ceil(kda / planes)`` groups (K3: 69 over 24 planes -> 23, 23, 23)."""
    attention = model.attention_layer_ids
    groups = [Group(name="full_attention", kind="attention", layers=attention)]
    kda = model.kda_layer_ids
    if kda:
        splits = split_contiguous(kda, math.ceil(len(kda) / len(attention)))
        names = group_names("kda", len(splits))
        groups.extend(
            Group(name=n, kind="kda", layers=s) for n, s in zip(names, splits, strict=True)
        )
    return tuple(groups)


def default_max_padding(model: HybridModel, deployment: Deployment) -> float | None:
    """The padding limit in force: the deployment's, else 0.25, or none once draft layers join
    (their planes carry no state, so tokenspeed lifts the limit for them)."""
    if deployment.max_padding is not None:
        return deployment.max_padding
    return None if model.draft_layers else DEFAULT_MAX_PADDING_FRACTION


def check_parent(model: HybridModel, deployment: Deployment) -> None:
    """Refuse what the parent engine does not run: decode context parallel."""
    if deployment.dcp > 1:
        raise Refusal(
            "dcp_unsupported",
            f"engine=parent has no decode context parallel (dcp={deployment.dcp})",
            facts={"engine": "parent", "dcp": deployment.dcp},
            hint="use dcp=1, or engine=vllm for a DCP decode",
        )


def pack_parent(
    model: HybridModel,
    deployment: Deployment,
    sizes: RankSizes,
    groups: tuple[Group, ...],
    stages: tuple[Stage, ...],
) -> ParentPlan:
    """Search the packing for the whole model, report #1152's beside it, build the plan."""
    frame = PackingFrame(
        mla_page_bytes=sizes.attention.page_bytes(PARENT_PAGE_TOKENS),
        state_bytes=sizes.kda_state_bytes,
        num_planes=len(groups[0].layers),
        groups=groups,
        max_padding=default_max_padding(model, deployment),
    )
    packing = search_packing(frame)
    return ParentPlan(
        model=model,
        deployment=deployment,
        sizes=sizes,
        groups=groups,
        stages=stages,
        packing=packing,
        max_padding=frame.max_padding,
        rule_1152=rule_1152(frame, packing),
    )
