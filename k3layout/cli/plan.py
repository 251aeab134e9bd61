"""``k3layout plan``: one plan as a table, or ``--json`` as its report."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..engines.vllm.rules import MAMBA_CACHE_MODES
from ..errors import Refusal
from ..layouts import EngineLayout, plan
from ..layouts.answer import RequestCapacity
from ..layouts.recommend import gpu_budget
from ..layouts.report import report
from ..memory import MemoryBudget, gib
from .common import (
    add_deployment_options,
    add_memory_options,
    add_model_options,
    console,
    deployment_from_args,
    format_layers,
    gib_bytes,
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
    add_memory_options(
        parser,
        kv_help="KV memory per rank in GiB: print how many requests of --max-model-len tokens "
        "it holds at once, checked against the GPU with the weights (default: what the "
        "engine's memory flag gives on --gpu, when a capacity is asked)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests of --max-model-len tokens held at once: print the least KV memory per "
        "rank that holds them",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="tokens of one request (default: the model's context, as every engine defaults)",
    )
    parser.add_argument(
        "--max-live",
        type=int,
        default=None,
        help="tokenspeed only: live requests its sizing is for (its max_bs; default: the most "
        "requests of --max-model-len the memory holds)",
    )
    parser.add_argument(
        "--mamba-cache-mode",
        dest="vllm_mamba_cache_mode",
        choices=MAMBA_CACHE_MODES,
        default=None,
        help="as vLLM 0.33's deprecated flag: align or none, resolved by prefix caching "
        "(on: align, off: none)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan report as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Plan and print; exit 2 on a refusal."""

    def action() -> int:
        result = plan(model_from_args(args), deployment_from_args(args))
        capacity, budget = capacity_of(result, args)
        if args.json:
            print(report(result, capacity, budget).model_dump_json(indent=2))
            return 0
        show(result, capacity, args.requests, budget)
        return 0

    return run_refusing(action, args.json)


def _sets_memory(result: EngineLayout) -> bool:
    d = result.deployment
    return any(
        value is not None
        for value in (d.kv_memory_bytes, d.gpu_memory_utilization, d.mem_fraction_static)
    )


def capacity_of(
    result: EngineLayout, args: argparse.Namespace
) -> tuple[RequestCapacity | None, MemoryBudget | None]:
    """The engine's capacity the options ask, and the GPU's budget it stands on: at the least
    memory that holds ``--requests`` requests, or at the KV budget the memory options give
    (``--kv-memory-gib``, the engine's memory flag, else its default on ``--gpu``), at
    ``--max-model-len`` (default: the model's); none where no capacity is asked."""
    if args.max_live is not None and result.engine != "tokenspeed":
        raise Refusal(
            "engine_setting",
            f"--max-live sizes tokenspeed's arena; engine={result.engine} sizes its own "
            "(vLLM by --max-num-seqs at start, SGLang by --max-running-requests)",
            facts={"field": "max_live", "option": "--max-live", "engine": result.engine},
            hint="drop --max-live, or use --engine tokenspeed",
        )
    if args.max_live is not None and args.max_live < 1:
        raise Refusal(
            "invalid_argument",
            f"--max-live={args.max_live}: must be >= 1 (live requests)",
            facts={"field": "max_live", "option": "--max-live"},
            hint="pass --max-live 1 or more",
        )
    if _sets_memory(result) and args.requests is not None:
        raise Refusal(
            "invalid_argument",
            "a memory option asks what a memory holds, --requests the memory that holds them: "
            "give one",
            facts={"field": "requests", "option": "--requests"},
            hint="drop the memory option (--kv-memory-gib, --gpu-memory-utilization, "
            "--mem-fraction-static) or --requests",
        )
    extra = {} if args.max_live is None else {"max_live": args.max_live}
    if args.requests is not None:
        needed = result.memory_for(args.requests, args.max_model_len)
        budget = gpu_budget(result, needed)
        answer: RequestCapacity = result.capacity(needed, args.max_model_len, **extra)
        return answer, budget
    asked = args.max_model_len is not None or args.max_live is not None
    if not (asked or _sets_memory(result)):
        return None, None
    budget = gpu_budget(result, None)
    memory = budget.kv_memory_bytes if budget is not None else result.deployment.kv_memory_bytes
    answer = result.capacity(memory, args.max_model_len, **extra)
    return answer, budget


def budget_bytes(gib: float) -> int:
    """``--kv-memory-gib`` in bytes (refused as :func:`~.common.gib_bytes` refuses)."""
    return gib_bytes(gib, "--kv-memory-gib")


def _size_rows(result: EngineLayout) -> list[tuple[str, str]]:
    sizes = result.sizes
    tp = sizes.attn_tp
    rows = [
        ("attention bytes / token / layer", thousands(sizes.attention_bytes_per_token)),
        ("attention page (128 tokens)", thousands(sizes.attention_page_bytes())),
    ]
    target = {sizes.layer_specs[i] for i in range(result.model.num_layers)}
    # the rings where the engine keeps them in a group of their own (vLLM's packed layout)
    rings = sizes.ring if result.groups_of("ring") else None
    sides = [(spec, "") for spec in (rings, sizes.replay) if spec is not None]
    for spec, whose in [
        *((spec, "" if index in target else "draft ") for index, spec in enumerate(sizes.specs)),
        *sides,
    ]:
        for part in spec.parts:
            per = "slot" if spec.paging == "slot" else "token"
            if part.tokens_per_row > 1:  # a pooled part: a row per that many tokens
                per = f"{part.tokens_per_row} tokens"
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
    capacity: RequestCapacity | None,
    requests: int | None,
    budget: MemoryBudget | None = None,
) -> None:
    """Print a plan as tables: sizes and layout, groups, stages (with PP), and the capacity
    the options asked with the GPU's budget behind it."""
    out = console()
    d = result.deployment
    out.print(
        f"{result.model.name} | engine {result.engine} {d.version_run} | attn_tp {d.attn_tp} "
        f"x dp {d.attn_dp} | "
        f"pp {d.pp} | dcp {d.dcp} | {d.kv_dtype} | spec {d.spec_tokens} | {d.gpu}",
        style="bold",
    )
    # Under PP the layout's rows are the whole model's; each stage's are in the stages table.
    whole = " (whole model)" if len(result.stages) > 1 else ""
    rows = _size_rows(result) + [(f"{label}{whole}", value) for label, value in result.summary()]
    rows.append((f"bytes / token (attention cache){whole}", f"{result.bytes_per_token:,.1f}"))
    if capacity is not None:
        memory = (
            f"KV memory per rank for {requests:,} requests (least)"
            if requests is not None
            else "KV memory per rank"
        )
        rows += [(memory, gib(capacity.kv_memory_bytes)), *capacity.rows()]
    if budget is not None:
        title = "GPU memory per rank" + (" (the least flag that holds them)" if requests else "")
        rows += [(f"{title}: {label}", value) for label, value in budget.rows()]
    out.print(summary_table(rows))
    out.print(_groups_table(result))
    if len(result.stages) > 1:
        out.print(_stages_table(result))
