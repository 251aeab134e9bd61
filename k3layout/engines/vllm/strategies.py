"""vLLM's own deployment settings for :func:`k3layout.testing.deployments`: the values a sweep
draws each of them from, and the synthetic models it draws for vLLM. Which combinations plan
is the planner's verdict (:mod:`k3layout._deployment_space` plans each candidate), so nothing
here restates a rule of :mod:`.rules`, :mod:`.sparse` or :mod:`.replay`."""

from __future__ import annotations

from typing import Final, get_args

from ...deployment import Deployment
from ...dtypes import KV_CACHE_DTYPES
from ...model import HybridModel
from ...settings import (
    ATTENTION_BACKENDS,
    KDA_PREFILL_BACKENDS,
    MAMBA_CACHE_MODES,
    SPECULATIVE_METHODS,
)
from .rules import DENSE_MLA_KV_DTYPES
from .sparse import resolved_kv_cache_layout

REQUESTED_BLOCKS: Final = (None, 16, 64, 128, 256, 512, 2048)
"""``--block-size`` values drawn: unset, the releases' defaults and kernel blocks, and larger
powers of two (raised blocks of a hybrid are multiples of 128, so every interleave drawn
divides them)."""

DCP_INTERLEAVES: Final = (1, 2, 4, 8, 16)
"""``--dcp-kv-cache-interleave-size`` values drawn."""

MAMBA_BACKENDS: Final = get_args(Deployment.model_fields["mamba_backend"].annotation)
"""``--mamba-backend``'s values, as :class:`~k3layout.Deployment` takes them."""


def domains(model: HybridModel, layouts: tuple[str, ...]) -> dict[str, tuple[object, ...]]:
    """The values each vLLM setting is drawn from: the cache dtypes (FlashMLA's packed row for
    an indexed model's sparse backends), every attention backend (dense and sparse),
    the KV-cache layouts of ``layouts`` (unset too where what vLLM resolves without one is
    among them: ``BLHNC`` for an indexed model), requested blocks, DCP interleaves, KDA
    prefill kernels, cache modes, speculative methods, its own ReplaySSM and Mamba backend,
    and the extensible KV cache switch."""
    resolved = resolved_kv_cache_layout(Deployment(), model)
    unset: tuple[object, ...] = (None,) if resolved in layouts else ()
    # an indexed layer's sparse backends take FlashMLA's packed row too
    dtypes = KV_CACHE_DTYPES if model.indexer is not None else DENSE_MLA_KV_DTYPES
    return {
        "kv_dtype": dtypes,
        "attention_backend": (None, *ATTENTION_BACKENDS),
        "kv_cache_layout": (*unset, *layouts),
        "block_tokens": REQUESTED_BLOCKS,
        "dcp_interleave": DCP_INTERLEAVES,
        "kda_prefill_backend": KDA_PREFILL_BACKENDS,
        "mamba_cache_mode": (None, *MAMBA_CACHE_MODES),
        "speculative_method": (None, *SPECULATIVE_METHODS),
        "use_replayssm": (False, True),
        "mamba_backend": MAMBA_BACKENDS,
        "extensible_kv_cache": (None, True, False),
    }


def model_shapes(layouts: tuple[str, ...]) -> tuple[dict[str, object], ...]:
    """The keyword arguments of :func:`k3layout.testing.hybrid_models` whose models vLLM
    plans: any K3-family hybrid, and the indexed (GLM-5.3-Flash) family (in ``BLHNC``: its
    tail ring takes no other layout)."""
    return ({"indexed": False}, {"indexed": True})
