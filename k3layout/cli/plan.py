"""``k3layout plan``: one plan as a table, or ``--json`` as its report."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..layouts import EngineLayout, plan
from ..layouts.report import report
from .common import (
    add_deployment_options,
    add_model_options,
    console,
    deployment_from_args,
    format_layers,
    model_from_args,
    new_table,
    run_refusing,
    summary_table,
    thousands,
)

if TYPE_CHECKING:
    from rich.table import Table

GIB = 1 << 30


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``plan`` to the command line."""
    parser = subparsers.add_parser("plan", help="plan one deployment and print the layout")
    add_model_options(parser)
    add_deployment_options(parser)
    parser.add_argument(
        "--kv-memory-gib",
        type=float,
        default=None,
        help="KV memory per rank: also print blocks / parents and token capacity",
    )
    parser.add_argument("--max-live", type=int, default=1, help="live requests (parent capacity)")
    parser.add_argument("--json", action="store_true", help="print the plan report as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Plan and print; exit 2 on a refusal."""

    def action() -> int:
        result = plan(model_from_args(args), deployment_from_args(args))
        if args.json:
            print(report(result).model_dump_json(indent=2))
            return 0
        budget = None if args.kv_memory_gib is None else int(args.kv_memory_gib * GIB)
        show(result, budget, args.max_live)
        return 0

    return run_refusing(action, args.json)


def _size_rows(result: EngineLayout) -> list[tuple[str, str]]:
    sizes = result.sizes
    tp = sizes.attn_tp
    rows = [
        ("attention bytes / token / layer", thousands(sizes.attention_bytes_per_token)),
        ("attention page (128 tokens)", thousands(sizes.attention_page_bytes())),
    ]
    for spec in sizes.specs:
        per = "token" if spec.paging == "token" else "slot"
        for part in spec.parts:
            rows.append(
                (
                    f"{spec.kind.upper()} {part.name} / {per}",
                    f"{thousands(part.local_bytes(tp))}  {part.engine_shape(tp)} {part.dtype}",
                )
            )
    if sizes.state is not None:
        rows.append(
            (f"{sizes.state.kind.upper()} state S(tp, s) / layer", thousands(sizes.state_bytes))
        )
    return rows


def _groups_table(result: EngineLayout) -> Table:
    table = new_table("groups")
    for column in ("group", "kind", "layers", "module layers"):
        table.add_column(column)
    extra = result.group_columns()
    columns = list(next(iter(extra.values()), {}))
    for column in columns:
        table.add_column(column, justify="right")
    for group in result.groups:
        row = [group.name, group.kind, str(len(group.layers)), format_layers(group.layers)]
        table.add_row(*row, *(extra[group.name][c] for c in columns))
    return table


def _stages_table(result: EngineLayout) -> Table:
    table = new_table("pipeline stages")
    for column in ("stage", "module layers", "planes", "bytes / block or parent"):
        table.add_column(column)
    for stage in result.stages:
        table.add_row(
            str(stage.index),
            format_layers(stage.layers),
            str(stage.num_planes),
            thousands(result.stage_block_bytes(stage.index)),
        )
    return table


def show(result: EngineLayout, budget_bytes: int | None, max_live: int) -> None:
    """Print a plan as tables: sizes and layout, groups, and stages (with PP)."""
    out = console()
    d = result.deployment
    out.print(
        f"{result.model.name} | engine {result.engine} | attn_tp {d.attn_tp} x dp {d.attn_dp} | "
        f"pp {d.pp} | dcp {d.dcp} | {d.kv_dtype} | spec {d.spec_tokens}",
        style="bold",
    )
    rows = _size_rows(result) + result.summary()
    rows.append(("bytes / token", f"{result.bytes_per_token:,.1f}"))
    if budget_bytes is not None:
        rows += result.capacity_summary(budget_bytes, max_live)
    out.print(summary_table(rows))
    out.print(_groups_table(result))
    if len(result.stages) > 1:
        out.print(_stages_table(result))
