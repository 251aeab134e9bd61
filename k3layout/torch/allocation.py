"""Allocate a plan's KV cache on CPU with the engine's real aliasing.

Both engines allocate ONE backing per rank and cut the planes from it, consecutive: plane ``j``
starts ``j`` plane spans in (vLLM 0.33's one KV-cache tensor, layer-outermost as the plan lays
it out; the tokenspeed engine's ``bind(n)`` arena). ``vllm``: plane ``j`` is ``uint8 [num_blocks,
page]`` and every layer's tensors are strided views cut from its plane, so KDA layer ``j`` of
every group and attention layer ``j`` share plane ``j``'s bytes. One backing also lets the image
helpers copy a unit's pages of every plane in one strided copy. The views follow
:func:`~k3layout.offload.tensors.cache_spec`; the registered mapping has the form vLLM hands a
connector: a tensor per attention layer (and DSA index region), a tuple ``(conv, recurrent)``
per KDA layer (the conv state is ONE tensor, vLLM's ``SD`` or ``DS`` layout as the deployment
says).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

import torch

from .._args import expect, expect_args, expect_int
from .._validation import describe
from ..engines.vllm import BoundView, VllmPlan, vllm_bound_views
from ..errors import Refusal
from ..layouts import EngineLayout, LayoutBase
from ..limits import check_int64
from ..offload import LayerNames
from ._checks import tensor_parts
from .specs import CacheSpec, ElementDtype, PartSpec, cache_spec

TORCH_DTYPES: Final[dict[ElementDtype, torch.dtype]] = {
    "float8_e4m3fn": torch.float8_e4m3fn,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "int32": torch.int32,
    "uint8": torch.uint8,
}
"""The torch dtype of every element dtype the planner names."""

Registered: TypeAlias = Mapping[str, torch.Tensor | Sequence[torch.Tensor]]
"""What an engine registers per layer name: one tensor, or a KDA layer's parts (the conv
state and the recurrent state)."""


def parts_of(value: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """A registered value as its tuple of parts (one tensor is a tuple of one)."""
    return tensor_parts("value", value)


def _strided(name: str, tensor: torch.Tensor) -> None:
    """Refuse (``tensor_mismatch``) a tensor with no strided storage to view (sparse, ...)."""
    if tensor.layout != torch.strided:
        raise Refusal(
            "tensor_mismatch",
            f"{name} is a {tensor.layout} tensor; only a strided tensor has bytes to view",
            facts={"field": name, "layout": str(tensor.layout)},
            hint=f"pass {name} as a dense (strided) tensor",
        )


def _check_view(name: str, tensor: torch.Tensor, what: str, view: PartSpec | BoundView) -> None:
    """Refuse (``tensor_mismatch``) cutting ``view`` (``what``) from ``tensor`` unless it is a
    contiguous strided tensor holding every byte of the view."""
    shape, strides = view.shape, view.strides
    _strided(name, tensor)
    available = tensor.numel() * tensor.element_size()
    if len(shape) != len(strides):
        raise Refusal(
            "tensor_mismatch",
            f"{what} has {len(shape)} axes and {len(strides)} strides",
            facts={"field": what, "shape": tuple(shape), "strides": tuple(strides)},
            hint=f"give {what} one stride per axis",
        )
    # one past the last byte the view reads, from the start of the tensor
    steps = sum((n - 1) * stride for n, stride in zip(shape, strides, strict=True))
    needed = view.offset_bytes + view.elem_bytes * (1 + steps)
    if not tensor.is_contiguous() or needed > available:
        raise Refusal(
            "tensor_mismatch",
            f"{what} reads bytes up to {needed:,} of {name}, a "
            f"{'contiguous' if tensor.is_contiguous() else 'non-contiguous'} {tensor.dtype} "
            f"tensor of {available:,} B",
            facts={
                "field": name,
                "needed_bytes": needed,
                "available_bytes": available,
                "contiguous": tensor.is_contiguous(),
            },
            hint=f"cut {what} from a contiguous {name} holding all its bytes (see cache_spec)",
        )


def _typed(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor``'s bytes, flat, as ``dtype``; refuses bytes ``dtype`` cannot view (a size or
    storage offset off its element)."""
    try:
        return tensor.reshape(-1).view(dtype)
    except RuntimeError as error:  # torch names the misfit: the size or the storage offset
        raise Refusal(
            "tensor_mismatch",
            f"{name} cannot be viewed as {dtype}: {str(error).split(chr(10))[0]}",
            facts={"field": name, "dtype": str(tensor.dtype), "view_dtype": str(dtype)},
            hint=f"pass a {name} whose bytes start and end on whole {dtype} elements",
        ) from None


def cut(plane: torch.Tensor, part: PartSpec) -> torch.Tensor:
    """The view of ``part`` on a ``uint8`` ``plane`` (vLLM's ``as_strided`` over the raw bytes).

    >>> plane = torch.zeros(2, 8, dtype=torch.uint8)  # 2 blocks of an 8-byte page
    >>> spec = PartSpec(part="recurrent", dtype="float32", shape=(2, 1, 1, 1),
    ...                 strides=(2, 1, 1, 1), offset_bytes=4)
    >>> view = cut(plane, spec)
    >>> view[1] = 1.0
    >>> plane[1].view(torch.float32).tolist()  # block 1, the state's float after 4 B
    [0.0, 1.0]
    """
    expect_args(("plane", plane, torch.Tensor), ("part", part, PartSpec))
    if plane.dtype != torch.uint8:
        raise Refusal(
            "tensor_mismatch",
            f"plane is {plane.dtype}; a part is cut from a plane's raw bytes (uint8)",
            facts={"field": "plane", "dtype": str(plane.dtype), "expected_dtype": "torch.uint8"},
            hint="pass the uint8 plane (Allocation.planes, plane_view)",
        )
    _check_view("plane", plane, f"part {part.part}", part)
    return _cut(plane, part)


def _cut(plane: torch.Tensor, part: PartSpec) -> torch.Tensor:
    """:func:`cut` on a plane known to hold the part."""
    typed = _typed("plane", plane, TORCH_DTYPES[part.dtype])
    start = typed.storage_offset() + part.offset_bytes // part.elem_bytes
    return torch.as_strided(typed, part.shape, part.strides, start)


def plane_view(tensor: torch.Tensor, num_blocks: int, page_bytes: int) -> torch.Tensor:
    """``uint8 [num_blocks, page]`` over the bytes of the plane ``tensor`` starts; no copy.

    >>> plane = torch.arange(8, dtype=torch.uint8).reshape(2, 4)
    >>> latent = plane.view(torch.bfloat16)  # a layer's view: 2 blocks x 2 bf16
    >>> plane_view(latent, 2, 4).data_ptr() == plane.data_ptr()
    True
    """
    expect("tensor", tensor, torch.Tensor)
    for name, value in (("num_blocks", num_blocks), ("page_bytes", page_bytes)):
        if expect_int(name, value) < 1:
            raise Refusal(
                "invalid_argument",
                f"{name}={describe(value)} must be at least 1",
                facts={"field": name, name: describe(value)},
                hint=f"pass {name} >= 1 (CacheSpec.num_blocks, CacheSpec.page_bytes)",
            )
        check_int64(name, value)
    return _plane_view(tensor, num_blocks, page_bytes)


def _plane_view(
    tensor: torch.Tensor, num_blocks: int, page_bytes: int, back: int = 0
) -> torch.Tensor:
    """:func:`plane_view` with counts of at least 1 (a spec's), of the plane starting
    ``back`` bytes before ``tensor`` (a view of a part ``back`` bytes into the plane)."""
    _strided("tensor", tensor)
    storage = tensor.untyped_storage()
    offset = tensor.data_ptr() - back - storage.data_ptr()
    if offset < 0 or offset + num_blocks * page_bytes > storage.nbytes():
        raise Refusal(
            "tensor_mismatch",
            f"a plane of {num_blocks} pages of {page_bytes} B from byte {offset} runs past the "
            f"tensor's storage ({storage.nbytes()} B)",
            facts={
                "offset_bytes": offset,
                "num_blocks": num_blocks,
                "page_bytes": page_bytes,
                "storage_bytes": storage.nbytes(),
            },
            hint="validate the registered tensors against the plan first",
        )
    view = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return view.set_(storage, offset, (num_blocks, page_bytes), (page_bytes, 1))


@dataclass(frozen=True, eq=False)
class Allocation:
    """One rank's allocated cache: ``planes`` (``uint8``; vLLM ``[num_blocks, page]`` each, the
    parent arena's planes ``[plane_bytes]`` each) and every registered layer's tensors."""

    spec: CacheSpec
    planes: tuple[torch.Tensor, ...]
    layers: Mapping[str, tuple[torch.Tensor, ...]]
    bound: Mapping[str, torch.Tensor] = field(default_factory=dict)
    """``vllm``: exactly what vLLM 0.33 binds, by vLLM's layer names: a raw int8 page view
    per KDA layer and the MLA pages in the backend's kernel blocks, views of the one backing
    (:func:`~k3layout.layouts.vllm_bound_views`); :func:`~k3layout.torch.validate` takes it as
    it takes an engine's. Empty for ``tokenspeed``."""

    @property
    def registered(self) -> dict[str, torch.Tensor | tuple[torch.Tensor, ...]]:
        """The layers as an engine registers them: a tensor per attention layer and index
        region, the tuple ``(conv, recurrent)`` per KDA layer (``(k, score)`` per tail
        ring)."""
        return {
            layer.name: self.layers[layer.name]
            if layer.kind in ("kda", "ring")
            else self.layers[layer.name][0]
            for layer in self.spec.layers
        }

    @property
    def num_bytes(self) -> int:
        """Bytes allocated."""
        return sum(plane.numel() for plane in self.planes)


def allocate(
    plan: EngineLayout,
    num_blocks: int,
    *,
    stage: int = 0,
    names: LayerNames | None = None,
    fill: int | None = 0,
    device: torch.device | str = "cpu",
) -> Allocation:
    """Allocate ``plan``'s cache for a rank of pipeline stage ``stage``.

    ``num_blocks`` is vLLM's block count, or the tokenspeed engine's usable parents. ``fill`` is
    the byte every plane starts with (``None``: uninitialised, as ``torch.empty``).

    >>> from k3layout import Deployment, plan, preset
    >>> cache = allocate(plan(preset("kimi-linear-48b"), Deployment(attn_tp=8)), num_blocks=2)
    >>> latent = cache.registered["model.layers.3.self_attn.attn"]
    >>> conv, state = cache.registered["model.layers.0.self_attn"]
    >>> latent.shape, conv.shape, state.shape  # SD conv: (K-1, q|k|v) = (3, 3 x 512)
    (torch.Size([2, 512, 576]), torch.Size([2, 3, 1536]), torch.Size([2, 4, 128, 128]))
    >>> conv.data_ptr() == latent.data_ptr()  # KDA layer 0 of every group rides plane 0
    True
    >>> cache.bound["model.layers.0.self_attn"].shape  # what vLLM 0.33 binds: the raw page
    torch.Size([2, 1, 1, 271360])
    """
    expect_args(("plan", plan, LayoutBase), ("fill", fill, (int, type(None))))
    if fill is not None and not 0 <= fill <= 255:
        raise Refusal(
            "invalid_argument",
            f"fill={describe(fill)} is not a byte",
            facts={"field": "fill", "fill": describe(fill)},
            hint="pass fill between 0 and 255, or None to leave the bytes uninitialised",
        )
    where = _device(device)
    spec = cache_spec(plan, num_blocks, stage=stage, names=names)
    # one backing, planes consecutive (vLLM 0.33's one KV-cache tensor; the parent's arena)
    backing = _buffer((1, spec.allocation_bytes), fill, where)[0]
    ranges = zip(spec.plane_starts, spec.plane_spans, strict=True)
    planes = tuple(backing[start : start + span] for start, span in ranges)
    if spec.pages_tile_planes:
        planes = tuple(plane.view(spec.num_blocks, spec.page_bytes) for plane in planes)
        backing = backing.view(spec.num_planes, spec.num_blocks, spec.page_bytes)
    layers = {
        layer.name: tuple(_cut(planes[layer.plane], part) for part in layer.parts)
        for layer in spec.layers
    }
    bound = (
        {view.name: _cut_bound(backing, view) for view in vllm_bound_views(plan, num_blocks, stage)}
        if isinstance(plan, VllmPlan)
        else {}
    )
    return Allocation(spec=spec, planes=planes, layers=layers, bound=bound)


def cut_bound(backing: torch.Tensor, view: BoundView) -> torch.Tensor:
    """The view vLLM binds for one layer, over the bytes of ``backing`` (the rank's one
    allocation, any shape): ``view.offset_bytes`` into it, in ``view.dtype``."""
    expect_args(("backing", backing, torch.Tensor), ("view", view, BoundView))
    _check_view("backing", backing, f"view {view.name}", view)
    return _cut_bound(backing, view)


def _cut_bound(backing: torch.Tensor, view: BoundView) -> torch.Tensor:
    """:func:`cut_bound` on a backing known to hold the view."""
    typed = _typed("backing", backing, getattr(torch, view.dtype))  # named as torch names it
    start = typed.storage_offset() + view.offset_bytes // view.elem_bytes
    return torch.as_strided(typed, view.shape, view.strides, start)


def _device(device: object) -> torch.device:
    """``device`` as a torch device that can hold tensors; refuses (``invalid_argument``) a
    name torch does not know or a device this torch cannot reach."""
    expect("device", device, (torch.device, str))
    try:
        where = device if isinstance(device, torch.device) else torch.device(str(device))
        torch.empty(0, dtype=torch.uint8, device=where)
    except (RuntimeError, AssertionError) as error:  # unknown, or not built for / present
        raise Refusal(
            "invalid_argument",
            f"device={describe(device)} cannot hold tensors here: {str(error).split(chr(10))[0]}",
            facts={"field": "device", "device": describe(device)},
            hint="pass device='cpu', or 'meta' for a dry run with no bytes",
        ) from None
    return where


def _physical_bytes() -> int | None:
    """The machine's physical memory, where the OS says (``None`` where it does not)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no such name
        return None


def _buffer(shape: tuple[int, int], fill: int | None, device: torch.device) -> torch.Tensor:
    """The backing, refused (``size_limit``) where the memory cannot hold it: beyond the
    machine's physical memory on the CPU, or wherever the allocator runs out."""
    size = shape[0] * shape[1]
    physical = _physical_bytes() if device.type == "cpu" else None
    if physical is not None and size > physical:
        raise _too_big(size, device, f"beyond the machine's {physical:,} B of memory")
    try:
        if fill is None:
            return torch.empty(shape, dtype=torch.uint8, device=device)
        return torch.full(shape, fill, dtype=torch.uint8, device=device)
    except RuntimeError as error:  # torch's out of memory (torch.OutOfMemoryError included)
        raise _too_big(size, device, str(error).split("\n")[0]) from None


def _too_big(size: int, device: torch.device, why: str) -> Refusal:
    return Refusal(
        "size_limit",
        f"allocating {size:,} B on {device}: {why}",
        facts={"field": "num_blocks", "allocation_bytes": size, "device": str(device)},
        hint="allocate fewer blocks, or pass device='meta' for a dry run with no bytes",
    )
