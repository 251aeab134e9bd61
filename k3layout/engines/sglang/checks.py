"""SGLang 0.5.23: check the pools one rank allocated against the plan, memory included.

SGLang allocates every pool tensor on its own (``torch.zeros`` per MLA layer's ``kv_buffer``,
one ``conv`` and one ``temporal`` tensor over the stage's KDA layers, one ``IndexKeyCache``
buffer per indexed layer): each starts at byte 0 of its own storage, and no two share a byte.
:func:`check_pools` checks, in order, the layers each pool serves, every tensor's dtype, shape
and strides (:func:`~k3layout.engines.sglang.pools.pool_tensors`), that each starts where its
allocation starts, and that no two pool tensors overlap (``kv_buffer[0]`` bound to two MLA
layers would let both write one KV). Tensors are read by their attributes, so nothing here
imports SGLang or torch; on ``meta`` tensors, which hold no bytes, addresses are not compared.

Every refusal (``plan_mismatch``) carries the checks' one facts schema
(:class:`~k3layout.errors.CheckFacts`): ``layer`` the module layer, ``layer_name`` SGLang's
tensor (``kv_buffer[3]``, ``conv[0]``), ``group`` the plan's group, ``part`` the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

from ..._args import expect, expect_int
from ...errors import Fact, Refusal, check_refusal
from .layout import SglangPlan
from .pools import PoolTensor, pool_tensors

__all__ = ["check_pools"]


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return getattr(obj, name, default)


class _Check:
    """The plan and stage a refusal names its layers by."""

    def __init__(self, plan: SglangPlan, stage: int) -> None:
        self.plan, self.stage = plan, stage
        self.held = {
            layer: (group.name, position)
            for group in plan.stage(stage).groups
            for position, layer in enumerate(group.layers)
        }

    def refuse(
        self,
        message: str,
        *,
        field: str,
        expected: Fact,
        actual: Fact,
        tensor: PoolTensor | None = None,
        layer: int | None = None,
        hint: str = "plan from the engine's own ServerArgs and GPU (plan_from_sglang), or fix "
        "the pool",
        **extras: Fact,
    ) -> Refusal:
        if tensor is not None:
            layer = tensor.layers[0]
        group, position = self.held.get(layer, (None, None)) if layer is not None else (None, None)
        where = "" if layer is None else f" (layer {layer})"
        name = None if tensor is None else tensor.name
        return check_refusal(
            "plan_mismatch",
            f"SGLang's {name or field}{where}: {message}",
            check="check_pools",
            field=field,
            stage=self.stage,
            expected=expected,
            actual=actual,
            layer=layer,
            layer_name=name,
            group=group,
            position=position,
            part=None if name is None else name.split("[")[0],
            hint=hint,
            extra_facts=extras,
        )


def _ints(values: object) -> tuple[int, ...] | None:
    found = tuple(values) if isinstance(values, Iterable) else None
    if found is None or not all(type(v) is int for v in found):
        return None
    return found


def _read(
    check: _Check, planned: PoolTensor, tensor: Any
) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """A pool tensor's dtype, shape and strides (read by attribute), refused unless a tensor
    (with an address: ``data_ptr``, ``storage_offset``, ``element_size``)."""
    shape = _ints(_get(tensor, "shape", None))
    stride = _get(tensor, "stride")
    addressed = all(
        callable(_get(tensor, name)) for name in ("storage_offset", "element_size", "data_ptr")
    )
    strides = None
    if shape is not None and callable(stride) and addressed and hasattr(tensor, "dtype"):
        try:
            strides = _ints(stride())
        except (AttributeError, TypeError, ValueError, RuntimeError):
            strides = None
    if shape is None or strides is None:
        raise check.refuse(
            f"is a {type(tensor).__name__}, not a tensor",
            field="type",
            expected="Tensor",
            actual=type(tensor).__name__,
            tensor=planned,
        )
    return str(tensor.dtype).removeprefix("torch."), shape, strides


def _check_tensor(check: _Check, planned: PoolTensor, tensor: Any) -> None:
    dtype, shape, strides = _read(check, planned, tensor)
    for what, want, got in (
        ("dtype", planned.dtype, dtype),
        ("shape", planned.shape, shape),
        ("strides", planned.strides, strides),
    ):
        if want != got:
            raise check.refuse(
                f"{what} differs from the plan: planned {want}, SGLang has {got}",
                field=what,
                expected=want,
                actual=got,
                tensor=planned,
            )


def _extent(tensor: Any) -> tuple[int, int] | None:
    """``[start, end)`` of the bytes ``tensor`` reads (``None`` on ``meta`` or without an
    address): from its first element to one past its last."""
    device = _get(_get(tensor, "device"), "type")
    if device == "meta" or not callable(_get(tensor, "data_ptr")):
        return None
    size = int(tensor.element_size())
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    start = int(tensor.data_ptr())
    return start, start + (last + 1) * size


def _check_memory(check: _Check, tensors: Sequence[tuple[PoolTensor, Any]]) -> None:
    """Each tensor starts at byte 0 of its own allocation, and no two share a byte."""
    for planned, tensor in tensors:
        offset = int(tensor.storage_offset()) * int(tensor.element_size())
        if offset:
            raise check.refuse(
                f"starts {offset:,} B into its storage; SGLang allocates each pool tensor on "
                "its own, from its first byte",
                field="offset_bytes",
                expected=0,
                actual=offset,
                tensor=planned,
            )
    placed = sorted(
        ((extent, planned) for planned, tensor in tensors if (extent := _extent(tensor))),
        key=lambda item: item[0],
    )
    for (left, first), (right, second) in pairwise(placed):
        if right[0] < left[1]:
            shared = min(left[1], right[1]) - right[0]
            later, earlier = (
                (second, first) if second.layers[0] >= first.layers[0] else (first, second)
            )
            raise check.refuse(
                f"shares {shared:,} B with {earlier.name} (layer {earlier.layers[0]}): the plan "
                "keeps every pool tensor apart, so two layers would write the same bytes",
                field="overlap",
                expected=0,
                actual=shared,
                tensor=later,
                other_layer=earlier.name,
                hint="allocate every kv_buffer and state tensor on its own, as SGLang does "
                "(one tensor per MLA layer, never one bound twice)",
            )


def _attention_ids(pool: Any) -> tuple[int, ...] | None:
    """The MLA layers a token pool serves, in buffer order: SGLang's
    ``full_attention_layer_id_mapping`` (layer id -> buffer index), else a plain list."""
    mapping = _get(pool, "full_attention_layer_id_mapping")
    if isinstance(mapping, Mapping):
        order = sorted(mapping.items(), key=lambda kv: kv[1] if type(kv[1]) is int else -1)
        return _ints(layer for layer, _ in order)
    ids = _get(pool, "full_attention_layer_ids")
    return None if ids is None else _ints(ids)


def _check_layers(
    check: _Check, what: str, planned: tuple[int, ...], actual: tuple[int, ...] | None
) -> None:
    if actual is None or actual == planned:
        return
    differ = [p for p, a in zip(planned, actual, strict=False) if p != a]
    if differ:
        wrong = differ[0]
    else:  # one is a prefix of the other: the first layer only one of them has
        wrong = planned[len(actual)] if len(planned) > len(actual) else actual[len(planned)]
    raise check.refuse(
        f"differs from the plan: planned {planned}, SGLang has {actual}",
        field="layers",
        expected=planned,
        actual=actual,
        layer=wrong,
        hint=f"plan the pools' stage (SGLang's {what}): stage= and the pipeline split",
    )


def _sequence(check: _Check, value: Any, what: str) -> Sequence[Any]:
    if not isinstance(value, Sequence):
        raise check.refuse(
            f"{what} is a {type(value).__name__}, not a list of tensors",
            field="type",
            expected="Sequence",
            actual=type(value).__name__,
            hint="pass SGLang's own pools (req_to_token_pool, token_to_kv_pool)",
        )
    return value


def _count(check: _Check, planned: Sequence[PoolTensor], given: Sequence[Any], what: str) -> None:
    if len(given) == len(planned):
        return
    wrong = planned[len(given)] if len(given) < len(planned) else None
    raise check.refuse(
        f"{what} holds {len(given)} tensors, the plan {len(planned)}",
        field="count",
        expected=len(planned),
        actual=len(given),
        layer=None if wrong is None else wrong.layers[0],
    )


def check_pools(
    plan: SglangPlan, req_to_token_pool: Any, token_to_kv_pool: Any, stage: int = 0
) -> SglangPlan:
    """Check one rank's pools against ``plan`` (of pipeline stage ``stage``): the
    ``MLATokenToKVPool`` (``token_to_kv_pool`` or its ``full_kv_pool``) must serve the stage's
    MLA layers with one ``kv_buffer`` each, the ``MambaPool`` (``req_to_token_pool.
    mamba_pool``) its KDA layers with ``conv[0]`` and ``temporal``, each tensor of the planned
    dtype, shape (for the pools' own sizes) and strides, each at the start of its own
    allocation and no two overlapping. Returns the plan; refuses (``plan_mismatch``) at the
    first difference, naming the tensor and the layer."""
    expect("plan", plan, SglangPlan)
    expect_int("stage", stage)
    plan.stage(stage)  # refuses a stage the plan does not have
    check = _Check(plan, stage)
    kv_pool = _get(token_to_kv_pool, "full_kv_pool") or token_to_kv_pool
    kv_buffer = _sequence(check, _get(kv_pool, "kv_buffer"), "the token pool's kv_buffer")
    num_tokens = expect_int("token_to_kv_pool.size", _get(kv_pool, "size", 0))
    mamba = _get(req_to_token_pool, "mamba_pool")
    size = _get(mamba, "size", 1) if mamba is not None else 1
    num_slots = expect_int("mamba_pool.size", size)
    planned = pool_tensors(plan, max(num_tokens, 1), max(num_slots, 1), stage)
    attention = [t for t in planned if t.name.startswith("kv_buffer")]
    mla_layers = tuple(t.layers[0] for t in attention)
    _check_layers(
        check, "full_attention_layer_ids", mla_layers, _attention_ids(token_to_kv_pool)
    )
    _count(check, attention, kv_buffer, "kv_buffer")
    checked = list(zip(attention, kv_buffer, strict=True))
    keys = [t for t in planned if t.name.startswith("index_k")]
    if keys:  # a pooled indexer's keys: the DSA pool's IndexKeyCache, one tensor per layer
        buffers = _get(_get(kv_pool, "index_key_cache"), "buffer")
        _count(check, keys, _sequence(check, buffers, "index_key_cache.buffer"), "index keys")
        checked.extend(zip(keys, buffers, strict=True))
    states = [t for t in planned if t.name.startswith(("conv", "temporal"))]
    if states:
        if mamba is None:
            raise check.refuse(
                "is missing: the plan keeps a state pool",
                field="type",
                expected="MambaPool",
                actual=None,
                layer=states[0].layers[0],
            )
        _check_layers(check, "mamba_layer_ids", states[0].layers, _ints_or_none(mamba))
        cache = _get(mamba, "mamba_cache")
        conv = _get(cache, "conv")
        tensors = {
            "conv[0]": conv[0] if isinstance(conv, Sequence) and conv else conv,
            "temporal": _get(cache, "temporal"),
        }
        checked.extend((want, tensors[want.name]) for want in states)
    for want, tensor in checked:
        _check_tensor(check, want, tensor)
    _check_memory(check, checked)
    return plan


def _ints_or_none(mamba: Any) -> tuple[int, ...] | None:
    ids = _get(mamba, "mamba_layer_ids")
    return None if ids is None else _ints(ids)
