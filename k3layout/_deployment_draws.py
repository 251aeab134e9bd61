"""Drawing deployments with hypothesis: :func:`deployments`, re-exported by
:mod:`k3layout.testing` (which says how to use it). The pins are checked when the strategy is
built; each draw walks :mod:`k3layout._deployment_space` from a witness, so every deployment
drawn plans and none is filtered."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from typing import Any, cast

from hypothesis import strategies as st

from . import _deployment_space as space
from ._args import expect_args
from ._deployment_witness import find_witness, witness
from .deployment import Deployment, EngineFlavour
from .errors import Refusal
from .layouts.seams import rules_for
from .model import HybridModel
from .registry import canonical_name, engine_names
from .settings import KV_CACHE_LAYOUTS, KvCacheLayout

__all__ = ["checked_layouts", "deployments", "module_heads"]

Engines = tuple[str, ...] | st.SearchStrategy[EngineFlavour]
"""The engines a draw takes: registered names, or a strategy of names drawn first."""


def checked_layouts(layouts: object) -> tuple[KvCacheLayout, ...]:
    """``layouts`` if it is a non-empty tuple of vLLM's KV-cache layouts; else refused."""
    expect_args(("layouts", layouts, tuple))
    chosen: tuple[object, ...] = tuple(layouts)  # type: ignore[arg-type]
    if not chosen or any(layout not in KV_CACHE_LAYOUTS for layout in chosen):
        raise Refusal(
            "invalid_argument",
            f"layouts={chosen!r} must name one or more of vLLM's KV-cache layouts",
            facts={"field": "layouts", "allowed": KV_CACHE_LAYOUTS},
            hint=f"pass layouts as a tuple of {list(KV_CACHE_LAYOUTS)}",
        )
    return cast(tuple[KvCacheLayout, ...], chosen)


def module_heads(model: HybridModel) -> int:
    """The heads every module layer's count (draft included) is a multiple of."""
    return reduce(math.gcd, (layer.num_heads for layer in model.module_layers))


@dataclass(frozen=True)
class _Request:
    """What a :func:`deployments` strategy draws: the model, its engines, the vLLM layouts,
    the pinned values and the pinned strategies (drawn first, in name order)."""

    model: HybridModel
    engines: Engines
    layouts: tuple[str, ...]
    fixed: Mapping[str, object]
    strategies: Mapping[str, st.SearchStrategy[Any]]


def deployments(
    model: HybridModel,
    engine: EngineFlavour | st.SearchStrategy[EngineFlavour] | None = None,
    plannable: bool = True,
    layouts: tuple[KvCacheLayout, ...] = ("LBNHC",),
    **pinned: Any,
) -> st.SearchStrategy[Deployment]:
    """Deployments of ``model`` for ``engine`` (a name, a strategy of names, or ``None``: any
    engine that plans it), every field in ``pinned`` fixed to its value or drawn from its
    strategy::

        deployments(model, "vllm", attn_tp=8, kv_dtype=st.sampled_from(["fp8", "bf16"]))

    With ``plannable`` every deployment drawn plans (:func:`k3layout.plan` returns), by
    construction: each field is drawn among the values with which the deployment drawn so far
    still plans (:mod:`k3layout._deployment_space`), so no draw is filtered or retried; the
    fields that shape no layout (the GPU's memory flags) stay unset unless pinned. Without
    it, near misses too: each field drawn on its own (attention TP, DCP and PP past what
    divides), for sweeps that only expect a plan or a refusal.

    ``layouts``: the vLLM KV-cache layouts to draw (``BLHNC`` with the one backend that serves
    it; the adapter and the ride take ``LBNHC`` only).

    Refuses (``invalid_argument``), when called: a field ``Deployment`` does not have, and a
    pinned value (or any value of a pinned ``sampled_from`` / ``just``) with which no
    deployment of the engine plans ``model``, naming the field and the values it could take
    (``facts["allowed"]``); a value drawn from another pinned strategy is refused so when it
    is drawn.
    """
    expect_args(("model", model, HybridModel), ("plannable", plannable, bool))
    chosen = checked_layouts(layouts)
    fixed, strategies = _pins(pinned)
    engines: Engines
    if isinstance(engine, st.SearchStrategy):
        engines = engine
    elif engine is None:
        engines = engine_names()
    else:
        expect_args(("engine", engine, str))
        engines = (canonical_name(engine),)
    request = _Request(model, engines, chosen, fixed, strategies)
    if not plannable:
        return _any_deployments(request)
    if isinstance(engines, tuple):
        engines = _planning_engines(model, engines, fixed, chosen)
        for name, strategy in strategies.items():
            for value in _finite_values(strategy):
                _planning_engines(model, engines, {**fixed, name: _hashable(name, value)}, chosen)
    return _planned(_Request(model, engines, chosen, fixed, strategies))


def _pins(
    pinned: Mapping[str, object],
) -> tuple[dict[str, object], dict[str, st.SearchStrategy[Any]]]:
    """The pinned fields split into values and strategies; refuses a name that is no field."""
    fields = [name for name in Deployment.model_fields if name != "engine"]
    for name in pinned:
        if name not in fields:
            close = [f for f in fields if f.split("_")[0] == name.split("_")[0]] or fields
            raise Refusal(
                "invalid_argument",
                f"{name}: Deployment has no such field to pin",
                facts={"field": name, "allowed": tuple(fields)},
                hint=f"pin one of Deployment's fields ({', '.join(close[:6])}, ...)",
            )
    values = {
        name: _hashable(name, value)
        for name, value in pinned.items()
        if not isinstance(value, st.SearchStrategy)
    }
    strategies = {k: v for k, v in pinned.items() if isinstance(v, st.SearchStrategy)}
    return values, strategies


def _hashable(name: str, value: object) -> object:
    """A pinned value as a deployment holds it (a list as a tuple); refuses one that cannot
    be a field's value (unhashable)."""
    held = tuple(value) if isinstance(value, list) else value
    try:
        hash(held)
    except TypeError:
        raise Refusal(
            "invalid_argument",
            f"{name}={held!r}: not a value a Deployment field holds",
            facts={"field": name, "type": type(held).__name__},
            hint=f"pin {name} to a value (or a strategy of values) Deployment takes",
        ) from None
    return held


def _finite_values(strategy: st.SearchStrategy[Any]) -> tuple[object, ...]:
    """The values of a plain ``sampled_from`` or ``just`` (checked when the strategy is
    built); none for any other strategy (checked as it draws)."""
    inner = getattr(strategy, "wrapped_strategy", strategy)
    elements = getattr(inner, "elements", None)
    if getattr(inner, "_transformations", ()) or not isinstance(elements, tuple | list):
        return ()
    return tuple(elements)


def _planning_engines(
    model: HybridModel,
    engines: tuple[str, ...],
    pins: Mapping[str, object],
    layouts: tuple[str, ...],
) -> tuple[str, ...]:
    """The engines of ``engines`` that plan ``model`` with ``pins``; none: the first one's
    refusal (naming the pinned field and what it could be)."""
    found = tuple(e for e in engines if find_witness(model, e, pins, layouts) is not None)
    if not found:
        witness(model, engines[0], pins, layouts)
    return found


@st.composite
def _planned(draw: st.DrawFn, request: _Request) -> Deployment:
    """A walk from a witness (:func:`k3layout._deployment_space.walk`), every step drawn
    among what plans."""
    model, layouts = request.model, request.layouts
    pins = dict(request.fixed)
    for name, strategy in sorted(request.strategies.items()):
        pins[name] = _hashable(name, draw(strategy))
    if isinstance(request.engines, tuple):
        engines = request.engines
        if request.strategies:  # the drawn pins may leave fewer engines
            engines = _planning_engines(model, engines, pins, layouts)
    else:
        engines = (canonical_name(draw(request.engines)),)
    picked = engines[0] if len(engines) == 1 else draw(st.sampled_from(engines))
    start = witness(model, picked, pins, layouts)
    domains = space.space(model, picked, layouts, pins)
    return space.walk(lambda options: draw(st.sampled_from(options)), model, domains, start)


@st.composite
def _any_deployments(draw: st.DrawFn, request: _Request) -> Deployment:
    """Each field drawn on its own from its domain, attention TP, DCP and PP past them."""
    model = request.model
    pins = dict(request.fixed)
    for name, strategy in sorted(request.strategies.items()):
        pins[name] = draw(strategy)
    if isinstance(request.engines, tuple):
        picked = draw(st.sampled_from(request.engines))
    else:
        picked = canonical_name(draw(request.engines))
    heads = module_heads(model)
    broad = {
        "attn_tp": st.integers(1, 2 * heads),
        "dcp": st.integers(1, 16) if rules_for(picked).facts.decode_context_parallel else None,
        "pp": st.integers(1, min(model.num_layers, space.MAX_PIPELINE_DRAWN)),
    }
    domains = space.space(model, picked, request.layouts)
    fields: dict[str, object] = {"engine": picked}
    for step in space.DRAW_ORDER:
        for name in (name for name in step if name in domains):
            wide = broad.get(name)
            options = st.sampled_from(space.values(domains[name], fields))
            fields[name] = draw(wide if wide is not None else options)
    return Deployment.model_validate({**fields, **pins})
