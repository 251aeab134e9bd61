"""Skip a conformance module where vLLM 0.33 is not installed (the README's test set-up
installs it), saying so; the rest of the test suite runs either way."""

from __future__ import annotations

import importlib.util
from importlib.metadata import version

import pytest

VLLM_VERSION = "0.33.0"


def require_vllm() -> None:
    """Skip the calling test module unless vLLM ``VLLM_VERSION`` is importable."""
    found = version("vllm") if importlib.util.find_spec("vllm") is not None else None
    if found != VLLM_VERSION:
        pytest.skip(
            f"vLLM {VLLM_VERSION} is not installed (found: {found}); the README's test "
            "set-up installs it",
            allow_module_level=True,
        )
