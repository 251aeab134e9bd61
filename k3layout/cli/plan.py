"""``k3layout plan``: one plan as a table, or ``--json`` as its report."""

from __future__ import annotations

import argparse
import math

from rich.table import Table

from ..constants import MAX_KV_MEMORY_GIB
from ..errors import Refusal
from ..layouts import ParentPlan, VllmPlan, plan
from ..layouts.report import report
from .common import (
    add_deployment_options,
    add_model_options,
    console,
    deployment_from_args,
    format_layers,
    model_from_args,
    run_refusing,
    summary_table,
    thousands,
)

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
        budget = None if args.kv_memory_gib is None else budget_bytes(args.kv_memory_gib)
        if args.max_live < 1:
            raise Refusal(
                "invalid_argument",
                f"--max-live={args.max_live}: must be >= 1 (live requests)",
                facts={"field": "max_live", "option": "--max-live"},
                hint="pass --max-live 1 or more",
            )
        show(result, budget, args.max_live)
        return 0

    return run_refusing(action, args.json)


def budget_bytes(gib: float) -> int:
    """``--kv-memory-gib`` in bytes; NaN, infinity, a negative or an over-large value is
    refused naming the option."""
    if not math.isfinite(gib) or gib < 0:
        raise Refusal(
            "invalid_argument",
            f"--kv-memory-gib={gib}: must be a finite number of GiB >= 0",
            facts={"field": "kv_memory_gib", "option": "--kv-memory-gib"},
            hint="pass the KV memory per rank in GiB, e.g. --kv-memory-gib 40",
        )
    if gib > MAX_KV_MEMORY_GIB:
        raise Refusal(
            "size_limit",
            f"--kv-memory-gib={gib:g}: above the bound {MAX_KV_MEMORY_GIB:,.0f} GiB",
            facts={
                "field": "kv_memory_gib",
                "option": "--kv-memory-gib",
                "bound": MAX_KV_MEMORY_GIB,
            },
            hint=f"use --kv-memory-gib <= {MAX_KV_MEMORY_GIB:,.0f}",
        )
    return int(gib * GIB)


def _size_rows(result: VllmPlan | ParentPlan) -> list[tuple[str, str]]:
    sizes = result.sizes
    rows = [
        ("MLA bytes / token / layer", thousands(sizes.attention.bytes_per_token)),
        ("MLA page (128 tokens)", thousands(sizes.attention.page_bytes())),
    ]
    if sizes.kda is not None:
        kda = sizes.kda
        rows += [
            (
                "KDA conv state (q|k|v)",
                f"{thousands(kda.conv_bytes)}  {kda.conv_shape('channel_major')}",
            ),
            ("KDA recurrent state", f"{thousands(kda.recurrent_bytes)}  {kda.recurrent_shape}"),
            ("KDA state S(tp, s) / layer", thousands(kda.state_bytes)),
        ]
    return rows


def _layout_rows(result: VllmPlan | ParentPlan) -> list[tuple[str, str]]:
    if isinstance(result, VllmPlan):
        return [
            ("block tokens", thousands(result.block_tokens)),
            ("page bytes (per layer)", thousands(result.page_bytes)),
            ("planes (group_size)", thousands(result.num_planes)),
            ("block bytes", thousands(result.block_bytes)),
            ("KDA page padding bytes", thousands(result.kda_page_padding_bytes)),
            (
                "spans: attention / KDA tokens",
                f"{thousands(result.attention_span_tokens)} / {thousands(result.kda_span_tokens)}",
            ),
        ]
    rows = [
        ("planes", thousands(result.num_planes)),
        ("packing p_m / p_l", f"{result.packing.mla_pages} / {result.packing.state_pages}"),
        ("plane bytes", thousands(result.packing.plane_bytes)),
        ("parent bytes", thousands(result.parent_bytes)),
        ("padding limit", "none" if result.max_padding is None else f"{result.max_padding:g}"),
    ]
    rule = result.rule_1152
    if rule is not None:
        verdict = "chosen" if rule.chosen else f"passed over: {rule.reason}"
        rows.append(("#1152 rule", f"{rule.mla_pages}/{rule.state_pages}, {verdict}"))
    return rows


def _capacity_rows(
    result: VllmPlan | ParentPlan, budget_bytes: int, max_live: int
) -> list[tuple[str, str]]:
    if isinstance(result, VllmPlan):
        blocks = result.num_blocks(budget_bytes)
        return [
            ("blocks in budget", thousands(blocks)),
            ("attention tokens", thousands(blocks * result.attention_span_tokens)),
        ]
    parents = result.parents_for_budget(budget_bytes)
    return [
        ("parents in budget (+1 null)", thousands(parents)),
        (
            f"token capacity (max_live {max_live})",
            thousands(result.token_capacity(parents, max_live)),
        ),
    ]


def _groups_table(result: VllmPlan | ParentPlan) -> Table:
    table = Table(title="groups", title_justify="left")
    for column in ("group", "kind", "layers", "module layers"):
        table.add_column(column)
    if isinstance(result, ParentPlan):
        for column in ("pages / parent", "padding", "utilization"):
            table.add_column(column, justify="right")
    for group in result.groups:
        row = [group.name, group.kind, str(len(group.layers)), format_layers(group.layers)]
        if isinstance(result, ParentPlan):
            row += [
                str(result.packing_by_group[group.name]),
                f"{result.padding_fraction[group.name]:.3f}",
                f"{result.utilization[group.name]:.3f}",
            ]
        table.add_row(*row)
    return table


def _stages_table(result: VllmPlan | ParentPlan) -> Table:
    table = Table(title="pipeline stages", title_justify="left")
    for column in ("stage", "module layers", "planes", "bytes / block or parent"):
        table.add_column(column)
    for stage in result.stages:
        unit = (
            result.stage_block_bytes(stage.index)
            if isinstance(result, VllmPlan)
            else result.stage_parent_bytes(stage.index)
        )
        table.add_row(
            str(stage.index), format_layers(stage.layers), str(stage.num_planes), thousands(unit)
        )
    return table


def show(result: VllmPlan | ParentPlan, budget_bytes: int | None, max_live: int) -> None:
    """Print a plan as tables: sizes and layout, groups, and stages (with PP)."""
    out = console()
    d = result.deployment
    out.print(
        f"{result.model.name} | engine {result.engine} | attn_tp {d.attn_tp} x dp {d.attn_dp} | "
        f"pp {d.pp} | dcp {d.dcp} | {d.kv_dtype} | spec {d.spec_tokens}",
        style="bold",
    )
    rows = _size_rows(result) + _layout_rows(result)
    rows.append(("bytes / token", f"{result.bytes_per_token:,.1f}"))
    if budget_bytes is not None:
        rows += _capacity_rows(result, budget_bytes, max_live)
    out.print(summary_table(rows))
    out.print(_groups_table(result))
    if len(result.stages) > 1:
        out.print(_stages_table(result))
