"""KV-cache groups, planes and pipeline stages: the vocabulary both engine layouts share.

A *group* is a list of layers that share one block table. A *plane* is one allocation of
per-layer pages: plane ``j`` holds the layer at position ``j`` of every group, so layers of
different groups alias the same bytes (a KDA layer's state rides inside an attention layer's
pages). A *stage* is a pipeline stage's contiguous range of module layers, with the groups
projected onto it (same names and order on every stage, possibly empty).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Annotated, Literal, TypeAlias, cast

from pydantic import Field, NonNegativeInt

from .._args import expect, expect_int, expect_sequence
from .._frozen import Frozen, trusted, trusted_maker, trusted_record
from ..cache import LayerCacheSpec
from ..deployment import Deployment
from ..errors import Refusal
from ..model import HybridModel
from ..placements import pp_stage_bounds
from ..registry import facts_of

GroupKind: TypeAlias = Literal["attention", "kda", "ring"]
"""``attention``: token-paged layers; ``kda``: state slots; ``ring``: the tail rings beside an
indexed layer's pages (:mod:`k3layout.cache.ring`), a group of its own in vLLM's packed
layout that names the layers whose rings it holds."""


class Group(Frozen):
    """One KV-cache group: ``layers`` are module layer ids in the group's own order; the
    layer at position ``j`` uses plane ``first_plane + j`` (``first_plane`` is 0 except for
    a parent layout's draft group of its own kind, whose planes follow the target's)."""

    name: Annotated[str, Field(min_length=1)]
    kind: GroupKind
    layers: tuple[NonNegativeInt, ...]
    first_plane: NonNegativeInt = 0

    def project(self, stage_layers: frozenset[int]) -> Group:
        """The same group restricted to the layers a stage holds (order kept)."""
        return self.restricted([layer for layer in self.layers if layer in stage_layers])

    def restricted(self, layers: list[int]) -> Group:
        """The same group with only ``layers``, a subsequence of its own (order kept)."""
        if len(layers) == len(self.layers):
            return self
        # A subsequence of this (validated) group's layers: nothing to re-validate.
        return trusted_record(
            Group,
            {
                "name": self.name,
                "kind": self.kind,
                "layers": tuple(layers),
                "first_plane": self.first_plane,
            },
        )

    def plane_of(self, position: int) -> int:
        """The plane of the layer at ``position``."""
        return self.first_plane + position


class PlaneMember(Frozen):
    """A layer that uses a plane, and the group it belongs to."""

    group: str
    kind: GroupKind
    layer: NonNegativeInt


def num_planes(groups: tuple[Group, ...]) -> int:
    """Planes needed so that every group's layer ``j`` has plane ``first_plane + j``: the
    longest group (vLLM's ``group_size``)."""
    return max((group.first_plane + len(group.layers) for group in groups), default=0)


def plane_members(groups: tuple[Group, ...]) -> tuple[tuple[PlaneMember, ...], ...]:
    """For every plane, the layer of each group that uses it."""
    return tuple(
        tuple(
            trusted(
                PlaneMember,
                group=group.name,
                kind=group.kind,
                layer=group.layers[p - group.first_plane],
            )
            for group in groups
            if 0 <= p - group.first_plane < len(group.layers)
        )
        for p in range(num_planes(groups))
    )


class GroupedLayout(Frozen):
    """Groups of layers on shared planes: plane ``j`` holds layer ``j`` of every group."""

    groups: tuple[Group, ...]

    @property
    def num_planes(self) -> int:
        """Planes allocated: the longest group (``group_size`` in vLLM's words)."""
        return num_planes(self.groups)

    @property
    def planes(self) -> tuple[tuple[PlaneMember, ...], ...]:
        """For every plane ``j``, layer ``j`` of each group (the layers aliasing it)."""
        return plane_members(self.groups)

    def groups_of(self, kind: GroupKind) -> tuple[Group, ...]:
        """The groups of ``kind`` that hold layers, in group order."""
        expect("kind", kind, str)
        return tuple(group for group in self.groups if group.kind == kind and group.layers)

    def group(self, name: str) -> Group:
        """The group called ``name`` (refuses a name that is not a group)."""
        for group in self.groups:
            if group.name == name:
                return group
        raise Refusal(
            "invalid_argument",
            f"group {name!r} is not a group of this layout",
            facts={"group": name, "groups": tuple(g.name for g in self.groups)},
            hint=f"use one of {', '.join(g.name for g in self.groups)}",
        )


class Stage(GroupedLayout):
    """One pipeline stage: its module layers and the plan's groups projected onto them."""

    index: NonNegativeInt
    layers: tuple[NonNegativeInt, ...]


def stage_at(stages: tuple[Stage, ...], index: int) -> Stage:
    """``stages[index]``, refusing (``invalid_argument``) an index that is not a stage."""
    if not 0 <= expect_int("stage", index) < len(stages):
        raise Refusal(
            "invalid_argument",
            f"stage={index} is not a pipeline stage (pp={len(stages)})",
            facts={"stage": index, "pp": len(stages)},
            hint=f"use 0 <= stage < {len(stages)}",
        )
    return stages[index]


def project_stages(
    model: HybridModel, deployment: Deployment, groups: tuple[Group, ...]
) -> tuple[Stage, ...]:
    """Split the model's module layers over ``deployment.pp`` stages (the engine's own split;
    draft layers on the last stage) and project ``groups`` onto each.

    Refuses (``invalid_argument``) arguments of the wrong type and a group holding a layer the
    model does not have; ``pp_too_deep`` and the split's other refusals."""
    expect("model", model, HybridModel)
    expect("deployment", deployment, Deployment)
    checked = tuple(cast(Sequence[Group], expect_sequence("groups", groups, Group)))
    num_layers = len(model.module_layers)
    for index, group in enumerate(checked):
        if group.layers and max(group.layers) >= num_layers:
            raise Refusal(
                "invalid_argument",
                f"groups[{index}] ({group.name}) holds layer {max(group.layers)}, not a module "
                f"layer of {model.name} ({num_layers} module layers)",
                facts={"field": f"groups[{index}]", "num_module_layers": num_layers},
                hint="project the groups of a plan of this model",
            )
    return projected_stages(model, deployment, checked)


def stage_bounds(model: HybridModel, deployment: Deployment) -> tuple[tuple[int, int], ...]:
    """``[start, end)`` module layers of each pipeline stage, split as ``deployment.engine``
    splits them (:attr:`~k3layout.registry.EngineFacts.pp_remainder_skips_last`)."""
    skips_last = facts_of(deployment.engine).pp_remainder_skips_last
    return pp_stage_bounds(model.num_layers, deployment.pp, deployment.pp_partition, skips_last)


def projected_stages(
    model: HybridModel, deployment: Deployment, groups: tuple[Group, ...]
) -> tuple[Stage, ...]:
    """:func:`project_stages` of arguments known good (the planner's own), on the engine's
    own stage split."""
    bounds = stage_bounds(model, deployment)
    if len(bounds) == 1:
        # One stage holds every module layer: each group is its own projection.
        layers = tuple(range(len(model.module_layers)))
        return (trusted(Stage, groups=groups, index=0, layers=layers),)
    # Each stage holds a contiguous range of module layers (the last one the draft layers
    # too, numbered after the target's): every group's layers are dealt to their stages in
    # one pass, in the group's order (each stage's projection of the group).
    ranges = [range(start, end) for start, end in bounds]
    ranges[-1] = range(bounds[-1][0], len(model.module_layers))
    starts = [start for start, _ in bounds[1:]]  # the last stage runs to the drafts' end
    projected: list[list[Group]] = [[] for _ in ranges]
    make_group = trusted_maker(Group)
    for group in groups:
        layers = group.layers  # increasing: each stage's run is one slice, cut by bisection
        cuts = [0, *(bisect_left(layers, start) for start in starts), len(layers)]
        for into, low, high in zip(projected, cuts, cuts[1:], strict=False):
            # A slice of a validated group's layers: nothing to re-validate.
            into.append(
                group
                if high - low == len(layers)
                else make_group(
                    {
                        "name": group.name,
                        "kind": group.kind,
                        "layers": layers[low:high],
                        "first_plane": group.first_plane,
                    }
                )
            )
    make_stage = trusted_maker(Stage)
    return tuple(
        make_stage({"groups": tuple(held_groups), "index": index, "layers": tuple(held)})
        for index, (held, held_groups) in enumerate(zip(ranges, projected, strict=True))
    )


def split_strided(layers: tuple[int, ...], num_groups: int) -> tuple[tuple[int, ...], ...]:
    """vLLM's split: group ``i`` is ``layers[i::num_groups]`` (keeps PP stages balanced)."""
    return tuple(layers[i::num_groups] for i in range(num_groups))


def split_contiguous(layers: tuple[int, ...], num_groups: int) -> tuple[tuple[int, ...], ...]:
    """tokenspeed's split: ``num_groups`` runs in order, the first ``n % g`` one layer longer."""
    size, extra = divmod(len(layers), num_groups)
    runs: list[tuple[int, ...]] = []
    start = 0
    for i in range(num_groups):
        end = start + size + (1 if i < extra else 0)
        runs.append(layers[start:end])
        start = end
    return tuple(runs)


def group_kind(spec: LayerCacheSpec) -> GroupKind:
    """``attention`` for a token-paged spec, ``kda`` for a state (slot) spec."""
    return "attention" if spec.paging == "token" else "kda"


def group_names(kind: GroupKind, count: int, prefix: str | None = None) -> tuple[str, ...]:
    """tokenspeed's names: ``full_attention`` (``full_attention_i`` when several) and
    ``linear_attention_0 ..``; ``prefix`` (a layer kind, ``gqa``) tells apart the buckets of
    one group kind (``full_attention_gqa``)."""
    base = "full_attention" if kind == "attention" else "linear_attention"
    if prefix is not None:
        base = f"{base}_{prefix}"
    if kind == "attention" and count == 1:
        return (base,)
    return tuple(f"{base}_{i}" for i in range(count))
