"""vLLM 0.33's own KV-cache start-up, run on CPU without weights, GPUs or process groups.

The conformance tests compare the planner with what this module gets from vLLM's code: the
engine's config objects built from a fixture ``config.json``, every attention layer of the
model built the way vLLM's Kimi-K3 decoder builds it (the layer classes' ``__new__`` plus
``nn.Module.__init__``, with only the attributes their ``__init__`` sets and the cache spec
reads), then the engine core's steps in order: the platform's block-size alignment, the
worker's ``get_kv_cache_spec``, the KV-cache layout resolution, the global groups and
``get_kv_cache_configs`` for each pipeline stage. Nothing of vLLM is copied here: every number
comes out of vLLM's functions.

Where vLLM asks the hardware (the platform's hybrid-allocator support, the KDA prefill
backend's availability), this module sets what a CUDA (SM90) engine would resolve, and says so.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.config.vllm import set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.utils import (
    get_current_attn_backends,
)
from vllm.distributed.utils import get_pp_indices
from vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn import (
    KimiGatedDeltaNetAttention,
)
from vllm.models.kimi_k3.nvidia.kda import KimiK3DeltaAttention
from vllm.models.kimi_k3.nvidia.mla import MultiHeadLatentAttention
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.utils import (
    get_supported_kv_cache_layouts,
    record_kv_cache_layout,
    resolve_kv_cache_layout,
)
from vllm.v1.core.kv_cache_planning import (
    get_global_kv_cache_groups,
    get_kv_cache_configs,
)
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_max_concurrency_for_kv_cache_config,
)
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig, KVCacheSpec
from vllm.v1.worker.utils import customize_attention_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DSPARK_DRAFT = FIXTURES / "kimi-k3-dspark-draft"
"""K3's DSpark draft in vLLM's ``K3DSparkConfig`` format: 5 dense MLA layers, 512 + 64 latent."""
MODEL_FILES = {
    "kimi-k3": "kimi-k3.config.json",
    "kimi-linear": "kimi-linear-48b-a3b.config.json",
}
BACKENDS = ("FLASHMLA", "CUTLASS_MLA", "FLASHINFER_MLA", "TRITON_MLA")
KV_CACHE_DTYPE = {"fp8": "fp8", "bf16": "auto", "fp8_ds_mla": "fp8_ds_mla"}  # ours -> vLLM's


# The GPU each backend runs on (CUDA compute capability): what an operator who picks the
# backend has. CUTLASS_MLA and FLASHINFER_MLA are Blackwell-only; FLASHMLA runs on both.
CAPABILITY = {"FLASHMLA": (9, 0), "CUTLASS_MLA": (10, 0), "FLASHINFER_MLA": (10, 0)}


@contextmanager
def _cuda_platform(backend: str) -> Iterator[None]:
    """The current platform selecting attention backends as vLLM's CUDA platform does for an
    explicitly chosen one (its ``validate_configuration`` on the GPU ``backend`` runs on; the
    CUDA platform module itself needs ``libcuda``). Backend modules that make CUDA buffers at
    import make them on ``meta``."""
    import vllm.platforms  # noqa: PLC0415
    import vllm.utils.platform_utils  # noqa: PLC0415
    from vllm.platforms.interface import DeviceCapability  # noqa: PLC0415

    major, minor = CAPABILITY.get(backend, (9, 0))
    capability = DeviceCapability(major=major, minor=minor)
    platform = vllm.platforms.current_platform
    empty, units = torch.empty, vllm.utils.platform_utils.num_compute_units

    def meta_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "meta"
        return empty(*args, **kwargs)

    def select(selected: Any, attn_selector_config: Any, num_heads: int | None = None) -> str:
        reasons = [
            reason
            for reason in selected.get_class().validate_configuration(
                device_capability=capability, **attn_selector_config._asdict()
            )
            if "is not available" not in reason  # a kernel not compiled into this CPU build
        ]
        if reasons:
            raise ValueError(
                f"Selected backend {selected} is not valid for this configuration. "
                f"Reason: {reasons}"
            )
        path: str = selected.get_path()
        return path

    torch.empty = meta_empty
    vllm.utils.platform_utils.num_compute_units = lambda *_: 1
    platform.get_attn_backend_cls = select
    try:
        yield
    finally:
        del platform.get_attn_backend_cls
        torch.empty = empty
        vllm.utils.platform_utils.num_compute_units = units


def mla_backend(config: VllmConfig, name: str, num_heads: int) -> type[Any]:
    """The MLA backend vLLM's selector gives a layer for ``--attention-backend name`` on a
    CUDA platform (the selector checks the backend against the config: dtype, cache dtype,
    a requested block size, DCP). Raises what vLLM raises for an invalid choice."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: PLC0415
    from vllm.v1.attention.selector import _cached_get_attn_backend, get_attn_backend  # noqa: PLC0415

    config.attention_config.backend = AttentionBackendEnum[name]
    _cached_get_attn_backend.cache_clear()
    text = config.model_config.hf_text_config
    with _cuda_platform(name), set_current_vllm_config(config):
        backend: type[Any] = get_attn_backend(
            text.kv_lora_rank + text.qk_rope_head_dim,
            torch.bfloat16,
            config.cache_config.cache_dtype,
            use_mla=True,
            use_sparse=False,
            num_heads=num_heads,
        )
    return backend


@dataclass(frozen=True)
class Case:
    """One engine start-up: the flags an operator passes to ``vllm serve``."""

    model: str = "kimi-k3"
    attn_tp: int = 1
    kv_dtype: str = "fp8"
    pp: int = 1
    dcp: int = 1
    backend: str = "FLASHMLA"
    block_tokens: int | None = None
    kv_cache_layout: str = "LBNHC"
    max_model_len: int = 8192
    prefix_caching: bool = True
    kda_prefill_backend: str = "triton"  # what vLLM resolved on the GPU (K3's KDA path)
    memory_bytes: int = 40 << 30  # each rank's KV-cache budget
    spec_tokens: int = 0
    drafter: str | None = None  # "dspark" (the fixture draft) or "mtp" (the target's modules)
    mtp_modules: int = 1  # num_nextn_predict_layers of the target config, with drafter="mtp"
    pp_partition: tuple[int, ...] | None = None  # VLLM_PP_LAYER_PARTITION

    def __str__(self) -> str:
        flags = [self.model, f"tp{self.attn_tp}", self.kv_dtype, self.backend]
        flags += [f"pp{self.pp}"] * (self.pp > 1) + [f"dcp{self.dcp}"] * (self.dcp > 1)
        flags += [f"block{self.block_tokens}"] * (self.block_tokens is not None)
        flags += [self.kv_cache_layout] * (self.kv_cache_layout != "LBNHC")
        flags += ["no-prefix-caching"] * (not self.prefix_caching)
        flags += [self.kda_prefill_backend] * (self.kda_prefill_backend != "triton")
        flags += [f"len{self.max_model_len}", f"{self.memory_bytes >> 20}MiB"]
        if self.drafter is not None:
            flags += [f"{self.drafter}{self.mtp_modules if self.drafter == 'mtp' else ''}"]
        flags += [f"s{self.spec_tokens}"] * (self.spec_tokens > 0)
        if self.pp_partition is not None:
            flags += ["part" + "_".join(map(str, self.pp_partition))]
        return "-".join(flags)


@dataclass
class Engine:
    """What vLLM resolved for a :class:`Case`: its config, each stage's layer specs (by
    layer name, in registration order) and each stage's ``KVCacheConfig``."""

    case: Case
    config: VllmConfig
    specs: list[dict[str, KVCacheSpec]]
    kv_cache_configs: list[KVCacheConfig] = field(default_factory=list)
    workers: list[VllmConfig] = field(default_factory=list)  # each stage's, with its layers

    @property
    def block_size(self) -> int:
        """The attention block the workers resolved: the block of the attention groups (the
        KDA groups' block is the same in ``align`` mode and ``max_model_len`` in ``none``)."""
        sizes: set[int] = {
            g.kv_cache_spec.block_size
            for config in self.kv_cache_configs
            for g in config.kv_cache_groups
            if isinstance(g.kv_cache_spec, AttentionSpec)
        }
        assert len(sizes) == 1, sizes
        return sizes.pop()

    @property
    def state_block_size(self) -> int:
        """The KDA groups' block (``mamba_block_size``)."""
        sizes: set[int] = {
            g.kv_cache_spec.block_size
            for config in self.kv_cache_configs
            for g in config.kv_cache_groups
            if not isinstance(g.kv_cache_spec, AttentionSpec)
        }
        assert len(sizes) == 1, sizes
        return sizes.pop()


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block (vLLM reads its ``VLLM_*`` flags there)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def target_config(case: Case) -> dict[str, Any]:
    """The fixture ``config.json`` of ``case.model``; with an MTP drafter, its text config
    carries ``case.mtp_modules`` MTP modules."""
    config: dict[str, Any] = json.loads((FIXTURES / MODEL_FILES[case.model]).read_text())
    if case.drafter == "mtp":
        config.get("text_config", config)["num_nextn_predict_layers"] = case.mtp_modules
    return config


def model_config(case: Case, directory: Path) -> ModelConfig:
    """vLLM's ``ModelConfig`` of the fixture in ``directory`` (no tokenizer, no weights)."""
    return ModelConfig(
        model=str(directory),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=case.max_model_len,
    )


def vllm_config(case: Case, directory: Path) -> VllmConfig:
    """The engine's ``VllmConfig`` for ``case`` with the fixture config in ``directory``."""
    cache = CacheConfig(
        block_size=case.block_tokens,
        cache_dtype=KV_CACHE_DTYPE[case.kv_dtype],
        enable_prefix_caching=case.prefix_caching,
    )
    parallel = ParallelConfig(
        tensor_parallel_size=case.attn_tp,
        pipeline_parallel_size=case.pp,
        decode_context_parallel_size=case.dcp,
    )
    target = model_config(case, directory)
    speculative = None
    if case.drafter is not None and case.spec_tokens > 0:  # vLLM takes no drafter at 0
        speculative = SpeculativeConfig(
            method=case.drafter,
            model=str(DSPARK_DRAFT) if case.drafter == "dspark" else None,
            num_speculative_tokens=case.spec_tokens,
            target_model_config=target,
            target_parallel_config=parallel,
        )
    config = VllmConfig(
        model_config=target,
        cache_config=cache,
        parallel_config=parallel,
        speculative_config=speculative,
        device_config=DeviceConfig(device="cpu"),
    )
    # --attention-backend: on every process's config, as the engine's arguments set it
    from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: PLC0415

    config.attention_config.backend = AttentionBackendEnum[case.backend]
    # A CUDA platform supports the hybrid allocator; the CPU platform this runs on does not,
    # so VllmConfig disabled it. Restore the CUDA engine's setting.
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    return config


def _kda_layer(config: VllmConfig, case: Case, name: str, text: Any) -> nn.Module:
    """A KDA layer with the attributes its cache spec reads: Kimi-K3's own class for a
    full-rank gate, Kimi-Linear's otherwise (as vLLM's decoder layer picks)."""
    kda = text.linear_attn_config
    full_rank = kda.get("use_full_rank_gate", False)
    kind = KimiK3DeltaAttention if full_rank else KimiGatedDeltaNetAttention
    layer: Any = kind.__new__(kind)
    nn.Module.__init__(layer)
    speculative = config.speculative_config
    layer.prefix = name
    layer.tp_size = config.parallel_config.tensor_parallel_size
    layer.model_config = config.model_config
    layer.cache_config = config.cache_config
    layer.speculative_config = speculative
    layer.num_spec = speculative.num_speculative_tokens if speculative else 0
    layer.num_heads = kda["num_heads"]
    layer.head_dim = kda["head_dim"]
    layer.conv_size = kda["short_conv_kernel_size"]
    if full_rank:
        # resolve_kda_prefill_backend asks the GPU; an SM90 engine with a bf16 model resolves
        # "flashkda" for K3 (bounded gate, head_dim 128). Cases name the one they model.
        layer.kda_prefill_backend = case.kda_prefill_backend
    return cast(nn.Module, layer)


def _mla_layer(
    config: VllmConfig, name: str, text: Any, backend: type[Any], *, draft: bool = False
) -> Any:
    """A Kimi-K3 MLA layer with the attributes its cache spec and backend lookup read; a
    DSpark draft layer decodes its block non-causally and is marked a draft layer, as vLLM's
    proposer marks it."""
    layer = MultiHeadLatentAttention.__new__(MultiHeadLatentAttention)
    nn.Module.__init__(layer)
    layer.layer_name = name
    layer.head_size = text.kv_lora_rank + text.qk_rope_head_dim
    layer.kv_cache_dtype = config.cache_config.cache_dtype
    layer.attn_backend = backend
    layer.non_causal_multi_token_decode = draft and config.speculative_config.method == "dspark"
    layer.is_draft_layer = draft
    return layer


def build_layers(config: VllmConfig, case: Case, stage: int) -> dict[str, nn.Module]:
    """The attention layers pipeline stage ``stage`` registers, by vLLM name, in module
    order: KDA or MLA as the model config's ``is_kda_layer`` says."""
    text = config.model_config.hf_text_config
    partition = {}
    if case.pp_partition is not None:
        partition["VLLM_PP_LAYER_PARTITION"] = ",".join(map(str, case.pp_partition))
    with _environment(**partition):
        start, end = get_pp_indices(text.num_hidden_layers, stage, case.pp)
    prefix = "language_model.model" if case.model.startswith("kimi-k3") else "model"
    backend = mla_backend(config, case.backend, text.num_attention_heads // case.attn_tp)
    layers: dict[str, nn.Module] = {}
    for index in range(start, end):
        name = f"{prefix}.layers.{index}.self_attn"
        layers[name] = (
            _kda_layer(config, case, name, text)
            if text.is_kda_layer(index)
            else _mla_layer(config, name, text, backend)
        )
    speculative = config.speculative_config
    if speculative is not None and stage == case.pp - 1:  # the drafter runs on the last stage
        draft = speculative.draft_model_config.hf_text_config
        modules = (
            draft.num_hidden_layers
            if speculative.method == "dspark"
            else text.num_nextn_predict_layers
        )
        heads = draft.num_attention_heads // case.attn_tp
        draft_backend = mla_backend(config, case.backend, heads)
        for offset in range(modules):
            name = f"model.layers.{text.num_hidden_layers + offset}.self_attn"
            layers[name] = _mla_layer(config, name, draft, draft_backend, draft=True)
    return layers


def worker_specs(config: VllmConfig, layers: dict[str, nn.Module]) -> dict[str, KVCacheSpec]:
    """The worker's ``get_kv_cache_spec``: each layer's spec, customised by its backend."""
    specs: dict[str, KVCacheSpec] = {}
    for name, layer in layers.items():
        spec = layer.get_kv_cache_spec(config)  # type: ignore[operator]
        if isinstance(spec, AttentionSpec):
            spec = customize_attention_spec(layer.get_attn_backend(), spec)  # type: ignore[operator]
        specs[name] = spec
    return specs


def start(case: Case, tmp: Path) -> Engine:
    """Run vLLM's KV-cache start-up for ``case``.

    Raises what vLLM raises when it refuses the configuration."""
    directory = tmp / str(case)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(target_config(case)))
    config = vllm_config(case, directory)  # the engine core's
    specs: list[dict[str, KVCacheSpec]] = []
    supported: list[list[str]] = []
    workers: list[VllmConfig] = []
    for stage in range(case.pp):
        # Each pipeline stage's worker process holds its own copy of the config, builds its
        # own layers and aligns its own block size over them (multiproc_executor).
        worker = copy.deepcopy(config)
        workers.append(worker)
        context = worker.compilation_config.static_forward_context
        context.clear()
        context.update(build_layers(worker, case, stage))
        with set_current_vllm_config(worker):
            Platform.update_block_size_for_backend(worker)
            specs.append(worker_specs(worker, context))
            backends = get_current_attn_backends(worker)
            supported.append([layout.name for layout in get_supported_kv_cache_layouts(backends)])
    with set_current_vllm_config(config), _environment(VLLM_KV_CACHE_LAYOUT=case.kv_cache_layout):
        resolve_kv_cache_layout(config, supported, [s for d in specs for s in d.values()])
        groups = get_global_kv_cache_groups(config, specs)
        config.adjust_dcp_kv_cache_interleave_size(groups)
        kv_cache_configs = get_kv_cache_configs(
            config, specs, [case.memory_bytes] * len(specs), groups
        )
    for worker in workers:  # the core tells each worker the layout it resolved
        record_kv_cache_layout(worker.cache_config, config.cache_config.kv_cache_layout)
    return Engine(
        case=case,
        config=config,
        specs=specs,
        kv_cache_configs=kv_cache_configs,
        workers=workers,
    )


def allocated(
    engine: Engine, stage: int = 0, device: str = "meta"
) -> tuple[dict[str, torch.Tensor], list[list[Any]], list[list[int]]]:
    """What vLLM's ``allocate_kv_cache`` gives a worker of ``stage`` (one int8 backing, a view
    per layer), on ``device``, with the worker's attention groups and the kernel block sizes
    ``prepare_kernel_block_sizes`` gives: what the KV connector is handed, before the layers
    bind their kernel-block views (:func:`bind`)."""
    from vllm.v1.worker.utils import (  # noqa: PLC0415
        AttentionGroup,
        allocate_kv_cache,
        prepare_kernel_block_sizes,
        select_common_block_size,
    )

    config = engine.kv_cache_configs[stage]
    worker = engine.workers[stage]
    layers = worker.compilation_config.static_forward_context
    groups: list[list[Any]] = []
    for group_id, group in enumerate(config.kv_cache_groups):
        names = [name for name in group.layer_names if name in layers]
        backend = layers[names[0]].get_attn_backend() if names else None
        groups.append(
            [AttentionGroup(backend, names, group.kv_cache_spec, group_id)] if names else []
        )
    kernel = prepare_kernel_block_sizes(config, groups)
    # initialize_attn_backend's metadata builders set each group's kernel block this way
    for group_id, attention in enumerate(groups):
        for each in attention:
            spec = each.kv_cache_spec
            if isinstance(spec, AttentionSpec):
                size = select_common_block_size(kernel[group_id], [each.backend], [spec])
                if size != spec.block_size:
                    each.kernel_block_size = size
    layout = worker.cache_config.get_resolved_kv_cache_layout()
    with set_current_vllm_config(worker):
        caches: dict[str, torch.Tensor] = allocate_kv_cache(
            config, torch.device(device), layout, kernel
        )
    return caches, groups, kernel


def bind(engine: Engine, stage: int = 0, device: str = "meta") -> dict[str, torch.Tensor]:
    """What a worker of ``stage`` binds to its layers, allocated on ``device`` (``meta``
    unless a test needs real addresses and a small budget): vLLM's
    ``allocate_kv_cache`` (one int8 backing, a view per layer) then
    ``map_kv_caches_to_kernel_blocks`` (attention views in the backend's kernel blocks).
    Raises what vLLM raises when it cannot bind (a block-outermost block its kernels would
    have to split)."""
    from vllm.v1.worker.utils import map_kv_caches_to_kernel_blocks  # noqa: PLC0415

    caches, groups, _ = allocated(engine, stage, device)
    with set_current_vllm_config(engine.workers[stage]):
        bound: dict[str, torch.Tensor] = map_kv_caches_to_kernel_blocks(
            caches, [each for attention in groups for each in attention]
        )
    return bound


def max_concurrency(engine: Engine) -> float:
    """vLLM's ``get_max_concurrency_for_kv_cache_config`` of the scheduler's config."""
    scheduler = generate_scheduler_kv_cache_config(engine.kv_cache_configs)
    with set_current_vllm_config(engine.config):
        return float(get_max_concurrency_for_kv_cache_config(engine.config, scheduler))


def blocks_per_request(engine: Engine) -> list[int]:
    """Blocks one request of ``max_model_len`` holds in each group of the scheduler's config
    (``cdiv(max_memory_usage_bytes, page_size_bytes)``, as vLLM's concurrency counts)."""
    scheduler = generate_scheduler_kv_cache_config(engine.kv_cache_configs)
    with set_current_vllm_config(engine.config):
        return [
            -(
                -g.kv_cache_spec.max_memory_usage_bytes(engine.config)
                // g.kv_cache_spec.page_size_bytes
            )
            for g in scheduler.kv_cache_groups
        ]


def group_block_sizes(engine: Engine) -> list[int]:
    """Each global group's block in tokens as the scheduler counts it (attention scaled by
    DCP, KDA not: ``resolve_dcp_kv_block_size``), in vLLM's group order."""
    from vllm.v1.core.kv_cache_utils import resolve_dcp_kv_block_size  # noqa: PLC0415

    dcp = engine.config.parallel_config.decode_context_parallel_size
    groups = engine.kv_cache_configs[0].kv_cache_groups
    return [resolve_dcp_kv_block_size(g.kv_cache_spec, dcp) for g in groups]


def scheduler_block_size(engine: Engine) -> int:
    """The scheduler's block vLLM's engine core resolves (``resolve_kv_cache_block_sizes``)."""
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes  # noqa: PLC0415

    scheduler = generate_scheduler_kv_cache_config(engine.kv_cache_configs)
    with set_current_vllm_config(engine.config):
        block, _ = resolve_kv_cache_block_sizes(scheduler, engine.config)
    return int(block)


def with_block(case: Case, block_tokens: int | None) -> Case:
    """``case`` with another requested block size."""
    return replace(case, block_tokens=block_tokens)
