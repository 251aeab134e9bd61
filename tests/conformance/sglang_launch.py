"""A ``python -m sglang.launch_server`` launch line, parsed and sized by SGLang 0.5.23's own
code on CPU.

* :func:`launch_argv` - the line split as a shell splits it (``shlex``), its launcher checked,
  ``MODEL`` and ``DRAFT`` (``--model-path`` and ``--speculative-draft-model-path``) replaced by
  directories.
* :func:`parse_launch` - the arguments through ``sglang.srt.server_args.prepare_server_args``,
  the function ``sglang/launch_server.py`` calls on ``sys.argv[1:]`` (its ``argparse`` parser
  from ``ServerArgs.add_cli_args``, then ``ServerArgs.from_cli_args``): the raw ``ServerArgs``
  a launch starts from, before SGLang's resolution. ``--skip-tokenizer-init`` and ``--device
  cuda`` are added, as ``sglang_engine`` sets them (the fixtures ship no tokenizer; the device
  a CUDA launch resolves).
* :func:`sized` - ``sglang_engine.sglang_case`` on those ``ServerArgs``: the harness builds its
  ``ServerArgs`` from keyword fields, so it is given every field the line set (each field that
  differs from a launch of the model alone), and :func:`harness_args` checks that the record
  the harness builds that way is the parsed one, field for field.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sglang_engine as se

LAUNCHER = ("python", "-m", "sglang.launch_server")
MODEL = "MODEL"
DRAFT = "DRAFT"
HARNESS_FLAGS = ("--skip-tokenizer-init", "--device", "cuda")


def launch_argv(line: str, model: Path, draft: Path | None = None) -> list[str]:
    """The arguments after the launcher, placeholders replaced. Fails where the line does
    not start ``python -m sglang.launch_server`` or sets environment variables (SGLang's
    lines set none)."""
    words = shlex.split(line)
    assert tuple(words[:3]) == LAUNCHER, line
    argv = words[3:]
    for flag, path in (("--model-path", model), ("--speculative-draft-model-path", draft)):
        if flag in argv:
            at = argv.index(flag) + 1
            assert argv[at] == (MODEL if flag == "--model-path" else DRAFT), line
            assert path is not None, f"the line names {flag}: give its directory"
            argv[at] = str(path)
    assert MODEL not in argv and DRAFT not in argv, argv
    return argv


@contextmanager
def _root_logger() -> Iterator[None]:
    """``prepare_server_args`` reconfigures the root logger (``basicConfig(force=True)``);
    the test process keeps its own."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def parse_launch(argv: list[str], harness: bool = True) -> Any:
    """The raw ``ServerArgs`` SGLang's launcher parses from ``argv`` (with the harness's
    flags unless ``harness`` is false). Raises ``SystemExit`` where SGLang's parser rejects a
    flag."""
    se._sgl()  # SGLang imported with the CPU stand-ins, once
    from sglang.srt.server_args import prepare_server_args  # noqa: PLC0415

    with _root_logger():
        return prepare_server_args([*argv, *(HARNESS_FLAGS if harness else ())])


def _fields() -> tuple[str, ...]:
    from sglang.srt.arg_groups.arg_utils import record_fields  # noqa: PLC0415
    from sglang.srt.server_args import ServerArgs  # noqa: PLC0415

    return tuple(field.name for field in record_fields(ServerArgs))


def set_fields(server_args: Any) -> dict[str, Any]:
    """The fields the line set: each that differs from a launch of the same model alone."""
    alone = parse_launch(["--model-path", server_args.model_path], harness=False)
    return {
        name: getattr(server_args, name)
        for name in _fields()
        if getattr(server_args, name) != getattr(alone, name)
    }


def harness_args(server_args: Any) -> dict[str, Any]:
    """``sglang_case``'s keyword arguments for the parsed ``server_args`` (all but the GPU and
    the budget), checking that the ``ServerArgs`` the harness builds from them is the parsed
    record, field for field."""
    from sglang.srt.server_args import ServerArgs  # noqa: PLC0415

    given = set_fields(server_args)
    rebuilt = ServerArgs(model_path=server_args.model_path, **given)
    differ = [n for n in _fields() if getattr(rebuilt, n) != getattr(server_args, n)]
    assert not differ, differ
    return dict(
        tp=server_args.tp_size,
        dp=server_args.dp_size,
        enable_dp_attention=server_args.enable_dp_attention,
        pp=server_args.pp_size,
        dcp=server_args.dcp_size,
        kv_dtype=server_args.kv_cache_dtype,
        server_args=given,
    )


def sized(server_args: Any, gpu: str, budget_bytes: int) -> dict[str, Any]:
    """SGLang's resolution and pool sizing (``sglang_case``, no pools built) of the parsed
    ``server_args`` on ``gpu`` in ``budget_bytes`` (what ``KVCacheConfigurator`` divides)."""
    return se.sglang_case(
        server_args.model_path,
        gpu=gpu,
        budget_bytes=budget_bytes,
        pools=False,
        **harness_args(server_args),
    )
