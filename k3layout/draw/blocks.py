"""One block of a packed layout (vLLM's, for an indexed hybrid such as GLM-5.3-Flash): which
group's caches fill which bytes.

A packed block has no planes: the block pool gives a block to one group at a time, and each
group lays its caches over the whole block, spec after spec (an indexed layer's pooled keys,
then its latents; a KDA group's states; the tail rings). So the picture is one bar per group
across the block's bytes, each layer's cache a segment at its byte range
(:meth:`~k3layout.layouts.EngineLayout.byte_range` of block 0), the bytes the group leaves
unused shaded. The widest group sets the block (aligned up); every other row shows what a
block given to that group wastes.

GLM-5.3-Flash, TP 8, fp8, H200: a 1,536-token block of 8,802,816 B; the latents' row holds 11
pooled key caches (96 entries of 132 B) then 11 latents (1,536 rows of 512 B); each KDA row 9 or
8 states; the ring row 11 rings of 8,192 B.

Gids: ``cache.<group>.<layer>.<part>`` (a segment), ``unused.<group>`` (the shaded rest of its
row), ``label.<group>.<layer>`` (the module layer printed on its widest cache, where it is wide
enough to read).
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from pydantic import NonNegativeInt, PositiveInt

from .._frozen import Frozen
from ..errors import Refusal
from ..layouts import EngineLayout, GroupKind, LayoutBase
from .figure import (
    FRAME_EDGE,
    LABEL_COLOUR,
    PADDING_EDGE,
    PADDING_FACE,
    PADDING_HATCH,
    deployment_title,
    drawn_groups,
    group_colours,
    human_bytes,
    new_figure,
    padding_legend_patch,
)

MIN_LABELLED_WIDTH = 0.03
"""A layer whose caches span less of the block than this is not labelled (no room)."""


class BlockCell(Frozen):
    """Part ``part`` of module layer ``layer`` (group ``group``) in one block: ``size_bytes``
    from ``offset_bytes``, in a block of ``block_bytes``."""

    group: str
    kind: GroupKind
    layer: NonNegativeInt
    part: str
    offset_bytes: NonNegativeInt
    size_bytes: PositiveInt
    block_bytes: PositiveInt

    @property
    def end_bytes(self) -> int:
        """One past the cache's last byte in the block."""
        return self.offset_bytes + self.size_bytes


def block_cells(plan: EngineLayout, stage: int = 0) -> tuple[BlockCell, ...]:
    """Every cache of every group in one block of pipeline stage ``stage`` of a block-outermost
    ``plan``, group by group, at its byte range in block 0.

    >>> from k3layout import Deployment, plan, preset
    >>> cells = block_cells(plan(preset("glm-5.3-flash"), Deployment(attn_tp=8)))
    >>> first = next(c for c in cells if c.part == "latent")
    >>> first.layer, first.offset_bytes, first.size_bytes, first.block_bytes
    (3, 139392, 786432, 8802816)
    """
    if not isinstance(plan, LayoutBase):
        raise Refusal(
            "invalid_argument",
            f"draw_block takes a plan, not {type(plan).__name__}",
            facts={"type": type(plan).__name__},
            hint="pass the result of k3layout.plan(model, deployment)",
        )
    if not plan.block_outermost:
        raise Refusal(
            "layout_unsupported",
            "the plan is layer-outermost (LBNHC): its blocks are pages on planes, drawn by "
            "draw_planes",
            facts={"feature": "a picture of a block", "engine": plan.engine},
            hint="draw its planes (k3layout draw planes, draw_planes)",
        )
    block = plan.stage_block_bytes(stage)
    cells: list[BlockCell] = []
    for group in drawn_groups(plan, stage):
        parts = plan.group_spec(group).part_names
        for layer in group.layers:
            for part in parts:
                at = plan.byte_range(layer, part, 0, 1, stage)
                cells.append(
                    BlockCell(
                        group=group.name,
                        kind=group.kind,
                        layer=layer,
                        part=part,
                        offset_bytes=at.offset_bytes,
                        size_bytes=at.size_bytes,
                        block_bytes=block,
                    )
                )
    return tuple(cells)


def draw_block(plan: EngineLayout, *, stage: int = 0) -> Figure:
    """One block of a block-outermost ``plan`` (the packed layout of an indexed hybrid): a row
    per group across the block's bytes, each layer's caches at their byte ranges, the rest of
    the row shaded. ``stage``: the pipeline stage whose block is drawn."""
    cells = block_cells(plan, stage)
    groups = drawn_groups(plan, stage)
    colours = group_colours(groups)
    rows = {group.name: len(groups) - 1 - index for index, group in enumerate(groups)}
    block = plan.stage_block_bytes(stage)
    tokens = plan.tokens_per_page(plan.groups_of("attention")[0])
    figure = new_figure(10.0, 1.6 + 0.55 * len(groups))
    ax = figure.add_subplot()
    height = 0.7
    for group in groups:
        y = rows[group.name] + (1 - height) / 2
        ax.add_patch(
            Rectangle(
                (0, y),
                1,
                height,
                facecolor=PADDING_FACE,
                edgecolor=PADDING_EDGE,
                hatch=PADDING_HATCH,
                linewidth=0.4,
                gid=f"unused.{group.name}",
            )
        )
        own = [cell for cell in cells if cell.group == group.name]
        spans: dict[int, tuple[int, int]] = {}
        for cell in own:
            x, width = cell.offset_bytes / block, cell.size_bytes / block
            ax.add_patch(
                Rectangle(
                    (x, y),
                    width,
                    height,
                    facecolor=colours[group.name],
                    edgecolor=FRAME_EDGE,
                    linewidth=0.3,
                    gid=f"cache.{group.name}.{cell.layer}.{cell.part}",
                )
            )
            start, end = spans.get(cell.layer, (0, 0))
            if cell.size_bytes > end - start:  # labelled on its widest cache
                spans[cell.layer] = (cell.offset_bytes, cell.end_bytes)
        for layer, (start, end) in spans.items():
            if (end - start) / block < MIN_LABELLED_WIDTH:  # too narrow to read
                continue
            ax.text(
                (start + end) / 2 / block,
                y + height / 2,
                str(layer),
                ha="center",
                va="center",
                fontsize=6,
                color=LABEL_COLOUR,
                gid=f"label.{group.name}.{layer}",
            )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, len(groups))
    ticks = [0.0, 0.25, 0.5, 0.75, 1.0]
    ax.set_xticks(ticks, [human_bytes(block * t) for t in ticks])
    ax.tick_params(axis="x", labelsize=7, length=2)
    ax.set_yticks(
        [rows[g.name] + 0.5 for g in groups],
        [f"{g.name} ({len(g.layers)}: {', '.join(plan.group_spec(g).part_names)})" for g in groups],
    )
    ax.tick_params(axis="y", labelsize=8, length=0)
    ax.set_xlabel(
        "bytes of one block (a group's caches at their byte ranges; a block holds one group)"
    )
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    where = f" | stage {stage}" if len(plan.stages) > 1 else ""
    ax.set_title(
        f"{deployment_title(plan.model.name, plan.deployment)}{where}\n"
        f"one block of {tokens:,} tokens, {block:,} B, packed by group",
        fontsize=9,
    )
    handles = [Rectangle((0, 0), 1, 1, facecolor=colours[g.name], label=g.name) for g in groups]
    handles.append(padding_legend_patch())
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25),
        ncol=min(len(handles), 6),
        fontsize=7,
        frameon=False,
    )
    return figure
