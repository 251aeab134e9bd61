"""The tensors an engine registers for a plan, as data: every layer's parts, dtypes, shapes,
strides and byte offsets on its plane.

Allocation builds its views from this spec and validation checks live tensors against it, so
the two cannot drift apart. The module is pure Python (no torch): the spec is a frozen
record, built and inspected without torch.

``vllm`` (vLLM's hybrid allocator): one backing per rank, ``num_planes`` planes of
``num_blocks x page`` back to back (``LBNHC``); the layer at
position ``j`` of every group is cut from plane ``j``, with the page as block stride:

- MLA: ``latent [num_blocks, block_tokens, 576]`` in the cache dtype (FlashMLA's ``fp8_ds_mla``
  row is ``uint8 [.., 656]``); a DSA ``index_cache`` region follows the latent rows in the
  page, ``uint8 [num_blocks, block_tokens, 132]``, registered under its own name.
- KDA: the conv state (ONE tensor, q|k|v channels side by side) then the fp32 recurrent
  state, back to back from the page start (padding at the end). The conv state is
  ``[num_blocks, K-1+s, 3C]`` in vLLM's default ``SD`` layout or ``[num_blocks, 3C, K-1+s]``
  in ``DS``, ``C = H/tp * D``.

K3 at attention TP 8, fp8, 2 spec tokens (page 884,736 B): the conv state ``5 x 4,608`` bf16 at
byte 0, the fp32 recurrent state ``[12, 128, 128]`` at 46,080; 832,512 B of state, then 52,224 B
of padding. Every shape and offset comes from the layers' cache specs
(:mod:`k3layout.cache`); this module only places them on the planes.

``tokenspeed``: one arena of ``bind(n)``, each plane ``(n + 1) x`` its bytes, in the sorted
order of the plane ids as strings (``slot.0, slot.1, slot.10, ...``). Every layer's pages sit
``plane / p_g`` apart from ``plane - plane / p_g`` (the null page is the null parent's last
slot): ``latent [1 + n*p_m, 128, 576]`` at the exact page stride, a state's parts
``[1 + n*p_l, ...]``.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

from pydantic import NonNegativeInt, PositiveInt

from .._args import expect_args
from .._frozen import Frozen
from .._validation import describe
from ..cache import ElementDtype, element_bytes
from ..constants import INT64_MAX
from ..deployment import ConvLayout, EngineFlavour
from ..errors import Refusal
from ..layouts.protocol import EngineLayout, LayoutBase
from ..names import LayerNames, engine_layer_names, ring_region_name
from .image import part_region_name

PartName: TypeAlias = str
"""One tensor a layer registers: a part of its cache spec (``latent``, ``index``, ``conv``,
``recurrent``, ``k``, ``v``)."""

LayerKind: TypeAlias = Literal["attention", "index", "kda", "ring"]
"""What a registered name holds: an attention layer's first part, another part of an
attention layer registered under its own name (a DSA index region), or a state layer's
parts."""


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
        kind = {
            "attention": "attention layer",
            "index": "index region",
            "kda": "KDA layer",
            "ring": "tail ring",
        }
        return (
            f"{kind[self.kind]} {self.name} (group {self.group}, layer {self.position}, "
            f"plane {self.plane})"
        )


class CacheSpec(Frozen):
    """Every tensor one rank registers for a plan: ``num_planes`` planes of ``plane_bytes``.

    ``num_blocks`` counts vLLM blocks, or a parent arena's usable parents ``n`` (the arena
    holds ``n + 1``). Both engines' planes are consecutive in one allocation (vLLM's
    backing, the parent's arena).
    """

    engine: EngineFlavour
    stage: NonNegativeInt
    conv_layout: ConvLayout
    num_blocks: PositiveInt
    page_bytes: PositiveInt
    num_planes: PositiveInt
    plane_span_bytes: PositiveInt
    plane_starts: tuple[NonNegativeInt, ...]
    plane_spans: tuple[PositiveInt, ...]
    layers: tuple[LayerSpec, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """Registered names, in registration (module) order."""
        return tuple(layer.name for layer in self.layers)

    @property
    def pages_tile_planes(self) -> bool:
        """Whether each plane is exactly ``num_blocks`` pages, one per block (vLLM's planes;
        a parent arena's plane holds a null parent and several pages per parent)."""
        return self.plane_span_bytes == self.num_blocks * self.page_bytes

    @property
    def allocation_bytes(self) -> int:
        """Bytes the rank allocates: every plane."""
        ends = zip(self.plane_starts, self.plane_spans, strict=True)
        return max(start + span for start, span in ends)

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


def _spec_parts(
    plan: EngineLayout,
    layer: int,
    page_axes: tuple[tuple[int, int], ...],
    where: str,
    *,
    origin: int = 0,
) -> tuple[PartSpec, ...]:
    """Every part of one page of module ``layer`` (its rows of an attention spec, or one state
    slot), cut at the byte range the plan gives it, page 0 ``origin`` bytes into the plane."""
    tp = plan.deployment.attn_tp
    spec = plan.sizes.spec_of(layer)
    group, _ = plan.group_of(layer)
    tokens = plan.tokens_per_page(group)
    return tuple(
        _part(
            r.part,
            spec.part(r.part).dtype,
            page_axes,
            spec.page_shape(r.part, tp, tokens),
            offset_bytes=origin + r.offset_bytes,
            where=where,
        )
        for r in plan.part_range_list(layer)
    )


def _registered(
    name: str,
    group_kind: str,
    paging: str,
    parts: tuple[PartSpec, ...],
    where: dict[str, Any],
) -> list[LayerSpec]:
    """What a layer registers under its engine ``name``: a tail ring's ``(k, score)`` under
    its ring region's name, a state's parts under its own, an attention layer's first part
    under its own and each other part as a region of its own (a DSA index)."""
    if group_kind == "ring":
        return [LayerSpec(name=ring_region_name(name), kind="ring", parts=parts, **where)]
    if paging == "slot":
        return [LayerSpec(name=name, kind="kda", parts=parts, **where)]
    return [
        LayerSpec(
            name=part_region_name(name, part.part, i == 0),
            kind="attention" if i == 0 else "index",
            parts=(part,),
            **where,
        )
        for i, part in enumerate(parts)
    ]


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Refusal(
            "invalid_argument",
            f"{name}={describe(value)} must be an integer >= 1",
            facts={name: describe(value)},
            hint=f"allocate at least one {name.removeprefix('num_').rstrip('s')}",
        )


def _check_allocation_bytes(plan: EngineLayout, num_blocks: int, num_planes: int) -> None:
    """Refuse (``size_limit``) a block count whose planes would not fit an int64 byte count
    (what torch and the engines size a tensor with)."""
    if sum(plan.plane_span_at(j, num_blocks) for j in range(num_planes)) <= INT64_MAX:
        return
    # a plane spans fixed + num_blocks x per_block bytes in both engines
    per_block = plan.plane_span_bytes(2) - plan.plane_span_bytes(1)
    fixed = plan.plane_span_bytes(1) - per_block
    bound = max((INT64_MAX // num_planes - fixed) // per_block, 0)
    what = f"{num_planes} planes of that many blocks"
    raise _too_many_blocks(num_blocks, bound, what, num_planes=num_planes)


def _too_many_blocks(num_blocks: int, bound: int, what: str, **facts: int) -> Refusal:
    """The refusal (``size_limit``) of ``num_blocks`` past ``bound``, the most whose bytes
    (``what``) an int64 counts, as torch and the engines size a tensor."""
    return Refusal(
        "size_limit",
        f"num_blocks={describe(num_blocks)}: {what} are more bytes than an int64 counts "
        f"(at most {bound:,} blocks)",
        facts={"field": "num_blocks", "bound": bound, **facts},
        hint=f"use num_blocks <= {bound:,}",
    )


def cache_spec(
    plan: EngineLayout,
    num_blocks: int,
    *,
    stage: int = 0,
    names: LayerNames | None = None,
) -> CacheSpec:
    """The tensors a rank of pipeline stage ``stage`` registers for ``plan``.

    ``num_blocks`` is vLLM's block count, or the tokenspeed engine's usable parents (``bind(n)``).

    >>> from k3layout import Deployment, plan, preset
    >>> spec = cache_spec(plan(preset("kimi-k3"), Deployment(attn_tp=8, spec_tokens=2)), 4)
    >>> [(p.part, p.shape, p.offset_bytes) for p in spec.layer("model.layers.0.self_attn").parts]
    [('conv', (4, 5, 4608), 0), ('recurrent', (4, 12, 128, 128), 46080)]
    """
    expect_args(
        ("plan", plan, LayoutBase),
        ("stage", stage, int),
        ("names", names, (LayerNames, type(None))),
    )
    _check_count("num_blocks", num_blocks)
    if not plan.one_backing:
        raise Refusal(
            "engine_mismatch",
            f"engine={plan.engine} keeps its pools in tensors of their own; the adapter lays "
            "out planes shared by groups in one backing per rank (vllm, tokenspeed)",
            facts={"engine": plan.engine},
            hint="check the pools such an engine allocated with its bridge (SGLang: "
            "k3layout.engines.sglang.check_pools; their tensors: pools.pool_tensors)",
        )
    names = names or engine_layer_names(plan.model)
    names.check_covers(plan.model)
    if plan.block_outermost:
        return _blocks_spec(plan, num_blocks, stage, names)
    held = plan.stage(stage)
    _check_allocation_bytes(plan, num_blocks, held.num_planes)
    layers: list[LayerSpec] = []
    for group in held.groups:
        spec = plan.group_spec(group)
        for position, module_layer in enumerate(group.layers):
            axes = plan.page_axes_on(group, group.plane_of(position), num_blocks)
            name = names.name(module_layer)
            origin = plan.page_origin_bytes(group, group.plane_of(position))
            parts = _spec_parts(plan, module_layer, axes, f"layer {name}", origin=origin)
            where = {
                "module_layer": module_layer,
                "group": group.name,
                "position": position,
                "plane": group.plane_of(position),
            }
            layers.extend(_registered(name, group.kind, spec.paging, parts, where))
    planes = range(held.num_planes)
    return CacheSpec(
        plane_starts=tuple(plan.plane_start(j, num_blocks) for j in planes),
        plane_spans=tuple(plan.plane_span_at(j, num_blocks) for j in planes),
        engine=plan.engine,
        stage=stage,
        conv_layout=plan.deployment.conv_layout_run,
        num_blocks=num_blocks,
        page_bytes=plan.page_stride_bytes(plan.groups_of("attention")[0]),
        num_planes=held.num_planes,
        plane_span_bytes=plan.plane_span_bytes(num_blocks),
        layers=tuple(sorted(layers, key=lambda s: (s.module_layer, s.kind))),
    )


def _blocks_spec(plan: EngineLayout, num_blocks: int, stage: int, names: LayerNames) -> CacheSpec:
    """The spec of a block-outermost backing (``BLHNC``; vLLM's packed layout of an indexed
    hybrid): ``num_blocks`` blocks of the stage's block stride, every cache of a block at its
    byte range inside it. The backing is one plane whose page is the whole block, so every
    part is cut at its byte range of block 0 with the block stride as page stride; layers of
    different groups overlap where the engine gives a block to one group at a time."""
    stride = plan.stage_block_bytes(stage)
    if num_blocks > INT64_MAX // stride:
        what = f"that many blocks of {stride:,} B"
        raise _too_many_blocks(num_blocks, INT64_MAX // stride, what, block_bytes=stride)
    tp = plan.deployment.attn_tp
    axes = ((num_blocks, stride),)
    layers: list[LayerSpec] = []
    for group in plan.stage(stage).groups:
        spec = plan.group_spec(group)
        tokens = plan.tokens_per_page(group)
        for position, module_layer in enumerate(group.layers):
            name = names.name(module_layer)
            parts = tuple(
                _part(
                    part.name,
                    part.dtype,
                    axes,
                    spec.page_shape(part.name, tp, tokens),
                    offset_bytes=plan.byte_range(
                        module_layer, part.name, 0, num_blocks, stage
                    ).offset_bytes,
                    where=f"layer {name}",
                )
                for part in spec.parts
            )
            where = {
                "module_layer": module_layer,
                "group": group.name,
                "position": position,
                "plane": 0,
            }
            layers.extend(_registered(name, group.kind, spec.paging, parts, where))
    span = num_blocks * stride
    return CacheSpec(
        plane_starts=(0,),
        plane_spans=(span,),
        engine=plan.engine,
        stage=stage,
        conv_layout=plan.deployment.conv_layout_run,
        num_blocks=num_blocks,
        page_bytes=stride,
        num_planes=1,
        plane_span_bytes=span,
        layers=tuple(sorted(layers, key=lambda s: (s.module_layer, s.kind))),
    )
