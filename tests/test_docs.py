"""The docs hold: every ``python`` snippet runs (its asserts show the numbers), every command
of the CLI reference runs, every picture shown exists and is drawn by ``make_pictures``, and
the JSON schemas are what the models generate."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

from k3layout import (
    Deployment,
    EngineLayout,
    plan,
    plan_lmcache,
    plan_ride,
    plan_transfer,
    preset,
)
from k3layout.layouts.report import report
from k3layout.offload import ride_report
from k3layout.sweep import sweep
from k3layout.transfer import transfer_report

DOCS = Path(__file__).parent.parent / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
SNIPPET = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELL = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
PICTURE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")
MAX_PICTURE_BYTES = 200_000


def load(script: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(script, DOCS / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def snippets(page: Path) -> list[tuple[int, str]]:
    """Each python block of ``page`` with the line it starts on."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start(1)), m.group(1)) for m in SNIPPET.finditer(text)]


def name(page: Path) -> str:
    return str(page.relative_to(DOCS))


PAGES_WITH_SNIPPETS = [page for page in PAGES if snippets(page)]


def test_the_docs_have_the_promised_pages() -> None:
    assert {name(page) for page in PAGES} >= {
        "concepts.md",
        "integration.md",
        "cli.md",
        "seeds/000-lmcache-ride.md",
        "seeds/001-attention-dp-packing.md",
        "seeds/003-pp-to-dcp-transfer.md",
    }
    assert {name(page) for page in PAGES_WITH_SNIPPETS} >= {
        "concepts.md",
        "integration.md",
        "seeds/000-lmcache-ride.md",
        "seeds/001-attention-dp-packing.md",
        "seeds/003-pp-to-dcp-transfer.md",
    }


@pytest.mark.parametrize("page", PAGES_WITH_SNIPPETS, ids=name)
def test_the_pages_python_snippets_run_in_order(page: Path) -> None:
    if "k3layout.torch" in page.read_text():
        pytest.importorskip("torch")
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for line, code in snippets(page):
        # Pad with blank lines so that a failure points at the line of the page.
        exec(compile("\n" * line + code, str(page), "exec"), namespace)


def cli_examples() -> list[tuple[list[str], int]]:
    """Each ``k3layout ...`` line of the CLI reference, with the exit code it states."""
    examples: list[tuple[list[str], int]] = []
    for block in SHELL.findall((DOCS / "cli.md").read_text()):
        for line in block.splitlines():
            command, _, comment = line.partition("  # ")
            if command.startswith("k3layout "):
                code = 2 if "exits 2" in comment else 0
                examples.append((shlex.split(command)[1:], code))
    return examples


def test_the_cli_reference_shows_every_command() -> None:
    shown = {args[0] for args, _ in cli_examples()}
    assert shown == {"plan", "recommend", "sweep", "ride", "transfer", "draw"}
    assert {args[1] for args, _ in cli_examples() if args[0] == "draw"} == {
        "planes",
        "image",
        "order",
        "transfer",
        "segments",
        "sweep",
        "requests",
    }


def test_the_cli_reference_examples_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    for args, expected in cli_examples():
        run = subprocess.run(
            [sys.executable, "-m", "k3layout", *args],
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp_path,
        )
        assert run.returncode == expected, (args, run.stderr)


def test_every_picture_shown_is_drawn_by_make_pictures_and_small() -> None:
    pytest.importorskip("matplotlib")
    drawn = set(load("make_pictures").PICTURES)
    shown = {
        (page.parent / target).resolve()
        for page in PAGES
        for target in PICTURE.findall(page.read_text())
    }
    assert shown == {(DOCS / "img" / picture).resolve() for picture in drawn}
    assert {p.name for p in (DOCS / "img").iterdir()} == drawn
    for picture in drawn:
        assert (DOCS / "img" / picture).stat().st_size < MAX_PICTURE_BYTES, picture


def test_make_pictures_draws_every_picture(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    written = load("make_pictures").main(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in (DOCS / "img").iterdir())


def test_the_committed_schemas_are_the_generated_ones() -> None:
    generated: dict[str, str] = load("make_schemas").schemas()
    committed = {p.name: p.read_text() for p in (DOCS / "schema").glob("*.json")}
    assert set(committed) == set(generated)
    for file, text in generated.items():
        assert committed[file] == text, f"{file} is stale: run python docs/make_schemas.py"


def test_the_reports_validate_against_their_schemas() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    k3 = preset("kimi-k3-dspark")
    deployment = Deployment(attn_tp=8, spec_tokens=2)
    transfer = plan_transfer(
        preset("kimi-k3"), Deployment(pp=8), Deployment(attn_tp=8, dcp=8), prompt_tokens=512
    )
    documents: dict[str, list[BaseModel | EngineLayout]] = {
        "plan.schema.json": [
            plan(k3, deployment),
            plan(k3, Deployment(engine="tokenspeed", attn_tp=8)),  # main: rule_1152 null
            plan(k3, Deployment(engine="tokenspeed", engine_version="pr1152")),
        ],
        "plan-report.schema.json": [
            report(plan(k3, deployment)),
            report(plan(k3, Deployment(engine="tokenspeed", attn_tp=8))),
        ],
        "ride-report.schema.json": [ride_report(plan_ride(plan(k3, deployment)), 5000)],
        "lmcache-plan.schema.json": [plan_lmcache(plan(k3, Deployment(attn_tp=8, dcp=8)))],
        "transfer.schema.json": [transfer],
        "transfer-report.schema.json": [transfer_report(transfer)],
    }
    for file, values in documents.items():
        schema = json.loads((DOCS / "schema" / file).read_text())
        for value in values:
            jsonschema.validate(json.loads(value.model_dump_json()), schema)
    cells = sweep(preset("kimi-k3"), (5, 8))
    schema = json.loads((DOCS / "schema" / "sweep-cells.schema.json").read_text())
    jsonschema.validate([cell.model_dump(mode="json") for cell in cells], schema)


def _options(parser: argparse.ArgumentParser, path: str) -> set[tuple[str, str]]:
    """Every (command, option) the parser and its subcommands take."""
    found: set[tuple[str, str]] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _options(sub, f"{path} {name}".strip())
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                found.add((path, option))
    return found


def test_every_cli_option_is_in_the_cli_reference() -> None:
    from k3layout.cli import parser  # noqa: PLC0415

    text = (DOCS / "cli.md").read_text()
    missing = sorted(
        f"{command}: {option}" for command, option in _options(parser(), "") if option not in text
    )
    assert missing == []


def test_the_readmes_python_snippets_run_in_order() -> None:
    readme = DOCS.parent / "README.md"
    scope: dict[str, object] = {}
    found = snippets(readme)
    assert len(found) >= 2  # the plan and the operator's answer
    for line, code in found:
        exec(compile(code, f"{readme}:{line + 1}", "exec"), scope)
