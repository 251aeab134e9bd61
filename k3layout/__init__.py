"""k3layout: plans the KV-cache layout of Kimi-K3 and other hybrid MLA + KDA models.

The architecture reads top to bottom: a :class:`HybridModel` and a :class:`Deployment` give
per-rank :mod:`~k3layout.sizes`; :func:`plan` lays them out for an engine (``vllm`` or
``parent``) and returns a frozen, JSON-serialisable plan, or raises :class:`Refusal`. The
planner imports no torch; the adapter lives in ``k3layout.torch``.
"""

from .deployment import ENGINES, Deployment, EngineFlavour
from .dtypes import DTYPE_BYTES, KV_CACHE_DTYPES, DTypeName, KvCacheDtype
from .errors import Refusal, RefusalCode
from .layouts import (
    Binding,
    Group,
    GroupPages,
    LayerBinding,
    Packing,
    ParentPlan,
    Plan,
    PlaneMember,
    RuleCheck,
    Stage,
    VllmPlan,
    load_plan,
    plan,
    plan_parent,
    plan_vllm,
    with_engine,
)
from .model import (
    PRESETS,
    HybridModel,
    KDALayer,
    Layer,
    MLALayer,
    load_config,
    model_from_config,
    preset,
)
from .placements import Interleave, Replicate, Shard, TokenRun, pp_stage_bounds
from .sizes import KdaStateSizes, MlaCacheSizes, RankSizes, ReplayRecordSizes, rank_sizes

__version__ = "0.1.0"

__all__ = [
    "DTYPE_BYTES",
    "ENGINES",
    "KV_CACHE_DTYPES",
    "PRESETS",
    "Binding",
    "DTypeName",
    "Deployment",
    "EngineFlavour",
    "Group",
    "GroupPages",
    "HybridModel",
    "Interleave",
    "KDALayer",
    "KdaStateSizes",
    "KvCacheDtype",
    "Layer",
    "LayerBinding",
    "MLALayer",
    "MlaCacheSizes",
    "Packing",
    "ParentPlan",
    "Plan",
    "PlaneMember",
    "RankSizes",
    "Refusal",
    "RefusalCode",
    "ReplayRecordSizes",
    "Replicate",
    "RuleCheck",
    "Shard",
    "Stage",
    "TokenRun",
    "VllmPlan",
    "__version__",
    "load_config",
    "load_plan",
    "model_from_config",
    "plan",
    "plan_parent",
    "plan_vllm",
    "pp_stage_bounds",
    "preset",
    "rank_sizes",
    "with_engine",
]
