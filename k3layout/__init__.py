"""k3layout: plans the KV-cache layout of Kimi-K3 and other hybrid MLA + KDA models.

The architecture reads top to bottom: a :class:`HybridModel` and a :class:`Deployment` give
per-rank :mod:`~k3layout.sizes`; :func:`plan` lays them out for an engine (``vllm`` or
``parent``) and returns a frozen, JSON-serialisable plan, or raises :class:`Refusal`. On a
plan, :mod:`k3layout.offload` rides the KDA state on the PAGE object (:func:`plan_ride`) and
:mod:`k3layout.transfer` moves a request from a prefill to a decode (:func:`plan_transfer`).
The planner imports no torch; the adapter lives in ``k3layout.torch``.
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
from .offload import (
    CheckpointImage,
    LayerNames,
    PlaneOrder,
    RideOptions,
    RidePlan,
    TensorView,
    check_aliasing,
    checkpoint_image,
    engine_layer_names,
    plan_ride,
    plane_order,
    vllm_views,
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
    "CheckpointImage",
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
    "LayerNames",
    "MLALayer",
    "MlaCacheSizes",
    "Packing",
    "ParentPlan",
    "Plan",
    "PlaneMember",
    "PlaneOrder",
    "RankPair",
    "RankSizes",
    "Refusal",
    "RefusalCode",
    "Region",
    "ReplayRecordSizes",
    "Replicate",
    "RideOptions",
    "RidePlan",
    "RuleCheck",
    "Segment",
    "Shard",
    "Stage",
    "TensorView",
    "TokenRun",
    "TransferPlan",
    "VllmPlan",
    "__version__",
    "admission_refusal",
    "check_admission",
    "check_aliasing",
    "check_pairing",
    "checkpoint_image",
    "engine_layer_names",
    "load_config",
    "load_plan",
    "model_from_config",
    "pairing_refusal",
    "plan",
    "plan_parent",
    "plan_ride",
    "plan_transfer",
    "plan_vllm",
    "plane_order",
    "pp_stage_bounds",
    "preset",
    "rank_sizes",
    "transfer_violations",
    "vllm_views",
    "with_engine",
]
