"""Validate the tensors an engine registered against the plan, before anything runs.

Per registered name the engine hands one tensor (an attention layer, a DSA index region) or a
KDA layer's tuple ``(conv_q, conv_k, conv_v, recurrent)``. :func:`validate` reads each tensor's
address (``data_ptr``), strides and sizes and checks, in order:

1. the names: every layer of the stage, no other (``tensor_mismatch``, naming both lists);
2. the engine's KV-cache groups, when given: the plan's groups, in order (``aliasing``);
3. every tensor: count, dtype, shape and strides as the plan cuts them (``tensor_mismatch``);
4. every address: each layer at its plane's base plus its part's offset, planes disjoint
   (``aliasing``). A plane's base is where most layers say it is, so the refusal names the
   layer that is wrong, never the layers that agree with the plan: on one backing (vLLM
   0.33, the parent arena) plane ``j`` starts ``j`` plane spans after the start most layers
   agree on; on a tensor per plane, where most of the plane's layers agree;
5. ``vllm``: the ride's aliasing check on the publish order (``aliasing``): KDA layer ``j`` of
   every group starts at published plane ``j`` (:func:`~k3layout.offload.check_aliasing`).

Every refusal names the layer, its group and its plane. The result, a :class:`LiveLayout`, is
what the image and transfer helpers take as proof the layout was checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Literal

import torch
from pydantic import NonNegativeInt

from .._args import expect_args, expect_sequence
from .._frozen import Frozen
from ..engines.vllm import BoundView, VllmPlan, vllm_bound_views
from ..engines.vllm.caches import check_bound_views
from ..engines.vllm.packed import packed_cache_part
from ..errors import Fact, Refusal
from ..layouts import EngineLayout, LayoutBase, Plan
from ..offload import LayerNames, TensorView, check_aliasing, engine_layer_names, plane_order
from ..offload.stage import num_image_planes, ridable
from ._checks import expect_registered, tensor_parts
from .allocation import TORCH_DTYPES, Registered, _cut, _plane_view
from .specs import CacheSpec, LayerSpec, PartSpec, cache_spec


class LiveLayout(Frozen):
    """A registered layout that matched its plan: the spec it matched, every layer's
    :class:`~k3layout.offload.TensorView` and, for ``vllm``, the publish order it was checked
    under (aliased planes first)."""

    plan: Plan
    spec: CacheSpec
    names: LayerNames
    views: tuple[tuple[str, TensorView], ...]
    plane_bases: tuple[NonNegativeInt, ...]
    published: tuple[str, ...]

    def view(self, name: str) -> TensorView:
        """The view of the layer registered as ``name``."""
        for key, value in self.views:
            if key == name:
                return value
        raise Refusal(
            "layer_names",
            f"{name!r} is not an attention or KDA layer registered on stage {self.spec.stage}",
            facts={"name": name, "stage": self.spec.stage},
            hint="use a name of LiveLayout.views",
        )


def tensor_view(value: torch.Tensor | Sequence[torch.Tensor]) -> TensorView:
    """A registered value as the ride sees it: where its first tensor starts, the bytes from
    one block to the next (``stride(0) x element size``) and the blocks it spans.

    >>> tensor_view(torch.zeros(3, 4, dtype=torch.float32)).block_stride_bytes
    16
    """
    return _tensor_view(tensor_parts("value", value))


def _tensor_view(parts: tuple[torch.Tensor, ...]) -> TensorView:
    """:func:`tensor_view` of a registered value's parts (at least one)."""
    first = parts[0]
    if first.dim() == 0:
        raise Refusal(
            "tensor_mismatch",
            "a registered cache tensor has no block axis (a 0-d tensor)",
            facts={"shape": ()},
            hint="register num_blocks x ... views",
        )
    if first.layout != torch.strided:
        raise Refusal(
            "tensor_mismatch",
            f"a registered cache tensor is {first.layout}, not a strided view of cache memory",
            facts={"layout": str(first.layout)},
            hint="register num_blocks x ... strided views of the cache",
        )
    stride = first.stride(0) * first.element_size()
    return TensorView(
        base_address=first.data_ptr(), block_stride_bytes=stride, num_bytes=first.shape[0] * stride
    )


def _refuse(
    code: Literal["aliasing", "tensor_mismatch"],
    layer: LayerSpec,
    message: str,
    hint: str,
    **facts: Fact,
) -> Refusal:
    """A refusal naming ``layer``: its name, group, position in the group and plane."""
    where: dict[str, Fact] = {
        "layer_name": layer.name,
        "group": layer.group,
        "position": layer.position,
        "plane": layer.plane,
    }
    return Refusal(code, f"{layer.where}: {message}", facts={**where, **facts}, hint=hint)


def _binds_as_vllm(plan: VllmPlan, registered: Registered, stage: int) -> bool:
    """Whether ``registered`` is vLLM's own binding (its names, one view per layer) rather
    than the adapter's parts under the default names: whichever names it shares more of."""
    held = plan.stage(stage).layers
    default = engine_layer_names(plan.model)
    shared_vllm = sum(view.name in registered for view in vllm_bound_views(plan, 1, stage))
    shared_default = sum(default.name(layer) in registered for layer in held)
    return shared_vllm > shared_default


def _from_vllm_binding(
    plan: VllmPlan, registered: Registered, stage: int
) -> tuple[LayerNames, dict[str, tuple[torch.Tensor, ...]]]:
    """vLLM's binding checked as vLLM binds it (:func:`~k3layout.engines.vllm.caches.
    check_bound_views`, every corruption named), then cut into the plan's parts the way its
    layers slice their views (conv and recurrent out of the raw KDA page, the latent rows out
    of the kernel blocks): the rest of validation, the ride and the images take those."""
    names = engine_layer_names(plan.model, "vllm")
    probe = {view.name: view for view in vllm_bound_views(plan, 1, stage)}
    counts = Counter(
        value.shape[0] // probe[name].entries_per_block
        for name, value in registered.items()
        if name in probe and isinstance(value, torch.Tensor) and value.dim() > 0
    )
    num_blocks = max(counts.most_common(1)[0][0], 1) if counts else 1
    bound = check_bound_views(plan, registered, num_blocks, stage)
    spec = cache_spec(plan, num_blocks, stage=stage, names=names)
    bound_names = _bound_names(plan, spec, bound)
    parts: dict[str, tuple[torch.Tensor, ...]] = {}
    for layer in spec.layers:
        view = registered[bound_names[layer.name]]
        if not isinstance(view, torch.Tensor):  # a stand-in that passed for a tensor
            raise Refusal(
                "tensor_mismatch",
                f"{layer.name}: bound a {type(view).__name__}, not a torch tensor",
                facts={"layer_name": layer.name, "type": type(view).__name__},
                hint="bind a view of the KV-cache backing to every layer",
            )
        parts[layer.name] = _cut_parts(spec, layer, view)
    return names, parts


def _bound_names(plan: VllmPlan, spec: CacheSpec, bound: Sequence[BoundView]) -> dict[str, str]:
    """The name vLLM binds each of ``spec``'s registered names under: the same, except in
    the packed layout, where an indexed layer's latent, pooled keys and tail ring are caches
    of their own (``.attn``, ``.indexer.k_cache``, ``.indexer.tail_cache``), matched by the
    layer and the part each view starts with."""
    if not plan.packed:
        return {name: name for name in spec.names}
    starts = {
        (view.module_layer, packed_cache_part(plan.sizes, view.name, view.module_layer)): view.name
        for view in bound
    }
    return {layer.name: starts[layer.module_layer, layer.parts[0].part] for layer in spec.layers}


def _cut_parts(spec: CacheSpec, layer: LayerSpec, view: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The plan's parts of ``layer`` cut from the one view an engine bound (starting at the
    layer's first part in block 0), as the layer itself slices it."""
    plane = _plane_view(view, spec.num_blocks, spec.page_bytes, layer.parts[0].offset_bytes)
    return tuple(_cut(plane, part) for part in layer.parts)


def layer_parts(layout: LiveLayout, registered: Registered, name: str) -> tuple[torch.Tensor, ...]:
    """The parts (``conv``, ``recurrent``; ``latent``) of the layer registered as ``name``,
    whichever way it was registered: the adapter's parts as they are, or the plan's parts cut
    from the one view vLLM binds (a raw KDA page, MLA kernel blocks)."""
    expect_args(("layout", layout, LiveLayout), ("name", name, str))
    held = expect_registered("registered", registered)
    layer = layout.spec.layer(name)
    if isinstance(layout.plan, VllmPlan) and layout.plan.packed:
        views = vllm_bound_views(layout.plan, 1, layout.spec.stage, layout.names)
        bound = _bound_names(layout.plan, layout.spec, views)[name]
        name = bound if bound in held and name not in held else name
    if name not in held:
        raise Refusal(
            "layer_names",
            f"{name!r} is a layer of the layout but not of the registered tensors",
            facts={"name": name},
            hint="pass the registration the layout was validated on",
        )
    value = held[name]
    if not isinstance(value, torch.Tensor):
        return tensor_parts(f"registered[{name!r}]", value)  # the parts themselves
    if len(layer.parts) == 1 and tuple(value.shape) == layer.parts[0].shape:
        return (value,)  # the one part itself
    return _cut_parts(layout.spec, layer, value)


def _check_keys(registered: object) -> None:
    """A mapping keyed by layer names: anything else is refused before a name is compared."""
    if not isinstance(registered, Mapping):
        raise Refusal(
            "invalid_argument",
            f"registered is a {type(registered).__name__}, not a mapping of layer names to tensors",
            facts={"type": type(registered).__name__},
            hint="pass {layer name: tensor or (conv, recurrent)}, as the engine registers them",
        )
    bad = next((key for key in registered if not isinstance(key, str)), None)
    if bad is not None:
        raise Refusal(
            "tensor_mismatch",
            f"registered has a key {bad!r} ({type(bad).__name__}), not a layer name",
            facts={"key": repr(bad), "type": type(bad).__name__},
            hint="key the registered tensors by the engine's layer names (strings)",
        )


def _check_names(spec: CacheSpec, registered: Registered) -> None:
    expected = spec.names
    missing = tuple(name for name in expected if name not in registered)
    extra = tuple(sorted(name for name in registered if name not in set(expected)))
    if missing or extra:
        raise Refusal(
            "tensor_mismatch",
            f"stage {spec.stage}: the registered layers are not the plan's {len(expected)} "
            f"(missing {list(missing[:4])}{' ...' if len(missing) > 4 else ''}, "
            f"extra {list(extra[:4])}{' ...' if len(extra) > 4 else ''})",
            facts={"stage": spec.stage, "missing": missing, "extra": extra},
            hint="register every attention and KDA layer of the stage once, under its engine name",
        )


def _check_groups(
    plan: EngineLayout, stage: int, names: LayerNames, groups: Sequence[Sequence[str]]
) -> None:
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
        raise Refusal(
            "aliasing",
            f"stage {stage}: the engine's KV-cache group {index} holds {found} at layer "
            f"{position} (plane {position}); the plan's group {group.name} holds {expected} there",
            facts={
                "stage": stage,
                "group": group.name,
                "group_index": index,
                "position": position,
                "plane": position,
                "found": found,
                "expected": expected,
            },
            hint="group the layers as the plan does (vLLM: strided, bucket[i::num_groups])",
        )
    if len(given) > len(planned):
        raise Refusal(
            "aliasing",
            f"stage {stage}: the engine has {len(given)} KV-cache groups, the plan {len(planned)}",
            facts={"stage": stage, "num_groups": len(given), "expected_groups": len(planned)},
            hint="group the layers as the plan does",
        )


def _num_blocks(plan: EngineLayout, layer: LayerSpec, first: torch.Tensor) -> int:
    """The block (or usable parent) count ``layer``'s first tensor was allocated for."""
    leading = first.shape[0] if first.dim() else 0
    group = plan.group(layer.group)
    # The leading axis counts c0 + c1 * n pages for n blocks (parents): invert it.
    c0 = plan.page_axes(group, 0)[0][0]
    c1 = plan.page_axes(group, 1)[0][0] - c0
    return max((leading - c0) // c1, 1)


def _common_num_blocks(
    plan: EngineLayout, spec: CacheSpec, parts: dict[str, tuple[torch.Tensor, ...]]
) -> int:
    """The block count most layers were allocated for: one layer of another size is then
    refused by name, instead of every other layer being compared with it."""
    counts = Counter(_num_blocks(plan, layer, parts[layer.name][0]) for layer in spec.layers)
    return counts.most_common(1)[0][0]


def _parts(layer: LayerSpec, value: object) -> tuple[torch.Tensor, ...]:
    parts = (value,) if isinstance(value, torch.Tensor) else value
    if not isinstance(parts, tuple | list) or not all(isinstance(p, torch.Tensor) for p in parts):
        raise _refuse(
            "tensor_mismatch",
            layer,
            f"registered a {type(value).__name__}, not tensors",
            "register a tensor, or a KDA layer's (conv_q, conv_k, conv_v, recurrent)",
            type=type(value).__name__,
        )
    dense = next((p for p in parts if p.layout != torch.strided), None)
    if dense is not None:
        raise _refuse(
            "tensor_mismatch",
            layer,
            f"registered a {dense.layout} tensor, not a strided view of cache memory",
            "register strided views cut from the cache's planes",
            layout=str(dense.layout),
        )
    if len(parts) != len(layer.parts):
        raise _refuse(
            "tensor_mismatch",
            layer,
            f"{len(parts)} tensors registered, the plan cuts {len(layer.parts)} "
            f"({', '.join(p.part for p in layer.parts)})",
            f"register ({', '.join(p.part for p in layer.parts)})",
            num_tensors=len(parts),
            expected_tensors=len(layer.parts),
        )
    return tuple(parts)


def _check_part(layer: LayerSpec, part: PartSpec, tensor: torch.Tensor) -> None:
    dtype = TORCH_DTYPES[part.dtype]
    if tensor.dtype != dtype:
        raise _refuse(
            "tensor_mismatch",
            layer,
            f"{part.part} is {tensor.dtype}, the plan's is {dtype}",
            f"register {part.part} as {dtype}",
            part=part.part,
            dtype=str(tensor.dtype),
            expected_dtype=str(dtype),
        )
    for what, got, want in (
        ("shape", tuple(tensor.shape), part.shape),
        ("strides", tuple(tensor.stride()), part.strides),
    ):
        if got != want:
            raise _refuse(
                "tensor_mismatch",
                layer,
                f"{part.part} has {what} {got}, the plan's is {want}",
                f"cut {part.part} from its plane as {list(part.shape)} with strides "
                f"{list(part.strides)} (elements)",
                part=part.part,
                **{what: got, f"expected_{what}": want},
            )


def _storage_range(tensor: torch.Tensor) -> tuple[int, int]:
    """The address range of the storage ``tensor`` views (relative on ``meta``, as its
    ``data_ptr``)."""
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _implied_bases(
    spec: CacheSpec, parts: dict[str, tuple[torch.Tensor, ...]]
) -> list[tuple[LayerSpec, int]]:
    """Every layer with the base its first part says its plane has (address - offset),
    attention layers first, so that they win a tie as they always have."""
    ordered = sorted(spec.layers, key=lambda layer: layer.kind != "attention")
    return [
        (layer, parts[layer.name][0].data_ptr() - layer.parts[0].offset_bytes) for layer in ordered
    ]


def _plane_bases(spec: CacheSpec, parts: dict[str, tuple[torch.Tensor, ...]]) -> tuple[int, ...]:
    """Plane ``j``'s base, where most layers say it is: a corrupted layer cannot move its
    plane, so the address check names it rather than the layers sharing its plane.

    On one backing (planes consecutive: vLLM 0.33's KV-cache tensor, the parent's arena) every
    layer votes for the backing's start, ``base - plane x span``, and plane ``j`` starts ``j``
    spans after the winner: this names even a layer alone on its plane. Otherwise (a tensor per
    plane) each plane takes the base most of its layers imply; a tie goes to a base at a whole
    number of plane spans into its storage (a shifted view is not), then to attention layers.
    """
    span = spec.plane_span_bytes
    implied = _implied_bases(spec, parts)
    starts = Counter(base - spec.plane_starts[layer.plane] for layer, base in implied)
    start, votes = starts.most_common(1)[0]
    if not spec.pages_tile_planes or 2 * votes > len(implied):
        return tuple(start + spec.plane_starts[j] for j in range(spec.num_planes))
    candidates: dict[int, Counter[int]] = {j: Counter() for j in range(spec.num_planes)}
    aligned: set[int] = set()
    for layer, base in implied:
        candidates[layer.plane][base] += 1
        origin, _ = _storage_range(parts[layer.name][0])
        if (base - origin) % span == 0:
            aligned.add(base)
    return tuple(
        max(candidates[j], key=lambda base: (candidates[j][base], base in aligned))
        for j in range(spec.num_planes)
    )


def _plane_owner(spec: CacheSpec, plane: int) -> LayerSpec:
    on_plane = [layer for layer in spec.layers if layer.plane == plane]
    return next((la for la in on_plane if la.kind == "attention"), on_plane[0])


def _check_addresses(
    spec: CacheSpec, parts: dict[str, tuple[torch.Tensor, ...]], bases: tuple[int, ...]
) -> None:
    order = sorted(range(spec.num_planes), key=lambda j: bases[j])
    for left, right in pairwise(order):
        if bases[left] + spec.plane_spans[left] > bases[right]:
            raise _refuse(
                "aliasing",
                _plane_owner(spec, right),
                f"plane {right} starts {bases[right] - bases[left]} B after plane {left}, inside "
                f"its {spec.plane_spans[left]} B",
                "give every plane its own num_blocks x page bytes",
                other_plane=left,
                plane_span_bytes=spec.plane_spans[left],
            )
    for layer in spec.layers:
        for part, tensor in zip(layer.parts, parts[layer.name], strict=True):
            address = tensor.data_ptr()
            if address == bases[layer.plane] + part.offset_bytes:
                continue
            found = next(
                (j for j in order if bases[j] <= address < bases[j] + spec.plane_spans[j]), None
            )
            offset = 0 if found is None else address - bases[found]
            on = "no plane" if found is None else f"plane {found}, {offset} B past its start"
            raise _refuse(
                "aliasing",
                layer,
                f"{part.part} starts on {on}; the plan puts it on plane {layer.plane}, "
                f"{part.offset_bytes} B past its start",
                f"cut layer {layer.position} of every group from plane {layer.position}",
                part=part.part,
                found_plane=found,
                offset_bytes=offset,
                expected_offset_bytes=part.offset_bytes,
            )


def _publishes(plan: EngineLayout, stage: int) -> bool:
    """Whether the stage's state can ride: every image plane has an attention layer."""
    longest = max((len(g.layers) for g in plan.groups_of("attention", stage)), default=0)
    return num_image_planes(plan.stage(stage)) <= longest


def validate(
    plan: EngineLayout,
    registered: Registered,
    *,
    published: Sequence[str] | None = None,
    groups: Sequence[Sequence[str]] | None = None,
    stage: int = 0,
    names: LayerNames | None = None,
) -> LiveLayout:
    """Check the tensors an engine ``registered`` against ``plan``; refuse what does not match.

    ``published`` is the engine's PAGE publish order (``vllm`` only); ``None`` publishes as the
    ride does, aliased planes first, matched on the addresses found (and skips the ride's check
    on a pipeline stage whose state cannot ride: more KDA positions than attention layers).
    ``groups`` are the engine's KV-cache groups as name lists, checked against the plan's when
    given.

    >>> from k3layout import Deployment, plan, preset
    >>> from k3layout.torch import allocate
    >>> p = plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2))
    >>> live = validate(p, allocate(p, num_blocks=1).registered)
    >>> live.spec.num_blocks, live.published[:2], len(live.published)
    (1, ('model.layers.3.self_attn.attn', 'model.layers.7.self_attn.attn'), 29)
    """
    expect_args(
        ("plan", plan, LayoutBase),
        ("stage", stage, int),
        ("names", names, (LayerNames, type(None))),
    )
    expect_sequence("published", published, str, optional=True)
    for i, group in enumerate(expect_sequence("groups", groups, Sequence, optional=True)):
        expect_sequence(f"groups[{i}]", group, str)
    _check_keys(registered)
    if names is None and isinstance(plan, VllmPlan) and _binds_as_vllm(plan, registered, stage):
        names, registered = _from_vllm_binding(plan, registered, stage)
    names = names or engine_layer_names(plan.model)
    probe = cache_spec(plan, 1, stage=stage, names=names)
    _check_names(probe, registered)
    if groups is not None:
        _check_groups(plan, stage, names, groups)
    parts = {layer.name: _parts(layer, registered[layer.name]) for layer in probe.layers}
    spec = cache_spec(plan, _common_num_blocks(plan, probe, parts), stage=stage, names=names)
    for layer in spec.layers:
        for part, tensor in zip(layer.parts, parts[layer.name], strict=True):
            _check_part(layer, part, tensor)
    bases = _plane_bases(spec, parts)
    _check_addresses(spec, parts, bases)
    views = {
        layer.name: _tensor_view(parts[layer.name])
        for layer in spec.layers
        if layer.kind != "index"
    }
    order: tuple[str, ...] = ()
    rides = plan.state_rides_pages and not plan.block_outermost and _publishes(plan, stage)
    if published is not None or rides:
        vllm = ridable(plan)
        order = (
            plane_order(vllm, stage=stage, names=names, views=views).order
            if published is None
            else tuple(published)
        )
        check_aliasing(vllm, views, order, stage=stage, names=names)
    return LiveLayout(
        plan=plan,
        spec=spec,
        names=names,
        views=tuple(views.items()),
        plane_bases=bases,
        published=order,
    )
