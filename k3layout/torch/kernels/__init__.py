"""Reference kernels on CPU, fp32 and fp64: what the adapter's end-to-end checks run.

- :func:`kda_recurrent`, :func:`kda_chunked`: Kimi Delta Attention with fla's tensor
  conventions, token by token and in the chunked WY / UT form.
- :func:`short_conv`, :func:`short_conv_step`: the causal depthwise conv (SiLU) with its
  ``W - 1`` token cache, over a sequence and one decode step.
- :func:`mla_decode`: absorbed MLA over a paged latent cache through a block table, and
  :func:`mla_naive`, the decompress-then-attend MLA it must equal.

They are references, written for clarity and exactness rather than speed. Bad shapes, dtypes
or devices raise :class:`~k3layout.Refusal` ``tensor_mismatch`` naming the argument; bad
values or options raise ``invalid_argument``.
"""

from __future__ import annotations

from .conv import short_conv, short_conv_step
from .kda import kda_chunked, kda_recurrent
from .mla import mla_decode, mla_naive

__all__ = [
    "kda_chunked",
    "kda_recurrent",
    "mla_decode",
    "mla_naive",
    "short_conv",
    "short_conv_step",
]
