"""The ``k3layout`` command line: ``plan``, ``recommend``, ``sweep``, ``transfer``, ``ride``
and ``draw`` (exit 2 on a refusal)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from . import draw, plan, recommend, ride, sweep, transfer

SUBCOMMANDS = (plan, recommend, sweep, transfer, ride, draw)


def parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    top = argparse.ArgumentParser(
        prog="k3layout", description="Plan the KV-cache layout of hybrid MLA + KDA models."
    )
    subparsers = top.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.register(subparsers)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``k3layout`` script."""
    args = parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)
