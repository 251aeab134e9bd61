"""A cache part: one named tensor of a layer's cache, described once as its TP1 array.

A part has a global (TP1) shape in *logical* axes, a dtype and a placement over attention TP
(:class:`~k3layout.Shard` of one axis, or :class:`~k3layout.Replicate`). Every per-rank
number is derived from that: the local shape, the local bytes, the engine's tensor shape
(logical axes merged, ``view``), the byte offset of any element, and the strided copy that
moves one rank's share into another's (:meth:`CachePart.segment`).

Logical axes keep a split honest. vLLM's KDA conv state is ONE tensor per layer whose
channels are q|k|v side by side; TP splits each of q, k and v by heads. As one logical array
``(K-1+s, 3, H, D)`` with ``Shard(2)``, rank ``r`` holds ``(K-1+s, 3, H/tp, D)``, which the
engine sees merged as ``(K-1+s, 3*H/tp*D)`` (``view=(1, 3)``): its q, k and v shares side by
side in every row, exactly what vLLM allocates.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, TypeAlias

from pydantic import Field, PositiveInt, model_validator

from .._args import expect, expect_int, expect_items
from .._frozen import Frozen
from .._validation import describe
from ..constants import MAX_MODEL_DIM
from ..dtypes import DTYPE_BYTES, DTypeName
from ..errors import Refusal
from ..limits import check_bound
from ..placements import ReplicaShard, Replicate, Shard

Dim: TypeAlias = Annotated[int, Field(gt=0, le=MAX_MODEL_DIM)]
"""A head count or dimension of a layer: positive, at most ``MAX_MODEL_DIM`` (beyond it:
``size_limit``), so that no byte count of a plan leaves int64."""

ElementDtype: TypeAlias = DTypeName | Literal["uint8"]
"""Element dtypes of cache tensors: the planner's dtypes, and raw bytes (packed rows)."""

PartName: TypeAlias = Annotated[str, Field(min_length=1, max_length=64)]
"""A part's name within its layer: ``latent``, ``index``, ``conv``, ``recurrent``, ``k``,
``v``, ``replay_k`` ... (one word, the engines' own)."""


_ELEMENT_BYTES: dict[str, int] = {name: size for name, size in (*DTYPE_BYTES.items(), ("uint8", 1))}
"""Bytes per element of every :data:`ElementDtype`."""


def element_bytes(dtype: ElementDtype) -> int:
    """Bytes of one element of ``dtype``; refuses (``invalid_argument``) another value."""
    size = _ELEMENT_BYTES.get(dtype) if type(dtype) is str else None
    if size is None:
        expect("dtype", dtype, str)
        raise Refusal(
            "invalid_argument",
            f"dtype={describe(dtype)} is not an element dtype ({', '.join(_ELEMENT_BYTES)})",
            facts={"field": "dtype", "dtype": describe(dtype)},
            hint=f"use dtype in {list(_ELEMENT_BYTES)}",
        )
    return size


def check_dim(name: str, value: object) -> int:
    """``value`` if it is a :data:`Dim` (an ``int`` in ``1..MAX_MODEL_DIM``); else refuse
    (``invalid_argument``, or ``size_limit`` above the bound) naming ``name``."""
    number = expect_int(name, value)
    if number < 1:
        raise Refusal(
            "invalid_argument",
            f"{name}={describe(number)} must be >= 1",
            facts={"field": name},
            hint=f"pass {name} >= 1",
        )
    return check_bound(name, number, MAX_MODEL_DIM, why="a head count or dimension")


class CachePart(Frozen):
    """One tensor of a layer's cache: ``shape`` (TP1, logical axes) of ``dtype``, placed over
    attention TP by ``tp``. A token-paged part's shape is per token (the page adds the token
    axis in front); a slot part's shape is per request.

    ``view`` groups consecutive logical axes into the engine's tensor axes (``None``: one
    engine axis per logical axis). K3's recurrent state, ``(96, 128, 128)`` fp32, ``Shard(0)``
    over TP 8::

        rank    0          1           ...  7
        heads   [0, 12)    [12, 24)    ...  [84, 96)
        bytes   786,432 on every rank (12 x 128 x 128 x 4)
    """

    name: PartName
    shape: Annotated[tuple[PositiveInt, ...], Field(min_length=1, max_length=8)]
    dtype: ElementDtype
    tp: Shard | Replicate | ReplicaShard
    view: tuple[PositiveInt, ...] | None = None
    tokens_per_row: Annotated[int, Field(ge=1, le=MAX_MODEL_DIM)] = 1
    """Tokens one row of a token-paged part covers: 1 for a row per token; ``n`` for a
    token-pooled part keeping one compressed entry per ``n`` tokens (GLM-5.3-Flash's DSA
    indexer keys, :mod:`k3layout.cache.pooled`). A slot part ignores it."""

    @model_validator(mode="after")
    def _axes_fit(self) -> CachePart:
        if not isinstance(self.tp, Replicate) and self.tp.dim >= len(self.shape):
            raise ValueError(f"tp: dim={self.tp.dim} is not an axis of shape {self.shape}")
        if self.view is not None and sum(self.view) != len(self.shape):
            raise ValueError(
                f"view: {self.view} groups {sum(self.view)} axes, shape has {len(self.shape)}"
            )
        return self

    @property
    def elem_bytes(self) -> int:
        """Bytes per element."""
        return element_bytes(self.dtype)

    @property
    def global_bytes(self) -> int:
        """Bytes of the whole (TP1) array."""
        return math.prod(self.shape) * self.elem_bytes

    def local_size_and_offset(self, tp: int, rank: int = 0) -> tuple[int, int]:
        """``(size, offset)`` of ``rank``'s share along the placed axis (the whole first axis
        when replicated)."""
        dim = 0 if isinstance(self.tp, Replicate) else self.tp.dim
        return self.tp.local_size_and_offset(self.shape[dim], tp, rank)

    def local_shape(self, tp: int, rank: int = 0) -> tuple[int, ...]:
        """The logical array a rank of ``tp`` holds."""
        if isinstance(self.tp, Replicate):
            self.tp.local_size_and_offset(self.shape[0], tp, rank)  # refuses a bad rank
            return self.shape
        size, _ = self.local_size_and_offset(tp, rank)
        dim = self.tp.dim
        return (*self.shape[:dim], size, *self.shape[dim + 1 :])

    def engine_shape(self, tp: int) -> tuple[int, ...]:
        """The tensor an engine allocates on one rank: the local shape, axes merged by
        ``view`` (K3's SD conv state at TP 8, 2 spec tokens: ``(5, 4608)``)."""
        local = self.local_shape(tp)
        if self.view is None:
            return local
        merged: list[int] = []
        start = 0
        for width in self.view:
            merged.append(math.prod(local[start : start + width]))
            start += width
        return tuple(merged)

    def local_bytes(self, tp: int) -> int:
        """Bytes one rank of ``tp`` holds (every rank holds as many)."""
        return math.prod(self.local_shape(tp)) * self.elem_bytes

    def local_offset(self, index: tuple[int, ...], tp: int) -> int:
        """Byte offset of the element at logical ``index`` inside a rank's local tensor.

        The k channels of K3's SD conv state, row 0, start at index ``(0, 1, 0, 0)``: after
        the q channels, ``H/tp * D * 2`` bytes (24,576 at TP 1, 3,072 at TP 8).
        """
        expect_items("index", index, int)
        local = self.local_shape(tp)
        if len(index) != len(local) or any(
            not 0 <= i < n for i, n in zip(index, local, strict=True)
        ):
            raise Refusal(
                "invalid_argument",
                f"part {self.name}: index {index} is outside its local shape {local}",
                facts={"part": self.name, "index": index, "shape": local},
                hint="give one index per logical axis, each below its extent",
            )
        offset = 0
        for i, n in zip(index, local, strict=True):
            offset = offset * n + i
        return offset * self.elem_bytes
