"""Argument checks shared by the reference kernels.

Every argument a kernel cannot use is refused before any arithmetic, naming the kernel, the
argument, what it got and what was expected: a wrong type, rank, shape, dtype or device is a
``tensor_mismatch``; a tensor whose *values* break the kernel's contract (a positive log decay,
a block id outside the cache) or a bad scalar option is an ``invalid_argument``.
"""

from __future__ import annotations

import math
from typing import Final

import torch

from ...errors import Refusal

FLOAT_DTYPES: Final = (torch.float32, torch.float64)
"""The reference kernels compute in fp32 or fp64 (fla's reference precision, and exact-ish)."""

INDEX_DTYPES: Final = (torch.int32, torch.int64)
"""Block tables and sequence lengths: the integer dtypes engines pass to decode kernels."""


def tensor(kernel: str, name: str, value: object) -> torch.Tensor:
    """``value`` if it is a tensor, else refuse naming ``kernel``'s argument ``name``."""
    if not isinstance(value, torch.Tensor):
        kind = type(value).__name__
        raise Refusal(
            "tensor_mismatch",
            f"{kernel} argument {name}: expected a torch.Tensor, got {kind}",
            facts={"kernel": kernel, "argument": name, "type": kind},
            hint=f"pass {name} as a torch.Tensor",
        )
    return value


def axes(
    kernel: str,
    name: str,
    value: torch.Tensor,
    layout: tuple[str, ...],
    *,
    may_be_empty: tuple[str, ...] = (),
) -> tuple[int, ...]:
    """The sizes of ``value``'s axes, refused unless it has ``len(layout)`` non-empty axes.

    ``layout`` names the axes in the engines' notation (``("B", "T", "H", "K")``); an axis
    named in ``may_be_empty`` may have size 0 (a KDA call over no tokens is a valid no-op).
    """
    shape = tuple(value.shape)
    if len(shape) != len(layout):
        raise Refusal(
            "tensor_mismatch",
            f"{kernel} argument {name}: {len(shape)} axes {shape}, expected "
            f"{len(layout)} axes [{', '.join(layout)}]",
            facts={"kernel": kernel, "argument": name, "shape": shape, "expected": layout},
            hint=f"pass {name} as [{', '.join(layout)}]",
        )
    for axis, size in zip(layout, shape, strict=True):
        if size == 0 and axis not in may_be_empty:
            raise Refusal(
                "tensor_mismatch",
                f"{kernel} argument {name}: axis {axis} of shape {shape} is empty",
                facts={"kernel": kernel, "argument": name, "shape": shape, "expected": layout},
                hint=f"give {name} at least one entry along {axis}",
            )
    return shape


def shape(
    kernel: str, name: str, value: torch.Tensor, expected: tuple[int, ...], layout: str
) -> None:
    """Refuse unless ``value.shape == expected`` (``layout`` spells the axes for the message)."""
    actual = tuple(value.shape)
    if actual != expected:
        raise Refusal(
            "tensor_mismatch",
            f"{kernel} argument {name}: shape {actual} does not match {layout} = {expected}",
            facts={"kernel": kernel, "argument": name, "shape": actual, "expected": expected},
            hint=f"pass {name} with shape {expected}",
        )


def dtype(
    kernel: str, name: str, value: torch.Tensor, allowed: tuple[torch.dtype, ...]
) -> torch.dtype:
    """``value.dtype``, refused unless it is one of ``allowed``."""
    if value.dtype not in allowed:
        names = tuple(str(d) for d in allowed)
        raise Refusal(
            "tensor_mismatch",
            f"{kernel} argument {name}: dtype {value.dtype} is not one of {', '.join(names)}",
            facts={
                "kernel": kernel,
                "argument": name,
                "dtype": str(value.dtype),
                "expected": names,
            },
            hint=f"convert {name} with .to({names[0]})",
        )
    return value.dtype


def device(kernel: str, name: str, value: torch.Tensor, expected: torch.device) -> None:
    """Refuse unless ``value`` lives on ``expected`` (the device of the kernel's first input)."""
    if value.device != expected:
        raise Refusal(
            "tensor_mismatch",
            f"{kernel} argument {name}: on device {value.device}, the other inputs on {expected}",
            facts={
                "kernel": kernel,
                "argument": name,
                "device": str(value.device),
                "expected": str(expected),
            },
            hint=f"move {name} with .to({str(expected)!r})",
        )


def like(
    kernel: str,
    name: str,
    value: object,
    expected: tuple[int, ...],
    layout: str,
    *,
    reference: torch.Tensor,
) -> torch.Tensor:
    """``value`` as a tensor of shape ``expected`` on ``reference``'s dtype and device."""
    checked = tensor(kernel, name, value)
    shape(kernel, name, checked, expected, layout)
    dtype(kernel, name, checked, (reference.dtype,))
    device(kernel, name, checked, reference.device)
    return checked


def scale(kernel: str, value: object, default: float) -> float:
    """The attention ``scale``: ``default`` when ``None``, else a finite real number."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Refusal(
            "invalid_argument",
            f"{kernel}: scale={value!r} is not a finite number",
            facts={"kernel": kernel, "scale": repr(value)},
            hint=f"leave scale=None for the default {default:.6g}",
        )
    return float(value)


def positive_int(kernel: str, name: str, value: object) -> int:
    """``value`` if it is an ``int`` >= 1 (a chunk size), else refuse."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Refusal(
            "invalid_argument",
            f"{kernel}: {name}={value!r} must be a positive integer",
            facts={"kernel": kernel, name: repr(value)},
            hint=f"use an integer {name} >= 1 (64 is fla's default)",
        )
    return value
