"""The package: torch-free planner, typed, exports what it documents."""

from __future__ import annotations

import inspect
import subprocess
import sys
from importlib import resources

import k3layout


def test_the_planner_imports_without_torch() -> None:
    code = (
        "import sys, k3layout, k3layout.cli, k3layout.sweep\n"
        "k3layout.plan(k3layout.preset('kimi-k3'), k3layout.Deployment(attn_tp=8))\n"
        "print('torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"


def test_every_exported_name_exists_and_is_documented() -> None:
    for name in k3layout.__all__:
        value = getattr(k3layout, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{name} has no docstring"


def test_py_typed_ships() -> None:
    assert resources.files("k3layout").joinpath("py.typed").is_file()
