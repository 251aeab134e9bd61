"""``k3layout plan``: one plan as a table, or ``--json`` as its report."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from ..constants import MAX_KV_MEMORY_GIB
from ..engines.sglang import SglangCapacity, SglangPlan
from ..engines.vllm import VllmPlan
from ..engines.vllm.capacity import VllmCapacity
from ..engines.vllm.rules import MAMBA_CACHE_MODES
from ..errors import Refusal
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
        help="KV memory per rank: also print blocks / parents and token capacity (sglang: "
        "the memory SGLang's KVCacheConfigurator divides, and its capacity)",
    )
    parser.add_argument("--max-live", type=int, default=1, help="live requests (parent capacity)")
    parser.add_argument(
        "--mamba-cache-mode",
        dest="vllm_mamba_cache_mode",
        choices=MAMBA_CACHE_MODES,
        default=None,
        help="as vLLM 0.33's deprecated flag: align or none, resolved by prefix caching "
        "(on: align, off: none)",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="tokens of one request (vllm, with --kv-memory-gib: num_blocks, blocks per "
        "request by group and max concurrency, as vLLM counts them; sglang: its context "
        "length, default the model's)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan report as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Plan and print; exit 2 on a refusal."""

    def action() -> int:
        result = plan(model_from_args(args), deployment_from_args(args))
        budget = None if args.kv_memory_gib is None else budget_bytes(args.kv_memory_gib)
        capacity = capacity_of(result, budget, args.max_model_len)
        if args.json:
            print(report(result, capacity).model_dump_json(indent=2))
            return 0
        if args.max_live < 1:
            raise Refusal(
                "invalid_argument",
                f"--max-live={args.max_live}: must be >= 1 (live requests)",
                facts={"field": "max_live", "option": "--max-live"},
                hint="pass --max-live 1 or more",
            )
        show(result, budget, args.max_live, capacity)
        return 0

    return run_refusing(action, args.json)


def capacity_of(
    result: EngineLayout, budget: int | None, max_model_len: int | None
) -> VllmCapacity | SglangCapacity | None:
    """The engine's capacity of ``budget``: vLLM's at ``max_model_len`` (both given),
    SGLang's with a budget (at ``max_model_len`` or the model's context)."""
    if isinstance(result, SglangPlan):
        if budget is None:
            if max_model_len is not None:
                raise Refusal(
                    "invalid_argument",
                    "--max-model-len sets SGLang's context for its capacity: it needs "
                    "--kv-memory-gib",
                    facts={"field": "max_model_len", "option": "--max-model-len"},
                    hint="add --kv-memory-gib G",
                )
            return None
        return result.capacity(budget, max_model_len)
    if max_model_len is None:
        return None
    if budget is None or not isinstance(result, VllmPlan):
        raise Refusal(
            "invalid_argument",
            "--max-model-len counts vLLM's capacity: it needs --kv-memory-gib and --engine vllm",
            facts={"field": "max_model_len", "option": "--max-model-len"},
            hint="add --kv-memory-gib G (and --engine vllm)",
        )
    return result.capacity(budget, max_model_len)


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


def _size_rows(result: EngineLayout) -> list[tuple[str, str]]:
    sizes = result.sizes
    tp = sizes.attn_tp
    rows = [
        ("attention bytes / token / layer", thousands(sizes.attention_bytes_per_token)),
        ("attention page (128 tokens)", thousands(sizes.attention_page_bytes())),
    ]
    target = {sizes.layer_specs[i] for i in range(result.model.num_layers)}
    for index, spec in enumerate(sizes.specs):
        per = "token" if spec.paging == "token" else "slot"
        whose = "" if index in target else "draft "
        for part in spec.parts:
            rows.append(
                (
                    f"{whose}{spec.kind.upper()} {part.name} / {per}",
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


def show(
    result: EngineLayout,
    budget_bytes: int | None,
    max_live: int,
    capacity: VllmCapacity | SglangCapacity | None = None,
) -> None:
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
    if isinstance(capacity, SglangCapacity):
        rows += [("context (--max-model-len)", f"{capacity.max_model_len:,}"), *capacity.rows()]
    elif budget_bytes is not None:
        rows += result.capacity_summary(budget_bytes, max_live)
    if isinstance(capacity, VllmCapacity):
        rows += [
            (
                f"blocks / request of {capacity.max_model_len:,} tokens",
                " + ".join(str(g.blocks) for g in capacity.blocks_per_request)
                + f" = {capacity.total_blocks_per_request}",
            ),
            (
                "KDA cache mode / prefill kernel",
                f"{capacity.mamba_cache_mode} / {capacity.kda_prefill_backend or '-'}",
            ),
            ("max concurrency", f"{capacity.max_concurrency:,.2f}"),
        ]
    out.print(summary_table(rows))
    out.print(_groups_table(result))
    if len(result.stages) > 1:
        out.print(_stages_table(result))
