"""k3layout: plans the KV-cache layout of Kimi-K3 and other hybrid MLA + KDA models.

The architecture reads top to bottom: a :class:`HybridModel` and a :class:`Deployment` give
per-rank :mod:`~k3layout.sizes`; :func:`plan` lays them out for an engine (``vllm`` or
``tokenspeed``) and returns a frozen, JSON-serialisable plan, or raises :class:`Refusal`. On a
plan, :mod:`k3layout.offload` rides the KDA state on the PAGE object (:func:`plan_ride`) and
:mod:`k3layout.transfer` moves a request from a prefill to a decode (:func:`plan_transfer`).
The planner imports no torch; the adapter lives in ``k3layout.torch``.

Every public name is imported on first use (PEP 562 ``__getattr__``): ``import k3layout``
loads no submodule, and ``k3layout.plan`` loads the planner but not the offload, transfer or
torch packages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from .cache import CachePart, GQALayer, LayerCacheSpec, PartRange, conv_channel_offset
    from .deployment import CONV_LAYOUTS, ConvLayout, Deployment, EngineFlavour
    from .dtypes import DTYPE_BYTES, KV_CACHE_DTYPES, DTypeName, KvCacheDtype
    from .engines.tokenspeed import (
        Binding,
        GroupPages,
        LayerBinding,
        ParentPlan,
        plan_parent,
        plan_tokenspeed,
    )
    from .engines.vllm import VllmPlan, plan_vllm
    from .errors import Refusal, RefusalCode
    from .gpus import GPU_NAMES, GPUS, Gpu, GpuName
    from .layouts import (
        ByteRange,
        EngineLayout,
        Group,
        Packing,
        Plan,
        PlaneMember,
        RuleCheck,
        Stage,
        load_plan,
        plan,
        with_engine,
    )
    from .layouts.answer import RequestCapacity
    from .layouts.recommend import Recommendation, recommend
    from .layouts.seams import EngineRules
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
        NamingRule,
        PlaneOrder,
        RideOptions,
        RidePlan,
        TensorView,
        check_aliasing,
        checkpoint_image,
        engine_layer_names,
        naming_rule,
        plan_ride,
        plane_order,
        vllm_views,
    )
    from .placements import (
        Interleave,
        ReplicaShard,
        Replicate,
        Shard,
        TokenRun,
        pp_stage_bounds,
    )
    from .registry import EngineFacts, engine_names
    from .sizes import RankSizes, rank_sizes
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

_LAZY: dict[str, str] = {
    "CachePart": "cache",
    "GQALayer": "cache",
    "LayerCacheSpec": "cache",
    "PartRange": "cache",
    "conv_channel_offset": "cache",
    "CONV_LAYOUTS": "deployment",
    "ConvLayout": "deployment",
    "ByteRange": "layouts",
    "EngineLayout": "layouts",
    "ReplicaShard": "placements",
    "Deployment": "deployment",
    "EngineFlavour": "deployment",
    "DTYPE_BYTES": "dtypes",
    "KV_CACHE_DTYPES": "dtypes",
    "DTypeName": "dtypes",
    "KvCacheDtype": "dtypes",
    "Refusal": "errors",
    "RefusalCode": "errors",
    "Binding": "engines.tokenspeed",
    "Group": "layouts",
    "GroupPages": "engines.tokenspeed",
    "LayerBinding": "engines.tokenspeed",
    "Packing": "layouts",
    "ParentPlan": "engines.tokenspeed",
    "Plan": "layouts",
    "PlaneMember": "layouts",
    "RuleCheck": "layouts",
    "Stage": "layouts",
    "VllmPlan": "engines.vllm",
    "load_plan": "layouts",
    "plan": "layouts",
    "plan_parent": "engines.tokenspeed",
    "plan_tokenspeed": "engines.tokenspeed",
    "plan_vllm": "engines.vllm",
    "with_engine": "layouts",
    "RequestCapacity": "layouts.answer",
    "Recommendation": "layouts.recommend",
    "recommend": "layouts.recommend",
    "GPU_NAMES": "gpus",
    "GPUS": "gpus",
    "Gpu": "gpus",
    "GpuName": "gpus",
    "EngineRules": "layouts.seams",
    "EngineFacts": "registry",
    "engine_names": "registry",
    "PRESETS": "model",
    "HybridModel": "model",
    "KDALayer": "model",
    "Layer": "model",
    "MLALayer": "model",
    "load_config": "model",
    "model_from_config": "model",
    "preset": "model",
    "CheckpointImage": "offload",
    "LayerNames": "offload",
    "NamingRule": "offload",
    "PlaneOrder": "offload",
    "RideOptions": "offload",
    "RidePlan": "offload",
    "TensorView": "offload",
    "check_aliasing": "offload",
    "checkpoint_image": "offload",
    "engine_layer_names": "offload",
    "naming_rule": "offload",
    "plan_ride": "offload",
    "plane_order": "offload",
    "vllm_views": "offload",
    "Interleave": "placements",
    "Replicate": "placements",
    "Shard": "placements",
    "TokenRun": "placements",
    "pp_stage_bounds": "placements",
    "RankSizes": "sizes",
    "rank_sizes": "sizes",
    "RankPair": "transfer",
    "Region": "transfer",
    "Segment": "transfer",
    "TransferPlan": "transfer",
    "admission_refusal": "transfer",
    "check_admission": "transfer",
    "check_pairing": "transfer",
    "pairing_refusal": "transfer",
    "plan_transfer": "transfer",
    "transfer_violations": "transfer",
}
"""Every public name, and the submodule that defines it."""

__version__ = "0.1.0"

__all__ = [
    "CONV_LAYOUTS",
    "DTYPE_BYTES",
    "GPUS",
    "GPU_NAMES",
    "KV_CACHE_DTYPES",
    "PRESETS",
    "Binding",
    "ByteRange",
    "CachePart",
    "CheckpointImage",
    "ConvLayout",
    "DTypeName",
    "Deployment",
    "EngineFacts",
    "EngineFlavour",
    "EngineLayout",
    "EngineRules",
    "GQALayer",
    "Gpu",
    "GpuName",
    "Group",
    "GroupPages",
    "HybridModel",
    "Interleave",
    "KDALayer",
    "KvCacheDtype",
    "Layer",
    "LayerBinding",
    "LayerCacheSpec",
    "LayerNames",
    "MLALayer",
    "NamingRule",
    "Packing",
    "ParentPlan",
    "PartRange",
    "Plan",
    "PlaneMember",
    "PlaneOrder",
    "RankPair",
    "RankSizes",
    "Recommendation",
    "Refusal",
    "RefusalCode",
    "Region",
    "ReplicaShard",
    "Replicate",
    "RequestCapacity",
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
    "conv_channel_offset",
    "engine_layer_names",
    "engine_names",
    "load_config",
    "load_plan",
    "model_from_config",
    "naming_rule",
    "pairing_refusal",
    "plan",
    "plan_parent",
    "plan_ride",
    "plan_tokenspeed",
    "plan_transfer",
    "plan_vllm",
    "plane_order",
    "pp_stage_bounds",
    "preset",
    "rank_sizes",
    "recommend",
    "transfer_violations",
    "vllm_views",
    "with_engine",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY, __all__)
