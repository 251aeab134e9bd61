"""The weights one vLLM 0.33 rank holds, from vLLM's own model classes built on ``meta``.

:func:`vllm_weights` writes a fixture ``config.json`` (with a ``quantization_config`` and MTP
modules injected where asked) to a directory, builds vLLM's ``VllmConfig`` for it, fakes the
distributed state of one rank in this process (vLLM's tensor-, pipeline-, data- and
expert-parallel ``GroupCoordinator`` objects, with the world sizes and ranks of that rank),
then runs vLLM's ``initialize_model`` under ``torch.device("meta")`` and the model dtype: the
model's ``__init__`` and every parallel layer in it declare their per-rank parameters exactly as
on the GPU, and nothing is allocated. A draft (DSpark or MTP) is built by vLLM's own proposer
loader (``load_dspark_model`` / ``load_eagle_model``) against that target, so the draft shares
what vLLM shares (the target's embedding and LM head). Nothing of vLLM is copied here; every
shape comes out of vLLM's code.

What this measures is what ``create_weights`` declares: the tensors the checkpoint loads into.
It does not run ``process_weights_after_loading`` (see the report for what that adds: the MLA
layers' absorbed ``W_UK_T`` / ``W_UV``, and quantisation repacks).

Stubs, each restored on exit, and why none changes a declared shape:

* **Platform.** The current platform (vLLM's ``UnspecifiedPlatform`` on this CPU machine) has
  its class swapped for a subclass reporting CUDA, compute capability 9.0 (an H200), name
  ``NVIDIA H200`` and 132 SMs. vLLM picks kernels, and for quantised layers weight formats, from
  these; they are what the GPU reports. Attention backends are picked by the conformance
  harness's ``_cuda_platform`` (``vllm_engine``), as for the KV-cache suite.
* **CUDA streams and events.** ``torch.cuda.Stream`` / ``torch.cuda.Event`` (made in
  ``__init__`` for multi-stream overlap: ``KimiLinearModel``, ``KimiMoE``, the MTP layer, MLA's
  gate events) are inert objects. They hold no tensors.
* **Compiled ops.** ``torch.ops._C`` and the other compiled vLLM namespaces are permissive:
  any op name resolves to a stub that raises if called. ``__init__`` only looks ops up
  (``SiluAndMul`` stores ``torch.ops._C.silu_and_mul``; K3's KDA asks ``hasattr(torch.ops._C,
  "fused_kda_decode")``, true in the CUDA wheel, which selects the native fused decode and its
  ``decode_conv1d_weight`` buffer exactly as on the GPU). The capability queries of
  ``vllm._custom_ops`` (``cutlass_scaled_mm_supports_fp8``, ``..._block_fp8``, ``..._fp4``,
  ``mxfp4_experts_quant_supported``, ``cutlass_group_gemm_supported``) answer what the CUDA
  build answers for the capability asked (fp8 from 8.9, block fp8 from 9.0, fp4 from 10.0,
  grouped GEMM on 9.0 and 10.0).
* **MLA prefill backend.** ``get_mla_prefill_backend`` (in K3's ``mla`` module) returns an
  inert class: the real one needs FlashAttention's compiled module. A prefill backend is a plain
  object (not an ``nn.Module``) holding no parameters.
* **MLA decode backend.** The layers are built with the ``TRITON_MLA`` attention backend
  (``FLASHMLA``'s impl asserts its compiled module at ``__init__``). The impl is not an
  ``nn.Module`` and holds no parameters; the backend decides only the KV cache.
* **KDA prefill backend.** K3's ``resolve_kda_prefill_backend`` answers ``"triton"``; on an
  H200 it resolves ``"flashkda"``, which imports the FlashKDA extension to size its prefill
  workspaces (``_flashkda_buffer_specs``: activation buffers made at forward, not weights).
* **GEMM all-reduce fusion.** ``VLLM_KIMI_K3_GEMM_AR=0`` (its kernel module needs
  ``cutlass``): it attaches a communication helper (no parameters) to row-parallel layers.
* **Weight loading.** The draft loaders call ``get_model``; here it is ``initialize_model``
  under ``meta``, the same construction without a checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from vllm.distributed import parallel_state
from vllm.distributed.parallel_state import GroupCoordinator
from vllm_engine import DSPARK_DRAFT, _cuda_platform
from vllm_required import AT_LEAST_034

BACKEND = "TRITON_MLA"
"""The MLA backend the layers are built with (see the module docstring)."""

QUANTIZATIONS: dict[str, dict[str, Any]] = {
    "fp8-block": {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
    },
    # Kimi-K2-Thinking's: int4 weights, group 32, symmetric, routed experts only
    "int4-w4a16": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "ignore": [
            "lm_head",
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
        ],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "input_activations": None,
                "output_activations": None,
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "group_size": 32,
                    "strategy": "group",
                    "dynamic": False,
                    "actorder": None,
                    "observer": "minmax",
                    "observer_kwargs": {},
                },
            }
        },
    },
    "mxfp4": {"quant_method": "mxfp4"},
    "nvfp4": {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "kv_cache_quant_algo": None,
        "exclude_modules": ["lm_head"],
    },
}
"""Named ``quantization_config`` dicts :func:`vllm_weights` accepts by name."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor a rank holds."""

    shape: tuple[int, ...]
    dtype: str  # torch's name, e.g. "torch.bfloat16"
    nbytes: int
    kind: str  # "parameter" or "buffer"
    persistent: bool = True  # buffers: in the state dict (a parameter always is)


@dataclass
class Weights:
    """The tensors of one rank: the target model's and the draft's own (the draft's tensors
    that are the target's, such as a shared embedding, are in ``shared`` and not in
    ``draft``)."""

    target: dict[str, TensorInfo]
    draft: dict[str, TensorInfo] = field(default_factory=dict)
    shared: list[str] = field(default_factory=list)  # draft names aliasing target tensors
    model_class: str = ""
    draft_class: str = ""

    def bytes(self, part: str = "all", *, buffers: bool = True) -> int:
        """Bytes of ``part`` ("target", "draft" or "all"); non-persistent buffers count when
        ``buffers`` (they occupy GPU memory as copies of weights, e.g. KDA's decode conv)."""
        parts = {"target": [self.target], "draft": [self.draft]}
        chosen = parts.get(part, [self.target, self.draft])
        return sum(
            info.nbytes
            for tensors in chosen
            for info in tensors.values()
            if buffers or info.kind == "parameter"
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain data: every tensor and the totals."""

        def table(tensors: dict[str, TensorInfo]) -> dict[str, Any]:
            return {
                name: {
                    "shape": list(t.shape),
                    "dtype": t.dtype,
                    "bytes": t.nbytes,
                    "kind": t.kind,
                    "persistent": t.persistent,
                }
                for name, t in tensors.items()
            }

        return {
            "model_class": self.model_class,
            "draft_class": self.draft_class,
            "target": table(self.target),
            "draft": table(self.draft),
            "shared": list(self.shared),
            "target_bytes": self.bytes("target"),
            "draft_bytes": self.bytes("draft"),
            "total_bytes": self.bytes(),
            "parameter_bytes": self.bytes(buffers=False),
        }


# ---------------------------------------------------------------------------------------
# the stubs (module docstring)


def _group(name: str, world: int, rank: int) -> GroupCoordinator:
    """A ``GroupCoordinator`` of ``world`` ranks seen from ``rank``, with no process group:
    what the parallel layers read (sizes, ranks, first / last rank)."""
    group = GroupCoordinator.__new__(GroupCoordinator)
    group.unique_name = name
    group.rank = rank
    group.ranks = list(range(world))
    group.world_size = world
    group.rank_in_group = rank
    group.local_rank = rank
    group.device_group = None
    group.cpu_group = None
    group.use_device_communicator = False
    group.device_communicator = None
    group.mq_broadcaster = None
    return group


_GROUPS = ("_WORLD", "_TP", "_PP", "_DP", "_EP", "_PCP", "_DCP")


@contextmanager
def _distributed(
    *, tp: int, tp_rank: int, pp: int, pp_rank: int, dp: int, dp_rank: int
) -> Iterator[None]:
    """vLLM's parallel state of one rank: TP ``tp_rank`` of ``tp``, PP stage ``pp_rank`` of
    ``pp``, DP ``dp_rank`` of ``dp``; the expert group spans DP x TP (as vLLM's
    ``initialize_model_parallel`` makes it)."""
    saved = {name: getattr(parallel_state, name) for name in _GROUPS}
    parallel_state._WORLD = _group("world", tp * pp * dp, 0)
    parallel_state._TP = _group("tp", tp, tp_rank)
    parallel_state._PP = _group("pp", pp, pp_rank)
    parallel_state._DP = _group("dp", dp, dp_rank)
    parallel_state._EP = _group("ep", dp * tp, dp_rank * tp + tp_rank)
    parallel_state._PCP = _group("pcp", 1, 0)
    parallel_state._DCP = _group("dcp", 1, 0)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(parallel_state, name, value)


class _Inert:
    """A CUDA stream, event or prefill backend that does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Op:
    """A compiled op looked up at ``__init__``: raises if called."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"compiled op {self.name} is not available on CPU")

    def __getattr__(self, name: str) -> _Op:
        return _Op(f"{self.name}.{name}")


class _Namespace:
    """A compiled op namespace where every op exists (as in the CUDA wheel)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, name: str) -> _Op:
        return _Op(f"{self.name}.{name}")


_NAMESPACES = ("_C", "_moe_C", "_C_cache_ops", "_vllm_fa3_C", "_flashmla_C")
_CAPABILITY_QUERIES = {
    "cutlass_scaled_mm_supports_fp8": lambda c: c >= 89,
    "cutlass_scaled_mm_supports_block_fp8": lambda c: c >= 90,
    "cutlass_scaled_mm_supports_fp4": lambda c: c >= 100,
    "mxfp4_experts_quant_supported": lambda c: c >= 100,
    "cutlass_group_gemm_supported": lambda c: c in (90, 100),
}


@contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name = value`` for the block."""
    missing = object()
    saved = (
        owner.__dict__.get(name, missing)
        if isinstance(owner, type)
        else getattr(owner, name, missing)
    )
    setattr(owner, name, value)
    try:
        yield
    finally:
        if saved is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, saved)


@contextmanager
def _gpu(capability: tuple[int, int] = (9, 0)) -> Iterator[None]:
    """The stubs of the module docstring, for the block."""
    import vllm._custom_ops as ops  # noqa: PLC0415
    import vllm.config.vllm as config_module  # noqa: PLC0415
    import vllm.platforms  # noqa: PLC0415
    from vllm.models.kimi_k3.nvidia import kda, mla  # noqa: PLC0415
    from vllm.platforms.interface import DeviceCapability, PlatformEnum  # noqa: PLC0415

    platform = vllm.platforms.current_platform
    base = type(platform)
    major, minor = capability

    class Cuda(base):  # type: ignore[valid-type,misc]
        _enum = PlatformEnum.CUDA
        device_name = "cuda"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(major=major, minor=minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA H200"

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return 132

        @classmethod
        def current_device(cls) -> torch.device:
            return torch.device("meta")

    with ExitStack() as stack:
        platform.__class__ = Cuda
        stack.callback(setattr, platform, "__class__", base)
        if not AT_LEAST_034:  # 0.34 removed Model Runner V1, and the Triton check it fed
            stack.enter_context(_patched(config_module, "HAS_TRITON", True))
        else:
            # a ShardQ sparse MLA layer allocates its exchange buffers (runtime, no weights)
            # after asking its TP group about symmetric memory: no groups here
            from vllm.model_executor.layers.attention import mla_attention  # noqa: PLC0415

            stack.enter_context(
                _patched(mla_attention, "allocate_shardq_buffers", lambda *_, **__: None)
            )
        stack.enter_context(_patched(torch.cuda, "Stream", _Inert))
        stack.enter_context(_patched(torch.cuda, "Event", _Inert))
        for name in _NAMESPACES:
            stack.enter_context(_patched(torch.ops, name, _Namespace(name)))
        for name, query in _CAPABILITY_QUERIES.items():
            # in vllm._custom_ops and in every module that imported it by name
            original = getattr(ops, name)
            for module in [m for m in sys.modules.values() if m is not None]:
                if module.__name__.startswith("vllm") and module.__dict__.get(name) is original:
                    stack.enter_context(_patched(module, name, query))
        stack.enter_context(_patched(mla, "get_mla_prefill_backend", lambda *_: _Inert))
        stack.enter_context(_patched(kda, "resolve_kda_prefill_backend", lambda *_: "triton"))
        saved = os.environ.get("VLLM_KIMI_K3_GEMM_AR")
        os.environ["VLLM_KIMI_K3_GEMM_AR"] = "0"
        stack.callback(
            lambda: (
                os.environ.pop("VLLM_KIMI_K3_GEMM_AR")
                if saved is None
                else os.environ.__setitem__("VLLM_KIMI_K3_GEMM_AR", saved)
            )
        )
        # torch.device("meta") redirects the constructors it listed on its first use; list
        # torch's own, not the harness's wrapper of torch.empty that _cuda_platform installs
        constructors = torch.utils._device._device_constructors
        constructors.cache_clear()
        constructors()
        stack.enter_context(_cuda_platform(BACKEND))
        yield


# ---------------------------------------------------------------------------------------
# the harness


def fixture_config(
    config_path: Path,
    quantization: dict[str, Any] | None,
    mtp_modules: int,
    text_config: dict[str, Any] | None,
) -> dict[str, Any]:
    """The fixture's ``config.json`` with ``quantization``, MTP modules and ``text_config``
    (fields of the text model's config) injected."""
    config: dict[str, Any] = json.loads(Path(config_path).read_text())
    text = config.get("text_config", config)
    text.update(text_config or {})
    if mtp_modules:
        text["num_nextn_predict_layers"] = mtp_modules
    if quantization is not None:
        config["quantization_config"] = quantization
    return config


def _vllm_config(
    directory: Path,
    *,
    tp: int,
    pp: int,
    dp: int,
    dp_rank: int,
    enable_expert_parallel: bool,
    draft: str | None,
    draft_directory: Path,
    spec_tokens: int,
    max_model_len: int,
    language_only: bool,
) -> VllmConfig:
    """The engine's ``VllmConfig`` (what ``vllm serve`` flags make)."""
    limits = {"limit_mm_per_prompt": {"image": 0, "video": 0}} if language_only else {}
    target = ModelConfig(
        model=str(directory),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=max_model_len,
        **limits,
    )
    parallel = ParallelConfig(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        data_parallel_size=dp,
        data_parallel_rank=dp_rank,
        enable_expert_parallel=enable_expert_parallel,
    )
    speculative = None
    if draft is not None:
        speculative = SpeculativeConfig(
            method=draft,
            model=str(draft_directory) if draft == "dspark" else None,
            num_speculative_tokens=spec_tokens,
            target_model_config=target,
            target_parallel_config=parallel,
        )
    config = VllmConfig(
        model_config=target,
        cache_config=CacheConfig(),
        parallel_config=parallel,
        speculative_config=speculative,
        device_config=DeviceConfig(device="cpu"),
    )
    from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: PLC0415

    config.attention_config.backend = AttentionBackendEnum[BACKEND]
    if speculative is not None:  # the draft's backend is its own (the proposer's rule)
        speculative.attention_backend = AttentionBackendEnum[BACKEND]
    return config


def _tensors(
    model: nn.Module, seen: dict[int, str], owner: str
) -> tuple[dict[str, TensorInfo], list[str]]:
    """Every parameter and buffer of ``model`` not already in ``seen`` (by identity: a
    module registered under two names counts once), and the names of those another model
    (another ``owner``) holds."""
    tensors: dict[str, TensorInfo] = {}
    aliases: list[str] = []
    persistent = {
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        for name in module._buffers
        if name not in module._non_persistent_buffers_set
    }
    named: list[tuple[str, torch.Tensor, str]] = [
        (name, p, "parameter") for name, p in model.named_parameters(remove_duplicate=False)
    ] + [(name, b, "buffer") for name, b in model.named_buffers(remove_duplicate=False)]
    for name, tensor, kind in named:
        if kind == "parameter" and tensor.device.type != "meta":
            raise RuntimeError(f"{name} was allocated on {tensor.device}, not on meta")
        if id(tensor) in seen:
            if seen[id(tensor)] != owner:
                aliases.append(name)
            continue
        seen[id(tensor)] = owner
        tensors[name] = TensorInfo(
            shape=tuple(tensor.shape),
            dtype=str(tensor.dtype),
            nbytes=tensor.numel() * tensor.element_size(),
            kind=kind,
            persistent=kind == "parameter" or name in persistent,
        )
    return tensors, aliases


def vllm_weights(
    config_path: str | Path,
    *,
    tp: int = 1,
    tp_rank: int = 0,
    dp: int = 1,
    dp_rank: int = 0,
    enable_expert_parallel: bool = False,
    pp: int = 1,
    pp_rank: int = 0,
    quantization: str | dict[str, Any] | None = None,
    draft: str | None = None,
    draft_config: dict[str, Any] | None = None,
    mtp_modules: int = 1,
    spec_tokens: int = 1,
    max_model_len: int = 4096,
    language_only: bool = False,
    text_config: dict[str, Any] | None = None,
    capability: tuple[int, int] = (9, 0),
) -> Weights:
    """The tensors rank (``tp_rank``, ``pp_rank``, ``dp_rank``) of a vLLM 0.33 engine holds
    for the model of ``config_path`` (a ``config.json``): ``tp`` tensor-parallel ranks (the
    attention TP), ``dp`` data-parallel ranks (attention DP; the MoE spans DP x TP),
    ``enable_expert_parallel`` (``--enable-expert-parallel``), ``pp`` pipeline stages.

    ``quantization`` is a checkpoint ``quantization_config`` (or a name in
    :data:`QUANTIZATIONS`); ``draft`` is ``"dspark"`` (the fixture DSpark draft, with
    ``draft_config`` added to its config) or ``"mtp"`` (``mtp_modules`` MTP modules in the
    target config); a draft is built on the last stage. ``language_only`` is
    ``--limit-mm-per-prompt '{"image": 0, "video": 0}'``: vLLM then builds no vision tower
    (K3 builds one by default, from its ``vision_config`` or the config class's defaults when
    the config has none). ``text_config`` sets fields of the
    text model's config (e.g. an ``intermediate_size`` the fixture lacks). ``capability`` is
    the CUDA compute capability the platform reports (H200's 9.0 by default; B200 10.0).

    Raises what vLLM raises when it refuses the configuration."""
    if isinstance(quantization, str):
        quantization = QUANTIZATIONS[quantization]
    modules = mtp_modules if draft == "mtp" else 0
    config = fixture_config(Path(config_path), quantization, modules, text_config)
    from vllm.model_executor.model_loader.utils import initialize_model  # noqa: PLC0415
    from vllm.utils.torch_utils import set_default_torch_dtype  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "config.json").write_text(json.dumps(config))
        drafter = directory / "draft"
        drafter.mkdir()
        dspark = json.loads((DSPARK_DRAFT / "config.json").read_text())
        (drafter / "config.json").write_text(json.dumps(dspark | (draft_config or {})))
        # the engine core's config, made on this (CPU) platform as the KV-cache harness makes it
        vllm_config = _vllm_config(
            directory,
            tp=tp,
            pp=pp,
            dp=dp,
            dp_rank=dp_rank,
            enable_expert_parallel=enable_expert_parallel,
            draft=draft,
            draft_directory=drafter,
            spec_tokens=spec_tokens,
            max_model_len=max_model_len,
            language_only=language_only,
        )
        with (
            _gpu(capability),
            _distributed(tp=tp, tp_rank=tp_rank, pp=pp, pp_rank=pp_rank, dp=dp, dp_rank=dp_rank),
        ):

            def build(**kwargs: Any) -> nn.Module:
                """``get_model`` without a checkpoint: the model on ``meta``."""
                config = kwargs.get("model_config") or kwargs["vllm_config"].model_config
                with set_default_torch_dtype(config.dtype), torch.device("meta"):
                    model: nn.Module = initialize_model(
                        vllm_config=kwargs["vllm_config"], model_config=config
                    )
                return model

            model = build(vllm_config=vllm_config)
            seen: dict[int, str] = {}
            target, _ = _tensors(model, seen, "target")
            weights = Weights(target=target, model_class=type(model).__name__)
            if draft is not None and pp_rank == pp - 1:
                draft_model = _build_draft(model, vllm_config, draft, build)
                weights.draft, weights.shared = _tensors(draft_model, seen, "draft")
                weights.draft_class = type(draft_model).__name__
    return weights


def _build_draft(target: nn.Module, vllm_config: VllmConfig, draft: str, build: Any) -> nn.Module:
    """The draft model vLLM's proposer loads against ``target`` (sharing what it shares)."""
    import vllm.model_executor.model_loader as loader  # noqa: PLC0415
    import vllm.v1.worker.gpu.spec_decode.eagle.utils as eagle  # noqa: PLC0415

    with _patched(loader, "get_model", build), _patched(eagle, "get_model", build):
        if draft == "dspark":
            from vllm.v1.worker.gpu.spec_decode.dspark.utils import (  # noqa: PLC0415
                load_dspark_model,
            )

            model: nn.Module = load_dspark_model(target, vllm_config)
        else:
            model = eagle.load_eagle_model(target, vllm_config)
    return model
