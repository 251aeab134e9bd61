"""The checks :func:`~k3layout.torch.validate` runs on registered tensors, one idea each: the
names, the engine's groups, each layer's tensors (count, dtype, shape, strides), then where
the bytes are.

The address proof: every part of every layer views the rank's ONE backing (the plan lays out
one backing per rank: vLLM's KV-cache tensor, tokenspeed's arena) and starts at the byte the
plan's ``byte_range`` gives, counted from the backing's start (the tensor's storage offset, so
CPU, CUDA and ``meta`` tensors read alike). A layout whose every tensor has the right shape,
dtype and strides but whose planes or layers are in another order is refused as that
(:mod:`k3layout.layouts.reorder`): "the planes are published in another order: plane 0 holds
what the plan puts in plane 28, ...", naming the first layers it moves; a layer alone out of
place is named by itself.

Every refusal carries the checks' one facts schema (:class:`~k3layout.errors.CheckFacts`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from ..errors import Fact, Refusal, check_refusal
from ..layouts import EngineLayout
from ..layouts.reorder import Placed, Reordering, reordering
from ..offload import LayerNames
from .allocation import TORCH_DTYPES
from .specs import CacheSpec, LayerSpec, PartSpec

Parts = dict[str, tuple[torch.Tensor, ...]]
"""Each registered name's tensors, in the plan's part order."""


def refuse(
    code: Literal["aliasing", "tensor_mismatch"],
    layer: LayerSpec,
    message: str,
    hint: str,
    *,
    stage: int,
    field: str,
    expected: Fact,
    actual: Fact,
    part: str | None = None,
    block: int | None = None,
    **extras: Fact,
) -> Refusal:
    """A refusal naming ``layer`` (its name, module layer, group, position and plane) in the
    checks' one facts schema."""
    return check_refusal(
        code,
        f"{layer.where}: {message}",
        check="validate",
        field=field,
        stage=stage,
        expected=expected,
        actual=actual,
        hint=hint,
        layer=layer.module_layer,
        layer_name=layer.name,
        group=layer.group,
        position=layer.position,
        plane=layer.plane,
        part=part,
        block=block,
        extra_facts=extras,
    )


def check_keys(registered: object, stage: int) -> None:
    """A mapping keyed by layer names: anything else is refused before a name is compared."""
    if not isinstance(registered, Mapping):
        raise check_refusal(
            "invalid_argument",
            f"registered is a {type(registered).__name__}, not a mapping of layer names to tensors",
            check="validate",
            field="type",
            stage=stage,
            expected="Mapping",
            actual=type(registered).__name__,
            hint="pass {layer name: tensor or (conv, recurrent)}, as the engine registers them",
        )
    bad = next((key for key in registered if not isinstance(key, str)), None)
    if bad is not None:
        raise check_refusal(
            "tensor_mismatch",
            f"registered has a key {bad!r} ({type(bad).__name__}), not a layer name",
            check="validate",
            field="names",
            stage=stage,
            expected="str",
            actual=type(bad).__name__,
            layer_name=repr(bad),
            hint="key the registered tensors by the engine's layer names (strings)",
        )


def check_names(spec: CacheSpec, registered: Mapping[str, object]) -> None:
    """Every layer of the stage registered once under its name, and no other name."""
    expected = spec.names
    missing = tuple(name for name in expected if name not in registered)
    extra = tuple(sorted(name for name in registered if name not in set(expected)))
    if missing or extra:
        first = spec.layer(missing[0]) if missing else None
        raise check_refusal(
            "tensor_mismatch",
            f"stage {spec.stage}: the registered layers are not the plan's {len(expected)} "
            f"(missing {list(missing[:4])}{' ...' if len(missing) > 4 else ''}, "
            f"extra {list(extra[:4])}{' ...' if len(extra) > 4 else ''})",
            check="validate",
            field="names",
            stage=spec.stage,
            expected=expected,
            actual=tuple(name for name in registered if isinstance(name, str)),
            layer=None if first is None else first.module_layer,
            layer_name=missing[0] if missing else extra[0],
            group=None if first is None else first.group,
            position=None if first is None else first.position,
            plane=None if first is None else first.plane,
            missing=missing,
            extra=extra,
            hint="register every attention and KDA layer of the stage once, under its engine name",
        )


def check_groups(
    plan: EngineLayout, stage: int, names: LayerNames, groups: Sequence[Sequence[str]]
) -> None:
    """The engine's KV-cache groups are the plan's, in order, each layer in its place."""
    planned = [g for g in plan.stage(stage).groups if g.layers]
    given = [tuple(g) for g in groups]
    for index, group in enumerate(planned):
        want = tuple(names.name(layer) for layer in group.layers)
        got = given[index] if index < len(given) else ()
        if got == want:
            continue
        position = next(
            (j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None
        )
        position = min(len(got), len(want)) if position is None else position
        found = got[position] if position < len(got) else None
        expected = want[position] if position < len(want) else None
        plane = group.plane_of(position) if position < len(group.layers) else None
        raise check_refusal(
            "aliasing",
            f"stage {stage}: the engine's KV-cache group {index} holds {found} at layer "
            f"{position} (plane {plane}); the plan's group {group.name} holds {expected} there",
            check="validate",
            field="groups",
            stage=stage,
            expected=expected,
            actual=found,
            layer=group.layers[position] if position < len(group.layers) else None,
            layer_name=expected,
            group=group.name,
            position=position,
            plane=plane,
            hint="group the layers as the plan does (vLLM: strided, bucket[i::num_groups])",
        )
    if len(given) > len(planned):
        raise check_refusal(
            "aliasing",
            f"stage {stage}: the engine has {len(given)} KV-cache groups, the plan {len(planned)}",
            check="validate",
            field="groups",
            stage=stage,
            expected=len(planned),
            actual=len(given),
            hint="group the layers as the plan does",
        )


def layer_tensors(layer: LayerSpec, value: object, stage: int) -> tuple[torch.Tensor, ...]:
    """What ``layer`` registered as its tuple of strided tensors, one per planned part."""
    parts = (value,) if isinstance(value, torch.Tensor) else value
    names = tuple(p.part for p in layer.parts)
    if not isinstance(parts, tuple | list) or not all(isinstance(p, torch.Tensor) for p in parts):
        raise refuse(
            "tensor_mismatch",
            layer,
            f"registered a {type(value).__name__}, not tensors",
            f"register a tensor, or a KDA layer's ({', '.join(names)})",
            stage=stage,
            field="type",
            expected="Tensor" if len(names) == 1 else f"tuple of {len(names)} Tensors",
            actual=type(value).__name__,
        )
    dense = next((p for p in parts if p.layout != torch.strided), None)
    if dense is not None:
        raise refuse(
            "tensor_mismatch",
            layer,
            f"registered a {dense.layout} tensor, not a strided view of cache memory",
            "register strided views cut from the cache's planes",
            stage=stage,
            field="layout",
            expected=str(torch.strided),
            actual=str(dense.layout),
        )
    if len(parts) != len(layer.parts):
        raise refuse(
            "tensor_mismatch",
            layer,
            f"{len(parts)} tensors registered, the plan cuts {len(layer.parts)} "
            f"({', '.join(names)})",
            f"register ({', '.join(names)})",
            stage=stage,
            field="count",
            expected=len(layer.parts),
            actual=len(parts),
        )
    return tuple(parts)


def check_part(layer: LayerSpec, part: PartSpec, tensor: torch.Tensor, stage: int) -> None:
    """One tensor's dtype, shape and strides, as the plan cuts ``part``."""
    dtype = TORCH_DTYPES[part.dtype]
    if tensor.dtype != dtype:
        raise refuse(
            "tensor_mismatch",
            layer,
            f"{part.part} is {tensor.dtype}, the plan's is {dtype}",
            f"register {part.part} as {dtype}",
            stage=stage,
            field="dtype",
            expected=str(dtype),
            actual=str(tensor.dtype),
            part=part.part,
        )
    for what, got, want in (
        ("shape", tuple(tensor.shape), part.shape),
        ("strides", tuple(tensor.stride()), part.strides),
    ):
        if got != want:
            raise refuse(
                "tensor_mismatch",
                layer,
                f"{part.part} has {what} {got}, the plan's is {want}",
                f"cut {part.part} from its plane as {list(part.shape)} with strides "
                f"{list(part.strides)} (elements)",
                stage=stage,
                field=what,
                expected=want,
                actual=got,
                part=part.part,
            )


def _storage(tensor: torch.Tensor) -> int:
    """The storage ``tensor`` views, by its address (0 for every ``meta`` tensor: one)."""
    return int(tensor.untyped_storage().data_ptr())


def _offset(tensor: torch.Tensor) -> int:
    """Where ``tensor`` starts, in bytes from the start of its storage."""
    return int(tensor.storage_offset()) * tensor.element_size()


def backing_of(spec: CacheSpec, parts: Parts) -> int:
    """The address of the rank's one backing: the storage every registered tensor views.
    Refuses (``aliasing``) the first layer (in module order) viewing another storage."""
    storages = Counter(_storage(t) for layer in spec.layers for t in parts[layer.name])
    backing, _ = storages.most_common(1)[0]
    for layer in spec.layers:
        for part, tensor in zip(layer.parts, parts[layer.name], strict=True):
            if _storage(tensor) != backing:
                raise refuse(
                    "aliasing",
                    layer,
                    f"{part.part} views another storage than the rank's backing ({len(storages)} "
                    "storages registered); the plan lays every plane out in one backing, whose "
                    "byte ranges the ride, the images and transfers read",
                    "cut every layer's tensors from the one KV-cache backing (allocate)",
                    stage=spec.stage,
                    field="storage",
                    expected=1,
                    actual=len(storages),
                    part=part.part,
                )
    return backing


def _placed(spec: CacheSpec, parts: Parts) -> list[tuple[LayerSpec, PartSpec, Placed]]:
    return [
        (
            layer,
            part,
            Placed(
                name=layer.name,
                group=layer.group,
                position=layer.position,
                plane=layer.plane,
                offset_bytes=part.offset_bytes,
                expected_bytes=spec.plane_starts[layer.plane] + part.offset_bytes,
                actual_bytes=_offset(tensor),
            ),
        )
        for layer in spec.layers
        for part, tensor in zip(layer.parts, parts[layer.name], strict=True)
    ]


def _plane_at(spec: CacheSpec, offset: int) -> int | None:
    """The plane whose bytes hold backing byte ``offset`` (``None``: no plane's)."""
    ranges = zip(spec.plane_starts, spec.plane_spans, strict=True)
    held = (j for j, (start, span) in enumerate(ranges) if start <= offset < start + span)
    return next(held, None)


def _reordered(
    spec: CacheSpec, found: Reordering, placed: list[tuple[LayerSpec, PartSpec, Placed]]
) -> Refusal:
    layer, part, item = next(entry for entry in placed if entry[0].name == found.moved[0])
    hint = "cut the planes from the start of the backing, plane j at plane_starts[j]"
    expected: Fact = item.expected_bytes
    actual: Fact = item.actual_bytes
    field, extras = "offset_bytes", dict[str, Fact]()
    if found.kind == "planes":
        field, expected, actual = "plane_order", found.planned, found.order
        extras = {"order": found.order}
        hint = (
            "publish the planes in the plan's order: plane j of the backing holds layer j of "
            "every group (plan.stage(s).groups), at cache_spec's plane_starts[j]"
        )
    elif found.kind == "layers":
        field, expected, actual = "layer_order", layer.plane, _plane_at(spec, item.actual_bytes)
        extras = {"found_plane": actual}
        hint = "cut layer j of every group from plane j, as the plan's groups order them"
    return refuse(
        "aliasing",
        layer,
        found.sentence,
        hint,
        stage=spec.stage,
        field=field,
        expected=expected,
        actual=actual,
        part=part.part,
        block=0,
        moved=found.moved,
        **extras,
    )


def check_addresses(spec: CacheSpec, parts: Parts) -> None:
    """Every part starts at its byte range from the start of the one backing (the strides
    were checked with the shapes); a reordering of planes or layers is named as one."""
    backing_of(spec, parts)
    placed = _placed(spec, parts)
    if all(item.actual_bytes == item.expected_bytes for _, _, item in placed):
        return
    extents = spec.plane_spans if spec.num_planes > 1 else (spec.page_bytes,)
    found = reordering([item for _, _, item in placed], spec.plane_starts, extents)
    if found is not None:
        raise _reordered(spec, found, placed)
    layer, part, item = next(e for e in placed if e[2].actual_bytes != e[2].expected_bytes)
    plane = _plane_at(spec, item.actual_bytes)
    inside = 0 if plane is None else item.actual_bytes - spec.plane_starts[plane]
    on = "no plane" if plane is None else f"plane {plane}, {inside} B past its start"
    raise refuse(
        "aliasing",
        layer,
        f"{part.part} starts at byte {item.actual_bytes:,} of the backing, on {on}; the plan "
        f"puts it at byte {item.expected_bytes:,}, on plane {layer.plane}, {part.offset_bytes} B "
        "past its start",
        f"cut layer {layer.position} of every group from plane {layer.plane} at its byte range",
        stage=spec.stage,
        field="offset_bytes",
        expected=item.expected_bytes,
        actual=item.actual_bytes,
        part=part.part,
        block=0,
        found_plane=plane,
    )
