"""The witness a draw of :func:`k3layout.testing.deployments` starts from: a deployment with
the pinned values that plans, found by planning the start of
:mod:`k3layout._deployment_space` and the deployments one or two of its steps away; where
there is none, the refusal naming the pinned field to change and the values it could take
(each checked by a witness search of its own)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Final

from ._deployment_space import (
    DEFAULTS,
    DRAW_ORDER,
    Domain,
    combinations,
    engine_module,
    first_values,
    free_names,
    plans,
    refusal_of,
    space,
    values,
)
from .errors import Fact, Refusal
from .model import HybridModel
from .registry import engine_names

__all__ = ["allowed_fact", "find_witness", "witness"]

MAX_SEARCHED: Final = 20_000
"""Deployments a witness search plans at most before it refuses (two steps away from the
start is enough for every pin the tests make; this keeps a hopeless pin quick)."""


def _search(
    model: HybridModel, domains: Mapping[str, Domain], start: dict[str, object], depth: int
) -> dict[str, object] | None:
    """The first deployment at most ``depth`` (1 or 2) steps from ``start`` that plans."""
    if plans(model, start):
        return start
    steps = [names for names in (free_names(step, domains) for step in DRAW_ORDER) if names]
    searched = 0

    def moves(fields: dict[str, object], after: int) -> Iterator[tuple[int, dict[str, object]]]:
        for index in range(after, len(steps)):
            names = steps[index]
            for combo in combinations(domains, fields, names):
                yield index, {**fields, **dict(zip(names, combo, strict=True))}

    for _, moved in moves(start, 0):
        if plans(model, moved):
            return moved
    if depth < 2:
        return None
    for index, moved in moves(start, 0):
        for _, again in moves(moved, index + 1):
            searched += 1
            if plans(model, again):
                return again
            if searched > MAX_SEARCHED:
                return None
    return None


class _Pins:
    """A witness memo key: model by identity, engine, pins and layouts by value."""

    __slots__ = ("engine", "hash", "layouts", "model", "pins")

    def __init__(
        self,
        model: HybridModel,
        engine: str,
        pins: tuple[tuple[str, object], ...],
        layouts: tuple[str, ...],
    ) -> None:
        self.model, self.engine, self.pins, self.layouts = model, engine, pins, layouts
        self.hash = hash((id(model), engine, pins, layouts))

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Pins)
            and other.model is self.model
            and (other.engine, other.pins, other.layouts) == (self.engine, self.pins, self.layouts)
        )


@lru_cache(maxsize=1 << 12)
def _witness(key: _Pins, depth: int) -> tuple[tuple[str, object], ...] | None:
    pins = dict(key.pins)
    module = engine_module(key.engine)
    serves = getattr(module, "serves", None)
    if serves is not None and not serves(key.model):
        return None
    domains = space(key.model, key.engine, key.layouts, pins)
    found = _search(key.model, domains, first_values(key.engine, domains, pins), depth)
    return None if found is None else tuple(found.items())


def find_witness(
    model: HybridModel,
    engine: str,
    pins: Mapping[str, object],
    layouts: tuple[str, ...],
    depth: int = 2,
) -> dict[str, object] | None:
    """A deployment of ``engine`` with ``pins`` that plans ``model``, its fields in
    ``space``'s domains (``None``: none within ``depth`` steps of the start)."""
    key = _Pins(model, engine, tuple(sorted(pins.items())), layouts)
    found = _witness(key, depth)
    return None if found is None else dict(found)


def witness(
    model: HybridModel, engine: str, pins: Mapping[str, object], layouts: tuple[str, ...]
) -> dict[str, object]:
    """A deployment of ``engine`` with ``pins`` that plans ``model`` (:func:`find_witness`),
    or a refusal (``invalid_argument``) naming the first pinned field (in draw order) that
    the others leave values for: ``facts["allowed"]`` those values, ``facts["refusal"]`` the
    code the start was refused with. Where no pinned field has one (or none is pinned), the
    engine is named, with the engines that plan ``model`` with ``pins``.

    >>> from k3layout import preset
    >>> try:
    ...     witness(preset("kimi-k3"), "vllm", {"attn_tp": 5}, ("LBNHC",))
    ... except Refusal as refusal:
    ...     refusal.facts["field"], refusal.facts["allowed"], refusal.facts["refusal"]
    ('attn_tp', (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96), 'heads_not_divisible')
    """
    found = find_witness(model, engine, pins, layouts)
    if found is not None:
        return found
    start = first_values(engine, space(model, engine, layouts, pins), pins)
    why = refusal_of(model, start)
    reason = f" ({why.code}: {why.message})" if why is not None else ""
    shown = ", ".join(f"{name}={value!r}" for name, value in pins.items())
    for name in _blame_order(pins):
        others = {k: v for k, v in pins.items() if k != name}
        # a field the engine draws no values for takes its unset value alone
        domain = space(model, engine, layouts, others).get(name, (DEFAULTS[name],))
        allowed = tuple(
            value
            for value in values(domain, start)
            if find_witness(model, engine, {**others, name: value}, layouts, depth=1) is not None
        )
        if allowed:
            raise Refusal(
                "invalid_argument",
                f"{name}={pins[name]!r}: no deployment of engine={engine} with {shown} plans "
                f"model {model.name}{reason}",
                facts=_facts(model, engine, name=name, value=pins[name], allowed=allowed, why=why),
                hint=f"pin {name} to one of {list(allowed)}, or leave it to be drawn",
            )
    planning = [e for e in engine_names() if find_witness(model, e, pins, layouts, depth=1)]
    raise Refusal(
        "invalid_argument",
        f"engine={engine!r}: no deployment of it "
        + (f"with {shown} " if shown else "")
        + f"plans model {model.name}{reason}",
        facts=_facts(model, engine, name="engine", value=engine, allowed=planning, why=why),
        hint=f"use engine in {planning}" if planning else "pin fewer fields, or another model",
    )


def _blame_order(pins: Mapping[str, object]) -> list[str]:
    """Pinned fields in draw order, then the ones no step draws."""
    order = [name for step in DRAW_ORDER for name in step]
    return sorted(pins, key=lambda name: order.index(name) if name in order else len(order))


def allowed_fact(allowed: Sequence[object]) -> Fact:
    """Values as a refusal fact: a tuple of ints, else of their texts (``None`` for an unset
    field: ``("None", "FLASHMLA")``)."""
    ints = [v for v in allowed if isinstance(v, int) and not isinstance(v, bool)]
    return tuple(ints) if len(ints) == len(allowed) else tuple(str(v) for v in allowed)


def _facts(
    model: HybridModel,
    engine: str,
    *,
    name: str,
    value: object,
    allowed: Sequence[object],
    why: Refusal | None,
) -> dict[str, Fact]:
    shown: Fact = value if isinstance(value, int | float | str | bool) else repr(value)
    return {
        "field": name,
        "value": shown,
        "allowed": allowed_fact(allowed),
        "engine": engine,
        "model": model.name,
        "refusal": None if why is None else why.code,
    }
