"""The short causal convolution in front of KDA's q, k and v, with its ``W - 1`` token cache.

Depthwise (one kernel of width ``W`` per channel), causal, then SiLU, as fla's
``ShortConvolution`` and vLLM's ``causal_conv1d_fn``. Per channel ``d``::

    y_t = silu(bias_d + sum_j weight[d, j] * x_{t - (W - 1) + j}),   j = 0 .. W-1

where inputs before the sequence come from the cache. The cache is the conv state an engine
keeps per request: the last ``W - 1`` inputs, channel-major ``[B, D, W - 1]`` (vLLM's
``(channels, K - 1)`` conv-state layout). Running a sequence in two pieces, the second
starting from the first's cache, gives the unsplit run exactly.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import torch

from ...errors import Refusal
from . import _checks

Activation: TypeAlias = Literal["silu"] | None
"""``"silu"`` (KDA's, fla's default) or ``None`` for the bare convolution."""


def short_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
    *,
    activation: Activation = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Convolve ``x [B, T, D]`` with ``weight [D, W]``; return ``(y [B, T, D], new cache)``.

    ``cache [B, D, W - 1]`` holds the inputs before ``x`` (zeros when ``None``: a fresh request);
    the new cache holds the last ``W - 1`` inputs of ``cache`` followed by ``x``. With a width-2
    kernel ``[0.5, 1]`` and no activation each output is ``0.5 * previous + current``:

    >>> import torch
    >>> x = torch.tensor([[[1.0], [2.0], [4.0]]], dtype=torch.float64)  # B=1, T=3, D=1
    >>> w = torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    >>> y, cache = short_conv(x, w, cache=torch.full((1, 1, 1), 6.0, dtype=torch.float64),
    ...                       activation=None)
    >>> y.flatten().tolist(), cache.flatten().tolist()
    ([4.0, 2.5, 5.0], [4.0])
    """
    kernel = "short_conv"
    _check_activation(kernel, activation)
    x = _checks.tensor(kernel, "x", x)
    batch, tokens, channels = _checks.axes(kernel, "x", x, ("B", "T", "D"), may_be_empty=("T",))
    _checks.dtype(kernel, "x", x, _checks.FLOAT_DTYPES)
    width = _weight(kernel, x, weight, channels)
    history = _cache(kernel, x, cache, (batch, channels, width - 1))
    extended = torch.cat([history.transpose(1, 2), x], dim=1)  # [B, W - 1 + T, D]
    total = _bias(kernel, x, bias, channels).expand(batch, tokens, channels)
    for tap in range(width):  # tap by tap: elementwise, so a split run is bit-identical
        total = total + extended[:, tap : tap + tokens] * weight[:, tap]
    y = _activate(kernel, total, activation)
    new_cache = extended[:, extended.shape[1] - (width - 1) :].transpose(1, 2)
    return y, new_cache.contiguous()


def short_conv_step(
    x: torch.Tensor,
    cache: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: Activation = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode token ``x [B, D]`` against ``cache [B, D, W - 1]``: ``(y [B, D], new cache)``.

    The engines' decode-step form (vLLM ``causal_conv1d_update``, fla ``ShortConvolution.step``):
    the window is the cache followed by ``x``, the new cache drops its oldest column.

    >>> import torch
    >>> w = torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    >>> y, cache = short_conv_step(torch.tensor([[2.0]], dtype=torch.float64),
    ...                            torch.tensor([[[1.0]]], dtype=torch.float64), w, activation=None)
    >>> y.tolist(), cache.tolist()
    ([[2.5]], [[[2.0]]])
    """
    kernel = "short_conv_step"
    _check_activation(kernel, activation)
    x = _checks.tensor(kernel, "x", x)
    batch, channels = _checks.axes(kernel, "x", x, ("B", "D"))
    _checks.dtype(kernel, "x", x, _checks.FLOAT_DTYPES)
    width = _weight(kernel, x, weight, channels)
    if cache is None:
        raise Refusal(
            "tensor_mismatch",
            f"{kernel} argument cache: a decode step needs the conv state [B, D, W - 1] = "
            f"{(batch, channels, width - 1)}, got None",
            facts={"kernel": kernel, "argument": "cache", "expected": (batch, channels, width - 1)},
            hint="pass the cache short_conv returned, or zeros for a fresh request",
        )
    history = _cache(kernel, x, cache, (batch, channels, width - 1))
    window = torch.cat([history, x.unsqueeze(-1)], dim=-1)  # [B, D, W]
    total = (window * weight).sum(dim=-1) + _bias(kernel, x, bias, channels)
    return _activate(kernel, total, activation), window[:, :, 1:].contiguous()


def _weight(kernel: str, x: torch.Tensor, weight: object, channels: int) -> int:
    """Check ``weight [D, W]``; return the kernel width ``W``."""
    weight = _checks.tensor(kernel, "weight", weight)
    width = _checks.axes(kernel, "weight", weight, ("D", "W"))[1]
    _checks.like(kernel, "weight", weight, (channels, width), "[D, W]", reference=x)
    return width


def _cache(kernel: str, x: torch.Tensor, cache: object, expected: tuple[int, ...]) -> torch.Tensor:
    if cache is None:
        return x.new_zeros(expected)
    return _checks.like(kernel, "cache", cache, expected, "[B, D, W - 1]", reference=x)


def _bias(kernel: str, x: torch.Tensor, bias: object, channels: int) -> torch.Tensor:
    if bias is None:
        return x.new_zeros((channels,))
    return _checks.like(kernel, "bias", bias, (channels,), "[D]", reference=x)


def _activate(kernel: str, total: torch.Tensor, activation: Activation) -> torch.Tensor:
    return total if activation is None else torch.nn.functional.silu(total)


def _check_activation(kernel: str, activation: object) -> None:
    if activation is None or activation == "silu":
        return
    raise Refusal(
        "invalid_argument",
        f"{kernel}: activation={activation!r} is not 'silu' or None",
        facts={"kernel": kernel, "activation": repr(activation)},
        hint="use activation='silu' (KDA's) or None",
    )
