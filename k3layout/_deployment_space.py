"""The deployments of one model that an engine plans, found by planning: what
:func:`k3layout.testing.deployments` draws from, with no filter and no retry.

Each drawn field ranges over a small **domain**: the common ones here, derived from the model
and the engine's facts (attention TPs that divide the target's heads, DCP sizes that divide the
TP, the engine's releases and cache dtypes, the pipeline depths its stage split serves), and
each engine's own settings from its package's ``strategies.domains``. Which combination plans
is the planner's own verdict, never a copy of its rules:

- a **witness** is a deployment that plans: the domains' first values (each field's default
  where the domain holds it) with the pinned values, or, where that is refused, the first
  deployment one or two steps away that plans (:mod:`k3layout._deployment_witness`, which
  otherwise names the pinned field and the values it could take);
- a **walk** changes the witness one step of :data:`DRAW_ORDER` at a time, each step offering
  only the values with which the witness, changed at that step, still plans
  (:func:`step_choices`). The witness's own values always do, so no step is ever empty and
  no draw is thrown away; the last witness is the draw.

Worked example: Kimi-K3 on tokenspeed starts at attention TP 1 fp8, which ``main`` (the
newest revision) refuses: its fixed 12 MLA pages per plane (12 x 73,728 = 884,736 B) cannot
hold a 6,512,640 B KDA state. One step away, TP 8 plans (a state of 814,080 B fits): that is
the witness. Its walk draws the release, dtype and TP jointly among every combination that
plans, so #1152 (whose search grows the pages) comes with TP 1 too, ``main`` only with the TPs
its packing takes.

Verdicts are memoized per model object (as plans are, :mod:`k3layout.layouts.pipeline`), so a
sweep of one model plans each deployment once.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache, reduce
from types import ModuleType
from typing import Final, TypeAlias, cast

from .constants import REPLAYSSM_DEFAULT_CACHE_LEN
from .deployment import CONV_LAYOUTS, Deployment
from .errors import Refusal
from .gpus import GPU_NAMES
from .layouts.pipeline import plan
from .layouts.seams import rules_for
from .model import HybridModel

__all__ = [
    "DEFAULTS",
    "DRAW_ORDER",
    "FIELDS",
    "Domain",
    "combinations",
    "divisors",
    "engine_module",
    "first_values",
    "free_names",
    "plans",
    "refusal_of",
    "space",
    "step_choices",
    "values",
    "walk",
]

Domain: TypeAlias = tuple[object, ...] | Callable[[Mapping[str, object]], tuple[object, ...]]
"""A field's values: fixed, or a function of the fields drawn before it (DCP of the TP)."""

FIELDS: Final[tuple[str, ...]] = tuple(Deployment.model_fields)
DEFAULTS: Final[Mapping[str, object]] = {
    name: info.default for name, info in Deployment.model_fields.items()
}

DRAW_ORDER: Final[tuple[tuple[str, ...], ...]] = (
    ("max_padding",),
    ("engine_version", "kv_dtype", "attn_tp"),
    ("gpu",),
    ("spec_tokens",),
    ("speculative_method",),
    ("draft_kv_dtype",),
    ("pp",),
    ("dcp",),
    ("dcp_interleave",),
    ("attn_dp",),
    ("expert_parallel",),
    ("attention_backend",),
    ("kv_cache_layout",),
    ("block_tokens",),
    ("prefix_caching",),
    ("mamba_cache_mode",),
    ("kda_prefill_backend",),
    ("use_replayssm", "mamba_backend"),
    ("replayssm",),
    ("replayssm_cache_len",),
    ("conv_layout",),
    ("extensible_kv_cache",),
    ("mamba_full_memory_ratio",),
    ("max_running_requests",),
    ("max_mamba_cache_size",),
    ("max_total_tokens",),
    ("mamba_track_interval",),
)
"""The order fields are drawn in, a step at a time. The padding limit comes first (a larger
one lets more packings plan); then the release, the cache dtype and the attention TP are drawn
jointly, among every combination that plans (memoized per model object and start: a sweep of
one model plans them once), because they decide together whether a packing exists
(tokenspeed ``main`` takes fewer TPs than #1152; bf16 others than fp8). The later steps draw
one field each (two where the values of one are refused without the other: vLLM's own
ReplaySSM and its Mamba backend), the parallel sizes before the cache settings that depend on
them."""

MAX_PIPELINE_DRAWN: Final = 8
"""The deepest pipeline drawn (a sweep's budget, not a rule of any engine)."""
SPEC_TOKENS_DRAWN: Final = tuple(range(8))
"""Speculative tokens per step drawn: none, and up to 7 (past the DSpark seeds' 2)."""
ATTN_DP_DRAWN: Final = (1, 2, 8)
REPLAY_CACHE_LENS_DRAWN: Final = (REPLAYSSM_DEFAULT_CACHE_LEN, 4 * REPLAYSSM_DEFAULT_CACHE_LEN)

def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in ascending order."""
    return tuple(d for d in range(1, n + 1) if n % d == 0)


@lru_cache(maxsize=64)
def engine_module(engine: str) -> ModuleType | None:
    """The engine package's ``strategies`` module (its own domains and model shapes), if it
    has one."""
    package = rules_for(engine).facts.package
    name = f"{package}.strategies"
    if not package or importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


def _target_heads(model: HybridModel) -> int:
    """The heads every target layer's count is a multiple of: TP must divide them (a draft's
    heads only where the engine builds the draft, which planning decides)."""
    return reduce(math.gcd, (layer.num_heads for layer in model.layers))


def _dcp_sizes(fields: Mapping[str, object]) -> tuple[object, ...]:
    """DCP sizes dividing the attention TP (1 where the TP is no size: it is refused)."""
    tp = fields["attn_tp"]
    return divisors(tp) if isinstance(tp, int) and tp > 0 else (1,)


def space(
    model: HybridModel,
    engine: str,
    layouts: tuple[str, ...],
    pins: Mapping[str, object] | None = None,
) -> dict[str, Domain]:
    """The drawn fields of ``engine``'s deployments of ``model`` and their domains, each
    field's default first where the domain holds it; a pinned field's domain is its value.
    ``layouts``: the vLLM KV-cache layouts a sweep takes (its engine module reads them)."""
    rules = rules_for(engine)
    facts = rules.facts
    pipeline = rules.pipeline_ok
    depths = tuple(
        pp for pp in range(1, min(model.num_layers, MAX_PIPELINE_DRAWN) + 1) if pipeline(model, pp)
    )
    domains: dict[str, Domain] = {
        "engine_version": (None, *facts.versions),
        "gpu": GPU_NAMES,
        "kv_dtype": facts.kv_dtypes,
        "attn_tp": divisors(_target_heads(model)),
        "spec_tokens": SPEC_TOKENS_DRAWN,
        "pp": depths or (1,),
        "dcp": _dcp_sizes if facts.decode_context_parallel else (1,),
        "attn_dp": ATTN_DP_DRAWN,
        "expert_parallel": (False, True),
        "prefix_caching": (True, False),
        "replayssm": (False, True),
        "replayssm_cache_len": REPLAY_CACHE_LENS_DRAWN,
        "conv_layout": CONV_LAYOUTS if facts.conv_layout is None else (facts.conv_layout,),
    }
    if facts.separate_draft_kv_dtype and model.draft_layers:
        domains["draft_kv_dtype"] = (None, *facts.kv_dtypes)
    module = engine_module(engine)
    if module is not None and hasattr(module, "domains"):
        domains.update(module.domains(model, layouts))
    ordered = {name: _default_first(name, domain) for name, domain in domains.items()}
    for name, value in (pins or {}).items():
        ordered[name] = (value,)
    return ordered


def _default_first(name: str, domain: Domain) -> Domain:
    if callable(domain):
        return domain
    default = DEFAULTS[name]
    return (default, *(v for v in domain if v != default)) if default in domain else domain


def values(domain: Domain, fields: Mapping[str, object]) -> tuple[object, ...]:
    """A domain's values given the fields drawn so far."""
    return domain(fields) if callable(domain) else domain


def first_values(
    engine: str, domains: Mapping[str, Domain], pins: Mapping[str, object]
) -> dict[str, object]:
    """Every field at the start of a witness search: pinned, else its domain's first value,
    else the default (a field no engine draws)."""
    fields: dict[str, object] = {**DEFAULTS, "engine": engine}
    for step in DRAW_ORDER:
        for name in step:
            drawn = values(domains[name], fields) if name in domains else ()
            fields[name] = pins.get(name, drawn[0] if drawn else fields[name])
    fields.update(pins)
    return fields


def _key(fields: Mapping[str, object]) -> tuple[object, ...]:
    return tuple(fields[name] for name in FIELDS)


class _Verdict:
    """A memo key: the model by identity (kept alive while the key is), the fields by value
    (and, for a step's choices, the domains those values decide, carried uncompared)."""

    __slots__ = ("domains", "fields", "hash", "model")

    def __init__(self, model: HybridModel, fields: tuple[object, ...]) -> None:
        self.model, self.fields = model, fields
        self.hash = hash((id(model), fields))
        self.domains: Mapping[str, Domain] = {}

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Verdict)
            and other.model is self.model
            and other.fields == self.fields
        )


def refusal_of(model: HybridModel, fields: Mapping[str, object]) -> Refusal | None:
    """Why ``fields`` do not plan ``model`` (``None``: they do): the deployment's own refusal
    or the planner's."""
    try:
        plan(model, Deployment.model_validate(dict(fields)))
    except Refusal as refusal:
        return refusal
    return None


@lru_cache(maxsize=1 << 15)
def _plans(key: _Verdict) -> bool:
    return refusal_of(key.model, dict(zip(FIELDS, key.fields, strict=True))) is None


def plans(model: HybridModel, fields: Mapping[str, object]) -> bool:
    """Whether ``fields`` (every deployment field) make a deployment that plans ``model``
    (asked once per model object: the release left unset is the newest, planned alike)."""
    if fields["engine_version"] is None:
        newest = rules_for(fields["engine"]).facts.versions[-1:]
        fields = {**fields, "engine_version": newest[0] if newest else None}
    return _plans(_Verdict(model, _key(fields)))


def combinations(
    domains: Mapping[str, Domain], fields: Mapping[str, object], names: Sequence[str]
) -> Iterator[tuple[object, ...]]:
    """Every combination of ``names``' values, each domain read with the ones before it."""
    if not names:
        yield ()
        return
    first, rest = names[0], names[1:]
    for value in values(domains[first], fields):
        for tail in combinations(domains, {**fields, first: value}, rest):
            yield (value, *tail)


def free_names(step: Sequence[str], domains: Mapping[str, Domain]) -> tuple[str, ...]:
    return tuple(name for name in step if name in domains)


def step_choices(
    model: HybridModel,
    domains: Mapping[str, Domain],
    fields: Mapping[str, object],
    names: Sequence[str],
) -> list[tuple[object, ...]]:
    """The values of ``names`` (one step) with which ``fields``, changed there, still plan,
    in domain order; ``fields``' own values among them (they plan: a witness). Memoized per
    model object, fields and domains where the step's domains are fixed."""
    ranges = tuple(domains[name] for name in names)
    if any(callable(domain) for domain in ranges):
        return _choices(model, domains, fields, names)
    key = _Verdict(model, (*_key(fields), tuple(names), ranges))
    key.domains = domains  # decided by the key's values: carried, not compared
    return list(_kept_choices(key))


@lru_cache(maxsize=1 << 12)
def _kept_choices(key: _Verdict) -> tuple[tuple[object, ...], ...]:
    fields = dict(zip(FIELDS, key.fields, strict=False))
    names = cast(tuple[str, ...], key.fields[len(FIELDS)])
    return tuple(_choices(key.model, key.domains, fields, names))


def _choices(
    model: HybridModel,
    domains: Mapping[str, Domain],
    fields: Mapping[str, object],
    names: Sequence[str],
) -> list[tuple[object, ...]]:
    current = tuple(fields[name] for name in names)
    found = [
        combo
        for combo in combinations(domains, fields, names)
        if combo == current or plans(model, {**fields, **dict(zip(names, combo, strict=True))})
    ]
    return found if current in found else [current, *found]


def walk(
    choose: Callable[[list[tuple[object, ...]]], tuple[object, ...]],
    model: HybridModel,
    domains: Mapping[str, Domain],
    start: Mapping[str, object],
) -> Deployment:
    """The deployment a walk from the witness ``start`` reaches, ``choose`` picking each
    step's values among :func:`step_choices` (a pinned field's domain is its value: never
    changed)."""
    fields = dict(start)
    for step in DRAW_ORDER:
        names = free_names(step, domains)
        if not names:
            continue
        options = step_choices(model, domains, fields, names)
        picked = options[0] if len(options) == 1 else choose(options)
        fields.update(zip(names, picked, strict=True))
    return Deployment.model_validate(fields)
