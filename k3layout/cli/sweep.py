"""``k3layout sweep``: attention TP x dtype for both engines side by side."""

from __future__ import annotations

import argparse
import json

from ..errors import Refusal
from ..layouts import plan, with_engine
from ..layouts.recommend import most_served
from ..registry import engine_names
from ..sweep import SweepCell, default_attn_tps, sweep
from .common import (
    add_deployment_options,
    add_model_options,
    console,
    deployment_from_args,
    model_from_args,
    new_table,
    parse_dtypes,
    parse_ints,
    run_refusing,
)
from .plan import budget_bytes


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sweep`` to the command line."""
    parser = subparsers.add_parser("sweep", help="attention TP x dtype grid for both engines")
    add_model_options(parser)
    add_deployment_options(parser, engine=False)
    parser.add_argument("--tps", default=None, help="comma-separated attention TPs")
    parser.add_argument("--dtypes", default="fp8,bf16", help="comma-separated cache dtypes")
    parser.add_argument(
        "--kv-memory-gib",
        type=float,
        default=None,
        help="sweep requests against context length for this KV memory per rank instead: "
        "each engine's most requests of each context, with its recommended flags",
    )
    parser.add_argument(
        "--contexts",
        default="4096,16384,65536,131072,262144,524288,1048576",
        help="comma-separated context lengths (with --kv-memory-gib)",
    )
    parser.add_argument("--json", action="store_true", help="print the cells as JSON")
    parser.set_defaults(run=run)


def _requests(args: argparse.Namespace) -> int:
    """Requests against context for one budget, every engine: the most requests of each
    context the engine serves with its recommended flags (``recommend``), and those flags."""
    model = model_from_args(args)
    memory = budget_bytes(args.kv_memory_gib)
    contexts = parse_ints(args.contexts, "--contexts")
    base = deployment_from_args(args)
    rows: list[dict[str, object]] = []
    for engine in engine_names():
        try:
            result = plan(model, with_engine(base, engine))
        except Refusal as refusal:
            rows += [
                {
                    "engine": engine,
                    "max_model_len": n,
                    "max_requests": None,
                    "refusal": refusal.code,
                }
                for n in contexts
            ]
            continue
        for length in contexts:
            row: dict[str, object] = {"engine": engine, "max_model_len": length}
            try:
                best = most_served(result, length, memory)
            except Refusal as refusal:
                rows.append({**row, "max_requests": None, "refusal": refusal.code})
                continue
            if best is None:
                rows.append({**row, "max_requests": 0, "refusal": None})
                continue
            rows.append(
                {
                    **row,
                    "max_requests": best.requests,
                    "refusal": None,
                    "flags": best.command_line,
                    "unused_bytes": best.unused_bytes,
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = new_table(f"{model.name}: requests held at once, {args.kv_memory_gib:g} GiB per rank")
    table.add_column("context", justify="right")
    table.add_column("engine")
    table.add_column("requests", justify="right")
    table.add_column("flags")
    for row in rows:
        held = row["max_requests"]
        shown = f"[red]refused: {row['refusal']}[/red]" if held is None else f"{held:,}"
        table.add_row(
            f"{row['max_model_len']:,}", str(row["engine"]), shown, str(row.get("flags", ""))
        )
    console().print(table)
    return 0


def _cell_text(cell: SweepCell) -> str:
    if cell.refusal is not None:
        return f"[red]refused: {cell.refusal}[/red]"
    return f"{cell.packing} | pad {cell.padding:.3f} | {cell.bytes_per_token:,.0f} B/tok"


def run(args: argparse.Namespace) -> int:
    """Sweep and print; exit 0 (refused points are cells, not failures)."""

    def action() -> int:
        if args.kv_memory_gib is not None:
            return _requests(args)
        model = model_from_args(args)
        tps = default_attn_tps(model) if args.tps is None else parse_ints(args.tps, "--tps")
        dtypes = parse_dtypes(args.dtypes)
        cells = sweep(model, tps, dtypes, None, deployment_from_args(args))
        if args.json:
            print(json.dumps([cell.model_dump(mode="json") for cell in cells], indent=2))
            return 0
        table = new_table(f"{model.name}: attention TP x engine x dtype")
        table.add_column("attn_tp", justify="right")
        table.add_column("engine")
        for dtype in dtypes:
            table.add_column(dtype)
        by_key = {(c.engine, c.kv_dtype, c.attn_tp): c for c in cells}
        for tp in tps:  # one row per engine: the table stays readable as engines are added
            for engine in engine_names():
                cells_of = [_cell_text(by_key[(engine, dtype, tp)]) for dtype in dtypes]
                table.add_row(str(tp), engine, *cells_of)
        console().print(table)
        return 0

    return run_refusing(action, args.json)
