"""A transfer as a producer x consumer matrix of bytes.

Row ``p`` is producer (prefill) rank ``p``, column ``c`` consumer (decode) rank ``c``; the cell
holds the bytes ``p`` writes to ``c`` for one request (blank when the pair copies nothing).
Column totals are the bytes each consumer receives (``bytes_per_consumer``), row totals what
each producer sends. ``kind`` restricts the bytes to PAGE regions (MLA latent rows) or SLOT
regions (KDA state). PP8 x TP1 -> TP8 x DCP8 on K3, 4,096 tokens: every stage writes every
decode rank (8 x 8 cells), each consumer receiving its TP share of all 69 states and the latent
rows of the 512 tokens its DCP rank owns.

Gids: ``matrix`` (the image), ``cell.<p>.<c>`` (a cell's text), ``total.consumer.<c>`` and
``total.producer.<p>`` (the totals).
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from matplotlib.figure import Figure
from numpy import ma

from ..errors import Refusal
from ..transfer import TransferPlan
from .figure import human_bytes, new_figure, topology

BytesKind: TypeAlias = Literal["all", "page", "slot"]
"""Which bytes a matrix counts: every segment, PAGE (MLA latent) or SLOT (KDA state)."""

MAX_ANNOTATED = 16
"""A matrix with more producers or consumers than this is drawn without cell texts."""


def transfer_matrix(result: TransferPlan, kind: BytesKind = "all") -> tuple[tuple[int, ...], ...]:
    """Bytes producer ``p`` writes to consumer ``c``, as ``matrix[p][c]``.

    >>> from k3layout import Deployment, plan_transfer, preset
    >>> t = plan_transfer(preset("kimi-k3"), Deployment(pp=8), Deployment(attn_tp=8, dcp=8),
    ...                   prompt_tokens=4096)
    >>> m = transfer_matrix(t)
    >>> [sum(row[c] for row in m) for c in range(8)] == list(t.bytes_per_consumer)
    True
    """
    if not isinstance(result, TransferPlan):
        raise Refusal(
            "invalid_argument",
            f"draw_transfer takes a transfer plan, not {type(result).__name__}",
            facts={"type": type(result).__name__},
            hint="pass the result of k3layout.plan_transfer(...)",
        )
    if kind not in ("all", "page", "slot"):
        raise Refusal(
            "invalid_argument",
            f"kind={kind!r} is not one of all, page, slot",
            facts={"kind": str(kind)},
            hint="use kind='all', 'page' or 'slot'",
        )
    matrix = [[0] * result.num_consumers for _ in range(result.num_producers)]
    for pair in result.pairs:
        moved = pair.total_bytes if kind == "all" else pair.kind_bytes(kind)
        matrix[pair.producer][pair.consumer] += moved
    return tuple(tuple(row) for row in matrix)


def _consumer_label(rank: int, attn_tp: int, dcp: int) -> str:
    tp_rank = rank % attn_tp
    return f"c{rank}\ntp{tp_rank}" + (f" dcp{tp_rank % dcp}" if dcp > 1 else "")


def draw_transfer(result: TransferPlan, *, kind: BytesKind = "all") -> Figure:
    """The producer x consumer matrix of bytes of ``result`` (one request), with the totals
    each consumer receives and each producer sends."""
    matrix = transfer_matrix(result, kind)
    producers, consumers = result.num_producers, result.num_consumers
    figure = new_figure(max(6.5, 2.8 + 0.75 * consumers), max(3.8, 2.2 + 0.42 * producers))
    ax = figure.add_subplot()
    values = ma.masked_equal(matrix, 0)
    largest = max((max(row) for row in matrix), default=0)
    image = ax.imshow(
        values,
        cmap="Blues",
        vmin=0,
        vmax=max(largest, 1),
        aspect="auto",
        gid="matrix",
    )
    annotate = producers <= MAX_ANNOTATED and consumers <= MAX_ANNOTATED
    for p, row in enumerate(matrix):
        for c, moved in enumerate(row):
            if moved and annotate:
                ax.text(
                    c,
                    p,
                    human_bytes(moved),
                    ha="center",
                    va="center",
                    fontsize=6.5,
                    color="white" if moved > largest / 2 else "black",
                    gid=f"cell.{p}.{c}",
                )
    received = [sum(row[c] for row in matrix) for c in range(consumers)]
    for c, total in enumerate(received):
        ax.text(
            c,
            producers - 0.3,
            human_bytes(total),
            ha="center",
            va="top",
            fontsize=6.5,
            rotation=90 if consumers > 8 else 0,
            gid=f"total.consumer.{c}",
        )
    for p, row in enumerate(matrix):
        ax.text(
            consumers - 0.3,
            p,
            human_bytes(sum(row)),
            ha="left",
            va="center",
            fontsize=6.5,
            gid=f"total.producer.{p}",
        )
    prefill, decode = result.prefill, result.decode
    ax.set_xticks(
        range(consumers),
        [_consumer_label(c, decode.attn_tp, decode.dcp) for c in range(consumers)],
        fontsize=6.5,
    )
    ax.set_yticks(
        range(producers),
        [f"p{p} stage {p // prefill.attn_tp} tp{p % prefill.attn_tp}" for p in range(producers)],
        fontsize=6.5,
    )
    ax.xaxis.tick_top()
    ax.set_xlabel("consumer (decode) rank; totals received below", fontsize=8)
    ax.set_ylabel("producer (prefill) rank; totals sent right", fontsize=8)
    ax.set_xlim(-0.5, consumers + 0.9)
    ax.set_ylim(producers + 0.6, -0.5)
    which = {"all": "bytes", "page": "PAGE bytes (MLA rows)", "slot": "SLOT bytes (KDA state)"}
    ax.set_title(
        f"{result.model.name}: prefill {topology(prefill)} -> decode {topology(decode)} | "
        f"{result.prompt_tokens:,} tokens\n{which[kind]} per pair: {result.num_pairs} pairs, "
        f"{result.num_segments:,} segments, {human_bytes(sum(received))} in all",
        fontsize=9,
    )
    figure.colorbar(image, ax=ax, shrink=0.8, label="bytes")
    return figure
