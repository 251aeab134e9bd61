"""Chunked against recurrent KDA on CPU, at a few sequence lengths (same run, same machine).

Run by hand: ``python benchmarks/bench_kda.py``. Prints the median time of each form, the
ratio chunked / recurrent, and how far apart their outputs are (fla's bound: relative RMS
< 5e-3 in fp32). Both are references written for clarity, not speed: the recurrent form runs
one step per token, the chunked form one WY / UT step per 64-token chunk, so the ratio falls as
sequences grow. Small heads keep the whole run under a minute on two cores.
"""

from __future__ import annotations

import sys
from functools import partial

import torch
from timing import median_seconds

from k3layout.torch.kernels import kda_chunked, kda_recurrent

SEQUENCE_TOKENS = (256, 1024, 4096)
HEADS, HEAD_DIM = 4, 64  # small heads: K3 runs 96 x 128 (12 x 128 a rank at attn TP 8)
CHUNK_TOKENS = 64  # fla's chunk_kda chunk size
REPEATS = {256: 7, 1024: 5, 4096: 3}
FLA_FP32_TOLERANCE = 5e-3  # fla's relative-RMS bound between its chunked and recurrent KDA


def inputs(tokens: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """fp32 inputs in fla's layout: q, k, v ``[1, T, H, D]``, ``g <= 0``, ``beta`` in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (1, tokens, HEADS, HEAD_DIM)
    q, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    g = -torch.nn.functional.softplus(torch.randn(shape, generator=gen))
    beta = torch.sigmoid(torch.randn(shape[:3], generator=gen))
    return q, k, v, g, beta


def relative_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """fla's measure of agreement between two kernels' outputs."""
    return ((actual - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()


def main() -> int:
    print(
        f"KDA fp32, B=1, H={HEADS}, K=V={HEAD_DIM}, chunk {CHUNK_TOKENS}, L2-normed q and k, "
        f"{torch.get_num_threads()} torch threads"
    )
    header = ("tokens", "recurrent", "chunked", "chunked / recurrent", "rel RMS")
    print("{:>7} {:>12} {:>12} {:>20} {:>9}".format(*header))
    worst = 0.0
    for tokens in SEQUENCE_TOKENS:
        args = inputs(tokens)
        recurrent = partial(kda_recurrent, *args, use_qk_l2norm_in_kernel=True)
        chunked = partial(kda_chunked, *args, use_qk_l2norm_in_kernel=True, chunk_size=CHUNK_TOKENS)
        error = max(relative_rms(c, r) for c, r in zip(chunked(), recurrent(), strict=True))
        worst = max(worst, error)
        slow = median_seconds(recurrent, repeats=REPEATS[tokens])
        fast = median_seconds(chunked, repeats=REPEATS[tokens])
        print(
            f"{tokens:>7} {slow * 1e3:9.1f} ms {fast * 1e3:9.1f} ms {fast / slow:19.2f}x "
            f"{error:9.1e}"
        )
    verdict = "within" if worst < FLA_FP32_TOLERANCE else "OUTSIDE"
    print(f"worst relative RMS {worst:.1e} ({verdict} fla's {FLA_FP32_TOLERANCE:g})")
    return 0 if worst < FLA_FP32_TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
