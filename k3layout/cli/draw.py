"""``k3layout draw``: write a picture of a plan as PNG or SVG (needs ``k3layout[draw]``).

    k3layout draw planes   [model and deployment options] [--stage N]      -o planes.png
    k3layout draw image    [model and deployment options] [--stage N]      -o image.svg
    k3layout draw order    [model and deployment options] [--stage N]      -o order.png
    k3layout draw transfer --prefill pp8xtp1 --decode tp8xdcp8 [--kind page] -o transfer.svg
    k3layout draw segments --prefill pp8xtp1 --decode tp8xdcp8             -o segments.png
    k3layout draw sweep    [model options] [--tps 1,2,4,8] [--quantity bytes_per_token] -o s.png

The suffix of ``-o`` picks the format. What the picture shows is planned first, so a refusal
exits 2 like every command, with or without matplotlib; a missing matplotlib then exits 1
naming the extra to install.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TypeAlias, cast

from ..errors import Refusal
from ..layouts import EngineLayout, plan
from ..offload import checkpoint_image, plane_order
from ..sweep import RequestsCell, SweepCell, default_attn_tps, requests_sweep, sweep
from ..transfer import TransferPlan
from .common import (
    add_deployment_options,
    add_memory_options,
    add_model_options,
    deployment_from_args,
    model_from_args,
    parse_dtypes,
    parse_ints,
    run_refusing,
)
from .transfer import add_transfer_options, transfer_from_args

if TYPE_CHECKING:
    from matplotlib.figure import Figure

EXIT_MISSING_EXTRA = 1

PICTURES = ("planes", "image", "order", "transfer", "segments", "sweep")
"""The pictures ``k3layout draw`` writes."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``draw`` and its pictures to the command line."""
    parser = subparsers.add_parser("draw", help="write a picture of a layout as PNG or SVG")
    pictures = parser.add_subparsers(dest="picture", required=True)
    helps = {
        "planes": "the planes of one block (vllm) or parent (parent), padding shaded",
        "image": "the checkpoint image of one boundary: units over planes (vllm)",
        "order": "the PAGE plane order: aliased attention layers first (vllm)",
    }
    for name, text in helps.items():
        sub = pictures.add_parser(name, help=text)
        add_model_options(sub)
        add_deployment_options(sub)
        sub.add_argument(
            "--stage",
            type=int,
            default=None if name == "planes" else 0,
            help="pipeline stage"
            + (" (default: the whole model)" if name == "planes" else " (default 0)"),
        )
        _add_output(sub)
    for name, text in (
        ("transfer", "a transfer as a producer x consumer matrix of bytes"),
        ("segments", "which producer writes each (consumer rank, module layer)"),
    ):
        sub = pictures.add_parser(name, help=text)
        add_transfer_options(sub)
        if name == "transfer":
            sub.add_argument(
                "--kind",
                choices=("all", "page", "slot"),
                default="all",
                help="count every byte, PAGE (MLA rows) or SLOT (KDA state) bytes",
            )
        _add_output(sub)
    sub = pictures.add_parser(
        "requests", help="requests held at once against context length, one line per engine"
    )
    add_model_options(sub)
    add_deployment_options(sub, engine=False)
    add_memory_options(
        sub,
        kv_help="KV memory per rank in GiB (default: each engine's on --gpu, from its memory "
        "flag or default, checked against the GPU with the weights)",
    )
    sub.add_argument(
        "--contexts",
        default="4096,16384,65536,131072,262144,524288,1048576",
        help="comma-separated context lengths (tokens per request)",
    )
    _add_output(sub)
    sub = pictures.add_parser("sweep", help="padding or bytes per token: attention TP x dtype")
    add_model_options(sub)
    add_deployment_options(sub, engine=False)
    sub.add_argument("--tps", default=None, help="comma-separated attention TPs")
    sub.add_argument("--dtypes", default="fp8,bf16", help="comma-separated cache dtypes")
    sub.add_argument("--quantity", choices=("padding", "bytes_per_token"), default="padding")
    _add_output(sub)
    parser.set_defaults(run=run)


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--output", required=True, help="the picture to write: a .png or .svg path"
    )


Planned: TypeAlias = TransferPlan | tuple[SweepCell, ...] | tuple[RequestsCell, ...] | EngineLayout


def planned(args: argparse.Namespace) -> tuple[Planned, str]:
    """What the picture shows and its title, planned before matplotlib is imported, so that a
    refusal exits 2 with or without the draw extra."""
    if args.picture in ("transfer", "segments"):
        return transfer_from_args(args), ""
    model = model_from_args(args)
    if args.picture == "requests":
        contexts = parse_ints(args.contexts, "--contexts")
        return requests_sweep(model, None, contexts, deployment_from_args(args)), ""
    if args.picture == "sweep":
        tps = default_attn_tps(model) if args.tps is None else parse_ints(args.tps, "--tps")
        cells = sweep(model, tps, parse_dtypes(args.dtypes), None, deployment_from_args(args))
        return cells, f"{model.name}: {args.quantity}"
    result = plan(model, deployment_from_args(args))
    if args.picture == "image":
        # refuses a parent plan, or a stage whose state cannot ride
        checkpoint_image(result, stage=args.stage)
    elif args.picture == "order":
        plane_order(result, stage=args.stage)
    return result, ""


def picture(args: argparse.Namespace, source: Planned, title: str) -> Figure:
    """The figure of ``source`` (imports :mod:`k3layout.draw`, so matplotlib)."""
    from .. import draw  # noqa: PLC0415 - matplotlib only when a picture is asked for

    if isinstance(source, TransferPlan):
        if args.picture == "transfer":
            return draw.draw_transfer(source, kind=args.kind)
        return draw.draw_segment_map(source)
    if isinstance(source, tuple) and args.picture == "requests":
        return draw.draw_requests(cast(tuple[RequestsCell, ...], source))
    if isinstance(source, tuple):
        return draw.draw_sweep(
            cast(tuple[SweepCell, ...], source), quantity=args.quantity, title=title
        )
    if args.picture == "image":
        return draw.draw_image(source, stage=args.stage)
    if args.picture == "order":
        return draw.draw_plane_order(source, stage=args.stage)
    return draw.draw_planes(source, stage=args.stage)


def run(args: argparse.Namespace) -> int:
    """Plan, draw and write the picture, print its path; exit 2 on a refusal, 1 without
    matplotlib."""

    def action() -> int:
        source, title = planned(args)
        try:
            from ..draw import picture_path, save  # noqa: PLC0415 - matplotlib only on demand
        except ImportError as error:
            print(f"k3layout draw: {error}", file=sys.stderr)
            return EXIT_MISSING_EXTRA
        target = picture_path(args.output)
        figure = picture(args, source, title)
        try:
            written = save(figure, target)
        except OSError as error:  # unwritable: permissions, a read-only or full disk
            raise Refusal(
                "invalid_argument",
                f"-o {target}: cannot be written ({error.strerror or error})",
                facts={"field": "output", "option": "--output", "path": str(target)},
                hint="write the picture to a folder you can write to",
            ) from None
        print(written)
        return 0

    return run_refusing(action, False)
