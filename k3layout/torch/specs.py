"""The tensors a rank registers for a plan, as data: moved to :mod:`k3layout.offload.tensors`
(pure Python, no torch) and re-exported here for the adapter."""

from ..cache import ElementDtype, element_bytes
from ..offload.tensors import CacheSpec, LayerKind, LayerSpec, PartName, PartSpec, cache_spec

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
