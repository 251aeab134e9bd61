"""A transfer's segment map: which producer rank writes each (consumer rank, module layer).

One column per module layer (target then draft), one row per consumer (decode) rank; the cell
is coloured by the producer rank whose segments fill that consumer's region of that layer. A
strip above marks each layer MLA (PAGE rows) or KDA (SLOT state). Rows are placed by module
layer, so under PP a column's colour is the prefill stage holding that layer, whatever stage
the decode puts it on: PP8 x TP1 -> TP8 x DCP8 shows eight vertical bands, one per stage.

Gids: ``kinds`` (the strip), ``map`` (the matrix).
"""

from __future__ import annotations

from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from numpy import ma

from ..errors import Refusal
from ..transfer import TransferPlan
from .figure import ATTENTION_COLOUR, KDA_COLOURS, new_figure, topology

NO_PRODUCER = -1
"""A (consumer, layer) no segment writes: the consumer does not hold that layer."""

SEVERAL_PRODUCERS = -2
"""A (consumer, layer) written by more than one producer (never, in a plan by module layer)."""


def segment_map(result: TransferPlan) -> tuple[tuple[int, ...], ...]:
    """``map[c][layer]``: the producer rank writing consumer ``c``'s region of module layer
    ``layer`` (:data:`NO_PRODUCER` when none, :data:`SEVERAL_PRODUCERS` when more than one).
    The ReplaySSM cursor belongs to no layer and is not drawn.

    >>> from k3layout import Deployment, plan_transfer, preset
    >>> t = plan_transfer(preset("kimi-k3"), Deployment(pp=8), Deployment(attn_tp=8, dcp=8),
    ...                   prompt_tokens=4096)
    >>> m = segment_map(t)
    >>> m[0][0], m[0][11], m[7][92]  # stage 0 holds layers 0-10, stage 1 from 11, stage 7 92
    (0, 1, 7)
    """
    if not isinstance(result, TransferPlan):
        raise Refusal(
            "invalid_argument",
            f"draw_segment_map takes a transfer plan, not {type(result).__name__}",
            facts={"type": type(result).__name__},
            hint="pass the result of k3layout.plan_transfer(...)",
        )
    layers = len(result.model.module_layers)
    grid = [[NO_PRODUCER] * layers for _ in range(result.num_consumers)]
    for pair in result.pairs:
        row = grid[pair.consumer]
        for segment in pair.segments:
            for layer in segment.layers:  # none for the cursor
                current = row[layer]
                if current == NO_PRODUCER:
                    row[layer] = pair.producer
                elif current != pair.producer:
                    row[layer] = SEVERAL_PRODUCERS
    return tuple(tuple(row) for row in grid)


PRODUCER_COLOURS = (
    "#4C72B0",
    "#DD8452",
    "#55A868",
    "#C44E52",
    "#8172B3",
    "#937860",
    "#DA8BC3",
    "#8C8C8C",
    "#CCB974",
    "#64B5CD",
)
"""Producer ranks' colours, in turn (ranks beyond ten repeat them)."""


def _producer_colours(count: int) -> list[str]:
    base = PRODUCER_COLOURS
    return [base[i % len(base)] for i in range(count)]


def draw_segment_map(result: TransferPlan) -> Figure:
    """Which producer rank writes each (consumer rank, module layer) of ``result``, under a
    strip marking each module layer MLA or KDA."""
    grid = segment_map(result)
    model = result.model
    layers = len(model.module_layers)
    consumers, producers = result.num_consumers, result.num_producers
    figure = new_figure(max(8.0, 2.5 + 0.11 * layers), 2.4 + 0.3 * consumers)
    strip, ax = figure.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [1, max(consumers, 1) * 1.4]}
    )
    kinds = [[0 if layer.kind == "mla" else 1 for layer in model.module_layers]]
    strip.imshow(
        kinds,
        cmap=ListedColormap([ATTENTION_COLOUR, KDA_COLOURS[0]]),
        vmin=0,
        vmax=1,
        aspect="auto",
        gid="kinds",
    )
    strip.set_yticks([0], ["MLA / KDA"], fontsize=7)
    strip.tick_params(axis="x", length=0, labelbottom=False)
    colours = ["#000000", "#ffffff", *_producer_colours(producers)]  # several, none, ranks
    image = ax.imshow(
        ma.masked_equal(grid, NO_PRODUCER),
        cmap=ListedColormap(colours),
        norm=BoundaryNorm([b - 0.5 for b in range(-2, producers + 1)], len(colours)),
        aspect="auto",
        interpolation="nearest",
        gid="map",
    )
    step = 10 if layers > 40 else 5
    ax.set_xticks(range(0, layers, step), [str(x) for x in range(0, layers, step)], fontsize=7)
    ax.set_yticks(
        range(consumers),
        [f"c{c} tp{c % result.decode.attn_tp}" for c in range(consumers)],
        fontsize=7,
    )
    ax.set_xlabel("module layer", fontsize=8)
    ax.set_ylabel("consumer (decode) rank", fontsize=8)
    bar = figure.colorbar(
        image,
        ax=[strip, ax],
        ticks=range(producers),
        boundaries=[b - 0.5 for b in range(producers + 1)],
        values=range(producers),
        shrink=0.9,
    )
    bar.set_label("producer (prefill) rank", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    strip.set_title(
        f"{model.name}: prefill {topology(result.prefill)} -> decode "
        f"{topology(result.decode)}: the producer of every consumer's region, by module layer",
        fontsize=9,
    )
    return figure
