"""The torch adapter: the only part of k3layout that imports torch.

It executes and checks what the planner decided; it decides nothing itself:

- :func:`allocate` builds a plan's cache on CPU with the engine's aliasing (vLLM planes shared
  by layer ``j`` of every group; a parent arena laid out by ``bind(n)``), cut as
  :func:`cache_spec` says;
- :func:`validate` checks the tensors an engine registered against the plan (names, dtypes,
  shapes, strides, addresses, the ride's aliasing check) and returns a :class:`LiveLayout`;
- :func:`image_units`, :func:`pack_units`, :func:`restore_units` (and :func:`store_prefix`,
  :func:`restore_prefix`) view a boundary's checkpoint image with no copy, pack it to a tier
  and restore it into other blocks; :func:`restore_across_tp` moves it through a transfer plan;
- :mod:`k3layout.torch.tiny_model` runs a tiny K3-shaped model on those layouts, and
  :mod:`k3layout.torch.kernels` holds the reference kernels it uses.

Install it with ``pip install k3layout[torch]``.
"""

from __future__ import annotations

try:
    import torch as _torch
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "k3layout.torch needs torch, which is not installed: pip install k3layout[torch]"
    ) from error

del _torch

from ..transfer import RegionKey  # noqa: E402
from .allocation import (  # noqa: E402
    TORCH_DTYPES,
    Allocation,
    Registered,
    allocate,
    cut,
    cut_bound,
    parts_of,
    plane_view,
)
from .images import (  # noqa: E402
    PageUnits,
    boundary_blocks,
    image_units,
    kv_units,
    pack_units,
    restore_units,
)
from .live import LiveLayout, layer_parts, tensor_view, validate  # noqa: E402
from .regions import (  # noqa: E402
    apply_segments,
    restore_across_tp,
    tier_regions,
    write_regions,
)
from .specs import CacheSpec, LayerSpec, PartSpec, cache_spec  # noqa: E402
from .tables import BlockTables, block_tables, boundary_row  # noqa: E402
from .tier import Tier, restore_prefix, store_prefix  # noqa: E402

__all__ = [
    "TORCH_DTYPES",
    "Allocation",
    "BlockTables",
    "CacheSpec",
    "LayerSpec",
    "LiveLayout",
    "PageUnits",
    "PartSpec",
    "RegionKey",
    "Registered",
    "Tier",
    "allocate",
    "apply_segments",
    "block_tables",
    "boundary_blocks",
    "boundary_row",
    "cache_spec",
    "cut",
    "cut_bound",
    "image_units",
    "kv_units",
    "layer_parts",
    "pack_units",
    "parts_of",
    "plane_view",
    "restore_across_tp",
    "restore_prefix",
    "restore_units",
    "store_prefix",
    "tensor_view",
    "tier_regions",
    "validate",
    "write_regions",
]
