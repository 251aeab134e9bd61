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


@dataclass(frozen=True)
class Gpu:
    """One GPU: its vendor, compute capability (CUDA SM ``major.minor``; for AMD the gfx
    generation as ROCm reports it) and memory."""

    name: GpuName
    vendor: Literal["nvidia", "amd"]
    capability: tuple[int, int]
    memory_gib: int

    @property
    def sm(self) -> int:
        """The capability as one number, ``major * 10 + minor`` (H200: 90, B200: 100)."""
        return self.capability[0] * 10 + self.capability[1]


GPUS: Final[dict[GpuName, Gpu]] = {
    gpu.name: gpu
    for gpu in (
        Gpu("a100", "nvidia", (8, 0), 80),
        Gpu("h100", "nvidia", (9, 0), 80),
        Gpu("h200", "nvidia", (9, 0), 141),
        Gpu("b200", "nvidia", (10, 0), 180),
        Gpu("gb200", "nvidia", (10, 0), 186),
        # ROCm reports gfx942 / gfx950 as capability 9.4 / 9.5
        Gpu("mi300x", "amd", (9, 4), 192),
        Gpu("mi355x", "amd", (9, 5), 288),
    )
}
"""Every GPU a deployment can name."""

GPU_NAMES: Final[tuple[GpuName, ...]] = tuple(GPUS)

DEFAULT_GPU: Final[GpuName] = "h200"
