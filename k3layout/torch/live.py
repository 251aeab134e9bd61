"""Validate the tensors an engine registered against the plan, before anything runs.

Per registered name the engine hands one tensor (an attention layer, a DSA index region) or a
KDA layer's tuple ``(conv, recurrent)`` (the registered dict: the adapter's parts, under ATOM's
names by default), or the one view vLLM binds per layer (vLLM's bound dict, under vLLM's
names: a raw ``int8`` KDA page, MLA kernel blocks; recognised by its names and cut into the
same parts). :func:`validate` reads each tensor's storage, storage offset, strides and sizes
(:mod:`.placement`) and checks, in order:

1. the names: every layer of the stage, no other (``tensor_mismatch``, naming both lists);
2. the engine's KV-cache groups, when given: the plan's groups, in order (``aliasing``);
3. every tensor: count, dtype, shape and strides as the plan cuts them (``tensor_mismatch``);
4. every address: every part views the rank's one backing and starts at the plan's
   ``byte_range`` from its start (``aliasing``). Planes, or layers across planes, in another
   order are named as that (the order and the first layers it moves); a layer off alone is
   named by itself, never the layers that agree with the plan;
5. ``vllm``: the ride's aliasing check on the publish order (``aliasing``): KDA layer ``j`` of
   every group starts at published plane ``j`` (:func:`~k3layout.offload.check_aliasing`).

Every refusal carries the checks' one facts schema (:class:`~k3layout.errors.CheckFacts`):
the module layer, its group's name, its position and plane, the part, expected and actual.
The result, a :class:`LiveLayout`, is what the image and transfer helpers take as proof the
layout was checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
from pydantic import NonNegativeInt

from .._args import expect_args, expect_sequence
from .._frozen import Frozen
from ..engines.vllm import BoundView, VllmPlan, vllm_bound_views
from ..engines.vllm.caches import check_bound_views
from ..engines.vllm.packed import packed_cache_part
from ..errors import Refusal
from ..layouts import EngineLayout, LayoutBase, Plan
from ..offload import LayerNames, TensorView, check_aliasing, engine_layer_names, plane_order
from ..offload.stage import num_image_planes, ridable
from ._checks import expect_registered, tensor_parts
from .allocation import Registered, _cut, _plane_view
from .placement import (
    Parts,
    check_addresses,
    check_groups,
    check_keys,
    check_names,
    check_part,
    layer_tensors,
)
from .specs import CacheSpec, LayerSpec, cache_spec


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
    bound = check_bound_views(plan, registered, num_blocks, stage, check="validate")
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


def _num_blocks(plan: EngineLayout, layer: LayerSpec, first: torch.Tensor) -> int:
    """The block (or usable parent) count ``layer``'s first tensor was allocated for."""
    leading = first.shape[0] if first.dim() else 0
    group = plan.group(layer.group)
    # The leading axis counts c0 + c1 * n pages for n blocks (parents): invert it.
    c0 = plan.page_axes(group, 0)[0][0]
    c1 = plan.page_axes(group, 1)[0][0] - c0
    return max((leading - c0) // c1, 1)


def _common_num_blocks(plan: EngineLayout, spec: CacheSpec, parts: Parts) -> int:
    """The block count most layers were allocated for: one layer of another size is then
    refused by name, instead of every other layer being compared with it."""
    counts = Counter(_num_blocks(plan, layer, parts[layer.name][0]) for layer in spec.layers)
    return counts.most_common(1)[0][0]


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
    check_keys(registered, stage)
    if names is None and isinstance(plan, VllmPlan) and _binds_as_vllm(plan, registered, stage):
        names, registered = _from_vllm_binding(plan, registered, stage)
    names = names or engine_layer_names(plan.model)
    probe = cache_spec(plan, 1, stage=stage, names=names)
    check_names(probe, registered)
    if groups is not None:
        check_groups(plan, stage, names, groups)
    parts = {
        layer.name: layer_tensors(layer, registered[layer.name], stage) for layer in probe.layers
    }
    spec = cache_spec(plan, _common_num_blocks(plan, probe, parts), stage=stage, names=names)
    for layer in spec.layers:
        for part, tensor in zip(layer.parts, parts[layer.name], strict=True):
            check_part(layer, part, tensor, stage)
    check_addresses(spec, parts)
    backing = parts[spec.layers[0].name][0].untyped_storage().data_ptr()
    bases = tuple(backing + start for start in spec.plane_starts)
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
