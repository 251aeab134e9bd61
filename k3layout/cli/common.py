"""What every ``k3layout`` subcommand shares: model and deployment options, refusal exits."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..constants import MAX_KV_MEMORY_GIB
from ..deployment import CONV_LAYOUTS, Deployment
from ..dtypes import KV_CACHE_DTYPES, KvCacheDtype
from ..engines.vllm.rules import ATTENTION_BACKENDS, KDA_PREFILL_BACKENDS, KV_CACHE_LAYOUTS
from ..errors import Refusal
from ..gpus import DEFAULT_GPU, GPU_NAMES
from ..model import PRESETS, HybridModel, load_config, preset
from ..registry import engine_aliases, engine_names, facts_of
from ..settings import SPECULATIVE_METHODS

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

EXIT_REFUSED = 2
GIB = 1 << 30


def console() -> Console:
    """stdout console; wide enough for the tables when stdout is not a terminal."""
    from rich.console import Console  # noqa: PLC0415 - rich only when tables are printed

    return Console(highlight=False, width=None if sys.stdout.isatty() else 132)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--model`` (a preset or a config.json path), ``--draft`` (a draft's config.json) and
    ``--draft-layers``."""
    parser.add_argument(
        "--model",
        default="kimi-k3",
        help=f"a preset ({', '.join(PRESETS)}) or the path of a Hugging Face config.json",
    )
    parser.add_argument(
        "--draft",
        default=None,
        metavar="PATH",
        help="a DSpark draft checkpoint's config.json (or folder) whose layers join a "
        "config.json model, as load_config(draft=...)",
    )
    parser.add_argument(
        "--draft-layers",
        type=int,
        default=None,
        help="draft MLA layers appended to a config.json model (K3's DSpark: 5)",
    )


def engine_option(text: str) -> str:
    """``--engine``'s value: an engine's name, or a deprecated alias, resolved with a note on
    stderr (``parent`` is ``tokenspeed``)."""
    aliases = engine_aliases()
    if text in aliases:
        print(
            f"k3layout: --engine {text} is deprecated and goes in the next release; "
            f"use --engine {aliases[text]}",
            file=sys.stderr,
        )
        return aliases[text]
    return text


def add_deployment_options(parser: argparse.ArgumentParser, *, engine: bool = True) -> None:
    """The deployment's fields as options."""
    if engine:
        parser.add_argument("--engine", type=engine_option, choices=engine_names(), default="vllm")
        parser.add_argument(
            "--engine-version",
            default=None,
            help="the engine release to plan for, one k3layout follows ("
            + "; ".join(f"{name} {', '.join(facts_of(name).versions)}" for name in engine_names())
            + "; default: the newest of the engine's)",
        )
    parser.add_argument(
        "--gpu",
        choices=GPU_NAMES,
        default=DEFAULT_GPU,
        help=f"the GPU the engine runs on (default {DEFAULT_GPU}; SGLang picks its attention "
        "backend and page by it)",
    )
    parser.add_argument("--attn-tp", type=int, default=1, help="attention tensor parallel size")
    parser.add_argument("--attn-dp", type=int, default=1, help="attention data-parallel replicas")
    parser.add_argument("--kv-dtype", choices=KV_CACHE_DTYPES, default="fp8")
    parser.add_argument(
        "--draft-kv-dtype",
        choices=KV_CACHE_DTYPES,
        default=None,
        help="the draft's attention cache dtype (default: the engine's; tokenspeed #1152: bf16)",
    )
    parser.add_argument("--spec-tokens", type=int, default=0, help="speculative tokens per step")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages")
    parser.add_argument(
        "--expert-parallel",
        action="store_true",
        help="routed experts split whole over every rank of a stage (vLLM's "
        "--enable-expert-parallel, SGLang's --ep-size)",
    )
    parser.add_argument("--dcp", type=int, default=1, help="decode context parallel size")
    parser.add_argument("--dcp-interleave", type=int, default=1)
    parser.add_argument("--block-tokens", type=int, default=None, help="requested block (vllm)")
    parser.add_argument(
        "--max-padding",
        type=float,
        default=None,
        help="padding limit per group (parent; default 0.25, none with draft layers)",
    )
    parser.add_argument("--replayssm", action="store_true", help="ATOM ReplaySSM records")
    add_conv_layout_option(parser)
    parser.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS,
        default=None,
        help="vLLM's MLA attention backend (its kernel blocks shape the block; vllm): a dense "
        "one for an MLA layer without an indexer (Kimi-K3), a *_SPARSE one for an indexed "
        "layer (GLM-5.3-Flash); default: the one vLLM picks on --gpu for the cache dtype",
    )
    parser.add_argument(
        "--kv-cache-layout",
        choices=KV_CACHE_LAYOUTS,
        default=None,
        help="as VLLM_KV_CACHE_LAYOUT (LBNHC: layer-outermost; BLHNC: block-outermost); "
        "default: the one vLLM resolves from its backends (LBNHC, BLHNC for GLM-5.3-Flash; "
        "vllm)",
    )
    parser.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="vLLM without prefix caching: the KDA cache runs in 'none' mode (vllm); SGLang's "
        "--disable-radix-cache: one state slot per running request (sglang)",
    )
    parser.add_argument(
        "--use-replayssm",
        action="store_true",
        help="vLLM's own --use-replayssm: RecoverSSM with a drafter (vllm; refused where the "
        "release refuses it)",
    )
    parser.add_argument(
        "--mamba-backend",
        choices=("triton", "flashinfer"),
        default="triton",
        help="vLLM's --mamba-backend; with --use-replayssm flashinfer picks FlashInfer's "
        "ReplaySSM (vllm; refused where the release refuses it; default: triton)",
    )
    parser.add_argument(
        "--extensible-kv-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM 0.34's extensible KV cache (--enable-extensible-kv-cache / "
        "--no-enable-extensible-kv-cache); default: on unless a KV budget is given (vllm 0.34)",
    )
    parser.add_argument(
        "--mamba-full-memory-ratio",
        type=float,
        default=None,
        help="SGLang's state pool : token pool split (default 0.9; sglang)",
    )
    parser.add_argument(
        "--max-running-requests",
        type=int,
        default=None,
        help="SGLang's --max-running-requests (sglang)",
    )
    parser.add_argument(
        "--max-mamba-cache-size",
        type=int,
        default=None,
        help="SGLang's state slots, instead of the ratio's (sglang)",
    )
    parser.add_argument(
        "--mamba-track-interval",
        type=int,
        default=None,
        help="SGLang's tokens between tracked KDA states, a multiple of the page; default: "
        "SGLang's 256, or the page where it does not divide 256 (sglang)",
    )
    parser.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="SGLang's cap on the token pool per rank (sglang)",
    )
    parser.add_argument(
        "--kda-prefill-backend",
        choices=KDA_PREFILL_BACKENDS,
        default="auto",
        help="vLLM's KDA prefill kernel (auto: FlashKDA where the layer allows it; FlashKDA "
        "holds one more state block per request; vllm)",
    )
    parser.add_argument(
        "--speculative-method",
        choices=SPECULATIVE_METHODS,
        default=None,
        help="vLLM's --speculative-config method (default: the model's drafter; vllm)",
    )


def add_memory_options(parser: argparse.ArgumentParser, *, kv_help: str | None = None) -> None:
    """The GPU's memory: the engine's memory flag or an explicit KV budget (GiB, as every
    figure this command prints), the GPU's total where the table's is not the machine's, and
    the engine's reserve in place of k3layout's estimate."""
    parser.add_argument(
        "--kv-memory-gib",
        type=float,
        default=None,
        help=kv_help
        or "an explicit KV-cache budget per rank, in GiB (vLLM's --kv-cache-memory-bytes); "
        "default: what the engine's memory flag gives on --gpu",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="vLLM's and tokenspeed's memory flag (default: the engine's: vLLM 0.92, "
        "tokenspeed by world size)",
    )
    parser.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="SGLang's memory flag (default: SGLang's for the GPU and parallel sizes)",
    )
    parser.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=None,
        help="the GPU's total as its driver reports it, in GiB (default: the table's for --gpu)",
    )
    parser.add_argument(
        "--reserve-gib",
        type=float,
        default=None,
        help="what the engine keeps beside weights and KV (activations, CUDA graphs, context), "
        "in GiB, in place of k3layout's estimate",
    )


OPTION_FIELDS: dict[str, str] = {
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "mem_fraction_static": "--mem-fraction-static",
    "mamba_full_memory_ratio": "--mamba-full-memory-ratio",
    "max_running_requests": "--max-running-requests",
    "max_mamba_cache_size": "--max-mamba-cache-size",
    "max_total_tokens": "--max-total-tokens",
    "mamba_track_interval": "--mamba-track-interval",
    "max_padding": "--max-padding",
    "attention_backend": "--attention-backend",
    "kv_cache_layout": "--kv-cache-layout",
    "kda_prefill_backend": "--kda-prefill-backend",
    "speculative_method": "--speculative-method",
    "block_tokens": "--block-tokens",
    "dcp_interleave": "--dcp-interleave",
    "expert_parallel": "--expert-parallel",
}
"""Deployment fields an engine may refuse as another engine's setting, and the option each
comes from."""

MEMORY_OPTIONS = {
    "kv_memory_gib": "kv_memory_bytes",
    "gpu_memory_gib": "gpu_memory_bytes",
    "reserve_gib": "reserve_bytes",
}
"""The memory options in GiB and the deployment fields in bytes they fill."""


def gib_bytes(value: float, option: str, *, positive: bool = False) -> int:
    """``value`` GiB as bytes; NaN, infinity, a negative (or, where ``positive``, zero) or an
    over-large value is refused naming ``option``."""
    low = "> 0" if positive else ">= 0"
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise Refusal(
            "invalid_argument",
            f"{option}={value}: must be a finite number of GiB {low}",
            facts={"field": option.lstrip("-").replace("-", "_"), "option": option},
            hint=f"pass a size in GiB, e.g. {option} 40",
        )
    if value > MAX_KV_MEMORY_GIB:
        raise Refusal(
            "size_limit",
            f"{option}={value:g}: above the bound {MAX_KV_MEMORY_GIB:,.0f} GiB",
            facts={
                "field": option.lstrip("-").replace("-", "_"),
                "option": option,
                "bound": MAX_KV_MEMORY_GIB,
            },
            hint=f"use {option} <= {MAX_KV_MEMORY_GIB:,.0f}",
        )
    return int(value * GIB)


def memory_fields(args: argparse.Namespace) -> dict[str, object]:
    """The deployment's memory fields from the memory options, where the command has them."""
    fields: dict[str, object] = {}
    for option, field in MEMORY_OPTIONS.items():
        value = getattr(args, option, None)
        if value is not None:
            flag = f"--{option.replace('_', '-')}"
            fields[field] = gib_bytes(value, flag, positive=option != "reserve_gib")
    for name in ("gpu_memory_utilization", "mem_fraction_static"):
        value = getattr(args, name, None)
        if value is not None:
            fields[name] = value
    return fields


def add_conv_layout_option(parser: argparse.ArgumentParser) -> None:
    """``--conv-layout SD|DS``: vLLM's ``VLLM_SSM_CONV_STATE_LAYOUT``."""
    parser.add_argument(
        "--conv-layout",
        choices=CONV_LAYOUTS,
        default="SD",
        help="KDA conv state layout, as VLLM_SSM_CONV_STATE_LAYOUT (SD: time-major, the "
        "default; DS: channel-major)",
    )


def model_from_args(args: argparse.Namespace) -> HybridModel:
    """The model ``--model`` names: a preset, else a config path."""
    name: str = args.model
    draft: str | None = getattr(args, "draft", None)
    exists = path_exists(name, "--model")
    if name in PRESETS and not exists:
        model = preset(name)
        given = (("--draft", draft), ("--draft-layers", args.draft_layers))
        option = next((o for o, value in given if value is not None), None)
        if option is not None:
            raise Refusal(
                "invalid_argument",
                f"{option} applies to a config.json model, not preset {name!r}",
                facts={"model": name, "option": option},
                hint="use --model kimi-k3-dspark for K3 with its draft",
            )
        return model
    if not exists:
        raise Refusal(
            "unknown_model",
            f"model {name!r}: neither a preset nor an existing config path",
            facts={"model": name, "presets": tuple(PRESETS)},
            hint=f"use one of {', '.join(PRESETS)} or a path to a config.json",
        )
    if draft is None:
        return load_config(name, num_draft_layers=args.draft_layers)
    if not path_exists(draft, "--draft"):
        raise Refusal(
            "invalid_argument",
            f"--draft {_shown(draft)}: no such config.json or folder",
            facts={"field": "draft", "option": "--draft"},
            hint="pass the path of the draft checkpoint's config.json",
        )
    model = load_config(name, draft=draft)
    if args.draft_layers is not None and args.draft_layers != len(model.draft_layers):
        raise Refusal(
            "invalid_argument",
            f"--draft-layers={args.draft_layers} contradicts --draft {_shown(draft)}, whose "
            f"config.json has {len(model.draft_layers)} layers",
            facts={
                "option": "--draft-layers",
                "draft_layers": args.draft_layers,
                "draft_config_layers": len(model.draft_layers),
            },
            hint="drop --draft-layers: the draft's config.json gives its layers",
        )
    return model


def _shown(path: str) -> str:
    return repr(path if len(path) <= 80 else f"{path[:77]}...")


def path_exists(path: str, option: str) -> bool:
    """Whether ``path`` exists; a path the OS cannot even look up (too long, a NUL) is refused
    naming ``option``."""
    try:
        return Path(path).exists()
    except (OSError, ValueError) as error:
        shown = path if len(path) <= 80 else f"{path[:77]}..."
        raise Refusal(
            "invalid_argument",
            f"{option} {shown!r}: not a usable path ({getattr(error, 'strerror', None) or error})",
            facts={"field": option.lstrip("-").replace("-", "_"), "option": option},
            hint="pass a preset name or the path of a config.json",
        ) from None


def deployment_from_args(args: argparse.Namespace, **override: object) -> Deployment:
    """Build the deployment the options describe (validated; bad values are refused)."""
    fields: dict[str, object] = {
        "engine": getattr(args, "engine", "vllm"),
        "engine_version": getattr(args, "engine_version", None),
        "attn_tp": args.attn_tp,
        "attn_dp": args.attn_dp,
        "kv_dtype": args.kv_dtype,
        "draft_kv_dtype": getattr(args, "draft_kv_dtype", None),
        "spec_tokens": args.spec_tokens,
        "pp": args.pp,
        "dcp": args.dcp,
        "dcp_interleave": args.dcp_interleave,
        "block_tokens": args.block_tokens,
        "max_padding": args.max_padding,
        "replayssm": args.replayssm,
        "conv_layout": args.conv_layout,
        "attention_backend": getattr(args, "attention_backend", None),
        "kv_cache_layout": getattr(args, "kv_cache_layout", None),
        "prefix_caching": getattr(args, "prefix_caching", True),
        "extensible_kv_cache": getattr(args, "extensible_kv_cache", None),
        "use_replayssm": getattr(args, "use_replayssm", False),
        "mamba_backend": getattr(args, "mamba_backend", "triton"),
        "kda_prefill_backend": getattr(args, "kda_prefill_backend", "auto"),
        "speculative_method": getattr(args, "speculative_method", None),
        "mamba_cache_mode": getattr(args, "vllm_mamba_cache_mode", None),
        "gpu": getattr(args, "gpu", DEFAULT_GPU),
        "mamba_full_memory_ratio": getattr(args, "mamba_full_memory_ratio", None),
        "max_running_requests": getattr(args, "max_running_requests", None),
        "max_mamba_cache_size": getattr(args, "max_mamba_cache_size", None),
        "max_total_tokens": getattr(args, "max_total_tokens", None),
        "mamba_track_interval": getattr(args, "mamba_track_interval", None),
        "expert_parallel": getattr(args, "expert_parallel", False),
        **memory_fields(args),
    }
    return validated(Deployment, {**fields, **override})


def validated(kind: type[Deployment], fields: dict[str, object]) -> Deployment:
    """``kind(**fields)``; a refused field is named by its option (``--attn-tp``)."""
    try:
        return kind.model_validate(fields)
    except Refusal as refusal:
        options = {field: f"--{opt.replace('_', '-')}" for opt, field in MEMORY_OPTIONS.items()}
        raise option_refusal(refusal, options) from None


def option_refusal(
    refusal: Refusal, options: Mapping[str, str] | None = None, *, keep_hint: bool = False
) -> Refusal:
    """``refusal`` of a record built from options, its message led by the option of its field
    (``attn_tp`` -> ``--attn-tp``, or as ``options`` maps it); the code is kept, and the hint
    where ``keep_hint``."""
    field = str(refusal.facts.get("field", "")).split(".")[0]
    if not field or field.startswith("<"):
        return refusal
    option = (options or {}).get(field, f"--{field.replace('_', '-')}")
    return Refusal(
        refusal.code,
        f"{option}: {refusal.message}",
        facts={**refusal.facts, "option": option},
        hint=refusal.hint if keep_hint else f"pass a valid {option}",
    )


def refused(refusal: Refusal, as_json: bool) -> int:
    """Report a refusal: the message on stderr, with ``--json`` also the refusal on stdout."""
    print(f"refused [{refusal.code}]: {refusal}", file=sys.stderr)
    if as_json:
        print(json.dumps({"refused": refusal.to_dict()}, indent=2))
    return EXIT_REFUSED


def run_refusing(action: Callable[[], int], as_json: bool) -> int:
    """Run a subcommand; a refusal becomes exit code 2."""
    try:
        return action()
    except Refusal as refusal:
        if refusal.code == "engine_setting" and refusal.facts.get("field") in OPTION_FIELDS:
            # a deployment option the engine does not take: name the option given
            refusal = option_refusal(refusal, OPTION_FIELDS, keep_hint=True)
        return refused(refusal, as_json)


def parse_ints(text: str, option: str) -> tuple[int, ...]:
    """Comma-separated integers of ``option`` (refused, naming the option, when not)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise Refusal(
            "invalid_argument",
            f"{option}={text!r} must be comma-separated integers",
            facts={"option": option},
        ) from None


def parse_dtypes(text: str) -> tuple[KvCacheDtype, ...]:
    """Comma-separated cache dtypes of ``--dtypes`` (refused, naming the allowed ones)."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in KV_CACHE_DTYPES]
    if unknown:
        raise Refusal(
            "invalid_argument",
            f"--dtypes: {unknown} are not cache dtypes (allowed: {', '.join(KV_CACHE_DTYPES)})",
            facts={"option": "--dtypes"},
        )
    return cast(tuple[KvCacheDtype, ...], names)


def thousands(value: int) -> str:
    """``884736`` -> ``884,736``: every byte count in the tables."""
    return f"{value:,}"


def new_table(title: str | None = None, *, show_header: bool = True) -> Table:
    """An empty table, its title on the left: rich is imported here, only when a command
    prints tables (``--json`` never does)."""
    from rich.table import Table  # noqa: PLC0415 - rich only when tables are printed

    return Table(title=title, title_justify="left", show_header=show_header)


def summary_table(rows: Sequence[tuple[str, str]]) -> Table:
    """A two-column table of (quantity, value) rows, values right-aligned."""
    table = new_table(show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for quantity, value in rows:
        table.add_row(quantity, value)
    return table


def format_layers(layers: Sequence[int]) -> str:
    """Module layer ids, compressed: ``0-2`` for runs, ``3..91/4`` for strided runs."""
    parts: list[str] = []
    i = 0
    while i < len(layers):
        j = i + 1
        step = layers[j] - layers[i] if j < len(layers) else 0
        while j + 1 < len(layers) and layers[j + 1] - layers[j] == step:
            j += 1
        if j - i >= 2 and step > 0:
            span = f"{layers[i]}-{layers[j]}" if step == 1 else f"{layers[i]}..{layers[j]}/{step}"
            parts.append(span)
            i = j + 1
        else:
            parts.append(str(layers[i]))
            i += 1
    return ", ".join(parts)
