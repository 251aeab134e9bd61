"""Byte copies planned as numbers and run as few views: pages of one backing, regions in chunks.

Every ``copy_`` on the CPU forks and joins torch's thread pool and waits for its slowest
thread: page by page, that costs more than the pages on a busy host. So pages of one backing
are gathered with one ``index_select`` (:func:`stacked_planes`, :func:`page_rows`), and
transfer copies are folded into one view per group of layers (:func:`repeated`).

A region (a transfer plan's buffer of one part of one layer) is rarely one run of memory: an
attention part's rows sit in one block after another, wherever the block table put them.
:class:`Chunks` says where each chunk of a region starts, relative to the region's origin; the
regions of one part of many layers share their chunks and differ only by origin. A transfer
segment's strided copies are cut where a chunk ends (:func:`cuts`), once per shared chunking,
as byte offsets with no tensor made; :func:`repeated` then places those cuts at every layer's
origin, folding layers at a fixed step on both sides (one plane span apart on one backing, one
state range apart in a tier) into one 3-D view, so a transfer pays one copy, one fork and join
of the thread pool, per group of layers rather than per layer and block.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from ..errors import Refusal
from ..transfer import Segment

ROW_BYTES = 16_384
"""The row :func:`page_rows` cuts a backing into: under torch's grain (32,768 elements), so
that ``index_select`` takes its fast path, a ``memcpy`` per row in one parallel pass (ahead of
a plain ``copy_`` on these machines); long enough that the index stays small."""

MIN_ROW_BYTES = 4_096
"""The shortest row worth it: shorter rows make the index longer than the copy is worth."""

WIDE_BYTES = 16
"""The element :meth:`PageRows.scatter` copies rows in (``complex128``: moved, never computed
on, so every bit pattern survives): ``index_copy_`` goes element by element."""


def stacked_planes(planes: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``[planes, num_blocks, page]`` over ``uint8`` planes equally spaced in one storage,
    none overlapping (one backing); ``None`` otherwise, and on ``meta``, whose storages cannot
    be told apart by address (nothing is copied there anyway)."""
    first = planes[0]
    if first.device.type == "meta":
        return None
    num_blocks, page = first.shape
    step = planes[1].data_ptr() - first.data_ptr() if len(planes) > 1 else num_blocks * page
    storage = first.untyped_storage().data_ptr()
    for j, plane in enumerate(planes):
        if (
            plane.untyped_storage().data_ptr() != storage
            or plane.data_ptr() != first.data_ptr() + j * step
            or plane.stride() != (page, 1)
        ):
            return None
    if step < num_blocks * page:  # the planes would overlap
        return None
    return first.as_strided((len(planes), num_blocks, page), (step, page, 1))


@dataclass(frozen=True)
class PageRows:
    """Pages of one backing as rows: ``rows`` (``uint8 [rows, row]``, the row dividing both the
    page and the plane step) and ``index``, the rows of every unit's page of every plane,
    unit by unit, plane by plane (the packing order)."""

    rows: torch.Tensor
    index: torch.Tensor

    def gather(self, out: torch.Tensor) -> None:
        """Pack the pages into ``out``: ``index_select``'s fast path, a ``memcpy`` per row in
        one parallel pass."""
        torch.index_select(self.rows, 0, self.index, out=out.view(-1, self.rows.shape[1]))

    def scatter(self, tier: torch.Tensor) -> None:
        """Restore the pages from ``tier`` in one ``index_copy_``, one parallel pass: on
        16-byte elements where the rows allow (as fast as a plain copy), else on bytes."""
        rows, packed = self.rows, tier.view(-1, self.rows.shape[1])
        if rows.shape[1] % WIDE_BYTES == 0 and rows.storage_offset() % WIDE_BYTES == 0:
            rows, packed = rows.view(torch.complex128), packed.view(torch.complex128)
        rows.index_copy_(0, self.index, packed)


def page_rows(stacked: torch.Tensor, blocks: Sequence[int]) -> PageRows | None:
    """The rows of ``stacked`` planes (``[planes, num_blocks, page]``) and of block
    ``blocks[u]``'s pages; ``None`` when no row of :data:`MIN_ROW_BYTES` or more divides the
    page and the plane step."""
    planes, num_blocks, page = stacked.shape
    step = stacked.stride(0)
    row = _row_bytes(math.gcd(page, step))
    if row == 0:
        return None
    extent = (planes - 1) * step + num_blocks * page
    rows = stacked.as_strided((extent // row, row), (row, 1), stacked.storage_offset())
    starts = torch.tensor([[(j * step + b * page) // row for j in range(planes)] for b in blocks])
    index = starts.unsqueeze(-1) + torch.arange(page // row)
    return PageRows(rows, index.reshape(-1).to(stacked.device))


def _row_bytes(divides: int) -> int:
    """The longest row of at most :data:`ROW_BYTES` dividing ``divides`` (0: none of
    :data:`MIN_ROW_BYTES` or more)."""
    for parts in range(-(-divides // ROW_BYTES), divides // MIN_ROW_BYTES + 1):
        if divides % parts == 0:
            return divides // parts
    return 0


@dataclass(frozen=True, slots=True)
class Chunks:
    """A region of ``size_bytes``, kept in chunks of ``chunk_bytes``: region bytes ``[r x
    chunk_bytes, (r + 1) x chunk_bytes)`` are contiguous from byte ``offsets[r]`` past the
    region's origin (a state part is one chunk; an attention part one per block). One
    chunking serves the same part of every layer of a group, on every rank of a plan."""

    offsets: tuple[int, ...]
    chunk_bytes: int
    size_bytes: int

    def at(self, offset: int) -> int:
        """Region byte ``offset``, in bytes past the region's origin."""
        return self.offsets[offset // self.chunk_bytes] + offset % self.chunk_bytes

    def room(self, offset: int) -> int:
        """Bytes from region byte ``offset`` to the end of its chunk."""
        return self.chunk_bytes - offset % self.chunk_bytes


@dataclass(frozen=True, slots=True)
class Cut:
    """``shape`` bytes copied from byte ``src`` past a source region's origin to byte ``dst``
    past a target region's origin, with ``src_strides`` and ``dst_strides`` (the last axis
    contiguous): a copy planned once, placed at every layer's regions (:func:`repeated`)."""

    dst: int
    dst_strides: tuple[int, ...]
    src: int
    src_strides: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Run:
    """``shape`` bytes copied from ``source`` storage byte ``src`` to ``target`` storage byte
    ``dst``, with ``src_strides`` and ``dst_strides`` (the last axis contiguous)."""

    target: torch.Tensor
    dst: int
    dst_strides: tuple[int, ...]
    source: torch.Tensor
    src: int
    src_strides: tuple[int, ...]
    shape: tuple[int, ...]

    def views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(target, source)`` as strided views of their storages."""
        return (
            self.target.as_strided(self.shape, self.dst_strides, self.dst),
            self.source.as_strided(self.shape, self.src_strides, self.src),
        )


def cuts(segment: Segment, source: Chunks, target: Chunks) -> Iterator[Cut]:
    """A segment's copies of one region, cut inside one chunk on both sides: copies ``i, i +
    1, ...`` stay one cut while both chunks last; a copy across a chunk's end is cut there.
    Refuses a segment reading or writing past its region."""
    for chunks, end in ((source, segment.src_end_bytes), (target, segment.dst_end_bytes)):
        if end > chunks.size_bytes:
            raise Refusal(
                "tensor_mismatch",
                f"a segment reads or writes up to byte {end} of a {chunks.size_bytes} B region",
                facts={"end_bytes": end, "region_bytes": chunks.size_bytes},
                hint="plan the transfer for the same prefix and deployments as the tiers",
            )
    length, count = segment.length_bytes, segment.num_copies
    src_stride, dst_stride = segment.src_stride_bytes, segment.dst_stride_bytes
    i = 0
    while i < count:
        src = segment.src_offset_bytes + i * src_stride
        dst = segment.dst_offset_bytes + i * dst_stride
        if length <= min(source.room(src), target.room(dst)):
            n = min(
                count - i,
                _fitting(source.room(src), length, src_stride),
                _fitting(target.room(dst), length, dst_stride),
            )
            yield Cut(target.at(dst), (dst_stride, 1), source.at(src), (src_stride, 1), (n, length))
            i += n
            continue
        yield from _split(source, target, src, dst, length)
        i += 1


def _split(source: Chunks, target: Chunks, src: int, dst: int, length: int) -> Iterator[Cut]:
    """One copy across a chunk's end, cut wherever either side's chunk ends."""
    done = 0
    while done < length:
        size = min(length - done, source.room(src + done), target.room(dst + done))
        yield Cut(target.at(dst + done), (size, 1), source.at(src + done), (size, 1), (1, size))
        done += size


def _fitting(room: int, length: int, stride: int) -> int:
    """Copies of ``length`` bytes, ``stride`` apart, that fit in ``room`` bytes (at least 1;
    a single copy has stride 0)."""
    return 1 + (room - length) // stride if stride else 1


def repeated(
    planned: Sequence[Cut],
    target: torch.Tensor,
    source: torch.Tensor,
    origins: Sequence[tuple[int, int]],
) -> Iterator[Run]:
    """Each cut placed at every ``(dst, src)`` pair of region origins (storage bytes of
    ``target`` and ``source``) in turn; origins that follow at one fixed positive step on both
    sides fold into one run with a leading axis of that step (the regions of different layers
    never share a byte, so the view copies disjoint bytes)."""
    for cut in planned:
        start = 0
        while start < len(origins):
            stop, step = _stretch(origins, start)
            dst, src = origins[start]
            folded = stop - start > 1
            yield Run(
                target,
                dst + cut.dst,
                (step[0], *cut.dst_strides) if folded else cut.dst_strides,
                source,
                src + cut.src,
                (step[1], *cut.src_strides) if folded else cut.src_strides,
                (stop - start, *cut.shape) if folded else cut.shape,
            )
            start = stop


def _stretch(origins: Sequence[tuple[int, int]], start: int) -> tuple[int, tuple[int, int]]:
    """The end of the stretch of ``origins`` from ``start`` at one fixed positive step on both
    sides, and that step (``(0, 0)`` for a stretch of one)."""
    if start + 1 == len(origins):
        return start + 1, (0, 0)
    (dst, src), (next_dst, next_src) = origins[start], origins[start + 1]
    step = (next_dst - dst, next_src - src)
    if min(step) <= 0:
        return start + 1, (0, 0)
    stop = start + 2
    while stop < len(origins) and origins[stop] == (
        dst + (stop - start) * step[0],
        src + (stop - start) * step[1],
    ):
        stop += 1
    return stop, step


def execute(planned: Iterable[Run]) -> None:
    """Run every copy, in order."""
    for run in planned:
        target, source = run.views()
        target.copy_(source)
