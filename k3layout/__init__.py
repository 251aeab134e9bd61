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
from .transfer import (
    RankPair,
    Region,
    Segment,
    TransferPlan,
    admission_refusal,
    check_admission,
    check_pairing,
    pairing_refusal,
    plan_transfer,
    transfer_violations,
)

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
    "RankPair",
    "RankSizes",
    "Refusal",
    "RefusalCode",
    "Region",
    "ReplayRecordSizes",
    "Replicate",
    "RuleCheck",
    "Segment",
    "Shard",
    "Stage",
    "TokenRun",
    "TransferPlan",
    "VllmPlan",
    "__version__",
    "admission_refusal",
    "check_admission",
    "check_pairing",
    "load_config",
    "load_plan",
    "model_from_config",
    "pairing_refusal",
    "plan",
    "plan_parent",
    "plan_transfer",
    "plan_vllm",
    "pp_stage_bounds",
    "preset",
    "rank_sizes",
    "transfer_violations",
    "with_engine",
]
