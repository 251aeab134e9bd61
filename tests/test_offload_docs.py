"""The offload package's worked examples run, every public name is documented, no torch."""

from __future__ import annotations

import doctest
import importlib
import inspect
import subprocess
import sys

import pytest

import k3layout.offload

MODULES = (
    "k3layout.names",  # the layer names offload publishes by (below the engines)
    *(
        f"k3layout.offload.{name}"
        for name in ("plane_order", "image", "views", "aliasing", "ride", "stage", "report")
    ),
)


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_hold(name: str) -> None:
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0


def test_the_worked_examples_exist() -> None:
    attempted = sum(doctest.testmod(importlib.import_module(name)).attempted for name in MODULES)
    assert attempted >= 5 * 2  # plane_order, image, aliasing, ride, names: two lines or more


def test_every_public_name_is_documented() -> None:
    for name in k3layout.offload.__all__:
        value = getattr(k3layout.offload, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{name} has no docstring"


def test_the_offload_planner_imports_without_torch() -> None:
    code = (
        "import sys, k3layout.offload as o, k3layout\n"
        "p = k3layout.plan(k3layout.preset('kimi-k3'), k3layout.Deployment(attn_tp=8))\n"
        "o.plan_ride(p)\n"
        "print('torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"
