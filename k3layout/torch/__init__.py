"""The torch adapter: the only part of k3layout that imports torch.

It executes and checks what the planner decided; it decides nothing itself. Reference
kernels (KDA recurrent and chunked, the short causal conv, MLA absorbed decode and its naive
twin) live in :mod:`k3layout.torch.kernels`. Install it with ``pip install k3layout[torch]``.
"""

from __future__ import annotations

try:
    import torch as _torch
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "k3layout.torch needs torch, which is not installed: pip install k3layout[torch]"
    ) from error

del _torch
