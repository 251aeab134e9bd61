"""vLLM 0.33: plan from a live ``VllmConfig`` and check the ``KVCacheConfig`` it planned.

Nothing here imports vLLM: the objects are read by their attributes, so the same code runs in
an engine process (where they are vLLM's) and in tests (``tests/conformance`` builds them with
vLLM's own code on CPU).

- :func:`plan_from_vllm`: the model (the HF config, ``text_config`` nested or flat; the
  DSpark draft from the speculative config) and the deployment (parallel, cache, speculative
  and attention settings) a ``VllmConfig`` describes, planned.
- :func:`check_kv_cache_config`: vLLM's ``KVCacheConfig`` of one rank against that plan:
  the groups (their layers, in order), the backing's size for its ``num_blocks``, and where
  every tensor's offset and strides put each layer's pages. The refusal (``plan_mismatch``)
  names the first difference: the planned value, vLLM's value and the layer.
- :func:`check_kv_caches`: then the tensors the worker bound to every layer
  (:mod:`~k3layout.engines.vllm.caches`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ..._args import engine_attribute, expect, expect_int, running_version
from ...deployment import Deployment
from ...dtypes import KV_CACHE_DTYPES
from ...errors import Fact, Refusal, check_refusal
from ...gpus import DEFAULT_GPU, GPU_NAMES, GPUS, GpuName
from ...model import HybridModel, config_of, model_from_config
from .caches import check_bound_caches
from .engine import plan_vllm
from .layout import VllmPlan
from .packed import packed_cache_part
from .releases import VLLM_RELEASES_TEXT
from .rules import ATTENTION_BACKENDS, runs_on

__all__ = [
    "check_kv_cache_config",
    "check_kv_caches",
    "deployment_from_vllm",
    "engine_gpu",
    "layer_of",
    "model_from_vllm",
    "plan_from_vllm",
    "unmodelled",
    "worker_stage",
]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_KV_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8"}


def _get(obj: Any, path: str, default: Any = None) -> Any:
    for name in path.split("."):
        if obj is None:
            return default
        obj = getattr(obj, name, None)
    return default if obj is None else obj


def _mamba_backend(vllm_config: Any) -> str:
    """``mamba_config.backend`` (a ``MambaBackendEnum`` in 0.33 and 0.34: ``triton``,
    ``flashinfer`` or ``cpu``) as ``Deployment.mamba_backend``; ``triton`` (vLLM's default)
    where the config has none. Refuses the CPU backend (no GPU plan)."""
    backend = _get(vllm_config, "mamba_config.backend")
    if backend is None:
        return "triton"
    name = str(getattr(backend, "value", backend)).lower()
    if name not in ("triton", "flashinfer"):
        raise _refuse(
            "mamba_config.backend",
            f"Mamba backend {name!r} is not one k3layout plans for",
            "use --mamba-backend triton or flashinfer",
            allowed=("triton", "flashinfer"),
        )
    return name


def _refuse(field: str, message: str, hint: str, **facts: Any) -> Refusal:
    return Refusal(
        "invalid_config",
        f"vllm_config.{field}: {message}",
        facts={"field": field, **facts},
        hint=hint,
    )


def layer_of(name: str) -> int:
    """The module layer a vLLM layer name registers (``...layers.{i}.self_attn``)."""
    expect("name", name, str)
    found = _LAYER.search(name)
    if found is None:
        raise Refusal(
            "layer_names",
            f"layer name {name!r} names no module layer (expected '...layers.<i>.self_attn')",
            facts={"name": name},
            hint="pass the layer names vLLM registers",
        )
    return int(found.group(1))


def model_from_vllm(vllm_config: Any) -> HybridModel:
    """The model a ``VllmConfig`` serves: its HF config, plus the DSpark draft's layers when
    the speculative config names a DSpark draft model."""
    field = "model_config.hf_config"
    config = config_of(engine_attribute(vllm_config, field, "vllm_config"), field, "vllm_config")
    speculative = engine_attribute(vllm_config, "speculative_config", "vllm_config", nullable=True)
    drafts = None
    owner = "vllm_config.speculative_config"
    if speculative is not None and engine_attribute(speculative, "method", owner) == "dspark":
        path = "draft_model_config.hf_text_config.num_hidden_layers"
        drafts = engine_attribute(speculative, path, owner)
    name = _get(vllm_config, "model_config.served_model_name") or _get(
        vllm_config, "model_config.model", "vllm-model"
    )
    if isinstance(name, (list, tuple)):
        name = name[0] if name else "vllm-model"
    return model_from_config(config, name=str(name), num_draft_layers=drafts, source="vLLM")


def engine_gpu() -> GpuName | None:
    """The GPU of the engine this process runs in, as vLLM's platform reports it (its device
    name, else its compute capability); ``None`` outside a GPU engine."""
    try:
        from vllm.platforms import current_platform  # noqa: PLC0415 - only inside an engine
    except ImportError:
        return None
    try:
        if not (current_platform.is_cuda() or current_platform.is_rocm()):
            return None
        name = str(current_platform.get_device_name()).lower().replace(" ", "")
        capability = current_platform.get_device_capability()
    except (RuntimeError, AssertionError, OSError, AttributeError):
        return None  # no device reachable from this process
    for gpu in sorted(GPUS, key=len, reverse=True):  # gb200 before b200
        if gpu in name:
            return gpu
    if capability is None:
        return None
    found = (int(capability.major), int(capability.minor))
    vendor = "amd" if current_platform.is_rocm() else "nvidia"
    return next(
        (g.name for g in GPUS.values() if (g.vendor, g.capability) == (vendor, found)), None
    )


def unmodelled(option: str, value: object, why: str) -> Refusal:
    """A value vLLM takes for an option the planner reads but does not model: the engine
    serves it, so a startup check logs that it cannot check and lets the engine start
    (``facts["unmodelled"]``)."""
    return Refusal(
        "engine_setting",
        f"{VLLM_RELEASES_TEXT} take {option}={value!r}, which k3layout does not model ({why}): "
        "the layout cannot be checked",
        facts={"engine": "vllm", "field": option, "unmodelled": str(value)},
        hint=f"plan with a modelled {option}, or leave the engine unchecked",
    )


def _gpu_running(backend: str | None) -> GpuName:
    """Where the engine's GPU is unknown (a check run off the engine): the default GPU, or the
    first one the named backend runs on (a Blackwell backend names a Blackwell GPU)."""
    if backend not in ATTENTION_BACKENDS or runs_on(backend, DEFAULT_GPU):
        return DEFAULT_GPU
    return next(g for g in GPU_NAMES if runs_on(backend, g))


def deployment_from_vllm(vllm_config: Any, gpu: GpuName | None = None) -> Deployment:
    """The deployment a ``VllmConfig`` describes (engine ``vllm``) on ``gpu``: default the GPU
    of the engine this process runs in (:func:`engine_gpu`), else k3layout's default. A value
    vLLM takes that the planner does not model is refused as :func:`unmodelled`; a record
    without a field every ``VllmConfig`` has (``parallel_config``, its sizes, the cache
    config's dtype ...) is refused naming it (``invalid_config``), never read as a default."""

    def need(path: str, *, nullable: bool = False) -> Any:
        return engine_attribute(vllm_config, path, "vllm_config", nullable=nullable)

    dtype = str(need("cache_config.cache_dtype"))
    kv_dtype = _KV_DTYPES.get(dtype, dtype)
    backend = need("attention_config.backend", nullable=True)
    # None: unset, vLLM resolves it from its backends (as the plan does).
    layout = need("cache_config.kv_cache_layout", nullable=True) or os.environ.get(
        "VLLM_KV_CACHE_LAYOUT"
    )
    partition = os.environ.get("VLLM_PP_LAYER_PARTITION")
    additional = need("additional_config", nullable=True) or {}
    speculative = need("speculative_config", nullable=True)
    name = getattr(backend, "name", None)  # None: vLLM's selector picks it on the GPU
    if name is not None and name not in ATTENTION_BACKENDS:
        raise unmodelled("attention_backend", name, "its kernel blocks are not modelled")
    if kv_dtype not in KV_CACHE_DTYPES:
        raise unmodelled("kv_cache_dtype", dtype, "a quantised MLA row of its own")
    where = gpu or engine_gpu() or _gpu_running(name)
    fields: dict[str, Any] = {
        "engine": "vllm",
        "engine_version": running_version("vllm"),
        "gpu": where,
        "attn_tp": need("parallel_config.tensor_parallel_size"),
        "attn_dp": need("parallel_config.data_parallel_size"),
        "pp": need("parallel_config.pipeline_parallel_size"),
        "pp_partition": tuple(int(p) for p in partition.split(",")) if partition else None,
        "dcp": need("parallel_config.decode_context_parallel_size"),
        "dcp_interleave": need("parallel_config.cp_kv_cache_interleave_size"),
        "kv_dtype": kv_dtype,
        "spec_tokens": 0
        if speculative is None
        else engine_attribute(
            speculative, "num_speculative_tokens", "vllm_config.speculative_config"
        ),
        "block_tokens": need("cache_config.block_size")
        if need("cache_config.user_specified_block_size")
        else None,
        "attention_backend": name,
        "kv_cache_layout": "LBNHC" if layout in ("NHD", "LBNHC") else layout or None,
        "prefix_caching": bool(need("cache_config.enable_prefix_caching")),
        "use_replayssm": bool(_get(vllm_config, "cache_config.use_replayssm", False)),
        "mamba_backend": _mamba_backend(vllm_config),
        "kda_prefill_backend": (
            additional.get("kda_prefill_backend", "auto")
            if isinstance(additional, Mapping)
            else "auto"
        ),
    }
    return Deployment.model_validate(fields)


def plan_from_vllm(vllm_config: Any, gpu: GpuName | None = None) -> VllmPlan:
    """Plan the model and deployment a ``VllmConfig`` describes, for engine ``vllm``, on
    ``gpu`` (default: the engine's own, :func:`engine_gpu`)."""
    return plan_vllm(model_from_vllm(vllm_config), deployment_from_vllm(vllm_config, gpu))


def worker_stage(vllm_config: Any) -> int:
    """The pipeline stage of the worker ``vllm_config`` belongs to: its rank in vLLM's
    pipeline group where the worker set one up, else from ``parallel_config.rank`` (ranks run
    TP-fastest, then PP), else stage 0 of a one-stage pipeline. Refuses (``invalid_config``)
    a multi-stage config that says neither."""
    parallel = engine_attribute(vllm_config, "parallel_config", "vllm_config")
    stages = expect_int(
        "parallel_config.pipeline_parallel_size",
        engine_attribute(parallel, "pipeline_parallel_size", "vllm_config.parallel_config"),
    )
    try:
        from vllm.distributed import parallel_state  # noqa: PLC0415 - only inside an engine

        if parallel_state.model_parallel_is_initialized():
            return int(parallel_state.get_pp_group().rank_in_group)
    except ImportError:
        pass
    if stages == 1:
        return 0
    rank = _get(parallel, "rank", None)
    tp = _get(parallel, "tensor_parallel_size", 1)
    if isinstance(rank, int) and isinstance(tp, int) and tp > 0:
        return (rank // tp) % stages
    raise Refusal(
        "invalid_config",
        f"the worker's stage of a {stages}-stage pipeline is unknown: vLLM's pipeline group is "
        "not initialised and parallel_config.rank is not set",
        facts={"pipeline_parallel_size": stages},
        hint="run the check in a vLLM worker, or pass stage=",
    )


def check_kv_cache_config(
    vllm_config: Any,
    kv_cache_config: Any,
    stage: int | None = None,
    *,
    gpu: GpuName | None = None,
) -> VllmPlan:
    """Check one rank's ``KVCacheConfig`` (pipeline stage ``stage``: default the worker's
    own, :func:`worker_stage`) against the plan of ``vllm_config`` on ``gpu`` (default: the
    engine's own, :func:`engine_gpu`): the groups' layers in order (an indexed layer's
    caches once), the backing's size for ``num_blocks``, and each tensor's offset, layer
    stride and block stride (a packed plan's caches at their parts: :func:`cache_part`).
    Returns the plan; refuses (``plan_mismatch``) at the first difference, naming the planned
    and actual values and the layer."""
    result = plan_from_vllm(vllm_config, gpu)
    stage = worker_stage(vllm_config) if stage is None else expect_int("stage", stage)
    num_blocks = _count(kv_cache_config, "num_blocks")
    groups = list(_records(kv_cache_config, "kv_cache_groups"))
    # A stage holds the groups' projections; a group with none of its layers is left out.
    # An indexed layer has several caches (keys, latent) in one group: its id once.
    actual = [tuple(dict.fromkeys(layer_of(n) for n in _records(g, "layer_names"))) for g in groups]
    actual = [layers for layers in actual if layers]
    expected = [group.layers for group in result.stage(stage).groups if group.layers]
    if actual != expected:
        first = next(
            (i for i, (a, e) in enumerate(zip(actual, expected, strict=False)) if a != e),
            min(len(actual), len(expected)),
        )
        planned = [group for group in result.stage(stage).groups if group.layers]
        raise _mismatch(
            f"group {first} layers",
            expected[first] if first < len(expected) else (),
            actual[first] if first < len(actual) else (),
            result,
            stage,
            field="groups",
            group=planned[first].name if first < len(planned) else None,
        )
    planned_size = result.blocks_bytes(num_blocks, stage)
    for tensor in _records(kv_cache_config, "kv_cache_tensors"):
        names = list(_records(tensor, "layers"))
        size = _count(tensor, "size")
        if size != planned_size:
            raise _mismatch(
                "backing bytes",
                planned_size,
                size,
                result,
                stage,
                field="size_bytes",
                name=names[0],
            )
        for position, name in enumerate(names):
            layer = layer_of(name)
            part = cache_part(result, name)
            for block in (0, 1, num_blocks - 1) if num_blocks > 1 else (0,):
                want = (
                    result.byte_range(layer, part, block, num_blocks, stage).offset_bytes
                    if part is not None
                    else result.page_offset_bytes(layer, block, num_blocks, stage)
                )
                got = (
                    _count(tensor, "offset")
                    + position * _count(tensor, "layer_stride")
                    + block * _count(tensor, "block_stride")
                )
                if got != want:
                    raise _mismatch(
                        f"page of block {block}",
                        want,
                        got,
                        result,
                        stage,
                        field="offset_bytes",
                        name=name,
                        part=part,
                        block=block,
                    )
    return result


def check_kv_caches(
    vllm_config: Any,
    kv_cache_config: Any,
    kv_caches: Any,
    stage: int | None = None,
    *,
    gpu: GpuName | None = None,
) -> VllmPlan:
    """Check the caches a worker of pipeline stage ``stage`` (default: its own) bound
    (``kv_caches``: layer name -> tensor, one int8 backing viewed per layer) against the plan
    of ``vllm_config``:
    first ``kv_cache_config`` (:func:`check_kv_cache_config`), then, for every layer, its
    name (vLLM's, :func:`~k3layout.offload.naming_rule`), dtype, shape and strides, that it
    views the one backing, the address of its pages of blocks 0, 1 and N-1 relative to the
    backing (layer ``j`` of every group on plane ``j``) and, for a KDA layer, where its conv
    and recurrent states sit in the page. Works on CUDA, CPU and ``meta`` tensors (read by
    their attributes). Returns the plan; refuses the first difference naming the layer
    (``tensor_mismatch``, ``aliasing``)."""
    stage = worker_stage(vllm_config) if stage is None else expect_int("stage", stage)
    result = check_kv_cache_config(vllm_config, kv_cache_config, stage, gpu=gpu)
    return check_bound_caches(result, kv_cache_config, kv_caches, stage)


def cache_part(result: VllmPlan, name: str) -> str | None:
    """The part whose start vLLM's cache ``name`` binds in a packed plan (``None``: a plan of
    shared planes, whose layers each bind their whole page)."""
    if not result.packed:
        return None
    return packed_cache_part(result.sizes, name, layer_of(name))


def _count(record: Any, name: str) -> int:
    """An integer field of one of vLLM's KV-cache records; a missing one or anything but an
    int is refused naming it."""
    return expect_int(f"kv_cache_config.{name}", engine_attribute(record, name, "kv_cache_config"))


def _records(record: Any, name: str) -> list[Any]:
    """A list field of one of vLLM's KV-cache records (its groups, tensors, layer names); a
    missing one, or one that is not a list or tuple, is refused naming it."""
    value = engine_attribute(record, name, "kv_cache_config")
    expect(f"kv_cache_config.{name}", value, (list, tuple))
    return list(value)


def _mismatch(
    what: str,
    planned: Fact,
    actual: Fact,
    result: VllmPlan,
    stage: int,
    *,
    field: str,
    name: str | None = None,
    group: str | None = None,
    part: str | None = None,
    block: int | None = None,
) -> Refusal:
    """``check_kv_cache_config``'s refusal, in the checks' facts schema: the layer vLLM's
    ``name`` binds (its group, position and plane in the plan) or the group."""
    layer = None if name is None else layer_of(name)
    position = None
    if layer is not None:
        found, position = result.group_of(layer, stage)
        group = found.name
    where = "" if layer is None else f" (module layer {layer})"
    return check_refusal(
        "plan_mismatch",
        f"vLLM's KV cache config differs from the plan at {what}{where}: planned "
        f"{planned}, vLLM {actual}",
        check="check_kv_cache_config",
        field=field,
        stage=stage,
        expected=planned,
        actual=actual,
        layer=layer,
        layer_name=name,
        group=group,
        position=position,
        plane=position,
        part=part,
        block=block,
        hint="the engine and the planner disagree: check the vLLM version and flags the plan "
        "follows (k3layout.engines.vllm.releases)",
    )
