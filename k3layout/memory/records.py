"""The GPU's whole budget of one rank: weights + the engine's reserve + KV = what the engine
takes of the GPU, never more than the GPU."""

from __future__ import annotations

from pydantic import Field, NonNegativeInt, PositiveInt

from .._display import Displayed
from .._frozen import Frozen

GIB = 1 << 30


class ReserveTerm(Frozen):
    """One thing an engine keeps on the GPU beside the weights and the KV cache that cannot be
    known before it runs (its profile run's activation peak, CUDA graphs, the CUDA context and
    communicators): a named estimate, with how it was derived, or the user's own figure."""

    name: str = Field(description="what it is (activation_peak, cuda_graphs, ...)")
    bytes: NonNegativeInt = Field(description="the estimate, per rank")
    derivation: str = Field(description="how the figure is derived (or 'given')")


class MemoryBudget(Displayed, Frozen):
    """How an engine turns one GPU into a KV budget (the heaviest pipeline stage's rank).

    ``kv_memory_bytes`` is the engine's own rule applied to ``gpu_memory_bytes`` (the total
    the driver reports), the weights and, where the engine subtracts it, the reserve; or the
    KV budget given. ``used_bytes`` = weights + reserve + KV must fit in the GPU."""

    engine: str = Field(description="the engine")
    gpu: str = Field(description="the GPU (a name of k3layout.GPUS)")
    gpu_memory_bytes: PositiveInt = Field(
        description="the GPU's total as the driver reports it (torch.cuda.mem_get_info)"
    )
    memory_flag: tuple[str, str] = Field(
        description="the engine's memory flag and value the budget follows "
        "(--gpu-memory-utilization, --mem-fraction-static, --kv-cache-memory-bytes)"
    )
    flag_source: str = Field(description="given, or the engine's default (and its rule)")
    weights_bytes: NonNegativeInt = Field(description="the weights one rank holds")
    reserve: tuple[ReserveTerm, ...] = Field(description="the engine's reserve, term by term")
    kv_memory_bytes: int = Field(
        description="the KV-cache budget per rank (a rule that leaves none is refused)"
    )
    rule: str = Field(description="the engine's rule, as a formula of the figures above")
    kv_reserved_bytes: int | None = Field(
        None,
        description="what the engine sizes the KV cache to before warm-up, where it keeps less "
        "after (vLLM 0.34's extensible KV cache: its cap, which it shrinks to kv_memory_bytes "
        "once warm-up and CUDA graphs are measured); None: it keeps what it sizes",
    )

    @property
    def reserve_bytes(self) -> int:
        """Every reserve term."""
        return sum(term.bytes for term in self.reserve)

    @property
    def used_bytes(self) -> int:
        """Weights + reserve + KV."""
        return self.weights_bytes + self.reserve_bytes + self.kv_memory_bytes

    @property
    def free_bytes(self) -> int:
        """What the GPU keeps beyond ``used_bytes`` (never negative: a budget over the GPU is
        refused)."""
        return self.gpu_memory_bytes - self.used_bytes

    def display_head(self) -> str:
        """``vllm on h200, --gpu-memory-utilization 1: weights 22.47 + reserve 4.00 + KV
        113.35 of 139.80 GiB``: the flag and the sum the budget is."""
        flag, value = self.memory_flag
        return (
            f"{self.engine} on {self.gpu}, {flag} {value}: weights {self.weights_bytes / GIB:,.2f}"
            f" + reserve {self.reserve_bytes / GIB:,.2f} + KV {self.kv_memory_bytes / GIB:,.2f}"
            f" of {self.gpu_memory_bytes / GIB:,.2f} GiB"
        )

    def display_rows(self) -> list[tuple[str, str]]:
        """The table: :meth:`rows`."""
        return self.rows()

    def rows(self) -> list[tuple[str, str]]:
        """The budget as (label, value) rows, in GiB with the exact bytes."""
        flag, value = self.memory_flag
        rows = [
            ("GPU memory (driver total)", gib(self.gpu_memory_bytes)),
            ("memory flag", f"{flag} {value} ({self.flag_source})"),
            ("weights per rank", gib(self.weights_bytes)),
        ]
        rows += [
            (f"reserve: {term.name}", f"{gib(term.bytes)}  [{term.derivation}]")
            for term in self.reserve
        ]
        if self.kv_reserved_bytes is not None:
            rows.append(("KV sized before warm-up", gib(self.kv_reserved_bytes)))
        rows += [
            ("KV memory per rank", gib(self.kv_memory_bytes)),
            ("left on the GPU", gib(self.free_bytes)),
            ("engine rule", self.rule),
        ]
        return rows


def gib(value: int) -> str:
    """``value`` bytes as GiB with two decimals, and the exact bytes."""
    return f"{value / GIB:,.2f} GiB ({value:,} B)"
