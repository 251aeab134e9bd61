"""Allocate a plan's KV cache on CPU with the engine's real aliasing.

Both engines allocate ONE backing per rank and cut the planes from it, consecutive: plane ``j``
starts ``j`` plane spans in (vLLM 0.33's one KV-cache tensor, layer-outermost as the plan lays
it out; the parent engine's ``bind(n)`` arena). ``vllm``: plane ``j`` is ``uint8 [num_blocks,
page]`` and every layer's tensors are strided views cut from its plane, so KDA layer ``j`` of
every group and attention layer ``j`` share plane ``j``'s bytes. One backing also lets the image
helpers copy a unit's pages of every plane in one strided copy. The views follow
:func:`~k3layout.layouts.tensors.cache_spec`; the registered mapping has the form vLLM hands a
connector: a tensor per attention layer (and DSA index region), a tuple ``(conv, recurrent)``
per KDA layer (the conv state is ONE tensor, vLLM's ``SD`` or ``DS`` layout as the deployment
says).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

import torch

from ..errors import Refusal
from ..layouts import BoundView, EngineLayout, VllmPlan, vllm_bound_views
from ..offload import LayerNames
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
    return (value,) if isinstance(value, torch.Tensor) else tuple(value)


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
    dtype = TORCH_DTYPES[part.dtype]
    typed = plane.reshape(-1).view(dtype)
    start = typed.storage_offset() + part.offset_bytes // part.elem_bytes
    return torch.as_strided(typed, part.shape, part.strides, start)


def plane_view(tensor: torch.Tensor, num_blocks: int, page_bytes: int) -> torch.Tensor:
    """``uint8 [num_blocks, page]`` over the bytes of the plane ``tensor`` starts; no copy.

    >>> plane = torch.arange(8, dtype=torch.uint8).reshape(2, 4)
    >>> latent = plane.view(torch.bfloat16)  # a layer's view: 2 blocks x 2 bf16
    >>> plane_view(latent, 2, 4).data_ptr() == plane.data_ptr()
    True
    """
    storage = tensor.untyped_storage()
    offset = tensor.data_ptr() - storage.data_ptr()
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
    it takes an engine's. Empty for ``parent``."""

    @property
    def registered(self) -> dict[str, torch.Tensor | tuple[torch.Tensor, ...]]:
        """The layers as an engine registers them: a tensor per attention layer and index
        region, the tuple ``(conv, recurrent)`` per KDA layer."""
        return {
            layer.name: self.layers[layer.name]
            if layer.kind == "kda"
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

    ``num_blocks`` is vLLM's block count, or the parent engine's usable parents. ``fill`` is
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
    spec = cache_spec(plan, num_blocks, stage=stage, names=names)
    # one backing, planes consecutive (vLLM 0.33's one KV-cache tensor; the parent's arena)
    backing = _buffer((spec.num_planes, spec.plane_span_bytes), fill, device)
    if spec.engine == "vllm":
        backing = backing.view(spec.num_planes, spec.num_blocks, spec.page_bytes)
    planes = tuple(backing[j] for j in range(spec.num_planes))
    layers = {
        layer.name: tuple(cut(planes[layer.plane], part) for part in layer.parts)
        for layer in spec.layers
    }
    bound = (
        {view.name: cut_bound(backing, view) for view in vllm_bound_views(plan, num_blocks, stage)}
        if isinstance(plan, VllmPlan)
        else {}
    )
    return Allocation(spec=spec, planes=planes, layers=layers, bound=bound)


def cut_bound(backing: torch.Tensor, view: BoundView) -> torch.Tensor:
    """The view vLLM binds for one layer, over the bytes of ``backing`` (the rank's one
    allocation, any shape): ``view.offset_bytes`` into it, in ``view.dtype``."""
    dtype = getattr(torch, view.dtype)  # a bound dtype is named as torch names it
    typed = backing.reshape(-1).view(dtype)
    start = typed.storage_offset() + view.offset_bytes // view.elem_bytes
    return torch.as_strided(typed, view.shape, view.strides, start)


def _buffer(shape: tuple[int, ...], fill: int | None, device: torch.device | str) -> torch.Tensor:
    if fill is None:
        return torch.empty(shape, dtype=torch.uint8, device=device)
    return torch.full(shape, fill, dtype=torch.uint8, device=device)
