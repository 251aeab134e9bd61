"""k3layout: plans the KV-cache layout of Kimi-K3 and other hybrid MLA + KDA models.

The architecture reads top to bottom: a :class:`HybridModel` and a :class:`Deployment` give
per-rank :mod:`~k3layout.sizes`; :func:`plan` lays them out for the engine the deployment names
and returns a frozen, JSON-serialisable plan, or raises :class:`Refusal`. Three engines:

- ``vllm``: vLLM 0.34's (or 0.33's) hybrid allocator (a block raised until a page holds a KDA
  state, groups sharing planes, one backing per rank);
- ``sglang``: SGLang 0.5.23's token pool and state pool, split and counted as SGLang does on
  the GPU ``Deployment.gpu`` names;
- ``tokenspeed``: tokenspeed's Kimi-K3 recipe at its ``main`` or PR #1152's head
  (``engine_version``), its parent arena (``parent`` is a deprecated alias).

On a plan, :mod:`k3layout.offload` rides the KDA state on the PAGE object (:func:`plan_ride`)
and :mod:`k3layout.transfer` moves a request from a prefill to a decode (:func:`plan_transfer`).
The planner imports no torch; the adapter lives in ``k3layout.torch``.

Every public name is imported on first use (PEP 562 ``__getattr__``): ``import k3layout``
loads no submodule, and ``k3layout.plan`` loads the planner but not the offload, transfer or
torch packages. ``__all__`` and ``dir(k3layout)`` list them, as below (``help(k3layout)``
then documents each; ``help(k3layout.<name>)`` one).

:func:`plan` is typed by the :class:`EngineLayout` protocol, what every engine's plan
answers; ``plan(model, deployment, engine="vllm")`` (or :func:`plan_vllm`) by the engine's
own plan type. Plans, capacities and memory budgets show themselves in one line (``repr``)
and as a table in a notebook (``_repr_html_``) and in rich (``rich.print``).

Model
    HybridModel, Layer          a decoder's layers in module order (target, then draft)
    MLALayer, KDALayer, GQALayer   the layer kinds and their dimensions
    preset, PRESETS             the built-in models (kimi-k3, kimi-k3-dspark, kimi-linear-48b)
    load_config, model_from_config   a model from a Hugging Face config.json (draft optional)
    Architecture, Quantization, VisionTower, DSparkDraft   what its weights are

Deployment
    Deployment                  parallelism and cache settings of one deployment, per rank
    EngineFlavour, engine_names, EngineFacts, EngineRules   the engines and what each answers
    with_engine                 the same deployment for another engine
    Gpu, GpuName, GPUS, GPU_NAMES   the GPUs an engine runs on
    KvCacheDtype, KV_CACHE_DTYPES, DTypeName, DTYPE_BYTES   cache dtypes and their widths
    ConvLayout, CONV_LAYOUTS    the KDA conv state's layouts (SD, DS)

Planning
    plan, Plan                  plan a model on a deployment (any engine's plan)
    save_plan, load_plan        a plan to a file, and back (from a file, JSON or a dict), re-checked
    diff, PlanDiff, Difference  every field and derived number two plans differ in
    plan_vllm, VllmPlan         vLLM's hybrid layout
    plan_tokenspeed, plan_parent, ParentPlan   tokenspeed's parent arena (plan_parent: old name)
    plan_sglang, SglangPlan     SGLang's token pool and state pool
    Binding, GroupPages, LayerBinding   a tokenspeed arena bound to ``n`` parents
    EngineLayout, Stage, Group, PlaneMember   what every plan answers: stages, groups, planes
    Packing, RuleCheck          a packing per plane, and the followed revision's rule checked
    ByteRange                   where a part of a layer's page of a block lives
    RequestCapacity             what a KV budget per rank holds
    recommend, Recommendation   an engine's flags for a workload, and the command that starts it
    Refusal, RefusalCode        the one error: a stable code, the facts, a hint
    CheckFacts, CHECK_FACT_KEYS, check_facts_violations   the checks' one facts schema

The GPU's memory
    weights_per_rank, WeightsPlan, RankWeights, WeightGroup, WeightTensor   weights per rank
    memory_budget, least_budget, MemoryBudget, ReserveTerm   weights + reserve + KV = the GPU

Per-rank sizes
    rank_sizes, RankSizes       per-rank cache specs and bytes of every layer
    LayerCacheSpec, CachePart, PartRange   a layer's cache as named parts
    conv_channel_offset         the byte offset of a conv channel group in a row
    Shard, Replicate, ReplicaShard, Interleave, TokenRun   how a part splits over ranks
    pp_stage_bounds             module layers of each pipeline stage, as vLLM splits them

Offload (LMCache MP: the KDA state rides the PAGE object)
    plan_ride, RidePlan, RideOptions   the ride of one rank, and the settings it needs
    plan_lmcache, LMCachePlan, LMCacheOptions   LMCache 0.5.6's own vLLM connector
    plane_order, PlaneOrder     the publish order, aliased planes first
    checkpoint_image, CheckpointImage   one boundary's image
    check_aliasing, vllm_views, TensorView   the aliasing check on addresses
    engine_layer_names, naming_rule, LayerNames, NamingRule   the names engines register

Prefill-to-decode transfer
    plan_transfer, TransferPlan   every copy that moves one request
    RankPair, Segment, Region   a rank pair's copies and the buffers they read and write
    pairing_refusal, check_pairing   whether a pairing can carry head-sharded state
    admission_refusal, check_admission   whether the decode admits a request
    transfer_violations         the invariants of a transfer plan that do not hold
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, overload

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from .cache import CachePart, GQALayer, LayerCacheSpec, PartRange, conv_channel_offset
    from .deployment import CONV_LAYOUTS, ConvLayout, Deployment, EngineFlavour
    from .dtypes import DTYPE_BYTES, KV_CACHE_DTYPES, DTypeName, KvCacheDtype
    from .engines.sglang import SglangPlan, plan_sglang
    from .engines.tokenspeed import (
        Binding,
        GroupPages,
        LayerBinding,
        ParentPlan,
        plan_parent,
        plan_tokenspeed,
    )
    from .engines.vllm import VllmPlan, plan_vllm
    from .errors import (
        CHECK_FACT_KEYS,
        CheckFacts,
        Refusal,
        RefusalCode,
        check_facts_violations,
    )
    from .gpus import GPU_NAMES, GPUS, Gpu, GpuName
    from .layouts import (
        ByteRange,
        Difference,
        EngineLayout,
        Group,
        Packing,
        Plan,
        PlanDiff,
        PlaneMember,
        RuleCheck,
        Stage,
        diff,
        load_plan,
        save_plan,
        with_engine,
    )
    from .layouts.answer import RequestCapacity
    from .layouts.memory import least_budget, memory_budget
    from .layouts.recommend import Recommendation, recommend
    from .layouts.seams import EngineRules
    from .layouts.weights import weights_per_rank
    from .memory import MemoryBudget, ReserveTerm
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
    from .model.architecture import Architecture, DSparkDraft, Quantization, VisionTower
    from .offload import (
        CheckpointImage,
        LayerNames,
        LMCacheOptions,
        LMCachePlan,
        NamingRule,
        PlaneOrder,
        RideOptions,
        RidePlan,
        TensorView,
        check_aliasing,
        checkpoint_image,
        engine_layer_names,
        naming_rule,
        plan_lmcache,
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
    from .weights import RankWeights, WeightGroup, WeightsPlan, WeightTensor

    # k3layout.plan as a type checker sees it: the engine's plan type where the call names
    # the engine, else the protocol every plan answers. The function is
    # k3layout.layouts.plan (imported on first use, like every name here); the core never
    # names an engine, so the overloads naming each live on the package's face.
    @overload
    def plan(
        model: HybridModel, deployment: Deployment, *, engine: Literal["vllm"]
    ) -> VllmPlan: ...
    @overload
    def plan(
        model: HybridModel, deployment: Deployment, *, engine: Literal["tokenspeed", "parent"]
    ) -> ParentPlan: ...
    @overload
    def plan(
        model: HybridModel, deployment: Deployment, *, engine: Literal["sglang"]
    ) -> SglangPlan: ...
    @overload
    def plan(
        model: HybridModel, deployment: Deployment, *, engine: EngineFlavour | None = None
    ) -> EngineLayout: ...
    def plan(
        model: HybridModel, deployment: Deployment, *, engine: EngineFlavour | None = None
    ) -> EngineLayout:
        """Plan ``model``'s KV cache under ``deployment`` (:func:`k3layout.layouts.plan`)."""

_LAZY: dict[str, str] = {
    "least_budget": "layouts.memory",
    "memory_budget": "layouts.memory",
    "weights_per_rank": "layouts.weights",
    "MemoryBudget": "memory",
    "ReserveTerm": "memory",
    "Architecture": "model.architecture",
    "DSparkDraft": "model.architecture",
    "Quantization": "model.architecture",
    "VisionTower": "model.architecture",
    "RankWeights": "weights",
    "WeightGroup": "weights",
    "WeightsPlan": "weights",
    "WeightTensor": "weights",
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
    "CheckFacts": "errors",
    "CHECK_FACT_KEYS": "errors",
    "check_facts_violations": "errors",
    "diff": "layouts",
    "Difference": "layouts",
    "PlanDiff": "layouts",
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
    "SglangPlan": "engines.sglang",
    "plan_sglang": "engines.sglang",
    "load_plan": "layouts",
    "save_plan": "layouts",
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
    "LMCacheOptions": "offload",
    "LMCachePlan": "offload",
    "plan_lmcache": "offload",
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
    "CHECK_FACT_KEYS",
    "CONV_LAYOUTS",
    "DTYPE_BYTES",
    "GPUS",
    "GPU_NAMES",
    "KV_CACHE_DTYPES",
    "PRESETS",
    "Architecture",
    "Binding",
    "ByteRange",
    "CachePart",
    "CheckFacts",
    "CheckpointImage",
    "ConvLayout",
    "DSparkDraft",
    "DTypeName",
    "Deployment",
    "Difference",
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
    "LMCacheOptions",
    "LMCachePlan",
    "Layer",
    "LayerBinding",
    "LayerCacheSpec",
    "LayerNames",
    "MLALayer",
    "MemoryBudget",
    "NamingRule",
    "Packing",
    "ParentPlan",
    "PartRange",
    "Plan",
    "PlanDiff",
    "PlaneMember",
    "PlaneOrder",
    "Quantization",
    "RankPair",
    "RankSizes",
    "RankWeights",
    "Recommendation",
    "Refusal",
    "RefusalCode",
    "Region",
    "ReplicaShard",
    "Replicate",
    "RequestCapacity",
    "ReserveTerm",
    "RideOptions",
    "RidePlan",
    "RuleCheck",
    "Segment",
    "SglangPlan",
    "Shard",
    "Stage",
    "TensorView",
    "TokenRun",
    "TransferPlan",
    "VisionTower",
    "VllmPlan",
    "WeightGroup",
    "WeightTensor",
    "WeightsPlan",
    "__version__",
    "admission_refusal",
    "check_admission",
    "check_aliasing",
    "check_facts_violations",
    "check_pairing",
    "checkpoint_image",
    "conv_channel_offset",
    "diff",
    "engine_layer_names",
    "engine_names",
    "least_budget",
    "load_config",
    "load_plan",
    "memory_budget",
    "model_from_config",
    "naming_rule",
    "pairing_refusal",
    "plan",
    "plan_lmcache",
    "plan_parent",
    "plan_ride",
    "plan_sglang",
    "plan_tokenspeed",
    "plan_transfer",
    "plan_vllm",
    "plane_order",
    "pp_stage_bounds",
    "preset",
    "rank_sizes",
    "recommend",
    "save_plan",
    "transfer_violations",
    "vllm_views",
    "weights_per_rank",
    "with_engine",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY, __all__)
