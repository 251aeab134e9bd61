"""The GPUs a deployment runs on, and the facts about them that engines decide layouts by.

Engines pick kernels, and so page sizes and state blocks, by the device's compute capability
(SGLang's attention backend, vLLM's KDA prefill kernel): a plan is only right for the GPU it
was made for, so :attr:`k3layout.Deployment.gpu` names it (H200 by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

GpuName: TypeAlias = Literal["a100", "h100", "h200", "b200", "gb200", "mi300x", "mi355x"]
"""A GPU by its common name (lower case)."""


MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    """One GPU: its vendor, compute capability (CUDA SM ``major.minor``; for AMD the gfx
    generation as ROCm reports it) and memory.

    ``memory_bytes`` is the total the driver reports to the engine (``torch.cuda.mem_get_info``'s
    second value, which vLLM's ``MemorySnapshot`` and SGLang's profiler read), not the marketing
    figure: NVIDIA's driver keeps a few hundred MiB of the board's memory for itself
    (``nvidia-smi -q``'s "Reserved"), so an H200 sold as 141 GB reports 139.8 GiB.
    ``memory_source`` says where each figure was seen. The reserved share varies with the
    driver; ``--gpu-memory-gib`` (``gpu_memory_bytes``) gives the one a machine reports.
    """

    name: GpuName
    vendor: Literal["nvidia", "amd"]
    capability: tuple[int, int]
    memory_bytes: int
    memory_source: str
    smi_memory_mib: int
    """The board's total as ``nvidia-smi`` (``rocm-smi``) prints it, in MiB: what SGLang reads
    (``get_device_memory_capacity``) to pick its memory tier and default fraction."""

    @property
    def sm(self) -> int:
        """The capability as one number, ``major * 10 + minor`` (H200: 90, B200: 100)."""
        return self.capability[0] * 10 + self.capability[1]

    @property
    def memory_gib(self) -> float:
        """``memory_bytes`` in GiB (2**30 bytes), as the engines log it."""
        return self.memory_bytes / (1 << 30)


GPUS: Final[dict[GpuName, Gpu]] = {
    gpu.name: gpu
    for gpu in (
        Gpu(
            "a100",
            "nvidia",
            (8, 0),
            81_050 * MIB,
            "A100 80GB SXM: torch totals of 79.15-79.32 GiB seen in vLLM start-up logs "
            "(vllm-project/vllm-omni#276: 79.32 GiB); the lower figure kept",
            81_920,
        ),
        Gpu(
            "h100",
            "nvidia",
            (9, 0),
            81_008 * MIB,
            "H100 80GB SXM: nvidia-smi -q Total 81,559 MiB less Reserved 551 MiB, the total "
            "torch's OOM messages print (79.11 GiB); vLLM logs 79.18 GiB on other drivers "
            "(vllm-project/vllm-omni#1144)",
            81_559,
        ),
        Gpu(
            "h200",
            "nvidia",
            (9, 0),
            143_156 * MIB,
            "H200 SXM 141GB: torch device properties total_memory 143,156 MiB (nvidia-smi "
            "Total 143,771 MiB less ~615-700 MiB reserved); vLLM logs 139.81 GiB",
            143_771,
        ),
        Gpu(
            "b200",
            "nvidia",
            (10, 0),
            182_631 * MIB,
            "B200 180GB: torch device properties total_memory 182,631-182,642 MiB (nvidia-smi "
            "Total 183,359 MiB); vLLM logs 178.35 GiB; the lower figure kept",
            183_359,
        ),
        Gpu(
            "gb200",
            "nvidia",
            (10, 0),
            188_733 * MIB,
            "GB200 (one Blackwell die, 186GB): torch OOM messages print a total of 184.31 GiB "
            "(nvidia-smi Total 189,471 MiB)",
            189_471,
        ),
        Gpu(
            "mi300x",
            "amd",
            (9, 4),
            206_141_652_992,
            "MI300X 192GB: rocm-smi VRAM Total Memory 206,141,652,992 B, which hipMemGetInfo "
            "and torch report too (191.98 GiB)",
            196_592,
        ),
        Gpu(
            "mi355x",
            "amd",
            (9, 5),
            309_220_868_096,
            "MI355X 288GB: rocm-smi VRAM Total Memory 309,220,868,096 B, torch total_memory "
            "the same (287.98 GiB)",
            294_896,
        ),
    )
}
"""Every GPU a deployment can name."""

GPU_NAMES: Final[tuple[GpuName, ...]] = tuple(GPUS)

DEFAULT_GPU: Final[GpuName] = "h200"
