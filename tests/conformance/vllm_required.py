"""Skip a conformance module where no vLLM release k3layout follows is installed (the README's
test set-up installs 0.33.0 in the ``tests`` session and 0.34.0 in ``vllm034``), saying so; the
rest of the test suite runs either way.

The harnesses run under every followed release. Where vLLM's API moved between them, they
branch on the installed release (:data:`RUNNING`, :data:`AT_LEAST_034`); the tests plan with
``engine_version=RUNNING``, so that k3layout applies the installed release's rules.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import version

import pytest

from k3layout.engines.vllm.releases import VLLM_VERSIONS

RUNNING: str | None = version("vllm") if importlib.util.find_spec("vllm") is not None else None
"""The installed vLLM release (``None``: none installed)."""

AT_LEAST_034 = RUNNING is not None and tuple(map(int, RUNNING.split(".")[:2])) >= (0, 34)
"""Whether the installed release is 0.34 or later (Model Runner V1 removed, the extensible KV
cache, ``MLAAttention`` asking its implementation for an ``fp8_ds_mla`` row, NIXL's group
regions)."""


def require_vllm() -> None:
    """Skip the calling test module unless a followed vLLM release is importable."""
    if RUNNING not in VLLM_VERSIONS:
        pytest.skip(
            f"no vLLM release k3layout follows ({', '.join(VLLM_VERSIONS)}) is installed "
            f"(found: {RUNNING}); the README's test set-up installs them",
            allow_module_level=True,
        )


def running() -> str:
    """:data:`RUNNING`, for a module :func:`require_vllm` let run."""
    assert RUNNING is not None
    return RUNNING
