"""tokenspeed's Kimi-K3 cache recipe at the revision k3layout follows: #1152's head.

Groups -> pack -> bind, in tokenspeed's own terms (``recipes/kimi_k3.py`` and ``plan.py``):

- **groups**: ``full_attention`` holds the target's MLA layers in module order, then the
  draft's; the KDA layers, sorted, split into 3 equal contiguous runs ``linear_attention_0..2``.
  The layer at position ``j`` of its group uses plane ``slot.j``.
- **pack**: #1152's rule pins the packing, ``p_m = max(1, ceil(S / page))`` and
  ``p_l = max(1, p_m * page // S)``. Plane ``slot.j`` is the widest ``p_g x`` (the group's
  fields on it, each aligned to its element) over the groups on it, aligned up to 256 and to
  every ``p_g x element``; the parent is the planes' sum aligned to every ``p_g``. An MLA page
  must be exactly ``plane / p_m`` (its kernel strides by the payload), and every group's
  ``(parent / p_g - raw_g) / raw_g`` within the limit (0.25; none once a draft joins).
- **bind**: planes in the sorted order of their ids *as strings* (``slot.0``, ``slot.1``,
  ``slot.10``, ...), each ``(n + 1) x plane`` bytes; page ``x`` of group ``g`` at
  ``plane_start + plane - plane / p_g + x * plane / p_g``: the null page 0 is the last slot
  of the null parent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import PositiveInt

from ..._frozen import Frozen, trusted
from ...cache import LayerCacheSpec
from ...constants import DEFAULT_MAX_PADDING_FRACTION, PARENT_ALIGNMENT_BYTES, PARENT_PAGE_TOKENS
from ...errors import Refusal
from ...layouts.groups import Group
from ...sizes import RankSizes

REPOSITORY = "lightseekorg/tokenspeed"
REVISION = "a6ee91b3e612d111b0ad6361607f221419d139f7"
"""The tokenspeed commit whose K3 recipe this engine follows: PR #1152's head."""
REVISION_NAME = "tokenspeed #1152 head a6ee91b3"

STATE_GROUPS = 3
"""Kimi-K3's recipe splits the KDA layers into exactly this many state groups."""
PLANE_ALIGNMENT = PARENT_ALIGNMENT_BYTES
DEFAULT_MAX_PADDING = DEFAULT_MAX_PADDING_FRACTION
MAX_KERNEL_PAGE_ID = (1 << 31) - 1
"""A group's pages are int32 kernel page ids: ``n * p_g`` must stay at or under this."""


class Arena(Frozen):
    """One parent of the recipe's arena: each group's pages per parent, each plane's bytes
    (by plane index), and the parent."""

    packing: dict[str, PositiveInt]
    plane_bytes: tuple[PositiveInt, ...]
    parent_bytes: PositiveInt
    raw_bytes: dict[str, PositiveInt]
    """``raw_g``: every layer of group ``g``'s payload on one page."""

    def page_stride(self, group: Group, plane: int) -> int:
        """Bytes between consecutive pages of ``group`` on plane ``plane``: ``plane / p_g``."""
        return self.plane_bytes[plane] // self.packing[group.name]

    def padding(self, group: str) -> float:
        """``(parent / p_g - raw_g) / raw_g`` of group ``group``: the float tokenspeed prints
        and compares with its limit."""
        raw = self.raw_bytes[group]
        return (self.parent_bytes // self.packing[group] - raw) / raw


def plane_order(num_planes: int) -> tuple[int, ...]:
    """Plane indexes in the order tokenspeed binds them: sorted ids ``slot.j`` as strings."""
    return tuple(sorted(range(num_planes), key=lambda j: f"slot.{j}"))


def plane_starts(plane_bytes: Sequence[int], num_parents: int) -> tuple[int, ...]:
    """Arena offset of every plane (by index) in ``bind(num_parents)``: each plane spans
    ``(num_parents + 1) x`` its bytes, in :func:`plane_order`."""
    starts = [0] * len(plane_bytes)
    offset = 0
    for plane in plane_order(len(plane_bytes)):
        starts[plane] = offset
        offset += (num_parents + 1) * plane_bytes[plane]
    return tuple(starts)


def field_offsets(sizes: RankSizes, layer: int) -> tuple[tuple[str, int, int], ...]:
    """``(part, offset, bytes)`` of each part of one page of ``layer``: tokenspeed lays a
    layer's fields back to back, each aligned to its element size."""
    return _spec_fields(sizes.spec_of(layer), sizes.attn_tp)


def _spec_fields(spec: LayerCacheSpec, tp: int) -> tuple[tuple[str, int, int], ...]:
    """:func:`field_offsets` of one spec."""
    rows = PARENT_PAGE_TOKENS if spec.paging == "token" else 1
    out: list[tuple[str, int, int]] = []
    offset = 0
    for part in spec.parts:
        element = part.elem_bytes
        offset = -(-offset // element) * element
        size = rows * part.local_bytes(tp)
        out.append((part.name, offset, size))
        offset += size
    return tuple(out)


def payload_bytes(sizes: RankSizes, layer: int) -> int:
    """A layer's payload on one page: its fields' bytes, unaligned (``raw``)."""
    return sum(size for _, _, size in field_offsets(sizes, layer))


def rule_1152(mla_page_bytes: int, state_bytes: int) -> tuple[int, int]:
    """#1152's packing: ``(max(1, ceil(S / page)), max(1, p_m * page // S))``."""
    mla_pages = max(1, -(-state_bytes // mla_page_bytes))
    return mla_pages, max(1, mla_pages * mla_page_bytes // state_bytes)


def _lcm(values: Sequence[int]) -> int:
    result = 1
    for value in values:
        result = result * value // math.gcd(result, value)
    return result


def pack(
    groups: tuple[Group, ...], sizes: RankSizes, packing: dict[str, int], max_padding: float | None
) -> Arena:
    """Lay out one parent under ``packing`` (see the module); refuses (``padding_limit``) a
    group padded past ``max_padding`` and (``exact_stride``) an MLA page that is not
    ``plane / p_m``, each with tokenspeed's own words."""
    held = [g for g in groups if g.layers]
    # the fields of each distinct spec, once (the layers share a few)
    table = [_spec_fields(spec, sizes.attn_tp) for spec in sizes.specs]
    spans = [table[i][-1][1] + table[i][-1][2] for i in range(len(table))]
    payloads = [sum(size for _, _, size in fields) for fields in table]
    elements = [[part.elem_bytes for part in spec.parts] for spec in sizes.specs]
    index_of = sizes.layer_specs.__getitem__  # a layer's spec, for the loops below

    # a plane aligns to every ``p_g x element`` of the fields on it: per (p_g, spec), once
    aligned = {
        (count, index): _lcm([*(count * e for e in elements[index]), count])
        for count in set(packing.values())
        for index in range(len(table))
    }

    num_planes = max(g.plane_of(len(g.layers) - 1) + 1 for g in held)
    required = [0] * num_planes
    needs: list[set[int]] = [{PLANE_ALIGNMENT} for _ in range(num_planes)]
    for group in held:  # a group's layer j is on plane first_plane + j (Group.plane_of)
        count = packing[group.name]
        for plane, index in enumerate(map(index_of, group.layers), group.first_plane):
            required[plane] = max(required[plane], count * spans[index])
            needs[plane].add(aligned[count, index])
    alignment = [_lcm(sorted(need)) for need in needs]  # a plane's few distinct needs, once
    plane_bytes = tuple(
        -(-need // align) * align for need, align in zip(required, alignment, strict=True)
    )
    for group in held:
        if group.kind != "attention":
            continue
        for plane, layer in enumerate(group.layers, group.first_plane):
            stride = plane_bytes[plane] // packing[group.name]
            page = payloads[index_of(layer)]
            if stride != page:
                raise Refusal(
                    "layout_unsupported",
                    f"layer {layer}: its MLA page of {page:,} B needs page stride {page:,}, but "
                    f"plane slot.{plane} of {plane_bytes[plane]:,} B gives {stride:,} "
                    f"(tokenspeed: cache field 'layer.{layer}.latent_kv' needs page stride "
                    f"{page} but plane 'slot.{plane}' gives {stride})",
                    facts={"layer": layer, "plane": plane, "page_bytes": page, "stride": stride},
                    hint="the KDA state is wider than the MLA pages of its plane: another "
                    "attention TP or cache dtype changes the ratio",
                )
    parent_align = _lcm([PLANE_ALIGNMENT, *packing.values()])
    parent = -(-sum(plane_bytes) // parent_align) * parent_align
    raws = {
        group.name: sum(map(payloads.__getitem__, map(index_of, group.layers))) for group in held
    }
    arena = trusted(
        Arena, packing=dict(packing), plane_bytes=plane_bytes, parent_bytes=parent, raw_bytes=raws
    )
    for group in sorted(held, key=lambda g: g.name):
        padding = arena.padding(group.name)
        if max_padding is not None and padding > max_padding:
            raise Refusal(
                "padding_limit",
                f"group {group.name}: padding {padding:.6f} exceeds max_padding "
                f"{max_padding:g} under #1152's packing "
                f"{packing[group.name]} pages per parent (tokenspeed: cache group "
                f"{group.name!r}: padding fraction {padding:.6f} exceeds limit "
                f"{max_padding:.6f})",
                facts={
                    "group": group.name,
                    "padding": round(padding, 6),
                    "max_padding": max_padding,
                    "pages_per_parent": packing[group.name],
                },
                hint="tokenspeed's recipe pins #1152's packing: another attention TP or cache "
                "dtype, or engine=vllm, plans",
            )
    return arena


def recipe_groups(model_attention: tuple[int, ...], kda: tuple[int, ...]) -> tuple[Group, ...]:
    """``full_attention`` (target MLA then draft, in the order given) and the KDA layers,
    sorted, in :data:`STATE_GROUPS` equal contiguous runs (the caller checked they divide)."""
    groups = [trusted(Group, name="full_attention", kind="attention", layers=model_attention)]
    ordered = tuple(sorted(kda))
    if ordered:
        per_group = len(ordered) // STATE_GROUPS
        groups.extend(
            trusted(
                Group,
                name=f"linear_attention_{i}",
                kind="kda",
                layers=ordered[i * per_group : (i + 1) * per_group],
            )
            for i in range(STATE_GROUPS)
        )
    return tuple(groups)
