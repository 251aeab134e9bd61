"""The planes of a block (``vllm``) or a parent (``tokenspeed``): which layer's page sits where.

One column per plane, one row per group. The cell at (group, plane ``j``) is the page of layer
``j`` of that group: vLLM gives each layer one page per block, the parent layout ``p_g`` pages
(MLA) or state slots (KDA) per plane. The payload fills the cell from the bottom, labelled with
its module layer; the rest of the plane is padding, shaded, and so is a plane a shorter group
leaves unused (a block or parent of that group still spans it). Since plane ``j`` is shared by
layer ``j`` of every group, a column reads as "what rides on this plane"; a row's shaded bytes
are the group's padding per block or parent (``padding_fraction * p_g * raw_g`` in a parent).

K3 + DSpark, ``vllm``, TP 8, fp8, 2 spec tokens: 29 columns; the attention row fills all 29
pages, each KDA row 23, its pages ``832,512 / 884,736`` full and the rest shaded.

Gids: ``plane.<j>`` (the column), ``page.<group>.<layer>`` and ``padding.<group>.<layer>`` (the
two parts of a cell), ``unused.<group>.<j>`` (a plane the group has no layer on),
``label.<group>.<layer>`` (the module layer printed in it).
"""

from __future__ import annotations

from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from pydantic import NonNegativeInt, PositiveInt

from .._frozen import Frozen
from ..errors import Refusal
from ..layouts import EngineLayout, GroupKind, LayoutBase
from ..layouts.groups import num_planes as num_planes_of
from ..layouts.protocol import check_planes, on_planes
from .blocks import draw_block
from .figure import (
    CELL_SIZE,
    FRAME_EDGE,
    LABEL_COLOUR,
    deployment_title,
    drawn_groups,
    group_colours,
    new_figure,
    padding_legend_patch,
    page_cell,
)

MAX_DIVIDED_PAGES = 32
"""A plane holding more pages of a group than this is drawn without page dividers."""


class PlaneCell(Frozen):
    """Layer ``layer`` of group ``group`` on plane ``plane``: ``pages`` pages (or state slots)
    of ``payload_bytes`` each, on a plane of ``plane_bytes``."""

    plane: NonNegativeInt
    group: str
    kind: GroupKind
    layer: NonNegativeInt
    pages: PositiveInt
    payload_bytes: PositiveInt
    plane_bytes: PositiveInt

    @property
    def used_bytes(self) -> int:
        """Bytes the layer uses on the plane: ``pages * payload_bytes``."""
        return self.pages * self.payload_bytes

    @property
    def padding_bytes(self) -> int:
        """Bytes of the plane the layer leaves unused."""
        return self.plane_bytes - self.used_bytes


def plane_cells(plan: EngineLayout, stage: int | None = None) -> tuple[PlaneCell, ...]:
    """Every (group, plane) cell of the planes of one block (``vllm``) or parent (``tokenspeed``),
    group by group. ``stage=None`` draws the whole model, else that pipeline stage.

    >>> from k3layout import Deployment, plan, preset
    >>> cells = plane_cells(plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2)))
    >>> len(cells), cells[0].layer, cells[0].padding_bytes  # 29 + 3 x 23; 884,736 - 832,512
    (98, 0, 52224)
    """
    if not isinstance(plan, LayoutBase):
        raise Refusal(
            "invalid_argument",
            f"draw_planes takes a plan, not {type(plan).__name__}",
            facts={"type": type(plan).__name__},
            hint="pass the result of k3layout.plan(model, deployment)",
        )
    check_planes(plan, "a picture of planes")
    cells: list[PlaneCell] = []
    for group in drawn_groups(plan, stage):
        for j, layer in enumerate(group.layers):
            plane = group.plane_of(j)
            plane_bytes = plan.plane_bytes_in(group, plane)  # one block's (or parent's) plane
            stride = plan.page_stride_at(group, plane)
            cells.append(
                PlaneCell(
                    plane=plane,
                    group=group.name,
                    kind=group.kind,
                    layer=layer,
                    pages=plane_bytes // stride,
                    payload_bytes=plan.layer_payload_bytes(layer),
                    plane_bytes=plane_bytes,
                )
            )
    return tuple(cells)


def _subtitle(plan: EngineLayout, num_planes: int) -> str:
    return plan.block_caption(num_planes)


def draw_planes(plan: EngineLayout, *, stage: int | None = None) -> Figure:
    """The planes of one block (``vllm``) or one parent (``tokenspeed``) of ``plan``: a column per
    plane, a row per group, each layer's page labelled with its module layer, padding shaded.

    ``stage=None`` draws the whole model's groups; an index draws that pipeline stage's. A
    plan packed in blocks of several page sizes (an indexed hybrid) has no planes: its block
    is drawn instead (:func:`~k3layout.draw.blocks.draw_block`, stage 0 unless ``stage``).
    """
    if isinstance(plan, LayoutBase) and not on_planes(plan):
        return draw_block(plan, stage=stage or 0)
    cells = plane_cells(plan, stage)
    groups = drawn_groups(plan, stage)
    num_planes = num_planes_of(groups)
    colours = group_colours(groups)
    rows = {group.name: len(groups) - 1 - index for index, group in enumerate(groups)}
    width = max(8.5, 2.4 + 0.36 * num_planes)
    figure = new_figure(width, 1.5 + 0.62 * len(groups))
    ax = figure.add_subplot()
    for j in range(num_planes):
        ax.add_patch(
            Rectangle(
                (j + 0.02, -0.04),
                0.96,
                len(groups) + 0.02,
                facecolor="none",
                edgecolor=FRAME_EDGE,
                linewidth=0.6,
                gid=f"plane.{j}",
            )
        )
    dividers: list[list[tuple[float, float]]] = []
    offset = (1 - CELL_SIZE) / 2
    for cell in cells:
        x, y = cell.plane + offset, rows[cell.group] + offset
        fraction = cell.used_bytes / cell.plane_bytes
        page_cell(
            ax,
            (x, y),
            (CELL_SIZE, CELL_SIZE),
            (fraction, colours[cell.group]),
            (f"page.{cell.group}.{cell.layer}", f"padding.{cell.group}.{cell.layer}"),
        )
        if 1 < cell.pages <= MAX_DIVIDED_PAGES:
            step = CELL_SIZE * cell.payload_bytes / cell.plane_bytes
            dividers.extend(
                [(x, y + k * step), (x + CELL_SIZE, y + k * step)] for k in range(1, cell.pages)
            )
        middle_page = (cell.pages - 1) // 2 + 0.5  # the label sits on the middle page
        ax.text(
            cell.plane + 0.5,
            y + CELL_SIZE * middle_page * cell.payload_bytes / cell.plane_bytes,
            str(cell.layer),
            ha="center",
            va="center",
            fontsize=6.5,
            color=LABEL_COLOUR,
            bbox={"boxstyle": "square,pad=0.1", "facecolor": colours[cell.group], "linewidth": 0},
            gid=f"label.{cell.group}.{cell.layer}",
        )
    for group in groups:
        used = range(group.first_plane, group.first_plane + len(group.layers))
        for j in (j for j in range(num_planes) if j not in used):
            page_cell(
                ax,
                (j + offset, rows[group.name] + offset),
                (CELL_SIZE, CELL_SIZE),
                (0.0, colours[group.name]),
                ("", f"unused.{group.name}.{j}"),
            )
    if dividers:
        ax.add_collection(
            LineCollection(dividers, colors=LABEL_COLOUR, linewidths=0.3, gid="dividers")
        )
    ax.set_xlim(0, max(num_planes, 1))
    ax.set_ylim(-0.1, len(groups))
    ax.set_xticks([j + 0.5 for j in range(num_planes)], [str(j) for j in range(num_planes)])
    ax.tick_params(axis="x", labelsize=7, length=0)
    ax.set_yticks(
        [rows[g.name] + 0.5 for g in groups], [f"{g.name} ({len(g.layers)})" for g in groups]
    )
    ax.tick_params(axis="y", labelsize=8, length=0)
    ax.set_xlabel("plane  (a cell: one layer's page on it, labelled with the module layer)")
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    where = "" if stage is None else f" | stage {stage}"
    ax.set_title(
        f"{deployment_title(plan.model.name, plan.deployment)}{where}\n"
        f"{_subtitle(plan, num_planes)}",
        fontsize=9,
    )
    handles = [Rectangle((0, 0), 1, 1, facecolor=colours[g.name], label=g.name) for g in groups] + [
        padding_legend_patch()
    ]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=min(len(handles), int(width // 1.7)),
        fontsize=7,
        frameon=False,
    )
    return figure
