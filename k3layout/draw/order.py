"""The PAGE plane order: the order an engine would publish attention layers in, and the order
the ride publishes them in (the layers the KDA state aliases first).

Two columns of attention layer names, the given order on the left and the publish order on the
right, a line joining the two places of each layer (dark when the layer moved). The leading
image planes on the right are coloured, each with the KDA layers riding it. K3 + DSpark in name
order: the five ``draft.`` layers and ``model.layers.11`` .. sort ahead of
``model.layers.3``, so almost every line crosses.

Gids: ``given.<i>`` and ``published.<j>`` (the boxes), ``move.<j>`` (the line into published
plane ``j``), ``riders.<j>`` (the KDA layers riding image plane ``j``).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from ..errors import Refusal
from ..layouts import EngineLayout
from ..offload import PlaneOrder, RidePlan, plane_order
from .figure import ATTENTION_COLOUR, FRAME_EDGE, LABEL_COLOUR, new_figure

_BOX_WIDTH = 4.0
_GAP = 2.2
_MOVED = "#333333"
_KEPT = "#bbbbbb"


def order_of(
    source: PlaneOrder | RidePlan | EngineLayout, stage: int = 0
) -> tuple[PlaneOrder, str | None]:
    """The plane order to draw and the model's name (``None`` for a bare order): a ride's
    order, or a plan's in name order on ``stage`` (a ``tokenspeed`` plan is refused)."""
    if isinstance(source, PlaneOrder):
        return source, None
    if isinstance(source, RidePlan):
        return source.order, source.plan.model.name
    if isinstance(source, EngineLayout):
        return plane_order(source, stage=stage), source.model.name
    raise Refusal(
        "invalid_argument",
        f"draw_plane_order takes a plane order, a ride plan or a plan, not {type(source).__name__}",
        facts={"type": type(source).__name__},
        hint="pass k3layout.plane_order(plan) or the plan itself",
    )


def draw_plane_order(source: PlaneOrder | RidePlan | EngineLayout, *, stage: int = 0) -> Figure:
    """The given publish order beside the ride's (aliased attention layers first), a line per
    attention layer, the image planes coloured with the KDA layers that ride them."""
    order, model_name = order_of(source, stage)
    count = len(order.planes)
    figure = new_figure(9.0, 1.4 + 0.24 * count)
    ax = figure.add_subplot()
    right = _BOX_WIDTH + _GAP
    given_index = {name: i for i, name in enumerate(order.given)}
    for i, name in enumerate(order.given):
        y = count - 1 - i
        ax.add_patch(
            Rectangle(
                (0, y + 0.1),
                _BOX_WIDTH,
                0.8,
                facecolor="#f4f4f4",
                edgecolor=FRAME_EDGE,
                gid=f"given.{i}",
            )
        )
        ax.text(0.1, y + 0.5, f"{i:>2}  {name}", va="center", fontsize=6.5, family="monospace")
    for share in order.planes:
        j = share.plane
        y = count - 1 - j
        in_image = j < order.num_image_planes
        ax.add_patch(
            Rectangle(
                (right, y + 0.1),
                _BOX_WIDTH,
                0.8,
                facecolor=ATTENTION_COLOUR if in_image else "#f4f4f4",
                edgecolor=FRAME_EDGE,
                gid=f"published.{j}",
            )
        )
        ax.text(
            right + 0.1,
            y + 0.5,
            f"{j:>2}  {share.attention_layer}",
            va="center",
            fontsize=6.5,
            family="monospace",
            color=LABEL_COLOUR if in_image else "black",
        )
        if share.riders:
            ax.text(
                right + _BOX_WIDTH + 0.1,
                y + 0.5,
                "KDA " + ", ".join(str(m.layer) for m in share.riders),
                va="center",
                fontsize=6.5,
                gid=f"riders.{j}",
            )
        i = given_index[share.attention_layer]
        moved = i != j
        ax.add_line(
            Line2D(
                [_BOX_WIDTH, right],
                [count - 1 - i + 0.5, y + 0.5],
                color=_MOVED if moved else _KEPT,
                linewidth=0.8 if moved else 0.6,
                gid=f"move.{j}",
            )
        )
    ax.set_xlim(0, right + _BOX_WIDTH + 2.2)
    ax.set_ylim(0, max(count, 1))
    ax.set_xticks([_BOX_WIDTH / 2, right + _BOX_WIDTH / 2], ["given order", "publish order"])
    ax.xaxis.tick_top()
    ax.tick_params(axis="x", length=0, labelsize=8)
    ax.set_yticks([])
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    heading = f"PAGE plane order | stage {order.stage}"
    if model_name is not None:
        heading = f"{model_name}: {heading}"
    num_moved = sum(
        1 for share in order.planes if given_index[share.attention_layer] != share.plane
    )
    ax.set_title(
        f"{heading}\n{count} attention layers, the first {order.num_image_planes} (coloured) "
        f"carry the KDA state; {num_moved} change place",
        fontsize=9,
    )
    return figure
