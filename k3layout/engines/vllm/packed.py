"""vLLM's packed layout: the groups of a model whose caches have pages of several sizes in one
block-outermost backing (an indexed hybrid, GLM-5.3-Flash), as vLLM 0.33 groups and places
them (``_get_packed_kv_cache_groups``, ``get_kv_cache_config_from_groups``).

1. **Buckets** of one cache type, in order of first appearance: the KDA states, the indexed
   MLA layers (each a pooled key cache and a latent, a 1:1 pattern kept as one group), the
   tail rings.
2. **Repeats per group**: the count, at least the MLA bucket's, that wastes the fewest layers
   when every balanced bucket is cut into groups of it (ties: the larger).
3. **State groups**: the KDA bucket splits strided into enough groups that each fits the block
   the MLA group already needs (``anchor // kda_page`` states per block); the rings likewise.
4. **One backing**: every group overlays it; a block is ``max(group pages)`` rounded up to
   the lcm of every cache's alignment; inside a block a group's caches of one spec are back
   to back, spec after spec in order of first appearance (the keys, then the latents).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from ...cache import RING_PARTS, LayerCacheSpec
from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import GPUS
from ...layouts.groups import Group, Stage, split_strided
from ...layouts.protocol import ByteRange, check_block
from ...model import HybridModel
from ...sizes import RankSizes
from .sparse import (
    SparseBackend,
    indexer_alignment_bytes,
    latent_alignment_bytes,
)

RING_GROUP = "tail"
"""The name of the tail rings' group (vLLM's layers ``...indexer.tail_cache``)."""


class Run(NamedTuple):
    """One cache tensor of a group inside a block: ``parts`` of ``layers`` (in the group's
    order), ``page`` bytes each, starting ``offset`` bytes into the block."""

    parts: tuple[str, ...]
    layers: tuple[int, ...]
    page: int
    offset: int


def fewest_wasted(counts: Sequence[int], floor: int) -> int:
    """The repeats per group, at least ``floor``, that pad ``counts`` up the least when each
    is rounded up to a multiple of it (ties: the larger), as vLLM picks them."""
    best, waste = floor, None
    for size in range(max(floor, 1), max(*counts, floor) + 1):
        padding = sum(-count % size for count in counts)
        if waste is None or padding <= waste:
            best, waste = size, padding
    return best


def packed_groups(
    model: HybridModel, sizes: RankSizes, block: int, kda_page: int
) -> tuple[Group, ...]:
    """vLLM's packed groups of an indexed hybrid at ``block`` tokens (``kda_page``: the KDA
    page, padded): buckets in order of first appearance, KDA split to fit the MLA group."""
    mla = model.attention_layer_ids
    kda = model.kda_layer_ids
    tp = sizes.attn_tp
    spec = sizes.attention
    mla_group_bytes = len(mla) * spec.payload_bytes(tp, block)
    ring_page = 0 if sizes.ring is None else sizes.ring.payload_bytes(tp)
    anchor = max(mla_group_bytes, kda_page if kda else 0, ring_page)
    repeats = fewest_wasted([n for n in (len(kda), len(mla), len(mla)) if n], len(mla))

    def state_groups(count: int, page: int) -> int:
        return max(-(-count // repeats), -(-count // max(anchor // page, 1)))

    buckets: list[tuple[int, list[Group]]] = []
    if kda:
        splits = split_strided(kda, state_groups(len(kda), kda_page))
        buckets.append(
            (
                kda[0],
                [
                    Group(name=f"linear_attention_{i}", kind="kda", layers=layers)
                    for i, layers in enumerate(splits)
                ],
            )
        )
    buckets.append((mla[0], [Group(name="full_attention", kind="attention", layers=mla)]))
    if sizes.ring is not None:
        # A ring follows its layer's key cache: its bucket opens right after the MLA one's.
        rings = split_strided(mla, state_groups(len(mla), ring_page))
        names = [f"{RING_GROUP}_{i}" for i in range(len(rings))] if len(rings) > 1 else [RING_GROUP]
        ring_groups = [
            Group(name=name, kind="ring", layers=layers)
            for name, layers in zip(names, rings, strict=True)
        ]
        buckets.append((mla[0], ring_groups))
    ordered = sorted(buckets, key=lambda item: item[0])  # stable: MLA before its rings
    return tuple(group for _, groups in ordered for group in groups)


def group_runs(sizes: RankSizes, group: Group, block: int, kda_page: int) -> tuple[Run, ...]:
    """The cache tensors of ``group`` inside a block, in vLLM's order: the layers of one spec
    back to back, specs in order of first appearance (an indexed layer's pooled keys before
    its latent; a draft's caches join the target's, whose specs they equal)."""
    tp = sizes.attn_tp
    by_spec: dict[int, list[int]] = {}
    for layer in group.layers:
        by_spec.setdefault(sizes.layer_specs[layer], []).append(layer)
    runs: list[tuple[tuple[str, ...], tuple[int, ...], int]] = []
    for index, members in by_spec.items():
        layers = tuple(members)
        if group.kind == "kda":
            runs.append((sizes.specs[index].part_names, layers, kda_page))
        elif group.kind == "ring":
            assert sizes.ring is not None
            runs.append((RING_PARTS, layers, sizes.ring.payload_bytes(tp)))
        else:
            spec = sizes.specs[index]
            for part in sorted(spec.parts, key=lambda p: p.tokens_per_row == 1):
                page = block // part.tokens_per_row * part.local_bytes(tp)
                runs.append(((part.name,), layers, page))
    placed: list[Run] = []
    offset = 0
    for parts, layers, page in runs:
        placed.append(Run(parts, layers, page, offset))
        offset += len(layers) * page
    return tuple(placed)


def alignment_bytes(
    model: HybridModel,
    sizes: RankSizes,
    deployment: Deployment,
    backend: SparseBackend,
    block: int,
) -> int:
    """The lcm of every cache's block stride alignment (the latent's and the key cache's;
    KDA states and rings need none)."""
    indexer = model.indexer
    assert indexer is not None
    latent = sizes.attention.part("latent").local_bytes(sizes.attn_tp)
    device = GPUS[deployment.gpu]
    quantized = deployment.kv_dtype != "bf16"
    return math.lcm(
        latent_alignment_bytes(backend, block, latent, quantized, device.capability[0]),
        indexer_alignment_bytes(indexer, block),
    )


def block_stride_bytes(
    groups: Sequence[Group], runs: Callable[[Group], tuple[Run, ...]], alignment: int
) -> int:
    """Bytes between blocks: the widest group's caches (``runs`` of each), rounded up to
    ``alignment``."""
    widest = max(sum(len(run.layers) * run.page for run in runs(g)) for g in groups if g.layers)
    return alignment * -(-widest // alignment)


PACKED_CACHES: tuple[tuple[str, str], ...] = (
    (".indexer.k_cache", "index"),
    (".indexer.tail_cache", RING_PARTS[0]),
    (".attn", "latent"),
)
"""The caches vLLM registers for an indexed layer (``Glm5NextIndexerCache``,
``Glm5NextTailCache``, the MLA attention) by name suffix, and the part of the plan each starts
with; any other name of a packed plan is a KDA layer's state page."""


def packed_cache_part(sizes: RankSizes, name: str, layer: int) -> str:
    """The part of module ``layer`` whose start vLLM's cache ``name`` binds (its suffix's,
    :data:`PACKED_CACHES`; a KDA layer's page: its first part)."""
    for suffix, part in PACKED_CACHES:
        if name.endswith(suffix):
            return part
    return sizes.spec_of(layer).parts[0].name


class PackedPlan(Protocol):
    """What :func:`packed_byte_range` reads of a packed vLLM plan."""

    @property
    def sizes(self) -> RankSizes: ...
    @property
    def stages(self) -> tuple[Stage, ...]: ...

    def stage(self, index: int) -> Stage: ...
    def group_spec(self, group: Group) -> LayerCacheSpec: ...
    def stage_block_bytes(self, stage: int) -> int: ...
    def runs(self, group: Group) -> tuple[Run, ...]: ...


def packed_byte_range(
    plan: PackedPlan, layer: int, part: str, *, block: int, num_blocks: int, stage: int
) -> ByteRange:
    """Where ``part`` of module ``layer`` lies in block ``block`` of a rank of ``stage``
    holding ``num_blocks`` blocks: ``block * block_stride``, then its tensor's offset inside
    the block and the layer's place in it (a ring part: in the ring's group)."""
    check_block(block, num_blocks)
    held = plan.stage(stage)
    for group in held.groups:
        if layer not in group.layers:
            continue
        for run in plan.runs(group):
            if part not in run.parts or layer not in run.layers:
                continue
            within, size = 0, run.page  # a run of one part: the page is the part
            if len(run.parts) > 1:  # a slot's parts back to back from its start
                ranges = plan.group_spec(group).ranges(plan.sizes.attn_tp)
                inner = next(r for r in ranges if r.part == part)
                within, size = inner.offset_bytes, inner.size_bytes
            offset = (
                block * plan.stage_block_bytes(stage)
                + run.offset
                + run.layers.index(layer) * run.page
                + within
            )
            return ByteRange(
                layer=layer, part=part, block=block, offset_bytes=offset, size_bytes=size
            )
    spec = plan.sizes.spec_of(layer)
    names = (*spec.part_names, *(() if plan.sizes.ring is None else RING_PARTS))
    raise Refusal(
        "invalid_argument",
        f"layer {layer} has no part {part!r} on stage {stage}",
        facts={"layer": layer, "part": part, "parts": names, "stage": stage},
        hint=f"use one of {', '.join(names)} of a layer the stage holds",
    )
