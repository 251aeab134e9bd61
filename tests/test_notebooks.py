"""The notebooks run top to bottom (their ``assert`` s restate the seeds' numbers) and show
their pictures; each opens with a title and the command that runs it, whose dependencies are the
``notebooks`` extra, and uses the current names."""

from __future__ import annotations

import ast
import json
import re
import sys
from importlib.metadata import entry_points, packages_distributions
from pathlib import Path
from typing import Any

import pytest
import tomllib

import k3layout
from k3layout.registry import engine_aliases

ROOT = Path(__file__).parent.parent
NOTEBOOKS = ROOT / "notebooks"

# The pictures each notebook shows: a planes / image / order / map picture or a plot per cell.
PICTURES = {"layouts.ipynb": 11, "offload.ipynb": 5, "transfer.ipynb": 4}


def execute(path: Path) -> Any:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=120,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    return notebook


def test_every_notebook_is_listed_and_committed_without_outputs() -> None:
    nbformat = pytest.importorskip("nbformat")
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(PICTURES)
    for name in PICTURES:
        notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert code, name
        assert all(not cell.outputs and cell.execution_count is None for cell in code), name


@pytest.mark.parametrize("name", sorted(PICTURES))
def test_the_notebook_runs_top_to_bottom_and_shows_its_pictures(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = execute(NOTEBOOKS / name)
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(shown) == PICTURES[name]


def _cells(name: str) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = json.loads((NOTEBOOKS / name).read_text())["cells"]
    return cells


def _code(name: str) -> ast.Module:
    """The notebook's code cells as one module (IPython's ``%`` magics left out)."""
    lines = [
        line
        for cell in _cells(name)
        if cell["cell_type"] == "code"
        for line in "".join(cell["source"]).splitlines()
        if not line.lstrip().startswith("%")
    ]
    return ast.parse("\n".join(lines))


def _extra(name: str) -> set[str]:
    """The distributions an extra of pyproject.toml names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~\[ ;]", spec)[0] for spec in project["optional-dependencies"][name]}


@pytest.mark.parametrize("name", sorted(PICTURES))
def test_the_notebook_opens_with_a_title_and_the_command_that_runs_it(name: str) -> None:
    first = _cells(name)[0]
    text = "".join(first["source"])
    assert first["cell_type"] == "markdown"
    assert re.match(r"# \S", text), "the first cell is the notebook's title"
    assert f"pip install -e '.[notebooks]' && jupyter execute notebooks/{name}" in text


def test_the_command_is_the_notebooks_extras_runner() -> None:
    # ``jupyter execute`` is nbclient's console script; the kernel it starts is ipykernel's
    (runner,) = entry_points(group="console_scripts", name="jupyter-execute")
    assert runner.dist is not None and runner.dist.name == "nbclient"
    assert {"nbclient", "ipykernel"} <= _extra("notebooks")


@pytest.mark.parametrize("name", sorted(PICTURES))
def test_the_notebooks_extra_holds_every_package_the_notebook_imports(name: str) -> None:
    imported = set()
    for node in ast.walk(_code(name)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"k3layout"}
    distributions = packages_distributions()
    needed = {dist for module in third_party for dist in distributions[module]}
    assert needed and needed <= _extra("notebooks"), (name, needed)


@pytest.mark.parametrize("name", sorted(PICTURES))
def test_the_notebook_uses_the_current_names(name: str) -> None:
    old = {"plan_parent"}  # tokenspeed's planner before the engine was renamed
    names = set()
    for node in ast.walk(_code(name)):
        if isinstance(node, ast.ImportFrom) and node.module == "k3layout":
            names |= {alias.name for alias in node.names}
    assert names and names <= set(k3layout.__all__)
    assert not names & old
    words = {n.id for n in ast.walk(_code(name)) if isinstance(n, ast.Name)}
    strings = {
        n.value
        for n in ast.walk(_code(name))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    assert not words & old
    assert not strings & set(engine_aliases()), "an engine by its deprecated alias"
