"""SGLang 0.5.23 as ``engine="sglang"``: its rules, pools, capacity, P/D and bridge.

- :mod:`.rules`: SGLang 0.5.23's rules (backend and page per GPU, the budget split, running
  requests, the pipeline split);
- :mod:`.layout`: the token pool and the state pool (:class:`SglangPlan`), registered by
  :mod:`.engine`; :mod:`.capacity`: ``max_total_num_tokens``, ``max_mamba_cache_size`` and
  ``max_running_requests`` of a budget;
- :mod:`.bridge`: plan from SGLang's own ``ServerArgs`` and model config, check the pools it
  allocated (no SGLang import);
- :mod:`.pool_args`: the arguments SGLang's pools are built with, from a plan (SGLang imported
  when called).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports
from .capacity import SglangCapacity, SglangStageCapacity
from .engine import SGLANG, plan_sglang
from .layout import SglangPlan
from .rules import SGLANG_VERSION

if TYPE_CHECKING:
    from .bridge import (
        check_pools,
        deployment_from_sglang,
        model_from_sglang,
        plan_from_sglang,
    )
    from .pool_args import pool_arguments

_LAZY: dict[str, str] = {
    "check_pools": "bridge",
    "deployment_from_sglang": "bridge",
    "model_from_sglang": "bridge",
    "plan_from_sglang": "bridge",
    "pool_arguments": "pool_args",
}

__all__ = [
    "SGLANG",
    "SGLANG_VERSION",
    "SglangCapacity",
    "SglangPlan",
    "SglangStageCapacity",
    "check_pools",
    "deployment_from_sglang",
    "model_from_sglang",
    "plan_from_sglang",
    "plan_sglang",
    "pool_arguments",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY, __all__)
