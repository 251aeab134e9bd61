"""The tensors an engine registers for a plan, as data: every layer's parts, dtypes, shapes,
strides and byte offsets on its plane.

Allocation builds its views from this spec and validation checks live tensors against it, so
the two cannot drift apart. The module is pure Python (no torch): the spec is a frozen record.

``vllm`` (vLLM's hybrid allocator): ``num_planes`` tensors of ``num_blocks x page``; the layer at
position ``j`` of every group is cut from plane ``j``, with the page as block stride:

- MLA: ``latent [num_blocks, block_tokens, 576]`` in the cache dtype (FlashMLA's ``fp8_ds_mla``
  row is ``uint8 [.., 656]``); a DSA ``index_cache`` region follows the latent rows in the
  page, ``uint8 [num_blocks, block_tokens, 132]``, registered under its own name.
- KDA: conv ``q``, ``k``, ``v`` then the fp32 recurrent state, back to back from the page start
  (padding at the end). Conv parts are ``[num_blocks, K-1+s, C]`` time-major (vLLM's "DS"
  layout, the default) or ``[num_blocks, C, K-1+s]`` channel-major, ``C = H/tp * D``.

K3 at attention TP 8, fp8, 2 spec tokens (page 884,736 B): conv parts of ``5 x 1,536`` bf16 at
bytes 0, 15,360 and 30,720, the fp32 recurrent state ``[12, 128, 128]`` at 46,080; 832,512 B of
state, then 52,224 B of padding.

``parent`` (tokenspeed / ATOM): one arena of ``bind(n)``, planes laid out plane-major. An MLA
layer's pages sit at an exact page stride, ``latent [1 + n*p_m, 128, 576]``; a state group's
pages are ``p_l`` per parent, so its parts are ``[n + 1, p_l, ...]`` with strides (plane, S).
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from pydantic import NonNegativeInt, PositiveInt

from .._frozen import Frozen
from ..constants import PARENT_PAGE_TOKENS
from ..deployment import EngineFlavour
from ..dtypes import DTYPE_BYTES, DTypeName
from ..errors import Refusal
from ..layouts import ParentPlan, VllmPlan
from ..layouts.groups import stage_at
from ..offload import LayerNames, engine_layer_names, index_region_name
from ..sizes import ConvLayout, KdaStateSizes

PartName: TypeAlias = Literal["latent", "index", "conv_q", "conv_k", "conv_v", "recurrent"]
"""One tensor a layer registers: the MLA latent, a DSA index region, a conv part, the state."""

ElementDtype: TypeAlias = DTypeName | Literal["uint8"]
"""Element dtypes of registered tensors: the planner's dtypes, and raw bytes."""

LayerKind: TypeAlias = Literal["attention", "index", "kda"]
"""What a registered name holds: an MLA layer, a DSA index region, or a KDA layer's state."""

DEFAULT_CONV_LAYOUT: ConvLayout = "time_major"
"""vLLM keeps the KDA conv state time-major ("DS" layout) by default."""


def element_bytes(dtype: ElementDtype) -> int:
    """Bytes of one element of ``dtype``."""
    return 1 if dtype == "uint8" else DTYPE_BYTES[dtype]


class PartSpec(Frozen):
    """One registered tensor: ``shape`` and ``strides`` in elements of ``dtype``, starting
    ``offset_bytes`` past the start of its plane (block or parent 0)."""

    part: PartName
    dtype: ElementDtype
    shape: tuple[PositiveInt, ...]
    strides: tuple[NonNegativeInt, ...]
    offset_bytes: NonNegativeInt

    @property
    def elem_bytes(self) -> int:
        """Bytes per element."""
        return element_bytes(self.dtype)


class LayerSpec(Frozen):
    """A registered name: its layer, group, position ``j`` in the group, plane and parts."""

    name: str
    kind: LayerKind
    module_layer: NonNegativeInt
    group: str
    position: NonNegativeInt
    plane: NonNegativeInt
    parts: tuple[PartSpec, ...]

    @property
    def where(self) -> str:
        """``KDA layer model.layers.4.self_attn (group linear_attention_0, layer 1, plane 1)``."""
        kind = {"attention": "attention layer", "index": "index region", "kda": "KDA layer"}
        return (
            f"{kind[self.kind]} {self.name} (group {self.group}, layer {self.position}, "
            f"plane {self.plane})"
        )


class CacheSpec(Frozen):
    """Every tensor one rank registers for a plan: ``num_planes`` planes of ``plane_bytes``.

    ``num_blocks`` counts vLLM blocks, or a parent arena's usable parents ``n`` (the arena
    holds ``n + 1``). ``vllm`` planes are separate allocations; ``parent`` planes are
    consecutive in one arena.
    """

    engine: EngineFlavour
    stage: NonNegativeInt
    conv_layout: ConvLayout
    num_blocks: PositiveInt
    page_bytes: PositiveInt
    num_planes: PositiveInt
    plane_bytes: PositiveInt
    layers: tuple[LayerSpec, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """Registered names, in registration (module) order."""
        return tuple(layer.name for layer in self.layers)

    @property
    def allocation_bytes(self) -> int:
        """Bytes the rank allocates: every plane."""
        return self.num_planes * self.plane_bytes

    def layer(self, name: str) -> LayerSpec:
        """The spec registered as ``name``."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise Refusal(
            "layer_names",
            f"{name!r} is not registered on stage {self.stage}",
            facts={"name": name, "stage": self.stage},
            hint="use one of CacheSpec.names",
        )


def _inner_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return tuple(strides)


def _part(
    part: PartName,
    dtype: ElementDtype,
    page_axes: tuple[tuple[int, int], ...],
    inner: tuple[int, ...],
    *,
    offset_bytes: int,
    where: str,
) -> PartSpec:
    """A part whose page axes are ``(count, stride in bytes)`` and whose inner axes are packed."""
    elem = element_bytes(dtype)
    for value, what in [
        (offset_bytes, "its offset"),
        *((s, "a page stride") for _, s in page_axes),
    ]:
        if value % elem:
            raise Refusal(
                "tensor_mismatch",
                f"{where}: {part} cannot be cut as {dtype}: {what} of {value} B is not a "
                f"multiple of its {elem} B element",
                facts={"part": part, "dtype": dtype, "bytes": value, "elem_bytes": elem},
                hint="pick head dims whose conv state is a whole number of fp32 words",
            )
    return PartSpec(
        part=part,
        dtype=dtype,
        shape=(*(count for count, _ in page_axes), *inner),
        strides=(*(stride // elem for _, stride in page_axes), *_inner_strides(inner)),
        offset_bytes=offset_bytes,
    )


def _attention_parts(
    plan: VllmPlan | ParentPlan, tokens: int, page_axes: tuple[tuple[int, int], ...]
) -> tuple[PartSpec, PartSpec | None]:
    """The latent part and the DSA index part (``None`` without) of one attention page:
    ``tokens`` latent rows from the page start, then as many index rows."""
    sizes = plan.sizes.attention
    where = f"{tokens}-token attention page"
    dtype: ElementDtype = sizes.element_dtype
    row = sizes.latent_dim
    if sizes.kv_dtype == "fp8_ds_mla":  # FlashMLA's packed row (fp8, fp32 scales, bf16 rope)
        dtype, row = "uint8", sizes.latent_bytes_per_token
    latent = _part("latent", dtype, page_axes, (tokens, row), offset_bytes=0, where=where)
    if not sizes.index_bytes_per_token:
        return latent, None
    index = _part(
        "index",
        "uint8",
        page_axes,
        (tokens, sizes.index_bytes_per_token),
        offset_bytes=tokens * sizes.latent_bytes_per_token,
        where=where,
    )
    return latent, index


def _kda_parts(
    kda: KdaStateSizes, conv_layout: ConvLayout, page_axes: tuple[tuple[int, int], ...], where: str
) -> tuple[PartSpec, ...]:
    """Conv q, k, v then the recurrent state, back to back from the page start."""
    conv_parts: tuple[PartName, PartName, PartName] = ("conv_q", "conv_k", "conv_v")
    shape = kda.conv_part_shape(conv_layout)
    parts = [
        _part(
            name,
            kda.conv_dtype,
            page_axes,
            shape,
            offset_bytes=i * kda.conv_part_bytes,
            where=where,
        )
        for i, name in enumerate(conv_parts)
    ]
    recurrent = _part(
        "recurrent",
        kda.recurrent_dtype,
        page_axes,
        kda.recurrent_shape,
        offset_bytes=kda.conv_bytes,
        where=where,
    )
    return (*parts, recurrent)


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Refusal(
            "invalid_argument",
            f"{name}={value!r} must be an integer >= 1",
            facts={name: repr(value)},
            hint=f"allocate at least one {name.removeprefix('num_').rstrip('s')}",
        )


def _check_conv_layout(conv_layout: object) -> None:
    if conv_layout not in ("time_major", "channel_major"):
        raise Refusal(
            "invalid_argument",
            f"conv_layout={conv_layout!r} is not time_major or channel_major",
            facts={"conv_layout": repr(conv_layout)},
            hint="use time_major (vLLM's DS layout) or channel_major",
        )


def cache_spec(
    plan: VllmPlan | ParentPlan,
    num_blocks: int,
    *,
    stage: int = 0,
    conv_layout: ConvLayout = DEFAULT_CONV_LAYOUT,
    names: LayerNames | None = None,
) -> CacheSpec:
    """The tensors a rank of pipeline stage ``stage`` registers for ``plan``.

    ``num_blocks`` is vLLM's block count, or the parent engine's usable parents (``bind(n)``).

    >>> from k3layout import Deployment, plan, preset
    >>> spec = cache_spec(plan(preset("kimi-k3"), Deployment(attn_tp=8, spec_tokens=2)), 4)
    >>> [(p.part, p.shape, p.offset_bytes) for p in spec.layer("model.layers.0.self_attn").parts]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('conv_q', (4, 5, 1536), 0), ('conv_k', (4, 5, 1536), 15360),
     ('conv_v', (4, 5, 1536), 30720), ('recurrent', (4, 12, 128, 128), 46080)]
    """
    _check_count("num_blocks", num_blocks)
    _check_conv_layout(conv_layout)
    names = names or engine_layer_names(plan.model)
    names.check_covers(plan.model)
    if isinstance(plan, VllmPlan):
        return _vllm_spec(plan, num_blocks, stage, conv_layout, names)
    return _parent_spec(plan, num_blocks, stage, conv_layout, names)


def _attention_layers(
    names: LayerNames,
    module_layer: int,
    group: str,
    position: int,
    parts: tuple[PartSpec, PartSpec | None],
) -> list[LayerSpec]:
    """An attention layer, and its DSA index region under its own name when it has one."""
    name = names.name(module_layer)
    latent, index = parts
    where = {"module_layer": module_layer, "group": group, "position": position, "plane": position}
    layers = [LayerSpec(name=name, kind="attention", parts=(latent,), **where)]
    if index is not None:
        layers.append(
            LayerSpec(name=index_region_name(name), kind="index", parts=(index,), **where)
        )
    return layers


def _kda_layer(
    names: LayerNames, module_layer: int, group: str, position: int, parts: tuple[PartSpec, ...]
) -> LayerSpec:
    return LayerSpec(
        name=names.name(module_layer),
        kind="kda",
        module_layer=module_layer,
        group=group,
        position=position,
        plane=position,
        parts=parts,
    )


def _vllm_spec(
    plan: VllmPlan, num_blocks: int, stage: int, conv_layout: ConvLayout, names: LayerNames
) -> CacheSpec:
    held = stage_at(plan.stages, stage)
    page = plan.page_bytes
    page_axes = ((num_blocks, page),)
    layers: list[LayerSpec] = []
    for group in held.groups:
        for position, module_layer in enumerate(group.layers):
            if group.kind == "attention":
                parts = _attention_parts(plan, plan.block_tokens, page_axes)
                layers += _attention_layers(names, module_layer, group.name, position, parts)
                continue
            where = f"layer {names.name(module_layer)}"
            state = _kda_parts(_kda_state(plan), conv_layout, page_axes, where)
            layers.append(_kda_layer(names, module_layer, group.name, position, state))
    return CacheSpec(
        engine="vllm",
        stage=stage,
        conv_layout=conv_layout,
        num_blocks=num_blocks,
        page_bytes=page,
        num_planes=held.num_planes,
        plane_bytes=num_blocks * page,
        layers=tuple(sorted(layers, key=lambda s: (s.module_layer, s.kind))),
    )


def _kda_state(plan: VllmPlan | ParentPlan) -> KdaStateSizes:
    if plan.sizes.kda is None:  # a KDA group exists only for a model with KDA layers
        raise Refusal(
            "invalid_argument",
            f"model {plan.model.name}: a KDA group without KDA sizes",
            facts={"model": plan.model.name},
            hint="plan the model again: its plan and sizes disagree",
        )
    return plan.sizes.kda


def _parent_spec(
    plan: ParentPlan, num_parents: int, stage: int, conv_layout: ConvLayout, names: LayerNames
) -> CacheSpec:
    binding = plan.bind(num_parents, stage)
    plane = binding.plane_bytes
    page = plan.mla_page_bytes
    if plane != plan.packing.mla_pages * page:
        raise Refusal(
            "tensor_mismatch",
            f"parent plane of {plane} B is not {plan.packing.mla_pages} MLA pages of {page} B: "
            "the MLA kernel walks pages at the payload stride",
            facts={"plane_bytes": plane, "mla_pages": plan.packing.mla_pages, "page_bytes": page},
            hint="plan the parent layout with an exact page stride",
        )
    plane_span = (num_parents + 1) * plane
    pages = {group.group: group.page_count for group in binding.groups}
    layers: list[LayerSpec] = []
    for bound in binding.layers:
        if bound.kind == "attention":
            parts = _attention_parts(plan, PARENT_PAGE_TOKENS, ((pages[bound.group], page),))
            layers += _attention_layers(names, bound.layer, bound.group, bound.plane, parts)
            continue
        axes = ((num_parents + 1, plane), (bound.pages_per_parent, bound.page_stride))
        where = f"layer {names.name(bound.layer)}"
        state = _kda_parts(_kda_state(plan), conv_layout, axes, where)
        layers.append(_kda_layer(names, bound.layer, bound.group, bound.plane, state))
    return CacheSpec(
        engine="parent",
        stage=stage,
        conv_layout=conv_layout,
        num_blocks=num_parents,
        page_bytes=page,
        num_planes=binding.num_planes,
        plane_bytes=plane_span,
        layers=tuple(sorted(layers, key=lambda s: (s.module_layer, s.kind))),
    )
