"""The layer kinds a hybrid model is made of, tagged by ``kind``.

Each kind is one module of :mod:`k3layout.cache` holding its record and its cache spec:
MLA (:mod:`~k3layout.cache.mla`), KDA (:mod:`~k3layout.cache.kda`) and GQA
(:mod:`~k3layout.cache.gqa`). A new kind is a new module there and one name here.
"""

from __future__ import annotations

from typing import Annotated, TypeAlias

from pydantic import Field

from ..cache.gqa import GQALayer
from ..cache.kda import KDALayer
from ..cache.mla import MLALayer

Layer: TypeAlias = Annotated[MLALayer | KDALayer | GQALayer, Field(discriminator="kind")]
"""One layer of a hybrid model, tagged by ``kind`` (``"mla"``, ``"kda"`` or ``"gqa"``)."""

AnyLayer: TypeAlias = MLALayer | KDALayer | GQALayer
"""The layer records, untagged (for annotations)."""

__all__ = ["AnyLayer", "GQALayer", "KDALayer", "Layer", "MLALayer"]
