"""A layer's cache spec: its named parts, and how it is paged.

Every layer kind describes its cache as one :class:`LayerCacheSpec`: a tuple of
:class:`~k3layout.cache.part.CachePart` and a *paging*:

- ``token``: the layer keeps a row per token (MLA latent, GQA K and V). A page of ``T`` tokens
  holds the parts back to back, each ``[T, *part]`` (tokens outermost), as the engines cut
  one block of a layer: the MLA latent rows, then a DSA index's rows; K rows, then V rows.
- ``slot``: the layer keeps one state per request (KDA conv and recurrent state, ReplaySSM
  records, GLM-5.3-Flash's indexer tail ring). A slot holds the parts back to back from its
  start; an engine that gives the slot a bigger page leaves the padding at the end.

A token-paged part may be *pooled* (:mod:`k3layout.cache.pooled`): one row per
``tokens_per_row`` tokens (GLM-5.3-Flash's DSA indexer keys, one per 16 tokens), so a page of
``T`` tokens holds ``T / tokens_per_row`` of its rows.

Everything per rank (bytes, the byte range of a part inside a page or slot) is derived here,
once; layouts place pages, transfers and images copy these ranges.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, TypeAlias

from pydantic import Field, NonNegativeInt, model_validator

from .._args import expect_int, expect_non_negative
from .._frozen import Frozen, trusted
from ..errors import Refusal
from ..placements import Interleave
from .part import CachePart

Paging: TypeAlias = Literal["token", "slot"]
"""``token``: rows per token, paged by blocks of tokens; ``slot``: one state per request."""


class PartRange(Frozen):
    """Where one part sits inside a layer's page or slot on one rank."""

    part: str
    offset_bytes: NonNegativeInt
    size_bytes: NonNegativeInt

    @property
    def end_bytes(self) -> int:
        """One past the part's last byte."""
        return self.offset_bytes + self.size_bytes


class LayerCacheSpec(Frozen):
    """What one layer keeps: ``parts`` under one ``paging``.

    ``kind`` names the layer kind that built it (``mla``, ``kda``, ``gqa``, ``replay``);
    two layers share a KV-cache group only when their specs are equal, as vLLM groups by
    spec. ``dcp`` deals a token-paged layer's tokens to DCP ranks (``None`` for slots:
    a state is not split by DCP).
    """

    kind: Annotated[str, Field(min_length=1)]
    paging: Paging
    parts: Annotated[tuple[CachePart, ...], Field(min_length=1)]
    dcp: Interleave | None = None

    @model_validator(mode="after")
    def _names_unique(self) -> LayerCacheSpec:
        names = [part.name for part in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"parts: names {names} repeat")
        if self.paging == "slot" and self.dcp is not None:
            raise ValueError("dcp: a slot is not split by DCP")
        return self

    @property
    def part_names(self) -> tuple[str, ...]:
        """The parts' names, in page order."""
        return tuple(part.name for part in self.parts)

    def part(self, name: str) -> CachePart:
        """The part called ``name`` (refuses another name, listing the parts)."""
        for part in self.parts:
            if part.name == name:
                return part
        raise Refusal(
            "invalid_argument",
            f"{self.kind} layer: no part {name!r}",
            facts={"kind": self.kind, "part": name, "parts": self.part_names},
            hint=f"use one of {', '.join(self.part_names)}",
        )

    def bytes_per_token(self, tp: int) -> int:
        """Bytes of one token's rows on a rank (token paging; 576 for K3's fp8 latent). A
        pooled part (a row per ``tokens_per_row`` tokens) is not a per-token row: it is
        counted by :meth:`payload_bytes`, not here (as vLLM sizes its block by the latent)."""
        self._need("token", "bytes_per_token")
        return sum(part.local_bytes(tp) for part in self.parts if part.tokens_per_row == 1)

    def tokens_bytes(self, tp: int, tokens: int) -> int:
        """Bytes ``tokens`` tokens keep on a rank (token paging), a pooled part's last row
        counted whole: a request's payload, whatever the page."""
        self._need("token", "tokens_bytes")
        expect_int("tp", tp)
        expect_non_negative("tokens", tokens)
        return sum(-(-tokens // part.tokens_per_row) * part.local_bytes(tp) for part in self.parts)

    @property
    def pooled(self) -> bool:
        """Whether a part keeps one row per several tokens (:mod:`k3layout.cache.pooled`)."""
        return any(part.tokens_per_row > 1 for part in self.parts)

    @property
    def page_tokens_multiple(self) -> int:
        """The token counts a page of this spec can hold are multiples of this: the lcm of
        its parts' ``tokens_per_row`` (1 unless a part is pooled)."""
        return math.lcm(*(part.tokens_per_row for part in self.parts))

    def payload_bytes(self, tp: int, tokens: int = 1) -> int:
        """Payload of one page of ``tokens`` tokens (token paging) or of one slot (slot
        paging, ``tokens`` ignored): ``S(tp, s)`` for a KDA layer."""
        return self.ranges(tp, tokens)[-1].end_bytes

    def ranges(self, tp: int, tokens: int = 1) -> tuple[PartRange, ...]:
        """Every part's byte range inside a page of ``tokens`` tokens or a slot, back to back
        from byte 0; the ranges tile ``[0, payload_bytes)`` exactly."""
        return _ranges(self, tp, tokens if self.paging == "token" else 1)

    def page_shape(self, name: str, tp: int, tokens: int) -> tuple[int, ...]:
        """The engine's shape of part ``name`` in one page: ``(rows, *engine_shape)`` for
        token paging (``tokens`` rows, a pooled part's ``tokens / tokens_per_row``), the
        engine shape for a slot."""
        part = self.part(name)
        shape = part.engine_shape(tp)
        if self.paging == "slot":
            return shape
        return (expect_int("tokens", tokens) // part.tokens_per_row, *shape)

    def _need(self, paging: Paging, what: str) -> None:
        if self.paging != paging:
            raise Refusal(
                "invalid_argument",
                f"{self.kind} layer: {what} needs {paging} paging, the layer has "
                f"{self.paging} paging",
                facts={"kind": self.kind, "paging": self.paging},
            )


def _ranges(spec: LayerCacheSpec, tp: int, rows: int) -> tuple[PartRange, ...]:
    """The part ranges of ``rows`` tokens (a slot: 1) of ``spec`` on a rank of ``tp``; a
    pooled part holds a row per ``tokens_per_row`` of them (refused unless they divide)."""
    if rows % spec.page_tokens_multiple:
        raise Refusal(
            "invalid_argument",
            f"{spec.kind} layer: a page of {rows} tokens does not hold whole rows of its pooled "
            f"parts (one row per {spec.page_tokens_multiple} tokens)",
            facts={"kind": spec.kind, "tokens": rows, "multiple": spec.page_tokens_multiple},
            hint=f"use a multiple of {spec.page_tokens_multiple} tokens",
        )
    ranges: list[PartRange] = []
    offset = 0
    for part in spec.parts:
        size = rows // part.tokens_per_row * part.local_bytes(tp)
        # Sizes from the part's own validated shape: nothing to re-validate.
        ranges.append(trusted(PartRange, part=part.name, offset_bytes=offset, size_bytes=size))
        offset += size
    return tuple(ranges)
