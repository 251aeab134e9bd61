"""vLLM 0.33's own command-line parsing and KV-cache memory budget, run on CPU.

Two things the conformance tests ask vLLM for:

* :func:`engine_config` - a ``vllm serve`` command line through vLLM's own parser
  (``FlexibleArgumentParser`` + ``EngineArgs.add_cli_args``), ``EngineArgs.from_cli_args`` and
  ``EngineArgs.create_engine_config``, on a CUDA platform of a given compute capability.
* :func:`budget` - the bytes one worker offers the KV cache: vLLM's ``request_memory`` on the
  worker's start-up snapshot, then ``Worker.determine_available_memory`` itself (its
  ``memory_profiling``, CUDA-graph estimate and ``--kv-cache-memory-bytes`` branch).

What this module fakes, and only that: the device. The CUDA platform's class answers the
capability and device questions a GPU would (vLLM's CUDA platform module needs ``libcuda``);
``torch.accelerator``'s memory queries read a :class:`_Device` whose bytes the test sets
(:class:`Facts`); the model runner is a stub whose profile run and CUDA-graph profiling
allocate the activation peak, non-torch memory and graph memory the facts say. Every
subtraction, rounding and refusal comes from vLLM's functions.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

# vLLM's CUDA platform module loads its stable-ABI ops library at import; the platform's
# configuration logic needs none of it (as in test_conformance_gpu).
sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))

# Imported before any platform swap: under a CUDA platform these modules would import the
# flash-attention extension, which a CPU build does not have.
import vllm.config.vllm as vllm_module  # noqa: E402
import vllm.model_executor.model_loader  # noqa: E402
import vllm.platforms  # noqa: E402
import vllm.v1.attention.backends.fa_utils  # noqa: E402
from vllm.config import VllmConfig  # noqa: E402
from vllm.config.compilation import PassConfig  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.platforms import cuda  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402
from vllm.utils.mem_utils import MemorySnapshot  # noqa: E402
from vllm.v1.worker.gpu_worker import Worker  # noqa: E402
from vllm.v1.worker.utils import request_memory  # noqa: E402
from vllm_required import AT_LEAST_034  # noqa: E402

from k3layout import Deployment  # noqa: E402

GiB = 1 << 30


class _FakeCuda(cuda.NonNvmlCudaPlatform):  # type: ignore[misc]
    """vLLM's CUDA platform with a discrete GPU of :attr:`capability` behind it."""

    capability: tuple[int, int] = (9, 0)

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability(*cls.capability)

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "fake CUDA device"

    @classmethod
    def device_count(cls) -> int:
        return 8

    @classmethod
    def is_integrated_gpu(cls, device_id: int = 0) -> bool:
        return False


@contextmanager
def cuda_platform(capability: tuple[int, int] = (9, 0)) -> Iterator[None]:
    """vLLM's current platform answers as its CUDA platform on a GPU of ``capability`` for the
    block (its class is swapped; modules that imported ``current_platform`` see it too), with
    Triton installed, as on a GPU (this CPU build has none, and without it ``VllmConfig``
    picks the V1 model runner, which refuses DSpark)."""
    platform: Any = vllm.platforms.current_platform
    saved = platform.__class__
    # 0.33 picks its model runner by Triton; 0.34 has the V2 runner alone
    triton = getattr(vllm_module, "HAS_TRITON", None)
    _FakeCuda.capability = capability
    platform.__class__ = _FakeCuda
    if not AT_LEAST_034:
        vllm_module.HAS_TRITON = True
    try:
        yield
    finally:
        platform.__class__ = saved
        if not AT_LEAST_034:
            vllm_module.HAS_TRITON = triton


def engine_args(argv: list[str]) -> EngineArgs:
    """``EngineArgs`` of a ``vllm serve`` command line (without ``vllm serve``), parsed by
    vLLM's own parser. Raises ``SystemExit`` where vLLM's parser rejects a flag."""
    with cuda_platform():  # the parser's defaults build a DeviceConfig, which needs a device
        parser = FlexibleArgumentParser()
        EngineArgs.add_cli_args(parser)
        return EngineArgs.from_cli_args(parser.parse_args(argv))


def engine_config(argv: list[str], capability: tuple[int, int] = (9, 0)) -> VllmConfig:
    """The ``VllmConfig`` vLLM's ``create_engine_config`` builds for ``argv`` on a CUDA GPU
    of ``capability``. Raises what vLLM raises for a configuration it refuses.

    One part of vLLM is not run: the allreduce+RMSNorm fusion's size table (it imports
    custom ops a CPU build lacks) reads as empty, which only drops one compile-range end."""
    args = engine_args(argv)
    table = PassConfig.__dict__["default_fi_allreduce_fusion_max_size_mb"]
    PassConfig.default_fi_allreduce_fusion_max_size_mb = staticmethod(lambda: {})
    try:
        with cuda_platform(capability):
            config: VllmConfig = args.create_engine_config()
    finally:
        PassConfig.default_fi_allreduce_fusion_max_size_mb = table
    return config


@dataclass(frozen=True)
class Facts:
    """What the hardware and the model measure at a worker's start-up, in bytes."""

    total: int
    """The device's total memory, as ``torch.cuda.mem_get_info()`` reports it."""
    in_use_at_start: int = 0
    """In use when the worker takes its start-up snapshot: CUDA context, NCCL buffers,
    cuBLAS handles, other processes."""
    weights: int = 0
    """Torch memory the model's weights take (allocated after the snapshot)."""
    activation_peak: int = 0
    """The torch peak of the profile run above the weights (freed after it)."""
    non_torch_increase: int = 0
    """Memory outside torch's allocator the worker takes after the snapshot (NCCL, cuBLAS
    workspaces, kernels' own buffers)."""
    cudagraph: int = 0
    """What the model runner's CUDA-graph profiling measures (its capture's memory)."""


class _Device:
    """One GPU's memory as ``torch.accelerator`` reports it: torch's allocated bytes (with
    their peak), torch's reserved bytes and memory held outside torch."""

    def __init__(self, facts: Facts) -> None:
        self.total = facts.total
        self.allocated = self.peak = self.reserved = 0
        self.other = facts.in_use_at_start

    def allocate(self, size: int) -> None:
        self.allocated += size
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)

    def release(self, size: int) -> None:
        self.allocated -= size

    def free(self) -> int:
        return self.total - self.reserved - self.other

    @contextmanager
    def installed(self) -> Iterator[None]:
        """``torch.accelerator``'s memory queries answer from this device for the block."""
        accelerator: Any = torch.accelerator
        fakes = {
            "memory_stats": lambda *_: {
                "allocated_bytes.all.peak": self.peak,
                "allocated_bytes.all.current": self.allocated,
            },
            "get_memory_info": lambda *_: (self.free(), self.total),
            "memory_reserved": lambda *_: self.reserved,
            "reset_peak_memory_stats": lambda *_: setattr(self, "peak", self.allocated),
            "empty_cache": lambda *_: setattr(self, "reserved", self.allocated),
        }
        saved = {name: getattr(accelerator, name) for name in fakes}
        for name, fake in fakes.items():
            setattr(accelerator, name, fake)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(accelerator, name, value)


class _Runner:
    """The model runner's part in the budget: the weights it loaded, a profile run that
    reaches the activation peak, and its CUDA-graph profiling (in 0.34 the V2 runner's, which
    measures none with the extensible KV cache or in eager mode; 0.33's worker does not ask in
    eager mode)."""

    def __init__(self, device: _Device, facts: Facts, config: VllmConfig) -> None:
        self.device, self.facts = device, facts
        self.model_memory_usage = facts.weights
        self.graphs = facts.cudagraph
        if AT_LEAST_034 and (
            config.cache_config.enable_extensible_kv_cache or config.model_config.enforce_eager
        ):
            self.graphs = 0

    def profile_run(self, randomize_inputs: bool = False) -> None:
        self.device.allocate(self.facts.activation_peak)
        self.device.release(self.facts.activation_peak)
        self.device.other += self.facts.non_torch_increase

    def profile_cudagraph_memory(self) -> int:
        return self.graphs


@dataclass(frozen=True)
class _Group:
    """A process group as the MoE layer reads it: only its size and this rank's place."""

    world_size: int
    rank_in_group: int


def moe_parallel(config: VllmConfig, dp_rank: int = 0, tp_rank: int = 0) -> Any:
    """vLLM's ``FusedMoEParallelConfig`` for the MoE layers of the worker at ``dp_rank`` and
    ``tp_rank`` of ``config`` (``make_parallel_config`` as a MoE layer calls it), with the
    process groups it asks for standing in by their sizes and this worker's ranks."""
    from vllm.model_executor.layers.fused_moe import config as moe  # noqa: PLC0415
    from vllm.model_executor.layers.fused_moe import layer  # noqa: PLC0415

    parallel = config.parallel_config
    groups = {
        "get_dp_group": lambda: _Group(parallel.data_parallel_size, dp_rank),
        "get_pcp_group": lambda: _Group(parallel.prefill_context_parallel_size, 0),
        "get_tensor_model_parallel_rank": lambda: tp_rank,
        "get_tensor_model_parallel_world_size": lambda: parallel.tensor_parallel_size,
    }
    saved = [
        (module, name, module.__dict__[name])
        for module in (moe, layer)
        for name in groups
        if name in module.__dict__
    ]
    for module, name, _ in saved:
        setattr(module, name, groups[name])
    try:
        return layer.make_parallel_config(None, None, None, False, parallel)
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def budget(config: VllmConfig, facts: Facts) -> int:
    """The KV-cache bytes one worker of ``config`` reports to the engine core when the device
    measures ``facts``: vLLM's ``request_memory`` on the start-up snapshot (as the worker's
    ``init_device`` calls it), the weights loaded, then ``Worker.determine_available_memory``.
    Raises what vLLM raises (``ValueError`` when the device has too little free memory)."""
    device = _Device(facts)
    runner = _Runner(device, facts, config)
    worker: Any = Worker.__new__(Worker)
    worker.vllm_config = config
    worker.model_config = config.model_config
    worker.cache_config = config.cache_config
    worker.parallel_config = config.parallel_config
    worker.model_runner = runner
    # The allocator's split limit is a CUDA-allocator setting with no bytes in it.
    worker._scoped_allocator_max_split = lambda max_split_size_mb: nullcontext()
    with cuda_platform(), device.installed():
        if not AT_LEAST_034:  # 0.34 has no other runner
            worker.use_v2_model_runner = config.use_v2_model_runner
        worker.init_snapshot = MemorySnapshot(device="cuda:0")
        worker.requested_memory = request_memory(worker.init_snapshot, config.cache_config)
        device.allocate(facts.weights)  # load_model
        available: int = worker.determine_available_memory()
    return available


def kept_after_warmup(deployment: Deployment, reserved: int, facts: Facts) -> int:
    """What vLLM 0.34's ``measure_kv_cache_bytes`` keeps of an extensible cache sized to
    ``reserved`` bytes once warm-up has taken the weights, memory outside torch and the CUDA
    graphs, with k3layout's start-up estimate for ``deployment`` in use before (nothing
    committed to the cache yet; the transient peak is the profile run's)."""
    from vllm.v1.worker import extensible_kv_cache as extensible  # noqa: PLC0415

    from k3layout import GPUS  # noqa: PLC0415
    from k3layout.memory.estimates import startup  # noqa: PLC0415

    # The module sets its margin floor at import by the platform: this CPU build is no ROCm.
    assert GiB == extensible.KV_CACHE_MARGIN_FLOOR_BYTES
    rocm = GPUS[deployment.gpu].vendor == "amd"
    initial_free = facts.total - startup(deployment).bytes
    held = facts.weights + facts.non_torch_increase + facts.cudagraph
    kept: int = extensible.measure_kv_cache_bytes(
        init_free_memory=initial_free,
        free_memory=initial_free - held,
        committed_bytes=0,
        requested_memory=reserved
        + facts.weights
        + facts.activation_peak
        + facts.non_torch_increase,
        transient_peak_bytes=facts.activation_peak,
        margin_floor_bytes=3 * GiB if rocm else GiB,  # vLLM's (3 if is_rocm() else 1) << 30
    )
    return kept
