"""vLLM 0.33's own KV-cache planning for GLM-5.3-Flash, run on CPU, every figure as a plain dict.

``plan_glm(...)`` builds what a CUDA engine of vLLM 0.33.0 builds for the fixture
``tests/fixtures/glm-5.3-flash/config.json`` and returns what vLLM's code computed, with
nothing of vLLM copied: the engine's config objects (``VllmConfig`` with ``ModelConfig``,
``CacheConfig``, ``ParallelConfig`` and, for MTP, ``SpeculativeConfig``); each pipeline stage's
cache layers built the way vLLM's GLM decoder builds them (``Glm5NextIndexerCache`` and
``Glm5NextTailCache`` with their real constructors; ``MLAAttention`` and
``Glm5NextLinearAttention`` by ``__new__`` plus the attributes their ``__init__`` sets and
their cache specs read, the MLA backend chosen by vLLM's own selector, the dtype canonicalised
by ``_canonicalize_sparse_mla_kv_cache_dtype``, the KDA prefill backend by
``_resolve_kda_prefill_backend``); then the worker's and the engine core's steps in order:
``Platform.update_block_size_for_backend``, the worker's ``get_kv_cache_spec`` (through
``vllm_engine.worker_specs``, plus the ``is_draft`` mark ``gpu_model_runner.py:7114`` adds),
``resolve_kv_cache_layout``, ``get_global_kv_cache_groups``,
``adjust_dcp_kv_cache_interleave_size``, ``get_kv_cache_configs`` (one spec dict per pipeline
stage, the stage's layers from vLLM's ``get_pp_indices``), ``generate_scheduler_kv_cache_config``,
``get_max_concurrency_for_kv_cache_config`` and ``resolve_kv_cache_block_sizes``; finally the
worker's ``allocate_kv_cache`` on the ``meta`` device, whose views give each layer's real byte
offset and block stride (``bound_offset``/``bound_block_stride``). Technique and shared pieces
(``worker_specs``, ``_environment``, ``FIXTURES``) come from ``vllm_engine.py`` (the Kimi-K3
harness); its ``_cuda_platform`` is not reused: it validates one explicitly named backend at a
capability fixed per backend name, while GLM needs CUDA's automatic priority selection and the
capability-dependent hooks below.

What is emulated, and how (everything else is vLLM's code as installed):

* torchvision. vLLM's ``models/glm5next/common/model.py:64`` imports
  ``model_executor/models/glm4_1v.py``, which imports transformers'
  ``models/glm4v/image_processing_glm4v.py``, which does
  ``from torchvision.transforms.v2 import functional`` unconditionally; the ``.venv`` has no
  torchvision, so vLLM cannot even inspect the architecture. When (and only when) torchvision
  is not importable, :func:`install_torchvision_stub` puts four empty modules
  (``torchvision``, ``.transforms``, ``.transforms.v2``, ``.transforms.v2.functional``) in
  ``sys.modules`` after pinning transformers' cached ``is_torchvision_available()`` to False,
  so transformers keeps its torchvision-free code paths. No vision code runs in planning.
  vLLM inspects a model class in a subprocess on a cold ``VLLM_CACHE_ROOT/modelinfos`` cache
  (``model_executor/models/registry.py:1123``) which would not see the stub, so while the stub
  is in use the inspection runs in-process (the subprocess only guards CUDA initialisation).
* The GPU (:func:`cuda_device`): ``vllm.platforms.cuda`` is imported with
  ``vllm._C_stable_libtorch`` stubbed and ``import_pynvml`` answered with a namespace; the CPU
  platform class then answers ``is_cuda()``, ``get_device_capability()`` (so the base class's
  ``has_device_capability``/``is_device_capability_family``), ``device_name`` "cuda", and takes
  ``CudaPlatform.get_attn_backend_cls``/``get_valid_backends`` (priority list plus every
  backend's ``validate_configuration``, ``platforms/cuda.py:377-518``); CUDA buffers that
  backend modules allocate at import go to ``meta``; ``has_flashinfer_sm90_nope_mla`` is
  answered by the ``flashinfer_sm90_nope_mla`` argument (True: the GPU box has FlashInfer >=
  0.6.18). ``VllmConfig`` is built by the CPU platform and then given the CUDA engine's
  settings: the hybrid allocator on (``disable_hybrid_kv_cache_manager=False``), the requested
  block size and SSM dtype should the CPU platform have changed them, and the architecture's
  ``verify_and_update_config`` (``model_executor/models/config.py:119-141``, SM10x: auto -> fp8)
  re-run under the emulated GPU.
* Not emulated: PCP, the model's non-cache modules (the fixture lacks fields the full
  constructor reads, e.g. ``mhc``, ``mla_use_nope``: a real engine fails there first, see the
  notes), ``_validate_supported_config`` is called as the model constructor does. TP ranks of a
  stage are identical, so one spec dict per stage stands for all of them.

Per-block byte offsets (established here by running it; ``layers[*].bound_offset`` is what
vLLM's own ``allocate_kv_cache`` views say, checked against the rule in ``offset_rule_holds``):

* One backing allocation of ``num_blocks * block_stride`` bytes per rank; every group overlays
  it from byte 0 (a block id belongs to one group at a time). Layout is always BLHNC (the tail
  backend ``KpoolTailBackend`` supports only BLHNC), so ``block_stride`` is the packed block,
  identical for every tensor: ``round_up(max over groups of the sum of its layers' pages,
  lcm(every layer's block-stride alignment))`` (``v1/core/kv_cache_planning.py:574-605``).
* Layer ``l`` of a ``KVCacheTensor`` has block ``b`` at ``offset + l*layer_stride +
  b*block_stride`` (``v1/kv_cache_interface.py:1475-1495``; views
  ``create_kv_cache_views`` ``kv_cache_interface.py:418-482`` via
  ``v1/worker/utils.py:564-627``). In BLHNC ``layer_stride`` is the layer's page.
* Tensors are made per group, one per distinct spec *value* inside the group, in the order each
  spec first appears in the group's ``kv_cache_specs``; their offsets accumulate
  ``len(layers) * page`` from 0 and restart at 0 for the next group
  (``kv_cache_planning.py:696-733``, ``layers_by_spec`` keyed by spec equality;
  ``is_draft`` is ``compare=False``, ``kv_cache_interface.py:215``, so draft layers join the
  target's tensors).
* MLA + indexer group (one group; ``layer_names`` interleave k_cache(3), latent(3), k_cache(7),
  ...): pages are NOT interleaved in the block. All k_cache pages come first, then all latent
  pages: k_cache of the j-th MLA layer (module order, MTP layers last) at ``j*k_page``, latent of
  the j-th at ``n_mla*k_page + j*latent_page``. E.g. SM90 fp8 TP8: k_page 12,672, latent page
  786,432: k_cache(3) at 0, k_cache(43) at 126,720, latent(3) at 139,392, latent(7) at 925,824;
  group page 8,790,144, block_stride 8,802,816 (round_up to lcm(512, 4224) = 16,896).
* KDA groups (``bucket[i::n]`` strided split, ``kv_cache_planning.py:1029-1039``): group ``i``
  holds KDA layers ``i, i+n, i+2n, ...`` (in KDA-only order); its j-th layer at
  ``j*kda_page`` (padded ``mamba_page_size_padded``; conv state then recurrent state inside the
  page, ``mamba/abstract.py:28-42``).
* Tail group (all tails, one group, block = ring): j-th MLA layer's tail at ``j*ring_page``
  (8,192 B for ring 16): a tail block uses only ``n_mla*ring_page`` bytes of a packed block.
* Pipeline parallelism: a stage's groups are the global groups projected to its layers
  (``kv_cache_planning.py:1413-1458``), so offsets restart per stage with the stage's own
  ``j``; each stage has its own ``block_stride`` (its widest projected group) and all use the
  smallest stage's ``num_blocks`` (``kv_cache_planning.py:1583-1596``).

Backend selection runs every candidate's ``validate_configuration``; a few cannot be imported
on this CPU build (CUDA extensions). They are reported (``cpu_import_failures_ahead`` in a plan,
``cpu_import_failures`` in a refusal) and an explicitly requested one is ``unsupported``. For
GLM's 512-wide NoPE latent they change nothing by code reading: FLASH_ATTN_MLA is dense
(``is_sparse`` False -> "sparse not supported"), FLASH_ATTN_MLA_SPARSE_FA4 (ahead on SM100 with
bf16 and <= 16 heads per rank) takes head size 576 only (``flashattn_mla_sparse.py:299-301``).

Cases run with this module (40 GiB per rank, max_model_len 8192, prefix caching, TP 8 unless
said; "blocks/request" is vLLM's count per group in group order, KDA groups first):

* H200 fp8: FLASHINFER_MLA_SPARSE_SM90, fp8, block 1536, groups kda 9/9/8/8 + mla 22 + tail 11,
  block_stride 8,802,816, num_blocks 4879, concurrency 256.79 (blocks/request 3,3,3,3,6,1).
* H200 fp8_ds_mla: FLASHMLA_SPARSE, block 1536, kda 12/11/11 + mla 22 + tail 11, 12,469,248,
  3444, 215.25 (3,3,3,6,1).
* B200 auto, MTP 1, 2 spec tokens: FLASHINFER_MLA_SPARSE, fp8, block 1536, kda 12/11/11 + mla 24
  + tail 12 (ring 32; mla and tail groups eagle), 9,732,096, 4413, 200.59 (5,5,5,6,1).
* H200 fp8 MTP 1 s2: 9,596,928, 4475, 203.41. H200 fp8 TP 1: block 8704, 49,826,304, 861,
  61.50. H200 auto (bf16): block 1024, 11,627,520, 3693, 175.86 (3,3,3,3,8,1). B200 fp8:
  9,191,424, 4672, 245.89. H200 fp8 TP 1 --block-size 1024: block 9216, 52,749,312, 814.
  H200 fp8 no prefix caching: mode "none", 8,802,816, 4879, 443.55 (1,1,1,1,6,1).
  H200 fp8 max_model_len 131072: 4879, 49.28 (3,3,3,3,86,1).
* DCP 2: H200 fp8 refused (no sparse backend: SM90 FlashInfer "DCP not supported", FLASHMLA_SPARSE
  needs bf16 or fp8_ds_mla). H200 auto: FLASHMLA_SPARSE, block 1024, 11,627,520, 3693, 217.24
  (3,3,3,3,4,1; MLA group's DCP block 2048, scheduler block 2048, hash block 1024). H200
  fp8_ds_mla: 12,469,248, 3444, 264.92 (3,3,3,3,1). B200 auto: 9,191,424, 4672, 292.00
  (3,3,3,3,3,1). B200 fp8 MTP 1 s2: 9,732,096, 4413, 232.26 (5,5,5,3,1). Pages and groups
  are those of DCP 1; only the MLA group's blocks per request change (``cdiv(L, block*dcp)``).
* PP 2 (stages [0, 23) and [23, 45), vLLM's ``get_pp_indices``): H200 fp8: stage block_stride
  4,004,352 and 4,798,464 (stage 0: kda 5/5/4/4, mla 10, tail 5; stage 1: kda 4/4/4/4, mla 12,
  tail 6), num_blocks 8950 on both (40 GiB // 4,798,464), concurrency 471.05. H200 fp8 MTP 1 s2
  (the MTP layer on stage 1): 4,730,880 / 5,609,472, 7656, 348.00. B200 auto MTP 1 s2:
  4,866,048 / 5,947,392, 7221, 328.23. H200 auto DCP 2 PP 2: FLASHMLA_SPARSE, block 1024,
  5,285,888 / 6,342,656, 6771, 398.29.
* Refused: 2 spec tokens without ``num_nextn_predict_layers`` (AttributeError at ``config``);
  ``--attention-backend FLASHMLA_SPARSE`` with fp8 on H200; nvfp4_ds_mla; fp8_ds_mla on B200;
  ``VLLM_KV_CACHE_LAYOUT=LBNHC``; ``index_kpool_always_select_tail: false`` (NotImplementedError).
  Unsupported: ``--attention-backend FLASH_ATTN_MLA_SPARSE_FA4`` (not importable here), A100.
* Every row of the notes' section 4 (86 cases, both tables) gives the same backend, dtype,
  block, groups, block_stride and num_blocks (or the same refusal), except the FA4 row, which
  the research script reported as a bare ImportError and this module reports as unsupported.
  ``offset_rule_holds`` was True in every plan.
"""

from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import json
import sys
import tempfile
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from vllm.config import (
    AttentionConfig,
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.config.vllm import set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
from vllm.distributed.utils import get_pp_indices
from vllm.model_executor.model_loader.utils import get_model_architecture
from vllm.platforms.interface import DeviceCapability, Platform
from vllm.v1.attention.backends.utils import (
    get_supported_kv_cache_layouts,
    record_kv_cache_layout,
    resolve_kv_cache_layout,
)
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_max_concurrency_for_kv_cache_config,
    resolve_dcp_kv_block_size,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.kv_cache_interface import (
    CircularBufferSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    UniformTypeKVCacheSpecs,
    compute_layer_kv_cache_shape_bytes,
)
from vllm_engine import FIXTURES, _environment, worker_specs
from vllm_required import AT_LEAST_034

FIXTURE = FIXTURES / "glm-5.3-flash" / "config.json"
GPUS: dict[str, tuple[int, int]] = {"H100": (9, 0), "H200": (9, 0), "B200": (10, 0)}
"""CUDA compute capability of each GPU name ``plan_glm`` takes."""
TORCHVISION_STUB_MODULES = (
    "torchvision",
    "torchvision.transforms",
    "torchvision.transforms.v2",
    "torchvision.transforms.v2.functional",
)
BASE_PREFIX = "language_model.model.layers"  # Glm5NextForConditionalGeneration's decoder
DRAFT_PREFIX = "model.layers"  # Glm5NextMTP loaded by the proposer (prefix "")


class _StubModule(types.ModuleType):
    """A torchvision module that exists: any attribute is an empty placeholder class (read
    only by image processing, which planning never runs)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__module__": self.__name__})


def install_torchvision_stub() -> bool:
    """Put an empty ``torchvision`` in ``sys.modules`` if the real one is not importable.

    Why: vLLM's ``models/glm5next/common/model.py`` imports ``glm4_1v``, which imports
    transformers' GLM-4V image processor, which imports ``torchvision.transforms.v2.functional``
    at module level; no vision code runs in KV-cache planning. transformers' cached
    ``is_torchvision_available()`` is evaluated (False) first, so transformers does not
    switch to its torchvision code paths. Returns whether the stub is (now) in use."""
    present = sys.modules.get("torchvision")
    if isinstance(present, _StubModule):
        return True
    if present is not None or importlib.util.find_spec("torchvision") is not None:
        return False
    from transformers.utils import import_utils  # noqa: PLC0415

    import_utils.is_torchvision_available()
    import_utils.is_torchvision_v2_available()
    parent: types.ModuleType | None = None
    for name in TORCHVISION_STUB_MODULES:
        module = _StubModule(name, "Stub: torchvision is not installed (vllm_glm.py).")
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []
        sys.modules[name] = module
        if parent is not None:
            setattr(parent, name.rsplit(".", 1)[1], module)
        parent = module
    return True


@contextmanager
def _inspect_in_process(active: bool) -> Iterator[None]:
    """vLLM's registry inspects a model class in a subprocess on a cold cache; with the
    torchvision stub (in this process only) it must run here."""
    if not active:
        yield
        return
    from vllm.model_executor.models import registry  # noqa: PLC0415

    saved = registry._run_in_subprocess
    registry._run_in_subprocess = lambda fn: fn()
    try:
        yield
    finally:
        registry._run_in_subprocess = saved


def _cuda_module() -> Any:
    """``vllm.platforms.cuda`` imported on a box without ``libcuda``."""
    if "vllm.platforms.cuda" in sys.modules:
        return sys.modules["vllm.platforms.cuda"]
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.utils import import_utils  # noqa: PLC0415

    saved = import_utils.import_pynvml
    import_utils.import_pynvml = types.SimpleNamespace  # pynvml is never called here
    try:
        from vllm.platforms import cuda  # noqa: PLC0415
    finally:
        import_utils.import_pynvml = saved
    return cuda


def _clear_capability_caches() -> None:
    """vLLM caches that depend on the GPU but do not key on it."""
    from vllm.utils import deep_gemm  # noqa: PLC0415
    from vllm.v1.attention.selector import _cached_get_attn_backend  # noqa: PLC0415

    _cached_get_attn_backend.cache_clear()
    for name in ("mqa_logits_use_mx_scales", "is_deep_gemm_supported"):
        getattr(deep_gemm, name).cache_clear()


_MISSING = object()
_SELECTIONS: list[tuple[list[Any], dict[Any, tuple[int, list[str]]]]] = []
"""What ``CudaPlatform.get_valid_backends`` returned (the valid candidates with their priority;
the invalid backends with priority and reasons) for each automatic backend selection made
under :func:`cuda_device`."""


@contextmanager
def cuda_device(
    capability: tuple[int, int], flashinfer_sm90_nope_mla: bool = True
) -> Iterator[None]:
    """The current (CPU) platform answering as vLLM's CUDA platform on a GPU of
    ``capability``, for the queries planning makes (see the module docstring)."""
    import vllm.platforms  # noqa: PLC0415
    from vllm.utils import platform_utils  # noqa: PLC0415
    from vllm.v1.attention.backends.mla import flashinfer_mla_sparse_sm90 as sm90  # noqa: PLC0415

    cuda = _cuda_module()
    device = DeviceCapability(*capability)
    platform = type(vllm.platforms.current_platform)
    valid_backends = cuda.CudaPlatform.get_valid_backends.__func__

    def recorded_valid_backends(
        cls: type[Any], device_capability: Any, attn_selector_config: Any, num_heads: Any = None
    ) -> tuple[Any, Any]:
        valid, invalid = valid_backends(cls, device_capability, attn_selector_config, num_heads)
        _SELECTIONS.append((valid, invalid))
        return valid, invalid

    patches: dict[str, Any] = {
        "is_cuda": lambda self: True,
        "get_device_capability": classmethod(lambda cls, device_id=0: device),
        "get_attn_backend_cls": classmethod(cuda.CudaPlatform.get_attn_backend_cls.__func__),
        "get_valid_backends": classmethod(recorded_valid_backends),
        "device_name": "cuda",
    }
    saved = {name: platform.__dict__.get(name, _MISSING) for name in patches}
    empty, units = torch.empty, platform_utils.num_compute_units
    nope = sm90.has_flashinfer_sm90_nope_mla

    def meta_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "meta"
        return empty(*args, **kwargs)

    for name, value in patches.items():
        setattr(platform, name, value)
    torch.empty = meta_empty
    platform_utils.num_compute_units = lambda *_: 1
    sm90.has_flashinfer_sm90_nope_mla = lambda: flashinfer_sm90_nope_mla
    _clear_capability_caches()
    try:
        yield
    finally:
        _clear_capability_caches()
        sm90.has_flashinfer_sm90_nope_mla = nope
        platform_utils.num_compute_units = units
        torch.empty = empty
        for name, value in saved.items():
            if value is _MISSING:
                delattr(platform, name)
            else:
                setattr(platform, name, value)


class _Refused(Exception):
    """vLLM refused the configuration at ``step``."""

    def __init__(
        self, step: str, error: BaseException, extra: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.step = step
        self.extra = extra or {}


class _Unsupported(Exception):
    """What vLLM would do here cannot be found out on this CPU build."""


ENGINE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    AssertionError,
    NotImplementedError,
    RuntimeError,
)
"""What vLLM raises when it refuses a configuration (an AttributeError only where the
configuration itself is read: building the config objects)."""


@contextmanager
def _engine(step: str, errors: tuple[type[BaseException], ...] = ENGINE_ERRORS) -> Iterator[None]:
    """Run a vLLM step; its refusal becomes :class:`_Refused`."""
    try:
        yield
    except errors as error:
        raise _Refused(step, error) from error


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` merged in (nested dicts merged, other values replaced)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def fixture_config(
    mtp_layers: int | None, config_override: dict[str, Any] | None
) -> dict[str, Any]:
    """The fixture ``config.json`` (with ``text_config.num_nextn_predict_layers`` when
    ``mtp_layers`` is given), then ``config_override`` merged in (``{"text_config": {...}}``
    for text fields)."""
    config: dict[str, Any] = json.loads(FIXTURE.read_text())
    if mtp_layers is not None:
        config["text_config"]["num_nextn_predict_layers"] = mtp_layers
    return _merge(config, config_override or {})


def _engine_config(
    directory: Path,
    capability: tuple[int, int],
    *,
    tp: int,
    pp: int,
    dcp: int,
    kv_dtype: str,
    spec_tokens: int,
    prefix_caching: bool,
    block_size: int | None,
    max_model_len: int,
    backend: str | None,
    kda_prefill_backend: str,
) -> VllmConfig:
    """The engine core's ``VllmConfig`` (``vllm serve`` flags), built on CPU then given the
    CUDA engine's settings (module docstring)."""
    with _engine("config", (*ENGINE_ERRORS, AttributeError, TypeError, KeyError)):
        cache = CacheConfig(
            block_size=block_size, cache_dtype=kv_dtype, enable_prefix_caching=prefix_caching
        )
        requested = (cache.block_size, cache.mamba_ssm_cache_dtype)
        parallel = ParallelConfig(
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            decode_context_parallel_size=dcp,
        )
        target = ModelConfig(
            model=str(directory),
            skip_tokenizer_init=True,
            dtype="bfloat16",
            max_model_len=max_model_len,
        )
        speculative = None
        if spec_tokens > 0:  # --speculative-config '{"method": "mtp", ...}'
            speculative = SpeculativeConfig(
                method="mtp",
                num_speculative_tokens=spec_tokens,
                target_model_config=target,
                target_parallel_config=parallel,
            )
        config = VllmConfig(
            model_config=target,
            cache_config=cache,
            parallel_config=parallel,
            speculative_config=speculative,
            device_config=DeviceConfig(device="cpu"),
            attention_config=AttentionConfig(backend=backend),
            additional_config={"kda_prefill_backend": kda_prefill_backend},
        )
    # What the CPU platform decided differently from a CUDA engine (module docstring).
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    cache_config = config.cache_config
    if (cache_config.block_size, cache_config.mamba_ssm_cache_dtype) != requested:
        stale = cache_config.block_size
        cache_config.block_size, cache_config.mamba_ssm_cache_dtype = requested
        if cache_config.mamba_block_size == stale and cache_config.mamba_cache_mode == "align":
            cache_config.mamba_block_size = cache_config.block_size
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP  # noqa: PLC0415

    hook = MODELS_CONFIG_MAP.get(config.model_config.architecture)
    if hook is not None:
        with cuda_device(capability), _engine("verify_and_update_config"):
            hook.verify_and_update_config(config)
    return config


def _import_failures(invalid: dict[Any, tuple[int, list[str]]], before: int) -> dict[str, Any]:
    """The backends of priority below ``before`` that vLLM's selector could not import on this
    CPU build (CUDA extensions): what they would say on a GPU is not known here."""
    return {
        backend.name: reasons
        for backend, (priority, reasons) in invalid.items()
        if priority < before and any(r.startswith(("ImportError", "OSError")) for r in reasons)
    }


def _mla_backend(worker: VllmConfig) -> tuple[type[Any], dict[str, Any]]:
    """What ``MLAAttention.__init__`` selects (``mla_attention.py:509-530``): vLLM's selector
    for a sparse 512-wide MLA layer, then the cache dtype canonicalised for that backend
    (written back to the cache config, as the layer does). Also returns the backends ahead of
    the chosen one in CUDA's priority list that could not be imported here."""
    from vllm.model_executor.layers.attention.mla_attention import (  # noqa: PLC0415
        _canonicalize_sparse_mla_kv_cache_dtype,
    )
    from vllm.v1.attention.selector import get_attn_backend  # noqa: PLC0415

    text = worker.model_config.hf_text_config
    cache = worker.cache_config
    selected = worker.attention_config.backend
    _SELECTIONS.clear()
    try:
        backend: type[Any] = get_attn_backend(
            text.kv_lora_rank + text.qk_rope_head_dim,
            worker.model_config.dtype,
            cache.cache_dtype,
            use_mla=True,
            use_sparse=text.index_topk is not None,
            num_heads=text.num_attention_heads // worker.parallel_config.tensor_parallel_size,
        )
    except ValueError as error:
        if selected is not None and ("[ImportError" in str(error) or "[OSError" in str(error)):
            raise _Unsupported(
                f"--attention-backend {selected.name} cannot be imported on this CPU build, "
                f"so whether vLLM accepts it on a GPU is not known here: {error}"
            ) from error
        failures = _import_failures(_SELECTIONS[-1][1], sys.maxsize) if _SELECTIONS else {}
        raise _Refused("attention backend", error, {"cpu_import_failures": failures}) from error
    failures = {}
    if selected is None and _SELECTIONS:  # the selection rule: the lowest priority number wins
        valid, invalid = _SELECTIONS[-1]
        failures = _import_failures(invalid, min(each.priority for each in valid))
    dtype = _canonicalize_sparse_mla_kv_cache_dtype(backend, cache.cache_dtype)
    if dtype != cache.cache_dtype:
        cache.cache_dtype = dtype
    return backend, failures


def _mla_cache_layers(
    worker: VllmConfig, index: int, prefix: str, backend: type[Any], draft: bool
) -> None:
    """Register one MLA decoder layer's three cache layers in construction order: the
    indexer's ``k_cache`` and ``tail_cache`` (real constructors, ``attention.py:260-277``),
    then the latent ``MLAAttention`` (``mla.py:122-140``)."""
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention  # noqa: PLC0415
    from vllm.models.glm5next.common.attention import (  # noqa: PLC0415
        Glm5NextIndexerCache,
        Glm5NextTailCache,
    )
    from vllm.models.glm5next.common.model import get_sparse_topk_buffer_width  # noqa: PLC0415

    text = worker.model_config.hf_text_config
    name = f"{prefix}.{index}.self_attn"
    key = Glm5NextIndexerCache(
        head_dim=text.index_head_dim + text.index_head_dim // 128 * 4,
        dtype=torch.uint8,
        prefix=f"{name}.indexer.k_cache",
        cache_config=worker.cache_config,
        index_kpool=text.index_kpool,
    )
    tail = Glm5NextTailCache(
        head_dim=text.index_head_dim,
        dtype=torch.bfloat16,
        prefix=f"{name}.indexer.tail_cache",
        cache_config=worker.cache_config,
        index_kpool=text.index_kpool,
    )
    latent: Any = MLAAttention.__new__(MLAAttention)
    nn.Module.__init__(latent)
    latent.layer_name = f"{name}.attn"
    latent.head_size = text.kv_lora_rank + text.qk_rope_head_dim
    latent.kv_cache_dtype = worker.cache_config.cache_dtype
    latent.attn_backend = backend
    latent.sliding_window = None
    latent.topk_buffer_width = get_sparse_topk_buffer_width(text)
    latent.indexer = key  # the layer's Indexer: non-None makes it the index-group leader
    latent.non_causal_multi_token_decode = False
    if AT_LEAST_034:  # its spec asks the implementation for an fp8_ds_mla row's bytes
        latent.impl = _row_impl(backend, text)
    for layer in (key, tail, latent):
        layer.is_draft_layer = draft  # llm_base_proposer.py:1328-1335
    worker.compilation_config.static_forward_context[latent.layer_name] = latent


def _row_impl(backend: Any, text: Any) -> Any:
    """The backend's MLA implementation, uninitialised, holding the latent and rope widths:
    all its ``fp8_ds_mla`` row-size hook reads (vLLM 0.34; 0.33 has a table)."""
    impl_class = backend.get_impl_cls()
    impl = impl_class.__new__(impl_class)
    impl.kv_lora_rank = text.kv_lora_rank
    impl.qk_rope_head_dim = text.qk_rope_head_dim
    return impl


def _kda_layer(worker: VllmConfig, index: int, kda_prefill_backend: str) -> None:
    """Register a ``Glm5NextLinearAttention`` with the attributes its ``__init__`` sets and its
    spec reads (``kda.py:163-200``, ``gdn/base.py:25-48``)."""
    from vllm.models.glm5next.common.kda import Glm5NextLinearAttention  # noqa: PLC0415

    text = worker.model_config.hf_text_config
    speculative = worker.speculative_config
    layer: Any = Glm5NextLinearAttention.__new__(Glm5NextLinearAttention)
    nn.Module.__init__(layer)
    layer.prefix = f"{BASE_PREFIX}.{index}.self_attn"
    layer.tp_size = worker.parallel_config.tensor_parallel_size
    layer.model_config = worker.model_config
    layer.cache_config = worker.cache_config
    layer.speculative_config = speculative
    layer.num_spec = speculative.num_speculative_tokens if speculative else 0
    layer.num_heads = text.linear_num_heads
    layer.head_dim = text.linear_head_dim
    layer.conv_size = text.linear_conv_kernel_dim
    layer.kda_prefill_backend = kda_prefill_backend
    worker.compilation_config.static_forward_context[layer.prefix] = layer


def _build_stage(
    worker: VllmConfig, stage: int, pp: int
) -> tuple[int, int, str, str, dict[str, Any]]:
    """Register the cache layers pipeline stage ``stage``'s worker builds, in module order
    (``make_layers`` over ``get_pp_indices``; the MTP draft on the last stage,
    ``gpu_model_runner.py:598``). Returns the stage's layer range, MLA backend name, KDA
    prefill backend and the backends ahead of the MLA one not importable here."""
    from vllm.models.glm5next.common.kda import _resolve_kda_prefill_backend  # noqa: PLC0415
    from vllm.models.glm5next.common.model import (  # noqa: PLC0415
        _is_kda_layer,
        _validate_supported_config,
    )

    text = worker.model_config.hf_text_config
    with _engine("model"):
        _validate_supported_config(text)
        start, end = get_pp_indices(text.num_hidden_layers, stage, pp)
    additional = worker.additional_config
    with _engine("kda prefill backend"):
        kda_backend = _resolve_kda_prefill_backend(
            additional.get("kda_prefill_backend", "auto"),
            text.linear_head_dim,
            worker.model_config.dtype,
            text.linear_lower_bound,
        )
    backend: type[Any] | None = None
    failures: dict[str, Any] = {}
    for index in range(start, end):
        if _is_kda_layer(text, index):
            _kda_layer(worker, index, kda_backend)
            continue
        if backend is None:  # selection is cached: every MLA layer gets the same backend
            backend, failures = _mla_backend(worker)
        with _engine("model"):
            _mla_cache_layers(worker, index, BASE_PREFIX, backend, draft=False)
    speculative = worker.speculative_config
    if speculative is not None and stage == pp - 1:
        # Glm5NextMultiTokenPredictor (mtp.py:112-123): MTP layers are MLA layers past the base.
        with _engine("model", (*ENGINE_ERRORS, AttributeError)):
            modules = speculative.draft_model_config.hf_text_config.num_nextn_predict_layers
        for offset in range(modules):
            if backend is None:
                backend, failures = _mla_backend(worker)
            with _engine("model"):
                _mla_cache_layers(
                    worker, text.num_hidden_layers + offset, DRAFT_PREFIX, backend, draft=True
                )
    name = backend.get_name() if backend is not None else "none"
    return start, end, name, kda_backend, failures


def _role(spec: KVCacheSpec) -> str:
    """A cache layer's part of the model, from its spec."""
    if isinstance(spec, MambaSpec):
        return "kda"
    if isinstance(spec, CircularBufferSpec):
        return "tail"
    role = getattr(spec, "cache_role", None)
    return "k_cache" if role is not None and role.name == "INDEXER" else "latent"


def _plain(value: Any) -> Any:
    """``value`` as plain Python (dtypes and enums as names, tuples as lists)."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        return [_plain(each) for each in value]
    if hasattr(value, "name") and hasattr(value, "value"):  # an enum
        return str(value.name)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _module_layer(name: str) -> int:
    """vLLM's ``extract_layer_index`` of a cache layer name."""
    from vllm.model_executor.models.utils import extract_layer_index  # noqa: PLC0415

    return int(extract_layer_index(name))


def _spec_fields(spec: KVCacheSpec, config: VllmConfig) -> dict[str, Any]:
    """What vLLM's spec says of one cache layer."""
    fields: dict[str, Any] = {
        "spec": type(spec).__name__,
        "page_size_bytes": spec.page_size_bytes,
        "real_page_size_bytes": getattr(spec, "real_page_size_bytes", None),
        "block_size": spec.block_size,
        "page_shape_bytes": _plain(compute_layer_kv_cache_shape_bytes(spec, 1)[1:]),
        "block_stride_alignment": spec.get_block_stride_alignment(),
        "max_memory_usage_bytes": spec.max_memory_usage_bytes(config),
        "max_num_blocks_per_req": spec.max_num_blocks_per_req(
            config, config.model_config.max_model_len
        ),
    }
    for field in (
        "dtype",
        "dtypes",
        "shapes",
        "num_kv_heads",
        "head_size",
        "head_size_v",
        "tokens_per_state",
        "dcp_sharded",
        "cache_dtype_str",
        "kv_quant_mode",
        "state_content_bytes",
        "cache_role",
        "num_speculative_blocks",
        "num_prefill_checkpoint_blocks",
        "prefill_checkpoint_alignment",
        "page_size_padded",
        "mamba_cache_mode",
        "mamba_type",
        "tp_replicated",
        "max_tp_shards",
        "topk_buffer_width",
        "is_index_group_leader",
    ):
        if hasattr(spec, field):
            fields[field] = _plain(getattr(spec, field))
    return fields


def _bound(kv_cache_config: KVCacheConfig, worker: VllmConfig) -> dict[str, tuple[int, int]]:
    """Each layer's (byte offset of block 0, block stride in bytes) in the views vLLM's
    ``allocate_kv_cache`` makes (on ``meta``)."""
    from vllm.v1.worker.utils import allocate_kv_cache  # noqa: PLC0415

    layout = worker.cache_config.get_resolved_kv_cache_layout()
    with set_current_vllm_config(worker):
        views = allocate_kv_cache(kv_cache_config, torch.device("meta"), layout)
    return {
        name: (
            view.storage_offset() * view.element_size(),
            view.stride(0) * view.element_size(),
        )
        for name, view in views.items()
    }


def _per_request_blocks(config: VllmConfig, group: KVCacheGroupSpec) -> int:
    """Blocks one request of ``max_model_len`` takes from the shared pool in ``group``:
    vLLM's ``get_max_concurrency_for_kv_cache_config`` of a one-block pool holding only this
    group is ``1 / blocks``."""
    alone = KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[group])
    concurrency = float(get_max_concurrency_for_kv_cache_config(config, alone))
    blocks = round(1 / concurrency)
    assert 1 / blocks == concurrency, (group.layer_names[0], concurrency)
    return blocks


def _group_entries(
    config: VllmConfig,
    groups: list[KVCacheGroupSpec],
    roles: dict[str, str],
    counted: list[KVCacheGroupSpec] | None = None,
) -> list[dict[str, Any]]:
    """``groups`` (a stage's, or the global ones) in vLLM's order. Blocks per request and
    block-table widths are vLLM's counts on ``counted`` (default ``groups``): for the global
    groups, the scheduler's config, which ``get_max_concurrency_for_kv_cache_config`` reads."""
    dcp = config.parallel_config.decode_context_parallel_size
    entries = []
    for index, (group, count) in enumerate(zip(groups, counted or groups, strict=True)):
        spec = group.kv_cache_spec
        first = (
            next(iter(spec.kv_cache_specs.values()))
            if isinstance(spec, UniformTypeKVCacheSpecs)
            else spec
        )
        entries.append(
            {
                "index": index,
                "layers": list(group.layer_names),
                "module_layers": [_module_layer(name) for name in group.layer_names],
                "roles": [roles[name] for name in group.layer_names],
                "spec": type(spec).__name__,
                "layer_spec": type(first).__name__,
                "block_size": spec.block_size,
                "page_size_bytes": spec.page_size_bytes,
                "eagle": group.is_eagle_group,
                "prefix_cacheable": spec.prefix_cacheable,
                "dcp_block_size": resolve_dcp_kv_block_size(spec, dcp),
                "max_memory_usage_bytes": spec.max_memory_usage_bytes(config),
                "blocks_per_request": _per_request_blocks(config, count),
                "block_table_width": count.kv_cache_spec.max_num_blocks_per_req(
                    config, config.model_config.max_model_len
                ),
            }
        )
    return entries


def _stage_entry(
    *,
    stage: int,
    layer_range: tuple[int, int],
    config: VllmConfig,
    worker: VllmConfig,
    specs: dict[str, KVCacheSpec],
    kv_cache_config: KVCacheConfig,
) -> dict[str, Any]:
    """One pipeline stage: its layers (spec, tensor and per-block placement), groups and
    tensors."""
    roles = {name: _role(spec) for name, spec in specs.items()}
    group_of = {
        name: index
        for index, group in enumerate(kv_cache_config.kv_cache_groups)
        for name in group.layer_names
    }
    bound = _bound(kv_cache_config, worker)
    placement: dict[str, dict[str, Any]] = {}
    tensors = []
    for index, tensor in enumerate(kv_cache_config.kv_cache_tensors):
        tensors.append(
            {
                "stage": stage,
                "index": index,
                "group": group_of[tensor.layers[0]],
                "offset": tensor.offset,
                "size": tensor.size,
                "layer_stride": tensor.layer_stride,
                "block_stride": tensor.block_stride,
                "num_layers": len(tensor.layers),
                "roles": sorted({roles[name] for name in tensor.layers}),
                "layers": list(tensor.layers),
            }
        )
        for position, name in enumerate(tensor.layers):
            placement[name] = {
                "tensor": index,
                "tensor_offset": tensor.offset,
                "tensor_size": tensor.size,
                "layer_stride": tensor.layer_stride,
                "block_stride": tensor.block_stride,
                "index_in_tensor": position,
                "offset_in_block": tensor.offset + position * tensor.layer_stride,
            }
    layers = []
    for name, spec in specs.items():
        entry: dict[str, Any] = {
            "name": name,
            "stage": stage,
            "module_layer": _module_layer(name),
            "role": roles[name],
            "draft": spec.is_draft,
            "group": group_of[name],
            **_spec_fields(spec, config),
            **placement[name],
        }
        entry["bound_offset"], entry["bound_block_stride"] = bound[name]
        layers.append(entry)
    strides = {tensor.block_stride for tensor in kv_cache_config.kv_cache_tensors}
    return {
        "stage": stage,
        "layer_range": list(layer_range),
        "block_size": worker.cache_config.block_size,
        "num_blocks": kv_cache_config.num_blocks,
        "block_stride": strides.pop() if len(strides) == 1 else sorted(strides),
        "layers": layers,
        "groups": _group_entries(config, kv_cache_config.kv_cache_groups, roles),
        "kv_cache_tensors": tensors,
        "offset_rule_holds": all(
            (layer["bound_offset"], layer["bound_block_stride"])
            == (layer["offset_in_block"], layer["block_stride"])
            for layer in layers
        ),
    }


def plan_glm(  # noqa: PLR0917 - the flags in the order the conformance tests pass them
    gpu: str = "H200",
    tp: int = 8,
    kv_dtype: str = "fp8",
    spec_tokens: int = 0,
    mtp_layers: int | None = None,
    dcp: int = 1,
    pp: int = 1,
    prefix_caching: bool = True,
    block_size: int | None = None,
    max_model_len: int = 8192,
    budget_bytes: int = 40 << 30,
    backend: str | None = None,
    config_override: dict[str, Any] | None = None,
    *,
    kda_prefill_backend: str = "auto",
    kv_cache_layout: str | None = None,
    pp_partition: tuple[int, ...] | None = None,
    flashinfer_sm90_nope_mla: bool = True,
    objects: bool = False,
) -> dict[str, Any]:
    """vLLM 0.33.0's KV-cache plan for GLM-5.3-Flash (the fixture) on one rank of each stage.

    Arguments are ``vllm serve`` flags: ``gpu`` "H100"/"H200" (SM90) or "B200" (SM100);
    ``tp`` ``--tensor-parallel-size``; ``kv_dtype`` ``--kv-cache-dtype`` verbatim ("auto",
    "fp8", "bfloat16", "fp8_ds_mla", ...); ``spec_tokens`` > 0 adds
    ``--speculative-config '{"method": "mtp", "num_speculative_tokens": N}'``; ``mtp_layers``
    writes ``text_config.num_nextn_predict_layers`` into the config (None: the fixture's,
    which has none); ``dcp`` ``--decode-context-parallel-size``; ``pp``
    ``--pipeline-parallel-size``; ``prefix_caching``; ``block_size`` ``--block-size``;
    ``max_model_len``; ``budget_bytes`` each rank's KV-cache memory; ``backend``
    ``--attention-backend``; ``config_override`` merged into ``config.json``;
    ``kda_prefill_backend`` ``additional_config.kda_prefill_backend``; ``kv_cache_layout``
    ``VLLM_KV_CACHE_LAYOUT``; ``pp_partition`` ``VLLM_PP_LAYER_PARTITION``;
    ``flashinfer_sm90_nope_mla`` whether the GPU box's FlashInfer has SM90 NoPE MLA;
    ``objects``: also return vLLM's own objects under ``"objects"`` (the engine's
    ``VllmConfig``, each stage's ``KVCacheConfig``, worker config and layer specs), for the
    bridges.

    Returns ``{"refused": "<ExceptionType>: <message>", "refused_at": step}`` where vLLM
    refuses, ``{"unsupported": why}`` where this harness cannot emulate the case, else the plan:
    engine-wide figures, ``layers`` (every stage's cache layers with their spec, tensor and
    per-block placement), ``groups`` (the global groups in vLLM's order, figures of the
    scheduler's config), ``kv_cache_tensors`` (every stage's) and ``stages`` (each stage's
    layers, groups projected to it, tensors, block stride and block count)."""
    if gpu not in GPUS:
        return {"unsupported": f"gpu {gpu!r}: only {sorted(GPUS)} are emulated"}
    capability = GPUS[gpu]
    stubbed = install_torchvision_stub()
    environment: dict[str, str] = {}
    if kv_cache_layout is not None:
        environment["VLLM_KV_CACHE_LAYOUT"] = kv_cache_layout
    if pp_partition is not None:
        environment["VLLM_PP_LAYER_PARTITION"] = ",".join(map(str, pp_partition))
    with (
        tempfile.TemporaryDirectory(prefix="vllm_glm-") as tmp,
        _inspect_in_process(stubbed),
        _environment(**environment),
    ):
        directory = Path(tmp)
        (directory / "config.json").write_text(
            json.dumps(fixture_config(mtp_layers, config_override))
        )
        try:
            plan = _plan(
                directory,
                capability,
                tp=tp,
                pp=pp,
                dcp=dcp,
                kv_dtype=kv_dtype,
                spec_tokens=spec_tokens,
                prefix_caching=prefix_caching,
                block_size=block_size,
                max_model_len=max_model_len,
                budget_bytes=budget_bytes,
                backend=backend,
                kda_prefill_backend=kda_prefill_backend,
                flashinfer_sm90_nope_mla=flashinfer_sm90_nope_mla,
            )
            if not objects:
                plan.pop("objects")
        except _Refused as refused:
            return {"refused": str(refused), "refused_at": refused.step, **refused.extra}
        except _Unsupported as unsupported:
            return {"unsupported": str(unsupported)}
    return {
        "gpu": gpu,
        "capability": list(capability),
        "tp": tp,
        "pp": pp,
        "dcp": dcp,
        "kv_dtype": kv_dtype,
        "spec_tokens": spec_tokens,
        "mtp_layers": mtp_layers,
        "prefix_caching": prefix_caching,
        "requested_block_size": block_size,
        "max_model_len": max_model_len,
        "budget_bytes": budget_bytes,
        "requested_backend": backend,
        **plan,
    }


def _check_later_stages_load(config: VllmConfig) -> None:
    """What a worker of stage 1 or later does when it loads the model, before any KV-cache
    planning: its V2 model runner asks the model for its empty intermediate tensors
    (``v1/worker/gpu/model_runner.py:547``). The GLM class vLLM resolves for the config has
    none (``models/glm5next/common/model.py``: "PP is gated off"), though its registry entry
    says it supports PP, so the config is accepted and the start-up fails there."""
    model_cls, _ = get_model_architecture(config.model_config)
    try:
        model_cls.make_empty_intermediate_tensors  # noqa: B018 - the lookup the runner does
    except AttributeError as error:
        raise _Refused("load", error) from None


def _plan(
    directory: Path,
    capability: tuple[int, int],
    *,
    tp: int,
    pp: int,
    dcp: int,
    kv_dtype: str,
    spec_tokens: int,
    prefix_caching: bool,
    block_size: int | None,
    max_model_len: int,
    budget_bytes: int,
    backend: str | None,
    kda_prefill_backend: str,
    flashinfer_sm90_nope_mla: bool,
) -> dict[str, Any]:
    """:func:`plan_glm` in the directory holding the config; raises :class:`_Refused`."""
    config = _engine_config(
        directory,
        capability,
        tp=tp,
        pp=pp,
        dcp=dcp,
        kv_dtype=kv_dtype,
        spec_tokens=spec_tokens,
        prefix_caching=prefix_caching,
        block_size=block_size,
        max_model_len=max_model_len,
        backend=backend,
        kda_prefill_backend=kda_prefill_backend,
    )
    workers: list[VllmConfig] = []
    specs: list[dict[str, KVCacheSpec]] = []
    supported: list[list[str]] = []
    ranges: list[tuple[int, int]] = []
    backends: set[tuple[str, str]] = set()
    import_failures: dict[str, Any] = {}
    if pp > 1:
        _check_later_stages_load(config)
    for stage in range(pp):
        # Each stage's worker process holds its own copy of the config, builds its own
        # layers and aligns its own block size over them (multiproc_executor.py:802).
        worker = copy.deepcopy(config)
        workers.append(worker)
        context = worker.compilation_config.static_forward_context
        context.clear()
        with set_current_vllm_config(worker), cuda_device(capability, flashinfer_sm90_nope_mla):
            start, end, mla, kda, failures = _build_stage(worker, stage, pp)
            ranges.append((start, end))
            backends.add((mla, kda))
            import_failures.update(failures)
            with _engine("update_block_size_for_backend"):
                Platform.update_block_size_for_backend(worker)
            with _engine("get_kv_cache_spec"):
                stage_specs = worker_specs(worker, context)
            specs.append(
                {  # gpu_model_runner.py:7114 marks the proposer's layers' specs
                    name: replace(spec, is_draft=True)
                    if getattr(context[name], "is_draft_layer", False)
                    else spec
                    for name, spec in stage_specs.items()
                }
            )
            layouts = get_supported_kv_cache_layouts(get_current_attn_backends(worker))
            supported.append([layout.name for layout in layouts])
    with (
        set_current_vllm_config(config),
        cuda_device(capability, flashinfer_sm90_nope_mla),
        _engine("engine core KV-cache planning"),
    ):
        layout = resolve_kv_cache_layout(config, supported, [s for d in specs for s in d.values()])
        groups = get_global_kv_cache_groups(config, specs)
        config.adjust_dcp_kv_cache_interleave_size(groups)
        kv_cache_configs = get_kv_cache_configs(config, specs, [budget_bytes] * pp, groups)
        scheduler = generate_scheduler_kv_cache_config(kv_cache_configs)
        concurrency = get_max_concurrency_for_kv_cache_config(config, scheduler)
        scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(scheduler, config)
    for worker in workers:  # the core tells each worker the layout it resolved
        record_kv_cache_layout(worker.cache_config, layout.name)
    stages = [
        _stage_entry(
            stage=stage,
            layer_range=ranges[stage],
            config=config,
            worker=workers[stage],
            specs=specs[stage],
            kv_cache_config=kv_cache_configs[stage],
        )
        for stage in range(pp)
    ]
    roles = {name: _role(spec) for stage_specs in specs for name, spec in stage_specs.items()}
    with set_current_vllm_config(config):
        global_groups = _group_entries(config, groups, roles, scheduler.kv_cache_groups)
    for entry in global_groups:
        entry["layers_per_stage"] = [
            len(stage["groups"][entry["index"]]["layers"]) for stage in stages
        ]
    cache = workers[-1].cache_config
    (mla_backend, kda_backend), *others = sorted(backends)
    assert not others, backends
    engine_objects = {
        "config": config,
        "kv_cache_configs": kv_cache_configs,
        "workers": workers,
        "specs": specs,  # each stage's worker's get_kv_cache_spec, the draft's marked
    }
    return {
        "backend": mla_backend,
        "kda_prefill_backend": kda_backend,
        "cpu_import_failures_ahead": import_failures,
        "cache_dtype": cache.cache_dtype,
        "supported_kv_cache_layouts": supported[0],
        "kv_cache_layout": layout.name,
        "block_size": cache.block_size,
        "mamba_block_size": cache.mamba_block_size,
        "mamba_page_size_padded": cache.mamba_page_size_padded,
        "mamba_cache_mode": cache.mamba_cache_mode,
        "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype,
        "num_blocks": scheduler.num_blocks,
        "block_stride": stages[0]["block_stride"],
        "block_strides": [stage["block_stride"] for stage in stages],
        "max_concurrency": float(concurrency),
        "blocks_per_request": [group["blocks_per_request"] for group in global_groups],
        "blocks_per_request_total": sum(group["blocks_per_request"] for group in global_groups),
        "block_table_widths": [group["block_table_width"] for group in global_groups],
        "scheduler_block_size": int(scheduler_block_size),
        "hash_block_size": int(hash_block_size),
        "cp_kv_cache_interleave_size": config.parallel_config.cp_kv_cache_interleave_size,
        "offset_rule_holds": all(stage["offset_rule_holds"] for stage in stages),
        "layers": [layer for stage in stages for layer in stage["layers"]],
        "groups": global_groups,
        "kv_cache_tensors": [tensor for stage in stages for tensor in stage["kv_cache_tensors"]],
        "stages": stages,
        "objects": engine_objects,
    }


def summary(plan: dict[str, Any]) -> str:
    """One line of a plan's key numbers (or its refusal)."""
    if "refused" in plan or "unsupported" in plan:
        return str(plan)
    counts = ", ".join(
        f"{'+'.join(sorted(set(g['roles'])))}:{len(g['layers'])}" for g in plan["groups"]
    )
    stages = " | ".join(
        f"stage{s['stage']} {s['layer_range']} stride {s['block_stride']} blocks {s['num_blocks']}"
        for s in plan["stages"]
    )
    return (
        f"{plan['gpu']} {plan['kv_dtype']} tp{plan['tp']} pp{plan['pp']} dcp{plan['dcp']} "
        f"s{plan['spec_tokens']} mtp{plan['mtp_layers']}: {plan['backend']} "
        f"{plan['cache_dtype']} {plan['kv_cache_layout']} block {plan['block_size']} "
        f"[{counts}] {stages} | num_blocks {plan['num_blocks']} "
        f"conc {plan['max_concurrency']:.2f} per-req {plan['blocks_per_request']} "
        f"rule {plan['offset_rule_holds']}"
    )


# What each cache layer is bound: the worker's path from KVCacheConfig to layer caches.

MODEL_RUNNERS = ("v2", "v1")
"""The GPU model runners :func:`bound_views` runs: "v2" (``v1/worker/gpu/model_runner.py``),
what a CUDA engine with Triton uses unless ``VllmConfig._get_v2_model_runner_unsupported_features``
names something (``config/vllm.py:731-766``: nothing for GLM-5.3-Flash's cases), and "v1"
(``v1/worker/gpu_model_runner.py``, ``VLLM_USE_V2_MODEL_RUNNER=0`` or no Triton)."""


class _UnbuiltMetadataBuilder:
    """Stands for a backend's metadata builder, which is not built here (its constructor
    needs the GPU's kernels; it reads the views' shapes only when a batch runs)."""

    requires_block_table_width = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs


@contextmanager
def _unbuilt_metadata_builders(backends: set[Any]) -> Iterator[None]:
    """Each backend's ``get_builder_cls`` answering a :class:`_UnbuiltMetadataBuilder` with the
    real builder's ``requires_block_table_width`` and ``get_cudagraph_support``, so
    ``AttentionGroup.create_metadata_builders`` (``v1/worker/utils.py:284-338``) runs its
    kernel-block selection and kernel block tables unchanged."""
    saved = {backend: backend.__dict__.get("get_builder_cls", _MISSING) for backend in backends}
    for backend in backends:
        real = backend.get_builder_cls()
        stub = type(
            f"Unbuilt{real.__name__}",
            (_UnbuiltMetadataBuilder,),
            {
                "requires_block_table_width": getattr(real, "requires_block_table_width", False),
                "get_cudagraph_support": real.get_cudagraph_support,
            },
        )
        backend.get_builder_cls = staticmethod(lambda stub=stub: stub)
    try:
        yield
    finally:
        for backend, value in saved.items():
            if value is _MISSING:
                delattr(backend, "get_builder_cls")
            else:
                backend.get_builder_cls = value


@contextmanager
def _cuda_runner() -> Iterator[None]:
    """The current platform answering ``check_runner_kv_caches_multi_layer`` as CUDA does
    (``platforms/cuda.py:253``: a no-op; GLM has three cache layers per MLA layer index)."""
    import vllm.platforms  # noqa: PLC0415

    platform = type(vllm.platforms.current_platform)
    saved = platform.__dict__.get("check_runner_kv_caches_multi_layer", _MISSING)
    check = _cuda_module().CudaPlatform.check_runner_kv_caches_multi_layer.__func__
    platform.check_runner_kv_caches_multi_layer = classmethod(check)
    try:
        yield
    finally:
        if saved is _MISSING:
            delattr(platform, "check_runner_kv_caches_multi_layer")
        else:
            platform.check_runner_kv_caches_multi_layer = saved


@contextmanager
def _recorded(module: Any, name: str, record: dict[str, Any], v1: bool) -> Iterator[None]:
    """``module.name`` (the runner's binding call) recording the views it is given, then
    running unchanged: V1's ``bind_kv_cache(kv_caches, ..., layer_kv_caches=...)`` gives the
    manager views and the layers' views, V2's ``bind_kv_cache_to_layers(kv_caches, ...)`` the
    layers' views."""
    real = getattr(module, name)

    def recorded(kv_caches: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        if v1:
            record["manager"] = dict(kv_caches)
            kv_caches_of_layers = kwargs.get("layer_kv_caches") or kv_caches
        else:
            kv_caches_of_layers = kv_caches
        record["layers"] = dict(kv_caches_of_layers)
        return real(kv_caches, *args, **kwargs)

    setattr(module, name, recorded)
    try:
        yield
    finally:
        setattr(module, name, real)


def _view_fields(tensor: torch.Tensor) -> dict[str, Any]:
    """A view's dtype, shape, strides (elements) and byte offset from the rank's backing."""
    return {
        "dtype": _plain(tensor.dtype),
        "shape": list(tensor.shape),
        "strides": list(tensor.stride()),
        "element_size": tensor.element_size(),
        "offset_bytes": tensor.storage_offset() * tensor.element_size(),
    }


def _draft_layer_names(worker: VllmConfig) -> set[str]:
    """The layers the MTP drafter's ``load_model`` finds (every attention layer its model
    adds: ``v1/worker/gpu/spec_decode/speculator.py:226-242``,
    ``v1/spec_decode/llm_base_proposer.py:1318-1341``)."""
    context = worker.compilation_config.static_forward_context
    return {name for name, layer in context.items() if getattr(layer, "is_draft_layer", False)}


def _bind_stage_v2(
    worker: VllmConfig, kv_cache_config: KVCacheConfig, last_stage: bool
) -> tuple[list[list[Any]], list[list[Any]], list[int], dict[str, Any]]:
    """V2 ``GPUModelRunner.initialize_kv_cache`` (``v1/worker/gpu/model_runner.py:623-834``),
    the steps that shape the caches: ``init_attn_backend`` (attention groups, kernel block
    sizes, metadata builders; ``v1/worker/gpu/attn_utils.py:197-311``), on the last stage the
    MTP speculator's ``set_attn`` (``init_attn_backend`` over the draft layers,
    ``spec_decode/speculator.py:287-310``; the speculator exists on the last stage only,
    ``model_runner.py:300-302``), then ``init_kv_cache`` (``attn_utils.py:397-444``:
    ``allocate_kv_cache`` on ``meta``, ``map_kv_caches_to_kernel_blocks`` over the target's
    and the speculator's groups, ``bind_kv_cache_to_layers`` into each layer's own
    ``bind_kv_cache``). Returns the target's and the draft's attention groups, the kernel
    block sizes and the views (manager views, layers' views)."""
    from vllm.v1.worker.gpu import attn_utils  # noqa: PLC0415

    kv_cache_config = copy.deepcopy(kv_cache_config)  # initialize_kv_cache's own copy
    drafts = _draft_layer_names(worker) if worker.speculative_config and last_stage else None
    cpu = torch.device("cpu")  # builders' kernel block tables are small: on CPU, readable
    groups, _, kernel_block_sizes = attn_utils.init_attn_backend(
        kv_cache_config, worker, cpu, draft_layer_names=drafts
    )
    draft_groups: list[list[Any]] = []
    if drafts:
        draft_groups, _, _ = attn_utils.init_attn_backend(
            kv_cache_config, worker, cpu, active_layer_names=drafts
        )
    record: dict[str, Any] = {}
    with _recorded(attn_utils, "bind_kv_cache_to_layers", record, v1=False):
        record["manager"] = attn_utils.init_kv_cache(
            worker.compilation_config.static_forward_context,
            kv_cache_config,
            torch.device("meta"),
            kernel_block_sizes,
            worker,
            attn_groups=(group for each in groups + draft_groups for group in each),
        )
    return groups, draft_groups, kernel_block_sizes, record


def _stage_runner_v1(worker: VllmConfig, last_stage: bool) -> Any:
    """A V1 ``GPUModelRunner`` stand-in holding what its KV-cache methods read
    (``gpu_model_runner.py:6623-6960``), with the MTP drafter (an ``EagleProposer``, ``:651``)
    on the last stage only (``:598``)."""
    from vllm.v1.spec_decode.eagle import EagleProposer  # noqa: PLC0415

    runner = types.SimpleNamespace(
        vllm_config=worker,
        model_config=worker.model_config,
        cache_config=worker.cache_config,
        parallel_config=worker.parallel_config,
        compilation_config=worker.compilation_config,
        speculative_config=worker.speculative_config,
        device=torch.device("meta"),
        attn_groups=[],
        kv_caches=[],
        shared_kv_cache_layers={},
        kv_sharing_fast_prefill_eligible_layers=set(),
        # CUDA-graph mode resolution and the reorder threshold do not touch the caches.
        _check_and_update_cudagraph_mode=lambda *args, **kwargs: None,
        calculate_reorder_batch_threshold=lambda: None,
    )
    if worker.speculative_config is not None and last_stage:
        drafter = EagleProposer.__new__(EagleProposer)
        drafter.vllm_config = worker
        drafter.device = runner.device
        drafter.draft_attn_groups = []
        drafter._draft_attn_layer_names = _draft_layer_names(worker)
        runner.drafter = drafter
    return runner


def _bind_stage_v1(
    worker: VllmConfig, kv_cache_config: KVCacheConfig, last_stage: bool
) -> tuple[list[list[Any]], list[list[Any]], list[int], dict[str, Any]]:
    """V1 ``GPUModelRunner.initialize_kv_cache`` (``gpu_model_runner.py:6990-7042``), the
    steps that shape the caches, as its own methods on a stand-in runner:
    ``initialize_attn_backend``, ``prepare_kernel_block_sizes``,
    ``initialize_metadata_builders`` (each attention group's kernel block; the drafter's
    ``initialize_attn_backend``, ``llm_base_proposer.py:1711-1771``), then
    ``initialize_kv_cache_tensors`` (``allocate_kv_cache`` on ``meta``,
    ``map_kv_caches_to_kernel_blocks``, ``bind_kv_cache``). Returns as
    :func:`_bind_stage_v2`."""
    from vllm.v1.worker import gpu_model_runner  # noqa: PLC0415
    from vllm.v1.worker.utils import prepare_kernel_block_sizes  # noqa: PLC0415

    runner_class = gpu_model_runner.GPUModelRunner
    kv_cache_config = copy.deepcopy(kv_cache_config)  # initialize_kv_cache's own copy
    runner = _stage_runner_v1(worker, last_stage)
    runner_class.initialize_attn_backend(runner, kv_cache_config)
    kernel_block_sizes: list[int] = prepare_kernel_block_sizes(kv_cache_config, runner.attn_groups)
    # The kernel block tables are small: built on CPU so that they can be read.
    runner.device = torch.device("cpu")
    drafter = getattr(runner, "drafter", None)
    if drafter is not None:
        drafter.device = runner.device
    runner_class.initialize_metadata_builders(runner, kv_cache_config, kernel_block_sizes)
    runner.device = torch.device("meta")
    record: dict[str, Any] = {}
    with _cuda_runner(), _recorded(gpu_model_runner, "bind_kv_cache", record, v1=True):
        runner_class.initialize_kv_cache_tensors(runner, kv_cache_config, kernel_block_sizes)
    draft_groups = [list(drafter.draft_attn_groups)] if drafter is not None else []
    return runner.attn_groups, draft_groups, kernel_block_sizes, record


def _bound_layer(
    layer: Any, given: torch.Tensor, manager: torch.Tensor, group: Any | None
) -> dict[str, Any]:
    """What one cache layer received (``given``), what it keeps after its own
    ``bind_kv_cache`` (``bound``; for a KDA layer the state views it cuts from each page, with
    their offsets inside the page) and the manager view the runner keeps for connectors."""
    entry: dict[str, Any] = {**_view_fields(given), "manager_view": _view_fields(manager)}
    if isinstance(layer.kv_cache, tuple):  # MambaBase.bind_kv_cache (mamba/abstract.py:28-42)
        page = given.storage_offset() * given.element_size()
        entry["bound"] = None
        entry["states"] = [
            {
                "state": name,
                **_view_fields(state),
                "offset_in_page": state.storage_offset() * state.element_size() - page,
                "nbytes_per_block": state[0].numel() * state.element_size(),
            }
            for name, state in zip(("conv", "recurrent"), layer.kv_cache, strict=True)
        ]
    else:
        entry["bound"] = _view_fields(layer.kv_cache)
    entry["backend"] = group.backend.get_name() if group is not None else None
    kernel = group.kernel_block_size if group is not None else None
    entry["kernel_block_size"] = kernel
    if group is not None and kernel is not None:
        spec = group.kv_cache_spec
        entry["kernel_pages_per_block"] = spec.block_size // kernel
        entry["kernel_block_stride"] = group.kernel_block_stride
        entry["kernel_page_entries"] = spec.get_num_kernel_states(kernel)
        entry["kernel_page_stride_bytes"] = given.stride(0) * given.element_size()
        # vLLM's own mapping of block ids 0, 1, 2 to kernel pages (one block per row: a
        # request's block table may be one block wide).
        entry["kernel_pages_of_blocks_0_1_2"] = [
            group.map_to_kernel_block_table(torch.tensor([[block]], dtype=torch.int32))[0].tolist()
            for block in range(3)
        ]
    return entry


def _group_entries_bound(groups: list[list[Any]], draft: bool) -> list[dict[str, Any]]:
    """Attention groups as plain figures."""
    return [
        {
            "group": group.kv_cache_group_id,
            "backend": group.backend.get_name(),
            "layers": len(group.layer_names),
            "kernel_block_size": group.kernel_block_size,
            "kernel_block_stride": group.kernel_block_stride,
            "draft": draft,
        }
        for each in groups
        for group in each
    ]


BIND_ERRORS: tuple[type[BaseException], ...] = (*ENGINE_ERRORS, AttributeError)
"""What binding raises when vLLM refuses (an AttributeError only for V1's missing drafter)."""


def bound_views(*, model_runner: str = "v2", **plan_glm_kwargs: Any) -> dict[str, Any]:
    """What each GLM-5.3-Flash cache layer is bound on one rank of each stage, by vLLM's code.

    Takes :func:`plan_glm`'s arguments (``objects`` is set here) and ``model_runner`` (one of
    :data:`MODEL_RUNNERS`), plans, then runs each stage's worker path from its
    ``KVCacheConfig`` to the layers' caches (:func:`_bind_stage_v2` or :func:`_bind_stage_v1`:
    vLLM's functions, the backing on ``meta``, the layers' own ``bind_kv_cache``; metadata
    builders are not built, see :class:`_UnbuiltMetadataBuilder`).

    Returns the plan's refusal if it refuses, ``{"refused", "refused_at": "bind", "stage"}``
    if binding raises, else ``{"plan": summary line, "model_runner",
    "v2_unsupported_features", "backend", "cache_dtype", "block_size", "num_blocks",
    "stages": [...]}``; each stage: ``num_blocks``, ``block_stride``, ``kernel_block_sizes``
    (per KV-cache group), ``attention_groups`` (group, backend, layer count, kernel block,
    kernel block stride, draft) and ``layers``: ``{layer_name: {"dtype", "shape", "strides"
    (elements), "element_size", "offset_bytes" (from the rank's backing), "module_layer",
    "role", "group", "draft", "backend", "kernel_block_size", "manager_view", "bound",
    ...}}``. The top-level view is the tensor passed to the layer's ``bind_kv_cache``,
    ``bound`` what the layer keeps (``kv_cache``), ``manager_view`` the runner's view in
    manager blocks (``allocate_kv_cache``; what KV connectors get). Where a block is split into
    kernel pages: ``kernel_pages_per_block``, ``kernel_block_stride`` (kernel page ``j`` of
    block ``b`` is page ``b * kernel_block_stride + j`` of the view), ``kernel_page_entries``,
    ``kernel_page_stride_bytes`` and ``kernel_pages_of_blocks_0_1_2`` (vLLM's
    ``map_to_kernel_block_table`` of blocks 0, 1 and 2). A KDA layer has ``bound`` None and
    ``states``: conv then recurrent, each with its view, ``offset_in_page`` and
    ``nbytes_per_block``."""
    if model_runner not in MODEL_RUNNERS:
        raise ValueError(f"model_runner {model_runner!r}: one of {MODEL_RUNNERS}")
    plan = plan_glm(**{**plan_glm_kwargs, "objects": True})
    if "refused" in plan or "unsupported" in plan:
        return plan
    engine = plan.pop("objects")
    capability = tuple(plan["capability"])
    nope = plan_glm_kwargs.get("flashinfer_sm90_nope_mla", True)
    bind_stage = _bind_stage_v2 if model_runner == "v2" else _bind_stage_v1
    workers: list[VllmConfig] = engine["workers"]
    stages = []
    for stage, (worker, kv_cache_config) in enumerate(
        zip(workers, engine["kv_cache_configs"], strict=True)
    ):
        context = worker.compilation_config.static_forward_context
        heads = (
            worker.model_config.hf_text_config.num_attention_heads
            // worker.parallel_config.tensor_parallel_size
        )
        for layer in context.values():
            if hasattr(layer, "topk_buffer_width"):  # MLAAttention: what its __init__ also sets
                layer._vllm_config = worker  # mla_attention.py:731
                layer.num_heads = heads  # Glm5NextMLAAttention's num_local_heads
        backends = {layer.get_attn_backend() for layer in context.values()}
        with (
            set_current_vllm_config(worker),
            cuda_device(capability, nope),
            _unbuilt_metadata_builders(backends),
        ):
            try:
                groups, draft_groups, kernel_block_sizes, record = bind_stage(
                    worker, kv_cache_config, stage == len(workers) - 1
                )
            except BIND_ERRORS as error:
                # V1 on a stage before the last: the runner has no drafter
                # (gpu_model_runner.py:598) but initialize_metadata_builders reads it (:6755).
                if isinstance(error, AttributeError) and "drafter" not in str(error):
                    raise
                return {
                    "refused": f"{type(error).__name__}: {error}",
                    "refused_at": "bind",
                    "stage": stage,
                    "model_runner": model_runner,
                }
        group_of = {
            name: group
            for each in groups + draft_groups
            for group in each
            for name in group.layer_names
        }
        planned = plan["stages"][stage]
        layers = {}
        for entry in planned["layers"]:
            name = entry["name"]
            layers[name] = {
                **_bound_layer(
                    context[name],
                    record["layers"][name],
                    record["manager"][name],
                    group_of.get(name),
                ),
                "module_layer": entry["module_layer"],
                "role": entry["role"],
                "group": entry["group"],
                "draft": entry["draft"],
            }
        stages.append(
            {
                "stage": stage,
                "num_blocks": planned["num_blocks"],
                "block_stride": planned["block_stride"],
                "kernel_block_sizes": kernel_block_sizes,
                "attention_groups": _group_entries_bound(groups, draft=False)
                + _group_entries_bound(draft_groups, draft=True),
                "layers": layers,
            }
        )
    return {
        "plan": summary(plan),
        "model_runner": model_runner,
        # 0.34 has the V2 runner alone: nothing it does not support
        "v2_unsupported_features": []
        if AT_LEAST_034
        else engine["config"]._get_v2_model_runner_unsupported_features(),
        "backend": plan["backend"],
        "cache_dtype": plan["cache_dtype"],
        "block_size": plan["block_size"],
        "num_blocks": plan["num_blocks"],
        "stages": stages,
    }


if __name__ == "__main__":
    for case in (
        {},
        {"kv_dtype": "fp8_ds_mla"},
        {"gpu": "B200", "kv_dtype": "auto", "spec_tokens": 2, "mtp_layers": 1},
        {"pp": 2},
        {"kv_dtype": "auto", "dcp": 2},
        {"spec_tokens": 2},
    ):
        print(case, summary(plan_glm(**case)))
