"""How SGLang 0.5.23 sizes Kimi-K3's (and Kimi-Linear's) KV cache, computed by SGLang's own code
on CPU, without weights, GPUs or process groups.

This is a conformance harness: it imports only SGLang, torch, the standard library and its
sibling ``sglang_platform.py`` (pytest only inside ``require_sglang``), never ``k3layout``.
Nothing of SGLang is reimplemented here; every number comes out of SGLang's objects. The
steps are the ones a scheduler process runs:

1. ``ServerArgs(...)`` from a fixture ``config.json`` and the case's flags, resolved by SGLang's
   resolution pipeline (``ServerArgs.resolve_once`` via ``runtime_context.publish``) under
   ``runtime_context.override_platform`` with the facts of the chosen GPU, so the attention
   backend, page size, mamba radix strategy and the other defaults are the ones that GPU gets.
2. ``ModelConfig.from_server_args`` (target, and the DSpark draft where there is one).
3. ``kv_cache_dtype.configure_kv_cache_dtype`` (what ``ModelRunner.configure_kv_cache_dtype``
   calls), ``layer_setup.resolve_layer_indices`` (the PP stage's layer range; the model object
   is a stand-in holding SGLang's own ``get_pp_indices`` answer, which is what
   ``make_pp_layers`` stores on the real model), ``resolve_spec_aux_hidden_state_config`` and
   ``is_post_capture_kv_active``.
4. ``KVCacheConfigurator(...)`` built with the same arguments ``ModelRunner.
   init_kv_cache_configurator`` passes, then its ``_resolve_memory_pool_config`` (what
   ``configure`` calls): the budget profile, the mamba/token split, the token constraints and
   ``resolve_max_num_reqs``.
5. Optionally ``KVCacheConfigurator._init_pools`` at the resolved sizes on the ``meta`` device
   (shapes and dtypes of every tensor SGLang allocates, no memory), or at small sizes on CPU
   (``sglang_allocate``: real tensors for a bridge check).

What stands in for a CUDA engine, and why (each is also said where it is done):

* Triton (not installable without CUDA) and torchvision (no wheel for torch 2.13.0+cpu):
  ``sglang_platform.install_platform_stubs``, shared with ``sglang_pd.py``, installs SGLang's
  own Triton stub for macOS (``sglang/_platform_stubs.py``) with its platform gates answered as
  on Apple silicon, and a torchvision module stub from the same ``_MockModule`` class; its
  docstring says what each does.
* GPU facts: ``override_platform(**GPUS[gpu].facts)``; GPU memory capacity
  (``utils.common.get_device_memory_capacity``, which asks ``nvidia-smi``) returns the GPU's
  MiB. It sets the memory-tier defaults (chunked prefill, CUDA-graph batch sizes,
  ``mem_fraction_static``) -- none of which enter the KV sizing below.
* The budget: ``KVCacheConfigurator._profile_available_bytes`` computes
  ``rest = available_gpu_memory - pre_model_load_memory * (1 - mem_fraction_static)`` and then
  subtracts its own multimodal reservation (``mm_runtime_reservation_gb``) and the mamba pool.
  ``budget_bytes`` is ``available_gpu_memory - slack``: ``get_available_gpu_memory`` (in the
  configurator's module) returns ``budget_bytes`` in GiB and ``pre_model_load_memory`` is 0,
  so the slack is 0. (MLA models never size post-capture, so the pre-capture activation floor
  that could raise the slack is not in play; ``post_capture_kv_active`` is still asked.)
* ``gc.collect()`` before the memory probe (``_profile_available_bytes``): a no-op, since the
  probe is the stand-in above (a full collection of a test process costs ~0.3 s a stage).
* Process groups: PP's token-capacity MIN (``_apply_token_constraints``' ``all_reduce`` over
  the world CPU group) is run by computing every stage (pass 1, the reduce a no-op), then every
  stage again with the reduce returning the MIN of what the stages contributed (pass 2) --
  SGLang's own reduce, with the other ranks' contributions supplied. ``world_group`` /
  ``pp_group`` are stand-ins; nothing on this path uses them for anything else.
* A case SGLang refuses (an exception from SGLang's code) returns ``{"refused": message}``.

Entry points::

    sglang_case(config_path, tp=8, kv_dtype="fp8", gpu="h200", budget_bytes=60 << 30) -> dict
    sglang_allocate(config_path, tp=8, max_total_num_tokens=64, max_running_requests=2,
                    max_mamba_cache_size=11) -> dict (real SGLang-allocated CPU tensors)
    sglang_server_args(config_path, tp=8, gpu="h200") -> (ServerArgs, ModelConfig), resolved

Each case runs in well under a second after a one-time import of SGLang (~6 s).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sglang_platform import (
    SGLANG_VERSION,
    install_platform_stubs,
    sglang_importable,
    skip_without_sglang,
)

GIB = 1 << 30
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODEL_FILES = {
    "kimi-k3": FIXTURES / "kimi-k3.config.json",
    "kimi-linear": FIXTURES / "kimi-linear-48b-a3b.config.json",
}
DSPARK_DRAFT = FIXTURES / "kimi-k3-dspark-draft"

# The facts SGLang's platform probes would report on each GPU (``runtime_context.
# _PLATFORM_PROBES`` / ``_PLATFORM_VALUES``), and the GPU's memory as ``nvidia-smi`` reports it
# (MiB). FlashInfer is part of SGLang's CUDA install, so ``has_flashinfer`` is true.
_NOT_ELSEWHERE = dict(
    is_cuda=True,
    is_hip=False,
    is_npu=False,
    is_xpu=False,
    is_musa=False,
    is_mps=False,
    has_amx=False,
    has_flashinfer=True,
)
_HOPPER = dict(
    _NOT_ELSEWHERE,
    is_sm90=True,
    is_sm100=False,
    is_sm100_or_sm110=False,
    is_sm110=False,
    is_sm120=False,
    is_blackwell=False,
    is_hopper_with_cuda_12_3=True,
    device_sm=90,
    device_capability=(9, 0),
)
GPUS: dict[str, dict[str, Any]] = {
    "h100": dict(
        mem_mib=81559.0,
        facts=_HOPPER,
    ),
    "h200": dict(
        mem_mib=143771.0,
        facts=_HOPPER,
    ),
    "b200": dict(
        mem_mib=183359.0,
        facts=dict(
            _NOT_ELSEWHERE,
            is_sm90=False,
            is_sm100=True,
            is_sm100_or_sm110=True,
            is_sm110=False,
            is_sm120=False,
            is_blackwell=True,
            is_hopper_with_cuda_12_3=False,
            device_sm=100,
            device_capability=(10, 0),
        ),
    ),
}
# Ours -> SGLang's ``--kv-cache-dtype`` spelling; SGLang's own spellings pass through.
KV_CACHE_DTYPE = {"fp8": "fp8_e4m3", "bf16": "bf16"}


# --------------------------------------------------------------------------------------------
# Availability
# --------------------------------------------------------------------------------------------


def sglang_available() -> bool:
    """True where SGLang ``SGLANG_VERSION`` and the sizing modules this harness drives
    import."""
    return sglang_importable(_sgl)


def require_sglang() -> None:
    """Skip the calling test module unless SGLang ``SGLANG_VERSION`` is importable."""
    skip_without_sglang(_sgl, "sizing modules")


# --------------------------------------------------------------------------------------------
# Import SGLang once, with the stand-ins it needs on a CPU-only Linux box
# --------------------------------------------------------------------------------------------

_MODULES: dict[str, Any] = {}
_GPU_MEM_MIB: list[float] = [GPUS["h200"]["mem_mib"]]


def _gpu_memory_capacity(device: str | None = None) -> float:
    # Stands in for ``utils.common.get_device_memory_capacity`` (nvidia-smi): the case's GPU.
    return _GPU_MEM_MIB[0]


def _patch_memory_capacity() -> None:
    """Point every module's imported ``get_device_memory_capacity`` at the case's GPU."""
    common = _MODULES["common"]
    original = _MODULES["get_device_memory_capacity"]
    modules: list[Any] = list(sys.modules.values())
    for module in modules:
        if module is not None and getattr(module, "get_device_memory_capacity", None) is original:
            module.get_device_memory_capacity = _gpu_memory_capacity
    common.get_device_memory_capacity = _gpu_memory_capacity


def _sgl() -> types.SimpleNamespace:
    """SGLang's modules, imported once."""
    if not _MODULES:
        install_platform_stubs()
        import logging  # noqa: PLC0415
        import warnings  # noqa: PLC0415

        import torch  # noqa: PLC0415

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.srt import runtime_context as rc  # noqa: PLC0415
            from sglang.srt.configs import model_config as mc  # noqa: PLC0415
            from sglang.srt.distributed import utils as dist_utils  # noqa: PLC0415
            from sglang.srt.mem_cache import kv_cache_configurator as kvc  # noqa: PLC0415
            from sglang.srt.mem_cache import kv_cache_dtype, memory_pool  # noqa: PLC0415
            from sglang.srt.model_executor import pool_configurator  # noqa: PLC0415
            from sglang.srt.model_executor.model_runner_components import (  # noqa: PLC0415
                kv_pool_runtime,
                layer_setup,
                spec_aux_hidden_state,
            )
            from sglang.srt.server_args import ServerArgs  # noqa: PLC0415
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: PLC0415
            from sglang.srt.utils import common  # noqa: PLC0415
        for name in ("sglang", "transformers"):
            logging.getLogger(name).setLevel(logging.ERROR)
        _MODULES.update(
            torch=torch,
            rc=rc,
            mc=mc,
            dist_utils=dist_utils,
            kvc=kvc,
            kv_cache_dtype=kv_cache_dtype,
            memory_pool=memory_pool,
            pool_configurator=pool_configurator,
            kv_pool_runtime=kv_pool_runtime,
            layer_setup=layer_setup,
            spec_aux=spec_aux_hidden_state,
            ServerArgs=ServerArgs,
            SpeculativeAlgorithm=SpeculativeAlgorithm,
            common=common,
            get_device_memory_capacity=common.get_device_memory_capacity,
        )
    return types.SimpleNamespace(**_MODULES)


# --------------------------------------------------------------------------------------------
# A case: ServerArgs -> publish -> ModelConfig -> KVCacheConfigurator
# --------------------------------------------------------------------------------------------

_MODEL_DIRS: dict[str, str] = {}


def _model_dir(config_path: str | os.PathLike[str]) -> str:
    """SGLang reads ``<model_path>/config.json``: a temporary directory holding the fixture."""
    path = Path(config_path)
    if path.is_dir():
        return str(path)
    key = str(path.resolve())
    if key not in _MODEL_DIRS:
        directory = tempfile.mkdtemp(prefix="sglang-engine-")
        shutil.copyfile(path, os.path.join(directory, "config.json"))
        _MODEL_DIRS[key] = directory
    return _MODEL_DIRS[key]


class SGLangRefused(Exception):
    """SGLang's own code raised: the case is one SGLang refuses."""


def _where(error: BaseException) -> str:
    """``file:function`` of the innermost SGLang frame that raised."""
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if "sglang" in f.filename and "sglang_engine" not in f.filename
    ]
    if not frames:
        return ""
    frame = frames[-1]
    name = frame.filename.split("site-packages/")[-1]
    return f"{name}:{frame.name}"


@contextlib.contextmanager
def _flashinfer_present() -> Iterator[None]:
    """Stands in for an installed FlashInfer (part of SGLang's CUDA install, and what the
    ``has_flashinfer`` fact says): Kimi-K3's DCP override (``arg_groups/model_overrides/
    kimi_k3.py:_require_kimi_k3_cutedsl_dcp_support``) imports
    ``flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla`` and checks its signature has
    ``enable_dcp`` (FlashInfer >= 0.6.17). Only that one symbol is provided, only while a case
    resolves, and only where FlashInfer is not really installed."""
    if importlib.util.find_spec("flashinfer") is not None:
        yield
        return
    package: Any = types.ModuleType("flashinfer")
    package.__path__ = []
    decode: Any = types.ModuleType("flashinfer.decode")

    def trtllm_batch_decode_with_kv_cache_mla(
        *args: Any, enable_dcp: bool = False, **kwargs: Any
    ) -> Any:
        raise NotImplementedError("stand-in: no kernel runs on the sizing path")

    decode.trtllm_batch_decode_with_kv_cache_mla = trtllm_batch_decode_with_kv_cache_mla
    package.decode = decode
    sys.modules["flashinfer"], sys.modules["flashinfer.decode"] = package, decode
    try:
        yield
    finally:
        sys.modules.pop("flashinfer.decode", None)
        sys.modules.pop("flashinfer", None)


@contextlib.contextmanager
def _session(gpu: str, *, flashinfer: bool = False) -> Iterator[types.SimpleNamespace]:
    """A clean process-wide SGLang context for one case: platform facts, GPU memory, env."""
    s = _sgl()
    if gpu not in GPUS:
        raise ValueError(f"unknown gpu {gpu!r}; known: {sorted(GPUS)}")
    saved_env = dict(os.environ)
    _GPU_MEM_MIB[0] = GPUS[gpu]["mem_mib"]
    _patch_memory_capacity()
    s.rc.reset_context()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(s.rc.override_platform(**GPUS[gpu]["facts"]))
            if flashinfer:
                stack.enter_context(_flashinfer_present())
            yield s
    finally:
        s.rc.reset_context()
        os.environ.clear()
        os.environ.update(saved_env)


def _server_args(
    s: types.SimpleNamespace,
    config_path: str | os.PathLike[str],
    *,
    tp: int,
    dp: int,
    enable_dp_attention: bool,
    pp: int,
    dcp: int,
    kv_dtype: str,
    spec: dict[str, Any] | None,
    max_running_requests: int | None,
    mamba_full_memory_ratio: float | None,
    max_mamba_cache_size: int | None,
    extra: dict[str, Any] | None,
) -> Any:
    kwargs: dict[str, Any] = dict(
        model_path=_model_dir(config_path),
        tp_size=tp,
        pp_size=pp,
        dp_size=dp,
        kv_cache_dtype=KV_CACHE_DTYPE.get(kv_dtype, kv_dtype),
        # No tokenizer is shipped with the fixtures; nothing on the sizing path reads it.
        skip_tokenizer_init=True,
        # The device a CUDA launch resolves; ``get_device()`` would find no accelerator here.
        device="cuda",
    )
    if enable_dp_attention:
        kwargs["enable_dp_attention"] = True
    if dcp != 1:
        kwargs["dcp_size"] = dcp
    if max_running_requests is not None:
        kwargs["max_running_requests"] = max_running_requests
    if mamba_full_memory_ratio is not None:
        kwargs["mamba_full_memory_ratio"] = mamba_full_memory_ratio
    if max_mamba_cache_size is not None:
        kwargs["max_mamba_cache_size"] = max_mamba_cache_size
    if spec:
        spec = dict(spec)
        algorithm = spec.pop("algorithm")
        kwargs["speculative_algorithm"] = algorithm
        draft = spec.pop("draft_model_path", None)
        if draft is None and algorithm.upper() == "DSPARK":
            draft = DSPARK_DRAFT
        if draft is not None:
            kwargs["speculative_draft_model_path"] = _model_dir(draft)
        for ours, theirs in (
            ("num_steps", "speculative_num_steps"),
            ("eagle_topk", "speculative_eagle_topk"),
            ("topk", "speculative_eagle_topk"),
            ("num_draft_tokens", "speculative_num_draft_tokens"),
            ("block_size", "speculative_dspark_block_size"),
            ("gamma", "speculative_dspark_block_size"),
        ):
            if ours in spec:
                kwargs[theirs] = spec.pop(ours)
        kwargs.update(spec)  # anything else: SGLang's own ServerArgs field names
    kwargs.update(extra or {})
    return s.ServerArgs(**kwargs)


def _jsonable(value: Any) -> Any:
    """Plain JSON values: numpy / torch scalars to int or float, tuples to lists."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, str, type(None))):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    for cast in (int, float):
        try:
            if cast(value) == value:
                return cast(value)
        except (TypeError, ValueError):
            pass
    return str(value)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _tensor(t: Any) -> dict[str, Any]:
    return {
        "shape": list(t.shape),
        "dtype": _dtype_name(t.dtype),
        "bytes": t.numel() * t.element_size(),
    }


class _StageRun:
    """One PP stage's (or the only stage's) configurator, built as ``ModelRunner`` builds it."""

    def __init__(
        self, s: types.SimpleNamespace, server_args: Any, *, pp_rank: int, device: str
    ) -> None:
        rc = s.rc
        self.s = s
        parallel = rc.get_parallel()
        tp_size = parallel.tp_size
        # The launcher's rank bundle for TP rank 0 of this stage (WORLD = tp * pp_rank + tp_rank).
        rc.publish(
            server_args,
            role="scheduler",
            ranks=rc.SpawnRanks(world_rank=tp_size * pp_rank, dp_rank=None, gpu_id=0),
        )
        parallel = rc.get_parallel()
        # Stand-in groups: the only reader on this path is the PP all_reduce (patched, below)
        # and ``get_available_gpu_memory(distributed=...)`` (patched, below).
        group = types.SimpleNamespace(
            world_size=parallel.pp_size,
            rank_in_group=pp_rank,
            cpu_group=None,
            is_first_rank=pp_rank == 0,
            is_last_rank=pp_rank == parallel.pp_size - 1,
        )
        parallel.override_permanently(world_group=types.SimpleNamespace(cpu_group=None))
        self.model_config = s.mc.ModelConfig.from_server_args(server_args)
        mc = self.model_config
        spec = rc.get_spec()
        self.spec_algorithm = s.SpeculativeAlgorithm.from_string(spec.speculative_algorithm)
        resolved_str, self.kv_cache_dtype = s.kv_cache_dtype.configure_kv_cache_dtype(
            server_args_kv_cache_dtype=rc.get_model().kv_cache_dtype,
            model=None,  # no weights: no checkpoint-declared fp8 KV scheme
            model_dtype=mc.dtype,
            is_draft_worker=False,
            is_dflash=self.spec_algorithm.is_dflash_family(),
            speculative_draft_attention_backend=spec.speculative_draft_attention_backend,
            speculative_draft_kv_cache_dtype=spec.speculative_draft_kv_cache_dtype,
        )
        self.kv_cache_dtype_str = resolved_str or rc.get_model().kv_cache_dtype
        # ``make_pp_layers`` stores SGLang's ``get_pp_indices`` range on the model; this
        # stand-in model holds just that.
        start, end = s.dist_utils.get_pp_indices(mc.num_hidden_layers, pp_rank, parallel.pp_size)
        self.model = types.SimpleNamespace(start_layer=start, end_layer=end)
        self.layer_info = s.layer_setup.resolve_layer_indices(
            model=self.model, model_config=mc, is_draft_worker=False
        )
        aux = s.spec_aux.resolve_spec_aux_hidden_state_config(
            server_args=server_args,
            model_config=mc,
            spec_algorithm=self.spec_algorithm,
            is_draft_worker=False,
        )
        post_capture = s.kv_pool_runtime.is_post_capture_kv_active(
            server_args=server_args,
            is_draft_worker=False,
            spec_algorithm=self.spec_algorithm,
            token_to_kv_pool_allocator=None,
        )
        self.kvc = s.kvc.KVCacheConfigurator(
            device=device,
            gpu_id=0,
            attn_dp_size=parallel.attn_dp_size,
            pp_size=parallel.pp_size,
            pp_group=group,
            model=self.model,
            model_config=mc,
            server_args=server_args,
            kv_cache_dtype=self.kv_cache_dtype,
            kv_cache_dtype_str=self.kv_cache_dtype_str,
            model_dtype=mc.dtype,
            page_size=rc.get_schedule().page_size,
            sliding_window_size=None,  # no sliding-window layers in Kimi-K3 / Kimi-Linear
            spec_algorithm=self.spec_algorithm,
            is_draft_worker=False,
            post_capture_kv_active=post_capture,
            spec_aux_config=aux,
            draft_parallel_layout=None,
            is_hybrid_swa=mc.is_hybrid_swa,
            is_hybrid_swa_compress=mc.is_hybrid_swa_compress,
            use_mla_backend=mc.attention_arch == s.mc.AttentionArch.MLA,
            layer_info=self.layer_info,
            forward_stream=None,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=None,
            memory_pool_config=None,
            draft_model_idx=None,
        )
        self.post_capture = post_capture

    def resolve(self, budget_bytes: int, reduce_min: int | None) -> Any:
        """``KVCacheConfigurator._resolve_memory_pool_config`` with the budget stood in."""
        from unittest import mock  # noqa: PLC0415

        torch = self.s.torch
        contributed: list[int] = []

        def all_reduce(
            tensor: Any, op: Any = None, group: Any = None, async_op: bool = False
        ) -> None:
            # PP's MIN over stages: this stage contributes ``tensor``; the others' are in
            # ``reduce_min`` (pass 2) or unknown yet (pass 1: the reduce leaves it as is).
            contributed.append(int(tensor.item()))
            if reduce_min is not None:
                tensor.fill_(min(reduce_min, int(tensor.item())))

        with (
            mock.patch.object(
                self.s.kvc, "get_available_gpu_memory", lambda *a, **k: budget_bytes / GIB
            ),
            mock.patch.object(torch.distributed, "all_reduce", all_reduce),
            # ``_profile_available_bytes`` runs ``gc.collect()`` so the GPU's free memory is
            # measured without weight-loading garbage; the memory here is the stand-in above,
            # which no garbage changes, and a full collection of a test process costs ~0.3 s.
            mock.patch.object(self.s.kvc, "gc", types.SimpleNamespace(collect=lambda *a: 0)),
        ):
            config = self.kvc._resolve_memory_pool_config(pre_model_load_memory=0)
        self.contributed = contributed
        return config


def _layer_report(run: _StageRun) -> dict[str, Any]:
    kvc = run.kvc
    li = run.layer_info
    mamba_cfg = kvc.mambaish_config
    out: dict[str, Any] = {"start_layer": li.start_layer, "end_layer": li.end_layer}
    if mamba_cfg is not None:
        out["full_attention_layer_ids"] = [
            i for i in mamba_cfg.full_attention_layer_ids if li.start_layer <= i < li.end_layer
        ]
        out["mamba_layer_ids"] = kvc._get_mamba_layer_ids_for_req_pool()
    return out


def _pool_report(pools: Any) -> dict[str, Any]:
    """Shapes and dtypes straight from the pool objects SGLang built."""
    out: dict[str, Any] = {}
    req = pools.req_to_token_pool
    kv = pools.token_to_kv_pool
    out["req_to_token_pool"] = {
        "class": type(req).__name__,
        "size": req.size,
        "req_to_token": _tensor(req.req_to_token),
    }
    mamba = getattr(req, "mamba_pool", None)
    if mamba is not None:
        cache = mamba.mamba_cache
        m: dict[str, Any] = {
            "class": type(mamba).__name__,
            "size": mamba.size,
            "mamba_layer_ids": list(mamba.mamba_layer_ids),
            "conv": [_tensor(c) for c in cache.conv],
            "temporal": _tensor(cache.temporal),
        }
        for name in ("intermediate_ssm", "intermediate_conv_window"):
            value = getattr(cache, name, None)
            if isinstance(value, list):
                m[name] = [_tensor(v) for v in value]
            elif value is not None:
                m[name] = _tensor(value)
        m["bytes"] = cache.mem_usage_bytes()
        out["mamba_pool"] = m
    kvd: dict[str, Any] = {
        "class": type(kv).__name__,
        "size": kv.size,
        "page_size": kv.page_size,
        "dtype": _dtype_name(kv.dtype),
    }
    full = getattr(kv, "full_kv_pool", None)
    inner = full if full is not None else kv
    if full is not None:
        kvd["full_attention_layer_ids"] = list(
            getattr(kv, "full_attention_layer_id_mapping", {}) or []
        )
        kvd["full_kv_pool_class"] = type(full).__name__
    buffers = getattr(inner, "kv_buffer", None)
    if buffers is not None:
        kvd["store_dtype"] = _dtype_name(inner.store_dtype)
        kvd["layer_num"] = inner.layer_num
        kvd["kv_buffer"] = [_tensor(b) for b in buffers]
        kvd["bytes"] = sum(b.numel() * b.element_size() for b in buffers)
    out["token_to_kv_pool"] = kvd
    out["allocator"] = {
        "class": type(pools.token_to_kv_pool_allocator).__name__,
        "size": pools.token_to_kv_pool_allocator.size,
    }
    return out


def _init_pools(run: _StageRun, *, max_total_num_tokens: int, max_running_requests: int) -> Any:
    s = run.s
    config = s.pool_configurator.MemoryPoolConfig(
        max_total_num_tokens=max_total_num_tokens, max_running_requests=max_running_requests
    )
    sizes = run.kvc._derive_pool_sizes(config=config)
    return run.kvc._init_pools(sizes=sizes, req_to_token_pool=None, token_to_kv_pool_allocator=None)


def _stage_report(run: _StageRun, config: Any, *, pools: bool) -> dict[str, Any]:
    s = run.s
    rc = s.rc
    kvc = run.kvc
    sched = rc.get_schedule()
    configurator = s.pool_configurator.create_memory_pool_configurator(kvc)
    out: dict[str, Any] = {"pp_rank": rc.get_parallel().pp_rank, **_layer_report(run)}
    out["configurator"] = type(configurator).__name__
    out["cell_size"] = getattr(configurator, "_cell_size", None)
    if kvc.dflash_draft_cell_size_per_token is not None:
        out["dflash_draft_cell_size_per_token"] = kvc.dflash_draft_cell_size_per_token
    out["contributed_max_total_num_tokens"] = run.contributed[0] if run.contributed else None
    out["max_total_num_tokens"] = config.max_total_num_tokens
    out["logical_max_total_num_tokens"] = kvc.logical_token_capacity(
        max_total_num_tokens=config.max_total_num_tokens
    )
    out["max_running_requests"] = config.max_running_requests
    if kvc.mambaish_config is not None:
        params = kvc.mambaish_config.mamba2_cache_params
        out["max_mamba_cache_size"] = sched.max_mamba_cache_size
        out["mamba_ratio"] = kvc._calculate_mamba_ratio()
        out["mamba_cache_per_req_all_layers"] = params.mamba_cache_per_req
        out["mamba_state"] = {
            "conv_shape": [list(c) for c in params.shape.conv],
            "temporal_shape": list(params.shape.temporal),
            "conv_dtype": _dtype_name(params.dtype.conv),
            "temporal_dtype": _dtype_name(params.dtype.temporal),
            "num_layers_all_stages": len(params.layers),
        }
    if pools:
        built = _init_pools(
            run,
            max_total_num_tokens=config.max_total_num_tokens,
            max_running_requests=config.max_running_requests,
        )
        out["pools"] = _pool_report(built)
        mp = out["pools"].get("mamba_pool")
        if mp is not None:
            per_slot = sum(c["bytes"] for c in mp["conv"]) + mp["temporal"]["bytes"]
            out["bytes_per_state_slot"] = per_slot // (mp["size"] + 1)
            if "intermediate_ssm" in mp or "intermediate_conv_window" in mp:
                scratch = mp.get("intermediate_ssm", {}).get("bytes", 0) + sum(
                    c["bytes"] for c in mp.get("intermediate_conv_window", [])
                )
                out["verify_scratch_bytes"] = scratch
    return out


def sglang_case(
    config_path: str | os.PathLike[str],
    *,
    tp: int,
    dp: int = 1,
    enable_dp_attention: bool = False,
    pp: int = 1,
    dcp: int = 1,
    kv_dtype: str = "fp8",
    gpu: str = "h200",
    budget_bytes: int,
    spec: dict[str, Any] | None = None,
    max_running_requests: int | None = None,
    mamba_full_memory_ratio: float | None = None,
    max_mamba_cache_size: int | None = None,
    pools: bool = True,
    server_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """SGLang's own sizing of one case, as plain JSON-able values.

    ``budget_bytes`` is the memory ``KVCacheConfigurator`` divides (after the weights, less the
    static-fraction slack, before its own multimodal reservation). ``spec``: ``None`` or e.g.
    ``{"algorithm": "DSPARK", "block_size": 7}`` / ``{"algorithm": "EAGLE", "num_steps": 3,
    "eagle_topk": 1, "num_draft_tokens": 4, "draft_model_path": ...}`` (other keys are passed as
    ServerArgs fields). ``server_args``: extra ServerArgs fields. ``pools``: also build the pools
    at the resolved sizes on the meta device and report their tensors. A case SGLang refuses
    returns ``{"refused": message, "where": "file:function"}``.
    """
    try:
        with _session(gpu, flashinfer=dcp > 1) as s:
            sa = _server_args(
                s,
                config_path,
                tp=tp,
                dp=dp,
                enable_dp_attention=enable_dp_attention,
                pp=pp,
                dcp=dcp,
                kv_dtype=kv_dtype,
                spec=spec,
                max_running_requests=max_running_requests,
                mamba_full_memory_ratio=mamba_full_memory_ratio,
                max_mamba_cache_size=max_mamba_cache_size,
                extra=server_args,
            )
            try:
                s.rc.publish(sa, role="scheduler", ranks=s.rc.SpawnRanks(world_rank=0, gpu_id=0))
            except Exception as error:  # resolution refused the flags
                return {"refused": f"{type(error).__name__}: {error}", "where": _where(error)}
            resolved = _resolved(s, sa)
            pp_size = s.rc.get_parallel().pp_size
            try:
                # Pass 1: every stage's own capacity (what it contributes to the PP MIN).
                contributions = []
                for rank in range(pp_size):
                    run = _StageRun(s, sa, pp_rank=rank, device="meta")
                    run.resolve(budget_bytes, reduce_min=None)
                    contributions.extend(run.contributed)
                floor = min(contributions) if contributions else None
                # Pass 2 (PP only): again, with the reduce answering the MIN.
                stages = []
                for rank in range(pp_size):
                    run = _StageRun(s, sa, pp_rank=rank, device="meta")
                    config = run.resolve(budget_bytes, reduce_min=floor if pp_size > 1 else None)
                    stages.append(_stage_report(run, config, pools=pools))
            except Exception as error:  # SGLang's sizing refused the case
                if not _where(error):
                    raise
                return {
                    "refused": f"{type(error).__name__}: {error}",
                    "where": _where(error),
                    "resolved": _jsonable(resolved),
                }
    except Exception as error:
        if not _where(error):
            raise
        return {"refused": f"{type(error).__name__}: {error}", "where": _where(error)}
    stages = _jsonable(stages)
    first = stages[0]
    result: dict[str, Any] = {
        "sglang_version": SGLANG_VERSION,
        "gpu": gpu,
        "budget_bytes": budget_bytes,
        **resolved,
        "stages": stages,
        "max_total_num_tokens": min(st["max_total_num_tokens"] for st in stages),
        "logical_max_total_num_tokens": min(st["logical_max_total_num_tokens"] for st in stages),
        "max_running_requests": min(st["max_running_requests"] for st in stages),
        "cell_size": first["cell_size"],
    }
    if "max_mamba_cache_size" in first:
        result["max_mamba_cache_size"] = min(st["max_mamba_cache_size"] for st in stages)
    if "bytes_per_state_slot" in first:
        result["bytes_per_state_slot"] = first["bytes_per_state_slot"]
    answer: dict[str, Any] = _jsonable(result)
    return answer


def _resolved(s: types.SimpleNamespace, sa: Any) -> dict[str, Any]:
    """The resolved flags that decide the sizing, read from SGLang's published bags."""
    rc = s.rc
    par = rc.get_parallel()
    ex = rc.get_exec()
    sched = rc.get_schedule()
    spec = rc.get_spec()
    backends = rc.attention_backends()
    cfg = sa.resolved_dict()
    out = {
        "attention_backend": cfg.get("attention_backend"),
        "prefill_attention_backend": backends[0] if backends else None,
        "decode_attention_backend": backends[1] if len(backends) > 1 else None,
        "page_size": sched.page_size,
        "kv_cache_dtype": rc.get_model().kv_cache_dtype,
        "mamba_radix_cache_strategy": cfg.get("mamba_radix_cache_strategy"),
        "enable_mamba_extra_buffer": bool(ex.mamba.enable_mamba_extra_buffer),
        "mamba_ssm_dtype": cfg.get("mamba_ssm_dtype"),
        "mamba_full_memory_ratio": sched.mamba_full_memory_ratio,
        "disable_radix_cache": bool(rc.get_memory().disable_radix_cache),
        "disable_overlap_schedule": bool(sched.disable_overlap_schedule),
        "requested_max_running_requests": sched.max_running_requests,
        "requested_max_mamba_cache_size": sched.max_mamba_cache_size,
        "context_len": None,
        "tp_size": par.tp_size,
        "pp_size": par.pp_size,
        "attn_tp_size": par.attn_tp_size,
        "attn_dp_size": par.attn_dp_size,
        "attn_dcp_size": par.attn_dcp_size,
        "speculative_algorithm": spec.speculative_algorithm,
        "speculative_num_steps": spec.speculative_num_steps,
        "speculative_eagle_topk": spec.speculative_eagle_topk,
        "speculative_num_draft_tokens": spec.speculative_num_draft_tokens,
        "mem_fraction_static": sched.mem_fraction_static,
        "chunked_prefill_size": sched.chunked_prefill_size,
    }
    model_config = s.mc.ModelConfig.from_server_args(sa)
    out["context_len"] = model_config.context_len
    out["is_multimodal"] = bool(model_config.is_multimodal)
    out["multimodal_reservation_gib"] = s.kvc.mm_runtime_reservation_gb(
        is_multimodal=model_config.is_multimodal,
        mm_feature_transport=rc.get_mm().mm_feature_transport,
    )
    _, dtype = s.kv_cache_dtype.configure_kv_cache_dtype(
        server_args_kv_cache_dtype=rc.get_model().kv_cache_dtype,
        model=None,
        model_dtype=model_config.dtype,
        is_draft_worker=False,
        is_dflash=False,
        speculative_draft_attention_backend=None,
        speculative_draft_kv_cache_dtype=None,
    )
    out["kv_cache_torch_dtype"] = _dtype_name(dtype)
    return out


def sglang_server_args(
    config_path: str | os.PathLike[str],
    *,
    tp: int,
    dp: int = 1,
    enable_dp_attention: bool = False,
    pp: int = 1,
    dcp: int = 1,
    kv_dtype: str = "fp8",
    gpu: str = "h200",
    spec: dict[str, Any] | None = None,
    max_running_requests: int | None = None,
    mamba_full_memory_ratio: float | None = None,
    max_mamba_cache_size: int | None = None,
    server_args: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """SGLang's own ``ServerArgs`` for a case, resolved by SGLang's pipeline on ``gpu`` (as
    ``sglang_case`` resolves it), and the target's ``ModelConfig.from_server_args``: the two
    objects a scheduler process holds, for a bridge that reads them. Raises what SGLang raises
    on a case it refuses. (The draft runner's config: :func:`sglang_draft_model_config`.)"""
    with _session(gpu, flashinfer=dcp > 1) as s:
        sa = _server_args(
            s,
            config_path,
            tp=tp,
            dp=dp,
            enable_dp_attention=enable_dp_attention,
            pp=pp,
            dcp=dcp,
            kv_dtype=kv_dtype,
            spec=spec,
            max_running_requests=max_running_requests,
            mamba_full_memory_ratio=mamba_full_memory_ratio,
            max_mamba_cache_size=max_mamba_cache_size,
            extra=server_args,
        )
        s.rc.publish(sa, role="scheduler", ranks=s.rc.SpawnRanks(world_rank=0, gpu_id=0))
        model_config = s.mc.ModelConfig.from_server_args(sa)
        return sa, model_config


def sglang_draft_model_config(server_args: Any, gpu: str = "h200") -> Any:
    """The draft runner's ``ModelConfig``, built as SGLang's scheduler builds it from the
    resolved ``server_args`` (``speculative_draft_model_path``, ``is_draft_model=True``)."""
    with _session(gpu, flashinfer=False) as s:
        s.rc.publish(server_args, role="scheduler", ranks=s.rc.SpawnRanks(world_rank=0, gpu_id=0))
        return s.mc.ModelConfig.from_server_args(
            server_args,
            model_path=server_args.speculative_draft_model_path,
            is_draft_model=True,
        )


def sglang_allocate(
    config_path: str | os.PathLike[str],
    *,
    tp: int,
    dp: int = 1,
    enable_dp_attention: bool = False,
    pp: int = 1,
    pp_rank: int = 0,
    dcp: int = 1,
    kv_dtype: str = "fp8",
    gpu: str = "h200",
    spec: dict[str, Any] | None = None,
    max_total_num_tokens: int = 64,
    max_running_requests: int = 2,
    max_mamba_cache_size: int = 11,
    device: str = "cpu",
    server_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Real pools, allocated by SGLang's ``KVCacheConfigurator._init_pools`` on ``device`` at
    small sizes: ``{"req_to_token_pool", "token_to_kv_pool", "allocator", "mamba_pool",
    "kv_buffer": [tensor per full-attention layer], "conv": [tensor], "temporal": tensor,
    "report": _pool_report}``. The sizes replace what ``_resolve_memory_pool_config`` would
    give (``max_mamba_cache_size`` through the runtime context, as SGLang itself sets it)."""
    with _session(gpu, flashinfer=dcp > 1) as s:
        sa = _server_args(
            s,
            config_path,
            tp=tp,
            dp=dp,
            enable_dp_attention=enable_dp_attention,
            pp=pp,
            dcp=dcp,
            kv_dtype=kv_dtype,
            spec=spec,
            max_running_requests=max_running_requests,
            mamba_full_memory_ratio=None,
            max_mamba_cache_size=max_mamba_cache_size,
            extra=server_args,
        )
        s.rc.publish(sa, role="scheduler", ranks=s.rc.SpawnRanks(world_rank=0, gpu_id=0))
        run = _StageRun(s, sa, pp_rank=pp_rank, device=device)
        pools = _init_pools(
            run,
            max_total_num_tokens=max_total_num_tokens,
            max_running_requests=max_running_requests,
        )
        req = pools.req_to_token_pool
        kv = pools.token_to_kv_pool
        inner = getattr(kv, "full_kv_pool", None) or kv
        out: dict[str, Any] = {
            "req_to_token_pool": req,
            "token_to_kv_pool": kv,
            "allocator": pools.token_to_kv_pool_allocator,
            "kv_buffer": list(getattr(inner, "kv_buffer", [])),
            "layers": _layer_report(run),
            "report": _pool_report(pools),
        }
        mamba = getattr(req, "mamba_pool", None)
        if mamba is not None:
            out["mamba_pool"] = mamba
            out["conv"] = list(mamba.mamba_cache.conv)
            out["temporal"] = mamba.mamba_cache.temporal
        return out


if __name__ == "__main__":  # a quick look: python sglang_engine.py [tp]
    tp_arg = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    answer = sglang_case(MODEL_FILES["kimi-k3"], tp=tp_arg, budget_bytes=60 * GIB)
    for st in answer.get("stages", []):
        st.pop("pools", None)
    print(json.dumps(answer, indent=1))
