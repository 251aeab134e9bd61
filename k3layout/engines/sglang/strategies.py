"""SGLang's own deployment settings for :func:`k3layout.testing.deployments`: the values a
sweep draws each of them from, and the synthetic models it draws for SGLang. Which
combinations plan is the planner's verdict (:mod:`k3layout._deployment_space` plans each
candidate), so nothing here restates a rule of :mod:`.rules` or :mod:`.layout`."""

from __future__ import annotations

from typing import Final

from ...model import HybridModel
from .rules import DEFAULT_TRACK_INTERVAL, DSA_INDEX_HEAD_DIMS, MAMBA_FULL_MEMORY_RATIO, SERVED_GPUS

MEMORY_RATIOS: Final = (None, MAMBA_FULL_MEMORY_RATIO / 2, MAMBA_FULL_MEMORY_RATIO, 2.0)
"""``--mamba-full-memory-ratio`` values drawn: unset, SGLang's default, half and above 1."""

RUNNING_REQUESTS: Final = (None, 1, 64, 512)
"""``--max-running-requests`` values drawn."""

STATE_SLOTS: Final = (None, 64, 1024)
"""``--max-mamba-cache-size`` values drawn."""

TOTAL_TOKENS: Final = (None, 1 << 16, 1 << 20)
"""``--max-total-tokens`` values drawn."""

TRACK_INTERVALS: Final = (None, DEFAULT_TRACK_INTERVAL // 4, DEFAULT_TRACK_INTERVAL, 1024)
"""``--mamba-track-interval`` values drawn (SGLang takes a multiple of its page)."""


def serves(model: HybridModel) -> bool:
    """Whether SGLang's DSA pool takes ``model``'s indexers (their key width, a fixed
    ``index_head_dim``); a model without one always."""
    return all(
        layer.indexer is None or layer.indexer.head_dim in DSA_INDEX_HEAD_DIMS
        for layer in model.mla_layers
    )


def domains(model: HybridModel, layouts: tuple[str, ...]) -> dict[str, tuple[object, ...]]:
    """The values SGLang's own flags are drawn from, and the GPUs it was read on."""
    return {
        "gpu": SERVED_GPUS,
        "mamba_full_memory_ratio": MEMORY_RATIOS,
        "max_running_requests": RUNNING_REQUESTS,
        "max_mamba_cache_size": STATE_SLOTS,
        "max_total_tokens": TOTAL_TOKENS,
        "mamba_track_interval": TRACK_INTERVALS,
    }


def model_shapes(layouts: tuple[str, ...]) -> tuple[dict[str, object], ...]:
    """The keyword arguments of :func:`k3layout.testing.hybrid_models` whose models SGLang
    plans: any K3-family hybrid, and indexed ones whose key width its DSA pool takes."""
    return ({"indexed": False}, {"indexed": True, "index_head_dims": DSA_INDEX_HEAD_DIMS})
