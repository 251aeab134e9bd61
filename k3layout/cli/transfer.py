"""``k3layout transfer``: a prefill-to-decode transfer plan as tables, or ``--json`` as its report.

    k3layout transfer --prefill pp8xtp1 --decode tp8xdcp8 [--model kimi-k3] [--replayssm]

A topology is ``x``-separated axes, each a name and a size: ``pp`` (pipeline stages), ``tp``
(attention TP), ``dcp`` (decode context parallel), ``dp`` (attention-DP replicas). The header
names each side's engine and layout, the P/D rule the decode's engine registered, and the
prompt length, marked ``(default)`` where ``--tokens`` was not given.
"""

from __future__ import annotations

import argparse
import re

from ..deployment import Deployment
from ..dtypes import KV_CACHE_DTYPES
from ..errors import Refusal
from ..gpus import DEFAULT_GPU, GPU_NAMES
from ..registry import engine_names
from ..transfer import (
    TransferPlan,
    TransferReport,
    check_admission,
    plan_transfer,
    transfer_report,
)
from ..transfer.pairing import coords_of, dcp_rank_of
from .common import (
    add_conv_layout_option,
    add_model_options,
    console,
    engine_option,
    model_from_args,
    new_table,
    run_refusing,
    summary_table,
    thousands,
    validated,
)

AXES = {"pp": "pp", "tp": "attn_tp", "dcp": "dcp", "dp": "attn_dp"}
"""Topology axis names and the :class:`~k3layout.Deployment` field each sets."""

_AXIS = re.compile(r"(dcp|dp|pp|tp)(\d+)")

DEFAULT_PROMPT_TOKENS = 4096
"""The prompt length without ``--tokens``; the output says it was the default."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``transfer`` to the command line."""
    parser = subparsers.add_parser(
        "transfer", help="plan the prefill-to-decode transfer of one request"
    )
    add_transfer_options(parser)
    parser.add_argument("--json", action="store_true", help="print the transfer report as JSON")
    parser.set_defaults(run=run)


def add_transfer_options(parser: argparse.ArgumentParser) -> None:
    """The options that shape a transfer plan (shared with ``k3layout draw transfer``)."""
    parser.add_argument("--prefill", required=True, help="prefill topology, e.g. pp8xtp1")
    parser.add_argument("--decode", required=True, help="decode topology, e.g. tp8xdcp8")
    add_model_options(parser)
    parser.add_argument(
        "--tokens",
        "--prompt-tokens",
        dest="prompt_tokens",
        type=int,
        default=None,
        help=f"prompt tokens of the request (default {DEFAULT_PROMPT_TOKENS:,}, marked "
        "'(default)' in the output)",
    )
    parser.add_argument(
        "--engine",
        type=engine_option,
        choices=engine_names(),
        default="vllm",
        help="both sides' engine",
    )
    parser.add_argument(
        "--gpu", choices=GPU_NAMES, default=DEFAULT_GPU, help="both sides' GPU (sglang)"
    )
    parser.add_argument("--kv-dtype", choices=KV_CACHE_DTYPES, default="fp8")
    parser.add_argument("--spec-tokens", type=int, default=0, help="speculative tokens per step")
    parser.add_argument("--dcp-interleave", type=int, default=1, help="decode DCP interleave")
    add_conv_layout_option(parser)
    parser.add_argument("--replayssm", action="store_true", help="ATOM ReplaySSM records")
    parser.add_argument(
        "--chunked",
        action="store_true",
        help="the prefill transfers in chunks: run the decode's admission check first",
    )


def parse_topology(text: str, option: str) -> dict[str, int]:
    """``"pp8xtp1"`` -> ``{"pp": 8, "attn_tp": 1}``; refuses (``invalid_argument``) anything
    else, naming the part it cannot read."""
    fields: dict[str, int] = {}
    for part in text.lower().split("x"):
        match = _AXIS.fullmatch(part.strip())
        if match is None or AXES[match.group(1)] in fields:
            problem = "repeats an axis" if match else "is not an axis and a size"
            raise Refusal(
                "invalid_argument",
                f"{option}={text!r}: {part!r} {problem}",
                facts={"option": option, "value": text, "part": part},
                hint=f"write x-separated axes from {', '.join(AXES)}, e.g. pp8xtp1 or tp8xdcp8",
            )
        fields[AXES[match.group(1)]] = int(match.group(2))
    return fields


def deployments_from_args(args: argparse.Namespace) -> tuple[Deployment, Deployment]:
    """The prefill and decode deployments the options describe."""
    shared: dict[str, object] = {
        "engine": args.engine,
        "gpu": args.gpu,
        "kv_dtype": args.kv_dtype,
        "spec_tokens": args.spec_tokens,
        "replayssm": args.replayssm,
        "conv_layout": args.conv_layout,
    }
    prefill = validated(Deployment, {**shared, **parse_topology(args.prefill, "--prefill")})
    decode = validated(
        Deployment,
        {
            **shared,
            "dcp_interleave": args.dcp_interleave,
            **parse_topology(args.decode, "--decode"),
        },
    )
    return prefill, decode


def prompt_tokens_of(args: argparse.Namespace) -> tuple[int, bool]:
    """The prompt length the options give, and whether it is the default (no ``--tokens``)."""
    given: int | None = args.prompt_tokens
    return (DEFAULT_PROMPT_TOKENS, True) if given is None else (given, False)


def transfer_from_args(args: argparse.Namespace) -> TransferPlan:
    """The transfer plan the options describe (with ``--chunked``, admitted first)."""
    model = model_from_args(args)
    prefill, decode = deployments_from_args(args)
    if args.chunked:
        check_admission(model, decode, chunked_transfer=True)
    return plan_transfer(model, prefill, decode, prompt_tokens=prompt_tokens_of(args)[0])


def run(args: argparse.Namespace) -> int:
    """Plan and print; exit 2 on a refusal."""

    def action() -> int:
        result = transfer_from_args(args)
        prefill, decode = result.prefill, result.decode
        report = transfer_report(result, prompt_tokens_default=prompt_tokens_of(args)[1])
        if args.json:
            print(report.model_dump_json(indent=2))
        else:
            show(report, (args.prefill, prefill), (args.decode, decode))
        return 0

    return run_refusing(action, args.json)


def show(
    report: TransferReport,
    prefill_side: tuple[str, Deployment],
    decode_side: tuple[str, Deployment],
) -> None:
    """Print a transfer report as tables: totals, per consumer rank, per producer rank.
    Each side is given as its topology text and its deployment."""
    (prefill_text, prefill), (decode_text, decode) = prefill_side, decode_side
    out = console()
    out.print(header(report, prefill_text, decode_text, decode), style="bold")
    rows = [
        ("TP pairing rule (decode engine's)", report.pd_rule or f"{report.decode_engine}'s facts"),
        ("pairs (producer, consumer)", thousands(report.pairs)),
        ("segments", thousands(report.segments)),
        ("copies (segments expanded)", thousands(report.copies)),
        ("bytes moved", thousands(report.total_bytes)),
    ]
    out.print(summary_table(rows))

    producers: dict[int, set[int]] = {}
    consumers: dict[int, set[int]] = {}
    segments_in = [0] * report.num_consumers
    segments_out = [0] * report.num_producers
    for pair in report.rank_pairs:
        producers.setdefault(pair.consumer, set()).add(pair.producer)
        consumers.setdefault(pair.producer, set()).add(pair.consumer)
        segments_in[pair.consumer] += pair.segments
        segments_out[pair.producer] += pair.segments

    by_consumer = new_table("bytes per consumer rank")
    for column in ("rank", "stage", "tp rank", "dcp rank", "producers", "segments"):
        by_consumer.add_column(column)
    for column in ("page bytes", "slot bytes", "bytes"):
        by_consumer.add_column(column, justify="right")
    for rank in range(report.num_consumers):
        stage, tp_rank = coords_of(rank, decode.attn_tp)
        by_consumer.add_row(
            str(rank),
            str(stage),
            str(tp_rank),
            str(dcp_rank_of(tp_rank, decode.dcp)),
            ", ".join(map(str, sorted(producers.get(rank, ())))),
            thousands(segments_in[rank]),
            thousands(report.page_bytes_per_consumer[rank]),
            thousands(report.slot_bytes_per_consumer[rank]),
            thousands(report.bytes_per_consumer[rank]),
        )
    out.print(by_consumer)

    by_producer = new_table("bytes per producer rank")
    for column in ("rank", "stage", "tp rank", "consumers", "segments"):
        by_producer.add_column(column)
    by_producer.add_column("bytes", justify="right")
    for rank in range(report.num_producers):
        stage, tp_rank = coords_of(rank, prefill.attn_tp)
        by_producer.add_row(
            str(rank),
            str(stage),
            str(tp_rank),
            ", ".join(map(str, sorted(consumers.get(rank, ())))),
            thousands(segments_out[rank]),
            thousands(report.bytes_per_producer[rank]),
        )
    out.print(by_producer)


def header(report: TransferReport, prefill_text: str, decode_text: str, decode: Deployment) -> str:
    """The first line: the model, each side's engine, layout and topology, the prompt length
    (``(default)`` when ``--tokens`` was not given) and the decode's cache settings.

    ``kimi-k3 | prefill vllm (block 11392) pp8xtp1 -> decode vllm (block 1536) tp8xdcp8
    (dcp interleave 1) | 4,096 tokens (default) | fp8 | spec 0 | conv SD``
    """
    tokens = f"{thousands(report.prompt_tokens)} tokens" + (
        " (default)" if report.prompt_tokens_default else ""
    )
    return (
        f"{report.model} | prefill {report.prefill_engine} {report.prefill_engine_version} "
        f"({report.prefill_layout}) {prefill_text} -> decode {report.decode_engine} "
        f"{report.decode_engine_version} ({report.decode_layout}) {decode_text} "
        f"(dcp interleave {decode.dcp_interleave}) | {tokens} | {decode.kv_dtype} | "
        f"spec {decode.spec_tokens} | conv {decode.conv_layout}"
        + (" | replayssm" if decode.replayssm else "")
    )
