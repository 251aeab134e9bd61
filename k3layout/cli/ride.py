"""``k3layout ride``: the LMCache MP ride of one rank, as tables or ``--json``; with
``--connector lmcache``, LMCache 0.5.6's own vLLM connector instead of ATOM's ride."""

from __future__ import annotations

import argparse
from typing import get_args

from ..errors import Refusal
from ..layouts import plan
from ..offload import (
    KvLoadFailurePolicy,
    LMCacheOptions,
    LMCachePlan,
    RideOptions,
    RidePlan,
    RideReport,
    engine_layer_names,
    plan_lmcache,
    plan_ride,
    ride_report,
)
from ..offload.plane_order import stage_attention_names
from ..offload.stage import ridable
from ..settings import MAMBA_CACHE_MODES
from .common import (
    add_deployment_options,
    add_model_options,
    console,
    deployment_from_args,
    model_from_args,
    new_table,
    option_refusal,
    run_refusing,
    summary_table,
    thousands,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ride`` to the command line."""
    parser = subparsers.add_parser(
        "ride", help="LMCache MP offload: plane order, checkpoint image and chunk grid"
    )
    add_model_options(parser)
    add_deployment_options(parser)
    parser.add_argument(
        "--connector",
        choices=("atom", "lmcache"),
        default="atom",
        help="atom: ATOM's plugin, the state riding the PAGE object (the default); lmcache: "
        "LMCache 0.5.6's own vLLM connector (LMCacheMPConnector)",
    )
    parser.add_argument(
        "--chunk", type=int, default=None, help="LMCache chunk tokens (default: the smallest)"
    )
    parser.add_argument(
        "--servers", type=int, default=1, help="LMCache servers (--connector lmcache)"
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="vLLM's --max-num-batched-tokens (--connector lmcache; default vLLM's 2048)",
    )
    parser.add_argument(
        "--pcp",
        type=int,
        default=1,
        help="vLLM's --prefill-context-parallel-size (--connector lmcache)",
    )
    parser.add_argument(
        "--lmcache-gib",
        type=float,
        default=None,
        help="LMCache memory per server in GiB: the prefix tokens it holds (--connector lmcache)",
    )
    parser.add_argument("--stage", type=int, default=0, help="pipeline stage of the rank")
    parser.add_argument(
        "--mamba-cache-mode",
        choices=MAMBA_CACHE_MODES,
        default="align",
        help="as vLLM 0.33's flag (align or none; the ride needs align)",
    )
    # --no-prefix-caching comes with the deployment options (the ride refuses it)
    parser.add_argument(
        "--kv-load-failure-policy", choices=get_args(KvLoadFailurePolicy), default="recompute"
    )
    parser.add_argument(
        "--publish-order",
        choices=("name", "module"),
        default="name",
        help="the order the engine would publish attention layers in before the reorder",
    )
    parser.add_argument(
        "--hit", type=int, default=None, help="a prefix hit in tokens: cap it, name its row"
    )
    parser.add_argument("--json", action="store_true", help="print the ride report as JSON")
    parser.set_defaults(run=run)


def _options(args: argparse.Namespace) -> RideOptions:
    fields = {
        "chunk_tokens": args.chunk,
        "mamba_cache_mode": args.mamba_cache_mode,
        "prefix_caching": args.prefix_caching,
        "kv_load_failure_policy": args.kv_load_failure_policy,
    }
    try:
        return RideOptions.model_validate(fields)
    except Refusal as refusal:
        raise option_refusal(refusal, {"chunk_tokens": "--chunk"}) from None


def _ride(args: argparse.Namespace) -> RidePlan:
    result = plan(model_from_args(args), deployment_from_args(args))
    published = None
    if args.publish_order == "module":
        on_stage = ridable(result).stage(args.stage)
        published = stage_attention_names(on_stage, engine_layer_names(result.model))
    return plan_ride(result, _options(args), stage=args.stage, published=published)


def _lmcache(args: argparse.Namespace) -> LMCachePlan:
    fields = {
        "chunk_tokens": args.chunk,
        "servers": args.servers,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "pcp": args.pcp,
    }
    try:
        options = LMCacheOptions.model_validate(fields)
    except Refusal as refusal:
        names = {"chunk_tokens": "--chunk", "max_num_batched_tokens": "--max-num-batched-tokens"}
        raise option_refusal(refusal, names) from None
    return plan_lmcache(plan(model_from_args(args), deployment_from_args(args)), options)


def show_lmcache(lm: LMCachePlan, server_gib: float | None) -> None:
    """Print LMCache's plan: its groups, the chunk, and what a cached chunk costs."""
    out = console()
    d_version = f"{lm.engine} {lm.engine_version}"
    out.print(f"LMCache {lm.lmcache} connector | {d_version} | chunk {lm.chunk_tokens:,} tokens")
    rows = [
        ("smallest chunk LMCache accepts", thousands(lm.smallest_chunk_tokens)),
        ("servers x writers each", f"{len(lm.writers_per_server)} x {lm.writers_per_server[0]}"),
        (
            "bytes per chunk per rank (by stage)",
            ", ".join(map(thousands, lm.stage_bytes_per_chunk)),
        ),
        ("bytes per chunk per server", ", ".join(map(thousands, lm.bytes_per_chunk_per_server))),
        ("bytes per cached token (busiest server)", f"{lm.bytes_per_token:,.2f}"),
    ]
    if server_gib is not None:
        held = lm.tokens_fit(int(server_gib * (1 << 30)))
        rows.append((f"prefix tokens in {server_gib:g} GiB per server", thousands(held)))
    out.print(summary_table(rows))
    table = new_table("LMCache groups")
    for column in ("stage", "vLLM group", "part"):
        table.add_column(column)
    for column in ("layers", "recurrent", "tokens/block", "bytes/chunk"):
        table.add_column(column, justify="right")
    for stage, groups in enumerate(lm.stages):
        for g in groups:
            table.add_row(
                str(stage),
                g.vllm_group,
                g.part,
                str(len(g.layers)),
                "yes" if g.recurrent else "no",
                thousands(g.tokens_per_block),
                thousands(g.bytes_per_chunk),
            )
    out.print(table)


def run(args: argparse.Namespace) -> int:
    """Plan the ride (or LMCache's connector) and print it; exit 2 on a refusal."""

    def action() -> int:
        if args.connector == "lmcache":
            lm = _lmcache(args)
            if args.json:
                print(lm.model_dump_json(indent=2))
            else:
                show_lmcache(lm, args.lmcache_gib)
            return 0
        report = ride_report(_ride(args), args.hit)
        if args.json:
            print(report.model_dump_json(indent=2))
        else:
            show(report)
        return 0

    return run_refusing(action, args.json)


def show(report: RideReport) -> None:
    """Print a ride report: the image and chunk grid, then the publish order."""
    out = console()
    options = report.options
    out.print(
        f"{report.model} | stage {report.stage} | mamba_cache_mode {options.mamba_cache_mode} | "
        f"prefix caching {'on' if options.prefix_caching else 'off'} | "
        f"kv_load_failure_policy {options.kv_load_failure_policy}",
        style="bold",
    )
    span_of = {s.kind: s.span_tokens for s in report.spans}
    spans = " / ".join(
        f"{kind} {thousands(span_of[kind])}" for kind in ("attention", "kda") if kind in span_of
    )
    rows = [
        ("block tokens", thousands(report.block_tokens)),
        ("page bytes", thousands(report.page_bytes)),
        ("units (one per KDA group)", thousands(report.units)),
        ("image planes (PAGE regions)", f"{report.image_planes} ({report.image_regions})"),
        ("planes published", thousands(len(report.plane_order))),
        ("unit bytes", thousands(report.unit_bytes)),
        ("image bytes", thousands(report.image_bytes)),
        ("state bytes", thousands(report.state_bytes)),
        ("chunk tokens", thousands(report.chunk_tokens)),
        ("smallest valid chunk", thousands(report.smallest_chunk_tokens)),
        ("group spans (tokens)", spans),
    ]
    if report.hit is not None:
        load = report.hit.load
        rows += [
            (
                "hit -> capped tokens",
                f"{thousands(report.hit.hit_tokens)} -> {thousands(report.hit.capped_tokens)}",
            ),
            ("load destination row", "none" if load is None else f"{load.row} in every KDA group"),
        ]
    out.print(summary_table(rows))
    table = new_table("PAGE planes in publish order")
    for column in ("plane", "given plane", "attention layer", "module layer", "allocation plane"):
        table.add_column(column)
    table.add_column("riders (KDA group:module layer)")
    for share in report.planes:
        riders = ", ".join(f"{m.group}:{m.layer}" for m in share.riders) or "-"
        in_image = "*" if share.plane < report.image_planes else ""
        table.add_row(
            f"{share.plane}{in_image}",
            str(report.given_order.index(share.attention_layer)),
            share.attention_layer,
            str(share.module_layer),
            str(share.allocation_plane),
            riders,
        )
    out.print(table)
    out.print("* in the checkpoint image")
