"""Argument checks of the adapter's public functions: tensors, registrations, region maps.

Each refuses (:class:`~k3layout.Refusal`) what the adapter cannot use, naming the parameter:
a wrong type is ``invalid_argument``; a tensor of the wrong dtype, shape or device, or a
registration without the layer asked for, is ``tensor_mismatch``. All are cheap (a few
attribute reads), so that the copy paths may call them per plane or per region.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import torch

from .._args import expect
from .._validation import describe
from ..errors import Refusal
from ..transfer import RegionKey


def expect_tensor(name: str, value: object) -> torch.Tensor:
    """``value`` if it is a tensor; else refuse (``invalid_argument``) naming ``name``."""
    expect(name, value, torch.Tensor)
    return cast(torch.Tensor, value)


def expect_registered(name: str, value: object) -> Mapping[str, object]:
    """``value`` if it is a mapping (of layer names to what they registered); else refuse.
    Its entries are checked when read (:func:`registered_parts`)."""
    _expect_mapping(
        name,
        value,
        "layer names to tensors",
        f"pass {name} as {{layer name: tensor or (conv, recurrent)}}, as registered",
    )
    return cast(Mapping[str, object], value)


def _expect_mapping(name: str, value: object, of: str, hint: str) -> None:
    """Refuse (``invalid_argument``) ``value`` unless it is a mapping (of ``of``)."""
    if not isinstance(value, Mapping):
        raise Refusal(
            "invalid_argument",
            f"{name}={describe(value)} must be a mapping of {of}, got {type(value).__name__}",
            facts={"field": name, "expected": "Mapping", "got": type(value).__name__},
            hint=hint,
        )


def tensor_parts(name: str, value: object) -> tuple[torch.Tensor, ...]:
    """A registered value (one tensor, or a non-empty sequence of tensors) as its parts;
    refuses anything else (``invalid_argument``), naming ``name``."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes, bytearray))
        and value
        and all(isinstance(part, torch.Tensor) for part in value)
    ):
        return tuple(cast(Sequence[torch.Tensor], value))
    raise Refusal(
        "invalid_argument",
        f"{name}={describe(value)} must be a tensor or a non-empty sequence of tensors, got "
        f"{type(value).__name__}",
        facts={
            "field": name,
            "expected": "Tensor or Sequence[Tensor]",
            "got": type(value).__name__,
        },
        hint=f"pass {name} as a tensor, or a KDA layer's (conv, recurrent)",
    )


def registered_parts(registered: Mapping[str, object], name: str) -> tuple[torch.Tensor, ...]:
    """The parts ``registered`` holds for layer ``name``; refuses a layer it does not hold
    (``tensor_mismatch``) or a value that is not tensors (``invalid_argument``)."""
    value = registered.get(name, _MISSING)
    if value is _MISSING:
        raise Refusal(
            "tensor_mismatch",
            f"registered has no layer {name!r}, which the layout reads",
            facts={"field": "registered", "name": name},
            hint="pass the registration the layout was validated on",
        )
    return tensor_parts(f"registered[{name!r}]", value)


_MISSING = object()


def expect_region_map(name: str, value: object) -> Mapping[RegionKey, object]:
    """``value`` if it is a mapping (of region keys to buffers); else refuse."""
    _expect_mapping(
        name,
        value,
        "region keys (field, layer) to uint8 tensors",
        "pass the regions tier_regions or apply_segments returned",
    )
    return cast(Mapping[RegionKey, object], value)


def expect_region_key(name: str, key: object) -> RegionKey:
    """``key`` if it is a region key ``(field, layer)`` (``layer`` an int or ``None``)."""
    if (
        not isinstance(key, tuple)
        or len(key) != 2
        or not isinstance(key[0], str)
        or not (key[1] is None or (isinstance(key[1], int) and not isinstance(key[1], bool)))
    ):
        raise Refusal(
            "invalid_argument",
            f"{name} has a key {describe(key)}, not a region key (field, layer)",
            facts={"field": name, "key": describe(key)},
            hint="key regions by Region.key: (field name, module layer or None)",
        )
    return cast(RegionKey, key)


def expect_bytes(name: str, value: object, *, size: int | None = None) -> torch.Tensor:
    """``value`` if it is a contiguous ``uint8`` 1-D tensor (of ``size`` bytes when given);
    else refuse: ``invalid_argument`` for another type, ``tensor_mismatch`` for another tensor."""
    tensor = expect_tensor(name, value)
    if (
        tensor.layout != torch.strided
        or tensor.dtype != torch.uint8
        or tensor.dim() != 1
        or (tensor.numel() > 1 and tensor.stride(0) != 1)
        or (size is not None and tensor.numel() != size)
    ):
        want = f"uint8 [{size}]" if size is not None else "uint8 [bytes]"
        raise Refusal(
            "tensor_mismatch",
            f"{name} must be a contiguous {want} tensor, got a {tensor.layout} {tensor.dtype} "
            f"{list(tensor.shape)}",
            facts={
                "field": name,
                "dtype": str(tensor.dtype),
                "shape": tuple(tensor.shape),
                "expected_bytes": size,
            },
            hint=f"pass {name} as a contiguous uint8 buffer of the region's bytes",
        )
    return tensor


def refuse_meta_source(name: str, source: torch.Tensor, target: torch.Tensor) -> None:
    """Refuse (``tensor_mismatch``) a copy from a ``meta`` ``source`` (no bytes) into real
    memory."""
    if source.device.type == "meta" and target.device.type != "meta":
        raise Refusal(
            "tensor_mismatch",
            f"{name} is a meta tensor, which holds no bytes, and the target is on {target.device}",
            facts={"field": name, "device": "meta", "target_device": str(target.device)},
            hint=f"pass {name} on the target's device; meta tensors only check sizes",
        )
