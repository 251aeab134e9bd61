"""The adapter's worked examples run, and every name it exports exists and is documented."""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

pytest.importorskip("torch")

import k3layout.torch

MODULES = (
    "k3layout.offload.tensors",
    "k3layout.torch.allocation",
    "k3layout.torch.live",
    "k3layout.torch.images",
    "k3layout.torch.tables",
)


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_hold(name: str) -> None:
    module = importlib.import_module(name)
    failures, attempted = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert attempted > 0 and failures == 0


def test_every_exported_name_exists_and_is_documented() -> None:
    for name in k3layout.torch.__all__:
        value = getattr(k3layout.torch, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{name} has no docstring"
    assert {"allocate", "validate", "image_units", "pack_units", "restore_units"} <= set(
        k3layout.torch.__all__
    )
