"""``k3layout sweep``: attention TP x dtype for both engines side by side."""

from __future__ import annotations

import argparse
import json

from ..errors import Refusal
from ..layouts import plan, with_engine
from ..layouts.recommend import gpu_budget, most_served
from ..registry import engine_names
from ..sweep import SweepCell, default_attn_tps, sweep
from .common import (
    GIB,
    add_deployment_options,
    add_memory_options,
    add_model_options,
    console,
    deployment_from_args,
    model_from_args,
    new_table,
    parse_dtypes,
    parse_ints,
    run_refusing,
)

DEFAULT_CONTEXTS = "4096,16384,65536,131072,262144,524288,1048576"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sweep`` to the command line."""
    parser = subparsers.add_parser("sweep", help="attention TP x dtype grid for both engines")
    add_model_options(parser)
    add_deployment_options(parser, engine=False)
    parser.add_argument("--tps", default=None, help="comma-separated attention TPs")
    parser.add_argument("--dtypes", default="fp8,bf16", help="comma-separated cache dtypes")
    add_memory_options(
        parser,
        kv_help="sweep requests against context length for this KV memory per rank (GiB) "
        "instead: each engine's most requests of each context, with its recommended flags",
    )
    parser.add_argument(
        "--contexts",
        default=None,
        help="comma-separated context lengths: sweep requests against context length in the "
        "KV budget the memory options give (each engine's default on --gpu without one); "
        "default 4096,...,1048576 with a memory option",
    )
    parser.add_argument("--json", action="store_true", help="print the cells as JSON")
    parser.set_defaults(run=run)


def _requests(args: argparse.Namespace) -> int:
    """Requests against context for one budget, every engine: the most requests of each
    context the engine serves with its recommended flags (``recommend``), and those flags."""
    model = model_from_args(args)
    contexts = parse_ints(args.contexts or DEFAULT_CONTEXTS, "--contexts")
    base = deployment_from_args(args)
    rows: list[dict[str, object]] = []
    for engine in engine_names():
        try:  # the engine's plan, and the KV budget its GPU gives
            result = plan(model, with_engine(base, engine))
            budget = gpu_budget(result, None)
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
        memory = budget.kv_memory_bytes if budget is not None else base.kv_memory_bytes
        assert memory is not None  # gpu_budget gives None only with a KV budget
        for length in contexts:
            row: dict[str, object] = {
                "engine": engine,
                "max_model_len": length,
                "kv_memory_bytes": memory,
            }
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
    table = new_table(f"{model.name}: requests held at once in each engine's KV budget per rank")
    table.add_column("context", justify="right")
    table.add_column("engine")
    table.add_column("KV per rank", justify="right")
    table.add_column("requests", justify="right")
    table.add_column("flags")
    for row in rows:
        held = row["max_requests"]
        shown = f"[red]refused: {row['refusal']}[/red]" if held is None else f"{held:,}"
        kv = row.get("kv_memory_bytes")
        table.add_row(
            f"{row['max_model_len']:,}",
            str(row["engine"]),
            "" if kv is None else f"{int(str(kv)) / GIB:,.2f} GiB",
            shown,
            str(row.get("flags", "")),
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
        memory = ("kv_memory_gib", "gpu_memory_utilization", "mem_fraction_static")
        if args.contexts is not None or any(getattr(args, n) is not None for n in memory):
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
