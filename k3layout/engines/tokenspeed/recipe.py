"""tokenspeed's Kimi-K3 cache recipe at the revisions k3layout follows (:mod:`.releases`):
#1152's head and ``main``. The mechanics are the same at both (tokenspeed's ``plan.py`` is
byte-identical); the packing rule is the revision's.

Groups -> pack -> bind, in tokenspeed's own terms (``recipes/kimi_k3.py`` and ``plan.py``):

- **groups**: ``full_attention`` holds the target's MLA layers in module order, then the
  draft's; the KDA layers, sorted, split into 3 equal contiguous runs ``linear_attention_0..2``.
  The layer at position ``j`` of its group uses plane ``slot.j``.
- **pack**: the revision's rule pins the packing (:meth:`TokenspeedRevision.packing`): #1152
  grows ``p_m = max(1, ceil(S / page))``, ``main`` fixes ``p_m = 12``; the state groups take
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
from collections.abc import Callable, Sequence

from pydantic import PositiveInt

from ..._frozen import Frozen, trusted
from ...cache import LayerCacheSpec
from ...constants import DEFAULT_MAX_PADDING_FRACTION, PARENT_ALIGNMENT_BYTES, PARENT_PAGE_TOKENS
from ...errors import Refusal
from ...layouts.groups import Group
from ...sizes import RankSizes
from .releases import PR1152, TokenspeedRevision

REVISION = PR1152.commit
"""PR #1152's head, the one revision this engine followed before ``main`` joined (kept for
compatibility: :data:`~.releases.REVISIONS` holds every followed revision)."""
REVISION_NAME = PR1152.title
"""How #1152's head is named (:attr:`TokenspeedRevision.title`)."""
FIELD_IDS = {"latent": "latent_kv", "conv": "conv_state", "recurrent": "recurrent_state"}
"""The planner's part names -> the field names tokenspeed's K3 recipe gives them
(``layer.<i>.<field>``)."""

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
    """#1152's packing: ``(max(1, ceil(S / page)), max(1, p_m * page // S))``
    (:meth:`TokenspeedRevision.packing` of :data:`~.releases.PR1152`)."""
    return PR1152.packing(mla_page_bytes, state_bytes)


def _lcm(values: Sequence[int]) -> int:
    result = 1
    for value in values:
        result = result * value // math.gcd(result, value)
    return result


def field_id(layer: int, part: str) -> str:
    """tokenspeed's id of ``part`` of module layer ``layer``: ``layer.<i>.<field>``."""
    return f"layer.{layer}.{FIELD_IDS.get(part, part)}"


def pack(
    groups: tuple[Group, ...],
    sizes: RankSizes,
    packing: dict[str, int],
    max_padding: float | None,
    revision: TokenspeedRevision = PR1152,
) -> Arena:
    """Lay out one parent under ``packing`` (see the module); refuses (``layout_unsupported``)
    an MLA page that is not ``plane / p_m`` and (``padding_limit``) a group padded past
    ``max_padding``, each with tokenspeed's own words; ``revision`` (whose rule gave
    ``packing``) only names the rule in them."""
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
    on_plane: list[list[tuple[Group, int]]] = [[] for _ in range(num_planes)]
    for group in held:  # a group's layer j is on plane first_plane + j (Group.plane_of)
        count = packing[group.name]
        for plane, layer in enumerate(group.layers, group.first_plane):
            index = index_of(layer)
            required[plane] = max(required[plane], count * spans[index])
            needs[plane].add(aligned[count, index])
            on_plane[plane].append((group, layer))
    alignment = [_lcm(sorted(need)) for need in needs]  # a plane's few distinct needs, once
    plane_bytes = tuple(
        -(-need // align) * align for need, align in zip(required, alignment, strict=True)
    )
    for plane in plane_order(num_planes):  # tokenspeed checks the planes in this order
        _check_exact_stride(
            plane,
            plane_bytes[plane],
            on_plane[plane],
            table=table,
            index_of=index_of,
            packing=packing,
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
                f"{max_padding:g} at {packing[group.name]} pages per parent (the packing "
                f"{revision.title} pins; tokenspeed: cache group "
                f"{group.name!r}: padding fraction {padding:.6f} exceeds limit "
                f"{max_padding:.6f})",
                facts={
                    "group": group.name,
                    "padding": round(padding, 6),
                    "max_padding": max_padding,
                    "pages_per_parent": packing[group.name],
                    "revision": revision.title,
                },
                hint=f"{revision.title}'s recipe pins its packing ({revision.packing_formula}): "
                "another attention TP or cache dtype, or engine=vllm, plans",
            )
    _check_planes(held, num_planes, revision)
    return arena


def _check_planes(held: list[Group], num_planes: int, revision: TokenspeedRevision) -> None:
    """Refuse (``layout_unsupported``) a layout of more planes than attention layers: the
    recipe's ``check_layout`` (``recipes/kimi_k3.py``, both revisions) wants one plane per MLA
    layer plus one per draft layer, the state riding inside them; a state group longer than
    that would get planes of its own."""
    attention = sum(len(g.layers) for g in held if g.kind == "attention")
    if num_planes == attention:
        return
    longest = max(held, key=lambda g: len(g.layers))
    raise Refusal(
        "layout_unsupported",
        f"group {longest.name}: {len(longest.layers)} layers need {num_planes} planes, and "
        f"the recipe lays out one per attention layer ({attention}: MLA and draft) "
        f"({revision.title}: Kimi-K3 LCM requires one target plane per MLA layer "
        f"plus the draft planes, got {num_planes})",
        facts={
            "engine": "tokenspeed",
            "revision": revision.title,
            "group": longest.name,
            "num_planes": num_planes,
            "expected_planes": attention,
        },
        hint=f"tokenspeed's recipe serves models whose {STATE_GROUPS} KDA state groups are no "
        "longer than their MLA layers plus draft layers; engine=vllm or engine=sglang plans "
        "this model",
    )


def _check_exact_stride(
    plane: int,
    plane_bytes: int,
    held: list[tuple[Group, int]],
    *,
    table: list[tuple[tuple[str, int, int], ...]],
    index_of: Callable[[int], int],
    packing: dict[str, int],
) -> None:
    """Refuse an MLA field on ``plane`` whose page stride ``plane / p_m`` is not its payload
    (tokenspeed's ``_check_exact_page_strides``: its kernel strides by the payload), naming
    the field that sizes the plane, the widest ``p_g x payload`` on it."""
    fields = [
        (packing[group.name] * size, field_id(layer, part), group, layer, part, size)
        for group, layer in held
        for part, _, size in table[index_of(layer)]
    ]
    for group, layer in sorted(held, key=lambda entry: entry[0].name):
        if group.kind != "attention":
            continue
        stride = plane_bytes // packing[group.name]
        for part, _, size in table[index_of(layer)]:
            if stride == size:
                continue
            widest = max(fields, key=lambda entry: (entry[0], entry[1]))
            name, sized_by = field_id(layer, part), widest[1]
            state_pages = sorted({packing[g.name] for g, _ in held if g.kind != "attention"})
            if widest[2].kind == "attention":
                why = (
                    f"the plane rounds {packing[group.name]} MLA pages up to the alignment "
                    f"{' and '.join(map(str, state_pages)) or 'its'} state pages per parent "
                    "ask of it"
                )
            else:
                why = (
                    f"the KDA state is wider than the {packing[group.name]} MLA pages of its plane"
                )
            raise Refusal(
                "layout_unsupported",
                f"layer {layer}: its MLA page of {size:,} B needs page stride {size:,}, but "
                f"plane slot.{plane} of {plane_bytes:,} B gives {stride:,}: {why} "
                f"(tokenspeed: cache field {name!r} needs page stride {size} but plane "
                f"'slot.{plane}' gives {stride}; its kernel indexes pages by an implicit "
                "payload-sized stride and would read the wrong rows. The plane is sized by "
                f"{sized_by!r}; move one of them to another plane or align their payloads)",
                facts={
                    "layer": layer,
                    "plane": plane,
                    "page_bytes": size,
                    "stride": stride,
                    "sized_by": sized_by,
                },
                hint="another attention TP or cache dtype changes the ratio of the KDA state to "
                "the MLA pages, or engine=vllm plans",
            )


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
