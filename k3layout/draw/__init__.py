"""Pictures of layouts (needs matplotlib: ``pip install k3layout[draw]``).

Each function takes a plan (or what a plan yields) and returns a matplotlib
:class:`~matplotlib.figure.Figure` built on the Agg canvas, without ``pyplot``: nothing is
shown and no window opens. :func:`save` writes it as PNG or SVG by the path's suffix.

- :func:`draw_planes`: the planes of one block (``vllm``) or parent (``tokenspeed``), each layer's
  page, which KDA group and layer rides on which plane, padding shaded.
- :func:`draw_block`: one block of a packed layout (an indexed hybrid's, GLM-5.3-Flash), each
  group's caches at their byte ranges (``draw_planes`` draws it for such a plan).
- :func:`draw_image`: the checkpoint image of one boundary, units over planes.
- :func:`draw_plane_order`: the PAGE publish order, aliased attention layers first.
- :func:`draw_transfer`: a transfer as a producer x consumer matrix of bytes.
- :func:`draw_segment_map`: which producer writes each (consumer rank, module layer).
- :func:`draw_sweep`: padding or bytes per token against attention TP and cache dtype.
- :func:`draw_requests`: requests held at once against context length, one line per engine.

Every element a reader looks for carries a gid (``plane.3``, ``page.full_attention.7``), kept
as the element id in an SVG; each module's docstring lists its own.
"""

from __future__ import annotations

try:
    import matplotlib as _matplotlib
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "k3layout.draw needs matplotlib, which is not installed: pip install 'k3layout[draw]'"
    ) from error

from .blocks import BlockCell, block_cells, draw_block
from .figure import human_bytes, picture_path, save, topology
from .image import draw_image
from .order import draw_plane_order
from .planes import PlaneCell, draw_planes, plane_cells
from .requests import draw_requests
from .segments import NO_PRODUCER, SEVERAL_PRODUCERS, draw_segment_map, segment_map
from .sweep import SweepQuantity, draw_sweep, sweep_grid
from .transfer import BytesKind, draw_transfer, transfer_matrix

del _matplotlib

__all__ = [
    "NO_PRODUCER",
    "SEVERAL_PRODUCERS",
    "BlockCell",
    "BytesKind",
    "PlaneCell",
    "SweepQuantity",
    "block_cells",
    "draw_block",
    "draw_image",
    "draw_plane_order",
    "draw_planes",
    "draw_requests",
    "draw_segment_map",
    "draw_sweep",
    "draw_transfer",
    "human_bytes",
    "picture_path",
    "plane_cells",
    "save",
    "segment_map",
    "sweep_grid",
    "topology",
    "transfer_matrix",
]
