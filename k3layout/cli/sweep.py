"""``k3layout sweep``: attention TP x dtype for both engines side by side."""

from __future__ import annotations

import argparse
import json

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


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sweep`` to the command line."""
    parser = subparsers.add_parser("sweep", help="attention TP x dtype grid for both engines")
    add_model_options(parser)
    add_deployment_options(parser, engine=False)
    parser.add_argument("--tps", default=None, help="comma-separated attention TPs")
    parser.add_argument("--dtypes", default="fp8,bf16", help="comma-separated cache dtypes")
    parser.add_argument("--json", action="store_true", help="print the cells as JSON")
    parser.set_defaults(run=run)


def _cell_text(cell: SweepCell) -> str:
    if cell.refusal is not None:
        return f"[red]refused: {cell.refusal}[/red]"
    return f"{cell.packing} | pad {cell.padding:.3f} | {cell.bytes_per_token:,.0f} B/tok"


def run(args: argparse.Namespace) -> int:
    """Sweep and print; exit 0 (refused points are cells, not failures)."""

    def action() -> int:
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
