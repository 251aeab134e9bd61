"""What every picture shares: a figure on the Agg canvas, the colours, byte labels and ``save``.

Figures are built without ``pyplot``: a :class:`~matplotlib.figure.Figure` on its own Agg
canvas, so drawing opens no window and touches no global figure list. Every drawn element a
reader (or a test) needs to find carries a *gid*, ``<what>.<key>...`` (``plane.3``,
``page.linear_attention_0.4``); an SVG keeps it as the element's ``id``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .._args import expect
from .._validation import describe
from ..constants import INT64_MAX
from ..deployment import Deployment
from ..errors import Fact, Refusal
from ..layouts import EngineLayout, Group
from ..layouts.groups import stage_at

PNG_DPI: Final = 150
"""Resolution of a saved PNG."""

FORMATS: Final = (".png", ".svg")
"""The suffixes :func:`save` writes."""

MAX_NAME_BYTES: Final = 255
"""The longest file or folder name a picture path may hold (the common file systems' limit)."""

MAX_PATH_BYTES: Final = 4096
"""The longest picture path (Linux's ``PATH_MAX``)."""

ATTENTION_COLOUR: Final = "#4C72B0"
KDA_COLOURS: Final = ("#55A868", "#DD8452", "#8172B3", "#C44E52", "#937860", "#DA8BC3")
PADDING_FACE: Final = "#e6e6e6"
PADDING_EDGE: Final = "#9a9a9a"
PADDING_HATCH: Final = "////"
FRAME_EDGE: Final = "#c8c8c8"
LABEL_COLOUR: Final = "#ffffff"

CELL_SIZE: Final = 0.88
"""Width and height of a page cell, in plane units (a column is 1 wide, a row 1 high): a cell's
full height stands for the whole plane's bytes."""


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure of ``width_in`` x ``height_in`` inches on an Agg canvas (never a window)."""
    figure = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def group_colours(groups: Sequence[Group]) -> dict[str, str]:
    """A colour per group: attention groups blue, KDA groups from :data:`KDA_COLOURS` in turn."""
    colours: dict[str, str] = {}
    kda = 0
    for group in groups:
        if group.kind == "attention":
            colours[group.name] = ATTENTION_COLOUR
        else:
            colours[group.name] = KDA_COLOURS[kda % len(KDA_COLOURS)]
            kda += 1
    return colours


def drawn_groups(plan: EngineLayout, stage: int | None = None) -> tuple[Group, ...]:
    """The groups a picture of ``plan`` shows: the whole model's, or one stage's that hold
    layers (refuses a ``stage`` that is not a pipeline stage)."""
    if stage is None:
        return tuple(group for group in plan.groups if group.layers)
    return tuple(group for group in stage_at(plan.stages, stage).groups if group.layers)


def human_bytes(num_bytes: float) -> str:
    """``884,736 B`` below a MiB, else ``60.3 MiB`` / ``1.20 GiB``.

    >>> human_bytes(884_736), human_bytes(69 * 814_080 + 24 * 512 * 576)
    ('884,736 B', '60.3 MiB')
    """
    expect("num_bytes", num_bytes, (int, float))
    if isinstance(num_bytes, float) and not math.isfinite(num_bytes):
        raise Refusal(
            "invalid_argument",
            f"num_bytes={num_bytes} is not a byte count",
            facts={"field": "num_bytes"},
            hint="pass a finite number of bytes",
        )
    if abs(num_bytes) > INT64_MAX:
        raise Refusal(
            "size_limit",
            f"num_bytes={describe(num_bytes)} is beyond the bound {INT64_MAX:,}",
            facts={"field": "num_bytes", "bound": INT64_MAX},
            hint="pass a byte count that fits int64",
        )
    if abs(num_bytes) < 1 << 20:
        return f"{num_bytes:,.0f} B"
    if abs(num_bytes) < 1 << 30:
        return f"{num_bytes / (1 << 20):,.1f} MiB"
    return f"{num_bytes / (1 << 30):,.2f} GiB"


def topology(deployment: Deployment) -> str:
    """A deployment's parallelism as ``pp8xtp1`` / ``tp8xdcp8`` (axes of size 1 left out,
    but for TP).

    >>> topology(Deployment(pp=8)), topology(Deployment(attn_tp=8, dcp=8))
    ('pp8xtp1', 'tp8xdcp8')
    """
    expect("deployment", deployment, Deployment)
    axes = (
        ("pp", deployment.pp),
        ("tp", deployment.attn_tp),
        ("dcp", deployment.dcp),
        ("dp", deployment.attn_dp),
    )
    shown = [f"{name}{size}" for name, size in axes if size > 1 or name == "tp"]
    return "x".join(shown)


def deployment_title(model_name: str, deployment: Deployment) -> str:
    """``kimi-k3 | vllm 0.33.0 | tp8 | fp8 | spec 2``: what a picture of one plan shows."""
    return (
        f"{model_name} | {deployment.engine} {deployment.version_run} | {topology(deployment)} | "
        f"{deployment.kv_dtype} | spec {deployment.spec_tokens}"
    )


def page_cell(
    ax: Axes,
    xy: tuple[float, float],
    size: tuple[float, float],
    fill: tuple[float, str],
    gids: tuple[str, str],
) -> None:
    """One page: ``fill = (payload fraction, colour)`` from the bottom of a ``size`` box at
    ``xy``, the rest shaded as padding; ``gids = (payload gid, padding gid)``. A fraction of 0
    draws padding only, of 1 no padding."""
    (x, y), (width, height), (fraction, colour) = xy, size, fill
    payload_gid, padding_gid = gids
    if fraction > 0:
        ax.add_patch(
            Rectangle(
                (x, y),
                width,
                height * fraction,
                facecolor=colour,
                edgecolor="none",
                gid=payload_gid,
            )
        )
    if fraction < 1:
        ax.add_patch(
            Rectangle(
                (x, y + height * fraction),
                width,
                height * (1 - fraction),
                facecolor=PADDING_FACE,
                edgecolor=PADDING_EDGE,
                hatch=PADDING_HATCH,
                linewidth=0.4,
                gid=padding_gid,
            )
        )


def padding_legend_patch() -> Rectangle:
    """The legend entry for shaded padding."""
    return Rectangle(
        (0, 0),
        1,
        1,
        facecolor=PADDING_FACE,
        edgecolor=PADDING_EDGE,
        hatch=PADDING_HATCH,
        label="padding",
    )


def picture_path(path: str | Path) -> Path:
    """``path`` if :func:`save` can write it: a ``str`` or ``Path`` with a ``.png`` or ``.svg``
    suffix, in an existing, writable folder; refuses (``invalid_argument``) anything else (a
    NUL, a name or path too long, a folder), before any drawing is done."""
    expect("path", path, (str, Path))
    target = Path(path)
    suffix, stem = target.suffix.lower(), target.stem
    if suffix not in FORMATS:
        raise Refusal(
            "invalid_argument",
            f"picture {_short(target.name)}: suffix {suffix or '(none)'!r} is not one of "
            f"{', '.join(FORMATS)}",
            facts={"field": "path", "path": _short(target), "suffix": suffix, "formats": FORMATS},
            hint=f"name the file {_short(stem)}.png or {_short(stem)}.svg",
        )
    problem = _unusable(target)
    facts: dict[str, Fact] = {}
    if problem is None:
        try:
            folder_missing = not target.parent.is_dir()
            is_folder = target.is_dir()
        except OSError as error:  # what the OS refuses to look up (a name too long for it)
            problem = f"not a usable path ({error.strerror or error})"
        else:
            if is_folder:
                problem = "is a folder"
            elif folder_missing or not os.access(target.parent, os.W_OK):
                folder = str(target.parent)
                state = "does not exist" if folder_missing else "is not writable"
                problem = f"folder {folder} {state}"
                facts["folder"] = folder
    if problem is not None:
        raise _path_refusal(target, problem, **facts)
    return target


def _unusable(target: Path) -> str | None:
    """Why no OS can open ``target`` whatever its folders hold, or ``None``."""
    text = str(target)
    if "\0" in text:
        return "holds a NUL character"
    try:
        encoded = os.fsencode(text)
    except UnicodeEncodeError:
        return "holds characters the file system cannot encode"
    if len(encoded) > MAX_PATH_BYTES:
        return f"is longer than {MAX_PATH_BYTES:,} bytes"
    if any(len(os.fsencode(part)) > MAX_NAME_BYTES for part in target.parts):
        return f"has a name longer than {MAX_NAME_BYTES} bytes"
    return None


def _path_refusal(target: Path, problem: str, **facts: Fact) -> Refusal:
    return Refusal(
        "invalid_argument",
        f"picture path={_short(target)!r}: {problem}",
        facts={"field": "path", "path": _short(target), **facts},
        hint="write the picture to a .png or .svg file in an existing, writable folder",
    )


def _short(path: str | Path, most: int = 120) -> str:
    text = str(path)
    return text if len(text) <= most else f"{text[: most - 3]}..."


def save(figure: Figure, path: str | Path) -> Path:
    """Write ``figure`` as PNG or SVG, chosen by the suffix of ``path``; returns the path.

    SVG keeps text as text and every gid as an element id; neither format records a date, so
    the same picture gives the same bytes. Refuses (``invalid_argument``) a ``figure`` that is
    not a ``Figure``, a path :func:`picture_path` refuses and one the OS cannot write.
    """
    expect("figure", figure, Figure)
    target = picture_path(path)
    suffix = target.suffix.lower()
    metadata: dict[str, str | None] = (
        {"Software": None} if suffix == ".png" else {"Date": None, "Creator": None}
    )
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "k3layout"}):
        try:
            figure.savefig(target, format=suffix[1:], dpi=PNG_DPI, metadata=metadata)
        except OSError as error:  # the write itself failed: permissions, a full disk
            raise _path_refusal(target, f"cannot be written ({error.strerror or error})") from None
    return target
