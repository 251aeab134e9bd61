"""The GPU's whole budget: weights per rank + the engine's reserve + KV = what the engine takes
of the GPU (:class:`MemoryBudget`), by each engine's own rule (:class:`BudgetRule`, an engine
package's ``budget`` seam). What only a GPU run measures is a named estimate
(:mod:`.estimates`), shown in the answer and replaceable (``Deployment.reserve_bytes``)."""

from .records import GIB, MemoryBudget, ReserveTerm, gib
from .rule import BudgetRule, checked, gpu_total, source_of

__all__ = [
    "GIB",
    "BudgetRule",
    "MemoryBudget",
    "ReserveTerm",
    "checked",
    "gib",
    "gpu_total",
    "source_of",
]
