"""Segments and the split algebra that yields them: what one producer rank copies to a consumer.

A :class:`Segment` is a strided copy, ``num_copies`` runs of ``length_bytes``, the ``i``-th from
``src_offset_bytes + i * src_stride_bytes`` of a producer's region to ``dst_offset_bytes +
i * dst_stride_bytes`` of the consumer's region of the same field and module layer, applied to
each of its module ``layers``. One segment stands for a whole run of equal copies (the rows of
a time-major conv state, the MLA rows of one DCP rank) in every layer of one cache spec that
one producer sends one consumer, so a plan's size grows neither with the prompt nor with the
layers a stage holds.

The segments come from placements, not index arithmetic: a field is a row-major array with a
global shape and one TP placement (:class:`~k3layout.Shard` of one dimension, as DTensor's
``Shard(dim)``, or :class:`~k3layout.Replicate`); a consumer's share is copied out of its
producer's share by :meth:`FieldLayout.segment`. MLA rows on a DCP decode follow
:class:`~k3layout.Interleave` (:func:`token_segments`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise
from typing import Annotated, Any, Literal, TypeAlias, TypeVar, cast

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from .._args import expect, expect_args, expect_int, expect_items
from .._frozen import Frozen, trusted_record
from .._validation import describe
from ..cache import CachePart, Paging
from ..constants import (
    INT64_MAX,
    MAX_LISTED_ITEMS,
    MAX_MODULE_LAYERS,
    MAX_PROMPT_TOKENS,
    MAX_RANKS,
)
from ..errors import Refusal
from ..limits import check_range
from ..placements import Interleave, Replicate

RegionField: TypeAlias = Annotated[str, Field(min_length=1, max_length=64)]
"""What a region holds: a part of a layer's cache spec (``latent``, ``index``, ``k``, ``v``
rows of an attention layer; ``conv``, ``recurrent`` and ReplaySSM's ``replay_k`` /
``replay_u`` / ``replay_g`` of a state layer's slot), or the slot's one ``cursor`` (no layer)."""

RegionKind: TypeAlias = Literal["page", "slot"]
"""``page``: an attention layer's rows of the request's tokens; ``slot``: its state slot."""

RegionKey: TypeAlias = tuple[RegionField, int | None]
"""``(field, module layer)``: how a segment names each region it reads and writes (layer
``None`` for the slot's cursor)."""

SegmentLayers: TypeAlias = Annotated[
    tuple[NonNegativeInt, ...], Field(max_length=MAX_MODULE_LAYERS)
]
"""The module layers a segment copies, in increasing order (empty for the slot's cursor)."""


def region_kind(paging: Paging) -> RegionKind:
    """``page`` for a token-paged part, ``slot`` for a part of a state slot."""
    return "page" if paging == "token" else "slot"


class Segment(Frozen):
    """``num_copies`` copies of ``length_bytes`` from a producer region to a consumer region,
    for each module layer in ``layers``.

    The copies are the same in every listed layer's region of ``field`` (the layers of one
    cache spec that one producer stage sends one consumer: PP8 x TP1 -> TP8 x DCP8 of K3 sends
    each consumer the conv state of stage 0's KDA layers 0, 1, 2, 4, 5, 6, 8, 9, 10 as one
    segment); ``layers`` is empty for the slot's cursor, which belongs to no layer.

    Copy ``i`` reads ``[src_offset_bytes + i*src_stride_bytes, .. + length_bytes)`` and writes
    ``[dst_offset_bytes + i*dst_stride_bytes, .. + length_bytes)``. The conv state of TP8
    decode rank ``d`` taken from a TP1 K3 producer in the ``DS`` layout (channel-major, no spec
    tokens, so 3 rows) is one segment of three copies, one per channel group q|k|v::

        copy  src offset            dst offset   length
        0     d*9,216               0            9,216    12 heads x 128 x 3 rows x 2 B
        1     73,728 + d*9,216      9,216        9,216    src stride: a TP1 part,
        2     147,456 + d*9,216     18,432       9,216    96 x 128 x 3 x 2 = 73,728

    In vLLM's default ``SD`` layout (time-major) the same share is ``3 x 3`` copies of
    ``12 x 128 x 2 = 3,072`` B, one per row and channel group, a TP1 group (24,576 B) apart.

    A single copy is stored with strides 0; a run of copies that touch end to end on both sides
    is stored as one copy (so a replicated region is one copy, written whole).
    """

    field: RegionField
    layers: SegmentLayers
    kind: RegionKind
    src_offset_bytes: NonNegativeInt
    dst_offset_bytes: NonNegativeInt
    length_bytes: PositiveInt
    num_copies: PositiveInt = 1
    src_stride_bytes: NonNegativeInt = 0
    dst_stride_bytes: NonNegativeInt = 0

    @model_validator(mode="after")
    def _layers_are_increasing(self) -> Segment:
        layers = self.layers
        if len(layers) > 1 and any(a >= b for a, b in pairwise(layers)):
            raise ValueError(f"layers {layers} must be increasing, each named once")
        return self

    @model_validator(mode="after")
    def _copies_do_not_overlap(self) -> Segment:
        if self.num_copies > 1 and min(self.src_stride_bytes, self.dst_stride_bytes) < (
            self.length_bytes
        ):
            raise ValueError(
                f"strides (src={self.src_stride_bytes}, dst={self.dst_stride_bytes}) must be at "
                f"least length_bytes={self.length_bytes} when num_copies={self.num_copies}"
            )
        return self

    @classmethod
    def strided(
        cls,
        field: RegionField,
        layers: tuple[int, ...],
        kind: RegionKind,
        *,
        src_offset_bytes: int,
        dst_offset_bytes: int,
        length_bytes: int,
        num_copies: int = 1,
        src_stride_bytes: int = 0,
        dst_stride_bytes: int = 0,
    ) -> Segment:
        """The segment in its canonical form: copies that touch end to end on both sides
        become one copy; a single copy has strides 0."""
        return cls(
            **_canonical(
                field,
                layers,
                kind,
                (src_offset_bytes, dst_offset_bytes),
                (length_bytes, num_copies, src_stride_bytes, dst_stride_bytes),
            )
        )

    @property
    def regions(self) -> tuple[RegionKey, ...]:
        """The regions this segment reads and writes, ``(field, layer)`` on both ranks: one
        per layer, or ``(field, None)`` alone for the slot's cursor."""
        if not self.layers:
            return ((self.field, None),)
        return tuple((self.field, layer) for layer in self.layers)

    @property
    def num_regions(self) -> int:
        """Regions the copies are applied to: one per layer (one for the cursor)."""
        return len(self.layers) or 1

    @property
    def region_bytes(self) -> int:
        """Bytes the segment moves into each region: ``num_copies * length_bytes``."""
        return self.num_copies * self.length_bytes

    @property
    def total_bytes(self) -> int:
        """Bytes the segment moves: ``num_regions * num_copies * length_bytes``."""
        return self.num_regions * self.num_copies * self.length_bytes

    @property
    def src_end_bytes(self) -> int:
        """One past the last source byte read."""
        last = self.src_offset_bytes + (self.num_copies - 1) * self.src_stride_bytes
        return last + self.length_bytes

    @property
    def dst_end_bytes(self) -> int:
        """One past the last destination byte written."""
        last = self.dst_offset_bytes + (self.num_copies - 1) * self.dst_stride_bytes
        return last + self.length_bytes

    def copies(self) -> tuple[tuple[int, int, int], ...]:
        """Every copy into one region as ``(src_offset_bytes, dst_offset_bytes,
        length_bytes)``, offsets inside the region (the same in each of :attr:`regions`).

        Refuses (``size_limit``) more copies than
        :data:`~k3layout.constants.MAX_LISTED_ITEMS` (a DCP 8 transfer of ``2**32`` tokens
        has ``2**29`` per segment): listed one by one they would exhaust memory; walk them by
        their strides instead (copy ``i`` reads ``src_offset_bytes + i * src_stride_bytes``)."""
        if self.num_copies > MAX_LISTED_ITEMS:
            raise Refusal(
                "size_limit",
                f"num_copies={self.num_copies:,} is above the bound {MAX_LISTED_ITEMS:,} of "
                f"copies listed one by one (segment {self.field} of layers {self.layers[:4]})",
                facts={"field": "num_copies", "bound": MAX_LISTED_ITEMS},
                hint="walk the copies by their strides: copy i reads src_offset_bytes + i x "
                "src_stride_bytes and writes dst_offset_bytes + i x dst_stride_bytes",
            )
        return tuple(
            (
                self.src_offset_bytes + i * self.src_stride_bytes,
                self.dst_offset_bytes + i * self.dst_stride_bytes,
                self.length_bytes,
            )
            for i in range(self.num_copies)
        )


def _canonical(
    field: RegionField,
    layers: tuple[int, ...],
    kind: RegionKind,
    offsets: tuple[int, int],
    copies: tuple[int, int, int, int],
) -> dict[str, Any]:
    """A segment's fields in canonical form (see :meth:`Segment.strided`), in declaration
    order: ``offsets`` are (src, dst), ``copies`` (length, number, src stride, dst stride)."""
    length_bytes, num_copies, src_stride_bytes, dst_stride_bytes = copies
    if num_copies > 1 and src_stride_bytes == dst_stride_bytes == length_bytes:
        length_bytes, num_copies = length_bytes * num_copies, 1
    if num_copies == 1:
        src_stride_bytes = dst_stride_bytes = 0
    return {
        "field": field,
        "layers": layers,
        "kind": kind,
        "src_offset_bytes": offsets[0],
        "dst_offset_bytes": offsets[1],
        "length_bytes": length_bytes,
        "num_copies": num_copies,
        "src_stride_bytes": src_stride_bytes,
        "dst_stride_bytes": dst_stride_bytes,
    }


def segment_fields(
    field: RegionField,
    layers: tuple[int, ...],
    kind: RegionKind,
    *,
    src_offset_bytes: int,
    dst_offset_bytes: int,
    length_bytes: int,
    num_copies: int = 1,
    src_stride_bytes: int = 0,
    dst_stride_bytes: int = 0,
) -> dict[str, Any]:
    """:meth:`Segment.strided`'s fields, canonical, in declaration order, unvalidated: the
    transfer planner's template for the segments it makes (:func:`planned_segment`)."""
    return _canonical(
        field,
        layers,
        kind,
        (src_offset_bytes, dst_offset_bytes),
        (length_bytes, num_copies, src_stride_bytes, dst_stride_bytes),
    )


def planned_segment(
    field: RegionField,
    layers: tuple[int, ...],
    kind: RegionKind,
    **copies: int,
) -> Segment:
    """:meth:`Segment.strided`, made without validation (:func:`~k3layout._frozen.trusted`):
    for the transfer planner only, whose every number comes from validated parts and
    placements by the split algebra (strides at least the length, positive lengths)."""
    return trusted_record(Segment, segment_fields(field, layers, kind, **copies))


MadeT = TypeVar("MadeT")
"""What a segment maker makes: a :class:`Segment`, or its fields (:func:`segment_fields`)."""


def part_segment(
    part: CachePart,
    layer: int | None,
    src: tuple[int, int],
    dst: tuple[int, int],
    *,
    gather: bool = False,
) -> Segment:
    """The copy that fills rank ``dst = (tp, rank)``'s share of a slot ``part`` of module
    ``layer`` (``None``: the cursor, of no layer) from rank ``src``'s: a segment of that one
    layer (:func:`~k3layout.plan_transfer` names every layer of the spec the same copy fills).

    A replicated part is copied whole. A sharded one: the consumer's slab along the placed
    axis must lie inside the producer's (its head group), else ``head_group_mismatch``; the
    axes before it become the copies, those after it the contiguous length::

        outer = prod(shape[:dim]),  inner = prod(shape[dim+1:]) * elem
        src_offset = (dst_off - src_off) * inner,  length = dst_size * inner
        strides: src_size * inner (producer), dst_size * inner (consumer)

    The SD conv state of K3, ``(K-1+s, 3, 96, 128)`` with ``Shard(2)``, gives ``3*(K-1+s)``
    copies, one per row and channel group (q, k, v).

    With ``gather`` the producer's slab may instead lie inside the consumer's (prefill TP a
    multiple of decode TP, as SGLang pairs them): it is copied whole to its place,
    ``dst_offset = (src_off - dst_off) * inner``.

    Refuses (``invalid_argument``) arguments of the wrong type, a ``layer`` that is not a
    module layer id and a ``src`` or ``dst`` that is not a ``(tp, rank)`` pair of ints with
    ``1 <= tp`` and ``0 <= rank < tp``; (``size_limit``) a ``tp`` beyond ``MAX_RANKS``.
    """
    expect("part", part, CachePart)
    if layer is not None:
        check_range("layer", layer, 0, MAX_MODULE_LAYERS - 1)
    _check_ranks("src", src)
    _check_ranks("dst", dst)
    expect("gather", gather, bool)
    return derive_part_segment(part, layer, src, dst, Segment.strided, gather=gather)


def _check_ranks(name: str, value: object) -> None:
    """Refuse ``value`` unless it is a ``(tp, rank)`` pair: a TP size and a rank of it."""
    expect_items(name, value, int)
    pair = cast(tuple[int, ...], value)
    if len(pair) != 2:
        raise Refusal(
            "invalid_argument",
            f"{name} has {len(pair)} items: it is a (tp, rank) pair",
            facts={"field": name},
            hint=f"pass {name} as (tp, rank)",
        )
    tp, rank = pair
    check_range(f"{name}[0]", tp, 1, MAX_RANKS)
    if not 0 <= rank < tp:
        raise Refusal(
            "invalid_argument",
            f"{name}[1]={describe(rank)} is not a rank of tp={tp}",
            facts={"field": f"{name}[1]", "tp": tp},
            hint=f"use 0 <= {name}[1] < {tp}",
        )


def derive_part_segment(
    part: CachePart,
    layer: int | None,
    src: tuple[int, int],
    dst: tuple[int, int],
    make: Callable[..., MadeT],
    *,
    gather: bool = False,
) -> MadeT:
    """:func:`part_segment`, made by ``make`` (:meth:`Segment.strided`, validated, or the
    planner's :func:`planned_segment` / :func:`segment_fields`)."""
    layers = () if layer is None else (layer,)
    placement = part.tp
    if isinstance(placement, Replicate):
        part.local_size_and_offset(*src)  # refuses a rank outside its TP group
        return make(
            part.name,
            layers,
            "slot",
            src_offset_bytes=0,
            dst_offset_bytes=0,
            length_bytes=part.local_bytes(dst[0]),
        )
    dim, shape = placement.dim, part.shape
    src_size, src_off = placement.local_size_and_offset(shape[dim], *src)
    dst_size, dst_off = placement.local_size_and_offset(shape[dim], *dst)
    inside = src_off <= dst_off <= dst_off + dst_size <= src_off + src_size
    gathered = gather and dst_off <= src_off <= src_off + src_size <= dst_off + dst_size
    if not (inside or gathered):
        raise Refusal(
            "head_group_mismatch",
            f"{part.name} layer {layer}: consumer rank {dst[1]} of tp={dst[0]} holds "
            f"[{dst_off}, {dst_off + dst_size}) of axis {dim}, outside producer rank "
            f"{src[1]} of tp={src[0]} holding [{src_off}, {src_off + src_size})",
            facts={
                "field": part.name,
                "producer_tp_rank": src[1],
                "prefill_tp": src[0],
                "consumer_tp_rank": dst[1],
                "decode_tp": dst[0],
            },
            hint="pair each consumer with the producer whose share contains its own",
        )
    inner = math.prod(shape[dim + 1 :]) * part.elem_bytes
    low = max(src_off, dst_off)  # the shared slab: the consumer's, or the producer's gathered
    return make(
        part.name,
        layers,
        "slot",
        src_offset_bytes=(low - src_off) * inner,
        dst_offset_bytes=(low - dst_off) * inner,
        length_bytes=min(src_size, dst_size) * inner,
        num_copies=math.prod(shape[:dim]),
        src_stride_bytes=src_size * inner,
        dst_stride_bytes=dst_size * inner,
    )


def token_segments(
    layer: int,
    field: RegionField,
    row_bytes: int,
    prompt_tokens: int,
    placement: Interleave,
    *,
    rank: int,
) -> tuple[Segment, ...]:
    """The MLA rows of tokens ``[0, prompt_tokens)`` that DCP rank ``rank`` owns, copied from a
    producer holding every token at row ``t`` to the consumer's local rows of module ``layer``
    (segments of that one layer).

    The rank's tokens are runs of ``interleave`` consecutive tokens, one per span of
    ``num_ranks * interleave``: all full runs are one strided segment, a partial last run a
    second. DCP 4, interleave 2, 13 tokens, rank 1 (tokens 2, 3, 10, 11)::

        copies  src rows   dst rows   (src stride 8 rows, dst stride 2 rows)
        0       2-3        0-1
        1       10-11      2-3

    Without DCP (one rank) the runs touch end to end and become one whole copy.

    Refuses (``invalid_argument``) arguments of the wrong type, a negative ``layer`` or
    ``prompt_tokens``, a ``row_bytes`` below 1 and a ``rank`` outside the placement;
    (``size_limit``) values beyond their bounds (``MAX_MODULE_LAYERS``, ``MAX_PROMPT_TOKENS``,
    int64 bytes).
    """
    expect_args(("field", field, str), ("placement", placement, Interleave))
    check_range("layer", layer, 0, MAX_MODULE_LAYERS - 1)
    check_range("row_bytes", row_bytes, 1, INT64_MAX)
    check_range("prompt_tokens", prompt_tokens, 0, MAX_PROMPT_TOKENS)
    if not 0 <= expect_int("rank", rank) < placement.num_ranks:
        raise Refusal(
            "invalid_argument",
            f"rank={describe(rank)} is not a rank of the placement's {placement.num_ranks}",
            facts={"field": "rank", "num_ranks": placement.num_ranks},
            hint=f"use 0 <= rank < {placement.num_ranks}",
        )
    if prompt_tokens * row_bytes > INT64_MAX:
        raise Refusal(
            "size_limit",
            f"row_bytes={row_bytes:,} x prompt_tokens={prompt_tokens:,} is beyond int64",
            facts={"field": "row_bytes", "bound": INT64_MAX},
            hint="byte counts must fit int64: pass fewer tokens or shorter rows",
        )
    return derive_token_segments(
        layer, field, row_bytes, prompt_tokens, placement, rank=rank, make=Segment.strided
    )


def derive_token_segments(
    layer: int,
    field: RegionField,
    row_bytes: int,
    prompt_tokens: int,
    placement: Interleave,
    *,
    rank: int,
    make: Callable[..., MadeT],
) -> tuple[MadeT, ...]:
    """:func:`token_segments`, made by ``make``."""
    layers = (layer,)
    count = placement.local_count(prompt_tokens, rank)
    if count and placement.num_ranks == 1:
        # One rank (no DCP): the runs touch end to end, one whole copy.
        return (
            make(
                field,
                layers,
                "page",
                src_offset_bytes=placement.global_token(rank, 0) * row_bytes,
                dst_offset_bytes=0,
                length_bytes=count * row_bytes,
            ),
        )
    run = placement.interleave
    full_runs, tail = divmod(count, run)
    segments: list[MadeT] = []
    if full_runs:
        segments.append(
            make(
                field,
                layers,
                "page",
                src_offset_bytes=placement.global_token(rank, 0) * row_bytes,
                dst_offset_bytes=0,
                length_bytes=run * row_bytes,
                num_copies=full_runs,
                src_stride_bytes=placement.num_ranks * run * row_bytes,
                dst_stride_bytes=run * row_bytes,
            )
        )
    if tail:
        local = full_runs * run
        segments.append(
            make(
                field,
                layers,
                "page",
                src_offset_bytes=placement.global_token(rank, local) * row_bytes,
                dst_offset_bytes=local * row_bytes,
                length_bytes=tail * row_bytes,
            )
        )
    return tuple(segments)
