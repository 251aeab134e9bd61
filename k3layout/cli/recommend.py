"""``k3layout recommend``: the engine's flags for N requests of L tokens at once, as a ready
command-line fragment, with the capacity behind them (``--json``: the recommendation)."""

from __future__ import annotations

import argparse

from ..layouts import plan
from ..offload.lmcache import lmcache_flags, lmcache_recommended, lmcache_server_command
from .common import (
    add_deployment_options,
    add_memory_options,
    add_model_options,
    console,
    deployment_from_args,
    model_from_args,
    run_refusing,
    summary_table,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``recommend`` to the command line."""
    parser = subparsers.add_parser(
        "recommend", help="the engine's flags that serve N requests of L tokens at once"
    )
    add_model_options(parser)
    add_deployment_options(parser)
    parser.add_argument(
        "--requests", type=int, required=True, help="requests held at once (per DP replica)"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="tokens of one request (default: the model's context)",
    )
    add_memory_options(
        parser,
        kv_help="KV memory per rank the flags may use, in GiB (default: the least the engine's "
        "memory flag holds the workload in, within what its default flag leaves)",
    )
    parser.add_argument(
        "--offload",
        choices=("none", "lmcache"),
        default="none",
        help="lmcache: add the flags that start LMCache 0.5.6's vLLM connector, and its "
        "server's command (vllm)",
    )
    parser.add_argument("--json", action="store_true", help="print the recommendation as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Recommend and print; exit 2 on a refusal (a budget too small names the most it holds
    and the memory the workload needs)."""

    def action() -> int:
        result = plan(model_from_args(args), deployment_from_args(args))
        answer = result.recommend(args.requests, args.max_model_len)
        server = None
        if args.offload == "lmcache":
            lm = lmcache_recommended(result)
            answer = answer.model_copy(update={"flags": (*answer.flags, *lmcache_flags(lm))})
            server = lmcache_server_command(lm)
        if args.json:
            print(answer.model_dump_json(indent=2))
            return 0
        out = console()
        version = result.deployment.version_run
        out.print(
            f"{result.model.name} | engine {result.engine} {version} | {result.deployment.gpu}"
        )
        print(answer.launch_line)
        if server is not None:
            print(server)
        out.print(summary_table(answer.rows()))
        return 0

    return run_refusing(action, args.json)
