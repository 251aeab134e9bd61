"""The notebooks run top to bottom (their ``assert`` s restate the seeds' numbers) and show
their pictures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"

# The pictures each notebook shows: a planes / image / order / map picture or a plot per cell.
PICTURES = {"layouts.ipynb": 9, "offload.ipynb": 5, "transfer.ipynb": 3}


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
