"""Shared fixtures: the presets and the Hugging Face configs they are checked against."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from k3layout import HybridModel, preset

FIXTURES = Path(__file__).parent / "fixtures"

settings.register_profile(
    "k3layout",
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("k3layout")


@pytest.fixture(scope="session")
def k3() -> HybridModel:
    """Kimi-K3 without its draft."""
    return preset("kimi-k3")


@pytest.fixture(scope="session")
def k3_dspark() -> HybridModel:
    """Kimi-K3 with the 5-layer DSpark draft."""
    return preset("kimi-k3-dspark")


@pytest.fixture(scope="session")
def kimi_linear() -> HybridModel:
    """Kimi-Linear-48B-A3B."""
    return preset("kimi-linear-48b")
