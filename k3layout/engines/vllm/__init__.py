"""vLLM 0.33 as ``engine="vllm"``: its rules, layout, capacity, bound views and bridge.

- :mod:`.rules`: vLLM 0.33's rules (kernel blocks, block raise, layouts, KDA modes);
- :mod:`.layout`: the hybrid allocator's plan (:class:`VllmPlan`), registered by
  :mod:`.engine`; :mod:`.capacity`: blocks per request, ``num_blocks``, max concurrency;
- :mod:`.bound`: what a worker binds to each layer, as data; :mod:`.caches`: those tensors
  checked;
- :mod:`.pd`: its prefill-to-decode rules, as its NIXL connector applies them (the TP rule,
  :data:`PD_RULE`, for :func:`~k3layout.plan_transfer`; :func:`nixl_refusal` for the rest);
- :mod:`.bridge`: plan from vLLM's own ``VllmConfig`` and check its ``KVCacheConfig`` and the
  bound caches (no vLLM import); :mod:`.plugin`: the startup check (``K3LAYOUT_CHECK=1``);
- :mod:`.kv_config`: vLLM's own ``KVCacheConfig`` and layer specs built from a plan (vLLM
  imported when called).

Importing the package registers the engine and loads only its planner; the bridge, the bound
views and the plugin load on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports
from .engine import VLLM, plan_vllm
from .layout import VllmPlan, block_tokens_for, built_model
from .rules import VLLM_VERSION

if TYPE_CHECKING:
    from .bound import BoundView, vllm_bound_views
    from .bridge import (
        check_kv_cache_config,
        check_kv_caches,
        deployment_from_vllm,
        layer_of,
        model_from_vllm,
        plan_from_vllm,
    )
    from .capacity import GroupBlocks, VllmCapacity
    from .kv_config import kv_cache_config, kv_cache_specs
    from .pd import PD_RULE, check_nixl, nixl_refusal
    from .plugin import register

_LAZY: dict[str, str] = {
    "BoundView": "bound",
    "vllm_bound_views": "bound",
    "check_kv_cache_config": "bridge",
    "check_kv_caches": "bridge",
    "deployment_from_vllm": "bridge",
    "layer_of": "bridge",
    "model_from_vllm": "bridge",
    "plan_from_vllm": "bridge",
    "GroupBlocks": "capacity",
    "VllmCapacity": "capacity",
    "kv_cache_config": "kv_config",
    "kv_cache_specs": "kv_config",
    "register": "plugin",
    "PD_RULE": "pd",
    "check_nixl": "pd",
    "nixl_refusal": "pd",
}

__all__ = [
    "PD_RULE",
    "VLLM",
    "VLLM_VERSION",
    "BoundView",
    "GroupBlocks",
    "VllmCapacity",
    "VllmPlan",
    "block_tokens_for",
    "built_model",
    "check_kv_cache_config",
    "check_kv_caches",
    "check_nixl",
    "deployment_from_vllm",
    "kv_cache_config",
    "kv_cache_specs",
    "layer_of",
    "model_from_vllm",
    "nixl_refusal",
    "plan_from_vllm",
    "plan_vllm",
    "register",
    "vllm_bound_views",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY, __all__)
