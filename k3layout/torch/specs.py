"""The tensors a rank registers for a plan, as data: moved to :mod:`k3layout.layouts.tensors`
(pure Python, no torch) and re-exported here for the adapter."""

from ..layouts.tensors import CacheSpec, LayerKind, LayerSpec, PartName, PartSpec, cache_spec
from ..cache import ElementDtype, element_bytes

__all__ = [
    "CacheSpec",
    "ElementDtype",
    "LayerKind",
    "LayerSpec",
    "PartName",
    "PartSpec",
    "cache_spec",
    "element_bytes",
]
