"""vLLM 0.33: check the KV caches a worker really bound against the plan.

vLLM binds every layer a view of the rank's one backing (a raw int8 page per KDA layer, MLA
pages in kernel blocks): :mod:`k3layout.engines.vllm.bound` describes each view; this module
checks live tensors against those views.

Nothing here imports torch or vLLM: a tensor is read by its attributes (``dtype``,
``shape``, ``stride()``, ``storage_offset()``, ``element_size()``, ``untyped_storage()``),
so the check runs on CUDA, CPU and ``meta`` tensors alike. Addresses are read relative to
the backing (the storage every view shares), which is what the plan's byte ranges are.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..._args import expect_int
from ...errors import CheckName, Refusal, check_refusal
from .bound import BoundView, vllm_bound_views
from .bound_facts import Reading, refuse_bound, where_bound
from .bound_order import check_order
from .layout import VllmPlan


def check_bound_caches(
    result: VllmPlan, kv_cache_config: Any, kv_caches: Any, stage: int = 0
) -> VllmPlan:
    """Check the caches vLLM bound on a rank of ``stage`` against ``result`` (the plan
    :func:`~k3layout.engines.vllm.check_kv_cache_config` checked ``kv_cache_config``
    against): :func:`check_bound_views` for its ``num_blocks``, with the KDA parts its groups'
    ``MambaSpec`` cut. Refuses the first difference, naming the layer."""
    num_blocks = expect_int(
        "kv_cache_config.num_blocks", getattr(kv_cache_config, "num_blocks", None)
    )
    check_bound_views(result, kv_caches, num_blocks, stage, _state_parts(kv_cache_config))
    return result


StateParts = Mapping[str, tuple[tuple[tuple[int, ...], int], ...]]
"""Each KDA layer's state parts as the engine cuts them: ``(shape, element bytes)`` each."""


def check_bound_views(
    result: VllmPlan,
    kv_caches: Any,
    num_blocks: int,
    stage: int = 0,
    state_parts: StateParts | None = None,
    *,
    check: CheckName = "check_kv_caches",
) -> tuple[BoundView, ...]:
    """Check tensors bound as vLLM binds them (``kv_caches``: vLLM's layer name -> tensor)
    against ``result``'s :func:`~k3layout.layouts.vllm_bound_views` for ``num_blocks``
    blocks: the names, then every layer's dtype, shape, strides, that it views the one
    backing, where its page of block 0 starts relative to the backing (planes or layers in
    another order named as such), its pages of blocks 1 and N-1, and (``state_parts``, the
    engine's own cut) where the KDA parts sit in the page. Returns the views; refuses the
    first difference, naming the layer, with the checks' facts schema (``check``: the check
    the caller runs)."""
    if not isinstance(kv_caches, Mapping):
        raise check_refusal(
            "invalid_argument",
            f"kv_caches is a {type(kv_caches).__name__}, not a mapping of layer names to tensors",
            check=check,
            field="type",
            stage=stage,
            expected="Mapping",
            actual=type(kv_caches).__name__,
            hint="pass the dict vLLM binds (GPUModelRunner.kv_caches by layer name)",
        )
    bound = vllm_bound_views(result, num_blocks, stage)
    views = {view.name: view for view in bound}
    _check_names(views, kv_caches, stage, check)
    storages = {
        name: _storage_of(view, kv_caches[name], where_bound(result, view, stage, check))
        for name, view in views.items()
    }
    backing, _ = Counter(storages.values()).most_common(1)[0]
    parts = state_parts or {}
    reads = {}
    for name, view in views.items():
        where = where_bound(result, view, stage, check)
        reads[name] = _read(kv_caches[name], where)
        _check_tensor(result, view, reads[name], stage, where=where)
        if storages[name] != backing:
            raise refuse_bound(
                "aliasing",
                where,
                "is not a view of the rank's one backing (another storage: "
                f"{len(set(storages.values()))} storages bound)",
                "bind every layer to a view of the one KV-cache backing",
                field="storage",
                expected=1,
                actual=len(set(storages.values())),
            )
    check_order(result, views, reads, num_blocks, stage=stage, check=check)
    for name, view in views.items():
        where = where_bound(result, view, stage, check)
        _check_pages(result, view, reads[name], num_blocks, stage, where=where)
        if name in parts:
            _check_state_parts(result, view.module_layer, parts[name], where)
    needed = result.blocks_bytes(num_blocks, stage)
    size = _storage_bytes(kv_caches[next(iter(views))])
    if size is not None and size < needed:
        raise check_refusal(
            "tensor_mismatch",
            f"stage {stage}: the backing holds {size:,} B, the plan's {num_blocks:,} blocks "
            f"need {needed:,} B",
            check=check,
            field="size_bytes",
            stage=stage,
            expected=needed,
            actual=size,
            hint="allocate num_blocks x the stage's block bytes",
        )
    return bound


def _check_names(
    views: Mapping[str, BoundView], kv_caches: Mapping[Any, Any], stage: int, check: CheckName
) -> None:
    """Refuse a non-string key, a missing layer or an extra one."""
    bad = [key for key in kv_caches if not isinstance(key, str)]
    if bad:
        raise check_refusal(
            "tensor_mismatch",
            f"kv_caches has a key {bad[0]!r} ({type(bad[0]).__name__}), not a layer name",
            check=check,
            field="names",
            stage=stage,
            expected="str",
            actual=type(bad[0]).__name__,
            layer_name=repr(bad[0]),
            hint="key kv_caches by the layer names vLLM registers",
        )
    missing = tuple(name for name in views if name not in kv_caches)
    extra = tuple(sorted(name for name in kv_caches if name not in views))
    if missing or extra:
        first = views[missing[0]] if missing else None
        raise check_refusal(
            "tensor_mismatch",
            f"stage {stage}: the bound layers are not the plan's {len(views)} (missing "
            f"{list(missing[:3])}{' ...' if len(missing) > 3 else ''}, extra "
            f"{list(extra[:3])}{' ...' if len(extra) > 3 else ''})",
            check=check,
            field="names",
            stage=stage,
            expected=tuple(views),
            actual=tuple(name for name in kv_caches if isinstance(name, str)),
            layer=None if first is None else first.module_layer,
            layer_name=missing[0] if missing else extra[0],
            missing=missing,
            extra=extra,
            hint="bind every attention and KDA layer of the stage once, under vLLM's name "
            f"(e.g. {next(iter(views))!r})",
        )


def _check_tensor(
    result: VllmPlan, view: BoundView, read: Reading, stage: int, *, where: dict[str, Any]
) -> None:
    want_dtype = f"torch.{view.dtype}"
    dtype, got_shape, got_strides, _, _ = read
    if dtype != want_dtype:
        raise refuse_bound(
            "tensor_mismatch",
            where,
            f"bound as {dtype}, the plan's view is {want_dtype}",
            f"bind it as {want_dtype}",
            field="dtype",
            expected=want_dtype,
            actual=dtype,
        )
    if got_shape != view.shape:
        raise refuse_bound(
            "tensor_mismatch",
            where,
            f"has shape {got_shape}, the plan's is {view.shape} (page {result.page_bytes:,} B)",
            "bind the plan's view: a wrong size means another page or block count",
            field="shape",
            expected=view.shape,
            actual=got_shape,
        )
    for axis, (got, want) in enumerate(zip(got_strides, view.strides, strict=True)):
        if view.shape[axis] > 1 and got != want:  # an axis of one: its stride means nothing
            raise refuse_bound(
                "tensor_mismatch",
                where,
                f"has strides {got_strides}, the plan's are {view.strides}"
                + _layout_note(result, axis, got * view.elem_bytes, stage),
                f"bind the plan's view ({result.kv_cache_layout})",
                field="strides",
                expected=view.strides,
                actual=got_strides,
            )


def _layout_note(result: VllmPlan, axis: int, got_bytes: int, stage: int) -> str:
    """Why a block stride differs: the tensors are in the other KV-cache layout."""
    if axis != 0:
        return ""
    planned = result.kv_cache_layout
    if planned == "LBNHC" and got_bytes == result.stage_block_bytes(stage):
        return " (the caches are laid out block-outermost, BLHNC; the plan is LBNHC)"
    if planned == "BLHNC" and got_bytes == result.page_bytes:
        return " (the caches are laid out layer-outermost, LBNHC; the plan is BLHNC)"
    return ""


def _check_pages(
    result: VllmPlan,
    view: BoundView,
    read: Reading,
    num_blocks: int,
    stage: int,
    *,
    where: dict[str, Any],
) -> None:
    """Blocks 0, 1 and N-1 start where the plan puts the layer's page (relative to the
    backing): layer ``j`` of every group on plane ``j``."""
    elem = view.elem_bytes
    _, _, strides, offset, _ = read
    start = offset * elem
    step = view.entries_per_block * strides[0] * elem
    for block in sorted({0, min(1, num_blocks - 1), num_blocks - 1}):
        want = view.page_offset_bytes(block)
        got = start + block * step
        if got != want:
            plane, at_block = _plane_and_block(result, got, num_blocks, stage)
            raise refuse_bound(
                "aliasing",
                where,
                f"its page of block {block} starts at byte {got:,} of the backing (plane "
                f"{plane}, block {at_block}); the plan puts it at byte {want:,} (plane "
                f"{where['plane']}, block {block})",
                f"bind layer {where['position']} of every group to plane {where['position']}",
                field="offset_bytes",
                expected=want,
                actual=got,
                block=block,
                found_plane=plane,
            )


def _plane_and_block(result: VllmPlan, offset: int, num_blocks: int, stage: int) -> tuple[int, int]:
    """The plane and block a backing offset falls in."""
    layer_stride = result.layer_stride_bytes(num_blocks, stage)
    block_stride = result.block_stride_bytes(stage)
    if result.kv_cache_layout == "BLHNC":
        return (offset % block_stride) // layer_stride, offset // block_stride
    return offset // layer_stride, (offset % layer_stride) // block_stride


def _state_parts(kv_cache_config: Any) -> StateParts:
    """Each KDA layer's parts as its group's spec gives them: ``(shape, element bytes)``."""
    parts: dict[str, tuple[tuple[tuple[int, ...], int], ...]] = {}
    for group in getattr(kv_cache_config, "kv_cache_groups", ()):
        spec = getattr(group, "kv_cache_spec", None)
        shapes, dtypes = getattr(spec, "shapes", None), getattr(spec, "dtypes", None)
        if shapes is None or dtypes is None:
            continue
        try:
            described = tuple(
                (
                    tuple(expect_int("shape[]", n) for n in shape),
                    expect_int("itemsize", dtype.itemsize),
                )
                for shape, dtype in zip(shapes, dtypes, strict=False)
            )
        except (AttributeError, TypeError) as error:
            raise Refusal(
                "invalid_argument",
                f"kv_cache_config: a group's spec has state shapes {shapes!r} and dtypes "
                f"{dtypes!r}, not shapes of integers and torch dtypes ({error})",
                facts={"field": "kv_cache_groups[].kv_cache_spec"},
                hint="pass the KVCacheConfig vLLM planned",
            ) from None
        parts.update(dict.fromkeys(getattr(group, "layer_names", ()), described))
    return parts


def _check_state_parts(
    result: VllmPlan,
    layer: int,
    parts: tuple[tuple[tuple[int, ...], int], ...],
    where: dict[str, Any],
) -> None:
    """The layer's conv and recurrent states, cut back to back from the page start by the
    shapes and dtypes of its group's spec, sit where the plan's part ranges say."""
    planned = result.part_range_list(layer)
    spec = result.sizes.spec_of(layer)
    tp = result.deployment.attn_tp
    offset = 0
    for index, planned_part in enumerate(planned):
        if index >= len(parts):
            break
        shape, elem = parts[index]
        size = math.prod(shape) * elem
        want_shape = spec.page_shape(planned_part.part, tp, 1)
        if (offset, size, shape) != (
            planned_part.offset_bytes,
            planned_part.size_bytes,
            want_shape,
        ):
            raise refuse_bound(
                "tensor_mismatch",
                where,
                f"its {planned_part.part} state is {shape} ({size:,} B) at byte {offset:,} of "
                f"the page; the plan's is {want_shape} ({planned_part.size_bytes:,} B) at "
                f"byte {planned_part.offset_bytes:,}",
                "the engine's KDA state shapes and the plan's disagree: check the conv "
                "layout (VLLM_SSM_CONV_STATE_LAYOUT) and the speculative tokens",
                field="parts",
                expected=(planned_part.offset_bytes, planned_part.size_bytes, *want_shape),
                actual=(offset, size, *shape),
                part=planned_part.part,
            )
        offset += size
    if len(parts) != len(planned):
        raise refuse_bound(
            "tensor_mismatch",
            where,
            f"its spec cuts {len(parts)} state parts, the plan {len(planned)} "
            f"({', '.join(p.part for p in planned)})",
            "check the vLLM version the plan follows",
            field="count",
            expected=len(planned),
            actual=len(parts),
        )


def _storage_of(view: BoundView, tensor: Any, where: dict[str, Any]) -> int:
    """The address of the storage ``tensor`` views (0 on ``meta``: one storage there)."""
    storage = getattr(tensor, "untyped_storage", None)
    readable = callable(storage) and callable(getattr(tensor, "stride", None))
    try:
        if readable:
            return int(storage().data_ptr())  # type: ignore[misc]
    except (AttributeError, TypeError, ValueError, RuntimeError):
        pass
    raise refuse_bound(
        "tensor_mismatch",
        where,
        f"is a {type(tensor).__name__}, not a tensor with a readable storage",
        "bind a tensor view of the KV-cache backing to every layer",
        field="type",
        expected="Tensor",
        actual=type(tensor).__name__,
    )


def _storage_bytes(tensor: Any) -> int | None:
    nbytes = getattr(tensor.untyped_storage(), "nbytes", None)
    return int(nbytes()) if callable(nbytes) else None


def _read(tensor: Any, where: dict[str, Any]) -> Reading:
    """A bound tensor's dtype, shape, strides, storage offset and element size, read by
    attribute (a torch tensor on any device); anything else is refused naming the layer."""
    try:
        return (
            str(tensor.dtype),
            tuple(int(n) for n in tensor.shape),
            tuple(int(n) for n in tensor.stride()),
            int(tensor.storage_offset()),
            int(tensor.element_size()),
        )
    except (AttributeError, TypeError, ValueError, RuntimeError):
        raise refuse_bound(
            "tensor_mismatch",
            where,
            f"is a {type(tensor).__name__} without a tensor's dtype, shape, strides and offset",
            "bind a tensor view of the KV-cache backing to every layer",
            field="type",
            expected="Tensor",
            actual=type(tensor).__name__,
        ) from None
