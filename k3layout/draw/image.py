"""The checkpoint image of one boundary: units over planes.

One row per unit (a KDA group), one column per image plane (the attention layer that publishes
it, by module layer). The cell at (unit ``u``, plane ``j``) is the page of that plane in the
group's block: the state of layer ``j`` of the group fills it from the bottom (labelled with the
KDA layer's module layer), the rest of the page is padding, shaded; a plane a shorter group
skips is all padding. Units follow each other in the image, plane by plane, so unit ``u`` is
bytes ``[u * unit, (u + 1) * unit)``, printed beside its row.

K3 + DSpark, TP 8, fp8, 2 spec tokens: 3 rows x 23 columns of 884,736 B pages, each holding
832,512 B of state: 61,046,784 B of image, 57,443,328 B of state.

Gids: ``unit.<u>`` (the row), ``state.<u>.<j>`` and ``padding.<u>.<j>`` (the parts of a cell),
``label.<u>.<j>`` (the KDA layer's module layer), ``range.<u>`` (the unit's byte range).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..errors import Refusal
from ..layouts import EngineLayout
from ..offload import CheckpointImage, RidePlan, checkpoint_image
from .figure import (
    CELL_SIZE,
    FRAME_EDGE,
    LABEL_COLOUR,
    group_colours,
    new_figure,
    padding_legend_patch,
    page_cell,
)


def image_of(
    source: CheckpointImage | RidePlan | EngineLayout, stage: int = 0
) -> tuple[CheckpointImage, str | None]:
    """The image to draw and the model's name (``None`` for a bare image): a ride's image, a
    plan's image on ``stage`` (a ``tokenspeed`` plan is refused with ``engine_mismatch``)."""
    if isinstance(source, CheckpointImage):
        return source, None
    if isinstance(source, RidePlan):
        return source.image, source.plan.model.name
    if isinstance(source, EngineLayout):
        return checkpoint_image(source, stage=stage), source.model.name
    raise Refusal(
        "invalid_argument",
        f"draw_image takes a checkpoint image, a ride plan or a plan, not {type(source).__name__}",
        facts={"type": type(source).__name__},
        hint="pass k3layout.checkpoint_image(plan) or the plan itself",
    )


def draw_image(source: CheckpointImage | RidePlan | EngineLayout, *, stage: int = 0) -> Figure:
    """The checkpoint image of one boundary as units (rows) over image planes (columns): each
    KDA layer's state in its page, padding shaded, each unit's byte range beside it.

    ``source`` is the image itself, a ride plan, or a plan (its image on pipeline ``stage``).
    """
    image, model_name = image_of(source, stage)
    units, planes = image.num_units, image.num_planes
    colours = group_colours(image.groups)
    figure = new_figure(max(8.5, 4.2 + 0.36 * planes), 1.6 + 0.62 * max(units, 1))
    ax = figure.add_subplot()
    state = image.layer_state_bytes / image.page_bytes
    offset = (1 - CELL_SIZE) / 2
    for unit, group in enumerate(image.groups):
        row = units - 1 - unit
        ax.add_patch(
            Rectangle(
                (0.0, row + 0.01),
                planes,
                0.98,
                facecolor="none",
                edgecolor=FRAME_EDGE,
                linewidth=0.6,
                gid=f"unit.{unit}",
            )
        )
        for j in range(planes):
            holds = j < len(group.layers)
            page_cell(
                ax,
                (j + offset, row + offset),
                (CELL_SIZE, CELL_SIZE),
                (state if holds else 0.0, colours[group.name]),
                (f"state.{unit}.{j}", f"padding.{unit}.{j}"),
            )
            if holds:
                ax.text(
                    j + 0.5,
                    row + offset + CELL_SIZE * state / 2,
                    str(group.layers[j]),
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    color=LABEL_COLOUR,
                    gid=f"label.{unit}.{j}",
                )
        start = unit * image.unit_bytes
        ax.text(
            planes + 0.2,
            row + 0.5,
            f"unit {unit}: {group.name}\nbytes [{start:,}, {start + image.unit_bytes:,})",
            ha="left",
            va="center",
            fontsize=7,
            gid=f"range.{unit}",
        )
    ax.set_xlim(0, planes + 3.6)
    ax.set_ylim(0, max(units, 1))
    ax.set_xticks(
        [j + 0.5 for j in range(planes)], [str(share.module_layer) for share in image.planes]
    )
    ax.tick_params(axis="x", labelsize=7, length=0)
    ax.set_yticks([units - 1 - u + 0.5 for u in range(units)], [f"unit {u}" for u in range(units)])
    ax.tick_params(axis="y", labelsize=8, length=0)
    ax.set_xlabel("image plane: the module layer of the attention layer publishing it")
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    heading = "checkpoint image of one boundary" + (f" | stage {image.stage}")
    if model_name is not None:
        heading = f"{model_name}: {heading}"
    ax.set_title(
        f"{heading}\n{units} units x {planes} planes x {image.page_bytes:,} B = "
        f"{image.image_bytes:,} B; state {image.num_kda_layers} x "
        f"{image.layer_state_bytes:,} B = {image.state_bytes:,} B",
        fontsize=9,
    )
    handles = [
        Rectangle((0, 0), 1, 1, facecolor=colours[g.name], label=f"{g.name} state")
        for g in image.groups
    ] + [padding_legend_patch()]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=len(handles),
        fontsize=7,
        frameon=False,
    )
    return figure
