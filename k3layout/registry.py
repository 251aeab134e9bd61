"""The engines a deployment can name, each registered by its own package.

The core never names an engine: it asks this registry for the facts of ``deployment.engine``
(:class:`EngineFacts`) and, in :mod:`k3layout.layouts.seams`, for the seams it plans with.
Every engine, k3layout's own three included, is declared under the entry-point group
``k3layout.engines`` (:data:`ENTRY_POINT_GROUP`) of its distribution's metadata, as pytest's
plugins are::

    [project.entry-points."k3layout.engines"]
    myengine = "my_package.engine:MYENGINE"

The name is the engine's, the object its registration (the :class:`Registered` its package
builds with :func:`~k3layout.layouts.seams.register_engine`). The registry reads the group on
first lookup and loads each entry, so a new engine is a package of its own that declares
itself, and nothing in k3layout imports the engines: no import runs back up. An entry that
does not load, or loads something other than an engine of its name, is refused
(``engine_plugin``) when that engine is named, and left out of :func:`engine_names` with a
warning; the other engines plan as before.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Final, Protocol

from .errors import Fact, Refusal

__all__ = [
    "ENTRY_POINT_GROUP",
    "EngineFacts",
    "LayerNaming",
    "canonical_name",
    "engine_aliases",
    "engine_names",
    "facts_of",
    "lookup",
    "register",
]


@dataclass(frozen=True)
class LayerNaming:
    """How an engine names one model family's cache layers: templates of ``{layer}`` (the
    module layer id) or, for a draft, ``{index}`` (the draft's own count from 0)."""

    model_types: tuple[str, ...]
    """The ``model_type`` values the rule names (empty: any model)."""
    attention: str
    kda: str
    draft: str
    source: str
    """Where the rule was read."""


@dataclass(frozen=True)
class EngineFacts:
    """What the core asks of an engine by value.

    - ``spec_conv_rows``: whether the KDA conv state keeps one row per speculative token
      (vLLM's does; SGLang's keeps ``K - 1`` rows and a verify scratch instead);
    - ``decode_context_parallel``: whether it runs DCP (sweeps draw it only there);
    - ``kv_dtypes``: the cache dtypes it takes (sweeps and strategies draw only these);
    - ``package``: the engine's package; a ``strategies`` module there, where one exists,
      draws the engine's own deployment settings for :mod:`k3layout.testing`;
    - ``gathers_state``: whether a decode rank may gather its KDA heads from several prefill
      ranks (prefill TP a multiple of decode TP), the first of which sends the latent rows;
    - ``decode_pp_matches_prefill``: whether a decode pipeline pairs only with an equal
      prefill one (or is one stage);
    - ``pd_refusal_note``: the engine's own account of a TP pairing it cannot serve;
    - ``pp_remainder_skips_last``: where the layers an even pipeline split leaves over go:
      one each to the stages before the last (vLLM), or from the last stage back (SGLang);
    - ``layer_naming``: the names it registers layers under, by model family (the first rule
      whose ``model_types`` hold the model's, or are empty, applies);
    - ``draft_kv_dtype``: the cache dtype its followed revision gives a draft's attention
      layers whatever the target's (``None``: the target's own);
    - ``separate_draft_kv_dtype``: whether a deployment may give the draft a cache dtype of
      its own (``Deployment.draft_kv_dtype``) other than the target's;
    - ``conv_layout``: the KDA conv state layout it always runs (``None``: the deployment's
      ``conv_layout``, vLLM's ``VLLM_SSM_CONV_STATE_LAYOUT``);
    - ``aliases``: other names a deployment may use for it, deprecated: using one warns
      (:class:`DeprecationWarning`);
    - ``listing_order``: where it stands in listings (sweeps, ``--engine`` choices);
    - ``launch``: the command that starts it, before the checkpoint (``vllm serve``);
    - ``kv_connectors``: the KV connectors k3layout plans for the engine (``lmcache``:
      LMCache's own connector, :mod:`k3layout.offload.lmcache`);
    - ``versions``: the releases (or revisions) of the engine k3layout follows, oldest first;
      each has its own rules in the engine's package, and the last is what a deployment
      naming none plans for (``Deployment.engine_version``);
    - ``scaled_fp8_latent_majors``: the CUDA capability majors where its fp8 cache of an
      indexed (DSA) MLA layer keeps FlashMLA's scaled row (one fp32 scale per 128 latent
      elements: 528 B for a 512 latent, SGLang's ``flashmla_kv`` on SM90) rather than the
      plain fp8 latent.
    """

    name: str
    spec_conv_rows: bool = False
    decode_context_parallel: bool = False
    kv_dtypes: tuple[str, ...] = ("fp8", "bf16", "fp8_ds_mla")
    package: str = ""
    gathers_state: bool = False
    decode_pp_matches_prefill: bool = False
    pd_refusal_note: str = ""
    pp_remainder_skips_last: bool = True
    layer_naming: tuple[LayerNaming, ...] = ()
    draft_kv_dtype: str | None = None
    conv_layout: str | None = None
    separate_draft_kv_dtype: bool = False
    aliases: tuple[str, ...] = field(default=())
    listing_order: int = 100
    launch: str = ""
    scaled_fp8_latent_majors: tuple[int, ...] = ()
    versions: tuple[str, ...] = ()
    kv_connectors: tuple[str, ...] = ()


class Registered(Protocol):
    """An engine's registration: its facts (and, in its seams, everything else)."""

    @property
    def facts(self) -> EngineFacts: ...


ENTRY_POINT_GROUP: Final = "k3layout.engines"
"""The entry-point group every engine is declared under: ``name = "module:object"``, the
object the engine's registration."""

_ENGINES: dict[str, Registered] = {}
_ALIASES: dict[str, str] = {}
_BROKEN: dict[str, Refusal] = {}
"""The declared engines that did not load, each with its refusal."""
_discovered: list[bool] = []


def register(engine: Registered) -> None:
    """Register an engine under its name and aliases (its package does this on import)."""
    _ENGINES[engine.facts.name] = engine
    for alias in engine.facts.aliases:
        _ALIASES[alias] = engine.facts.name


def _discover() -> None:
    """Load every engine declared under :data:`ENTRY_POINT_GROUP` once (on first lookup)."""
    if _discovered:
        return
    _discovered.append(True)  # first, so that an engine's import asking the registry ends here
    for entry in _declared():
        try:
            _load(entry)
        except Refusal as refusal:
            _BROKEN[entry.name] = refusal
            warnings.warn(str(refusal), RuntimeWarning, stacklevel=3)


def _declared() -> tuple[metadata.EntryPoint, ...]:
    """The group's entry points: every installed distribution's, and k3layout's own from its
    ``pyproject.toml`` when k3layout runs from a source tree whose metadata declares none (not
    installed, or installed before the group was added)."""
    found = tuple(metadata.entry_points(group=ENTRY_POINT_GROUP))
    if any(_distribution_of(entry) == "k3layout" for entry in found):
        return found
    named = {entry.name for entry in found}
    return found + tuple(entry for entry in _source_tree_entries() if entry.name not in named)


def _distribution_of(entry: metadata.EntryPoint) -> str | None:
    dist = getattr(entry, "dist", None)  # Python 3.10+: the distribution declaring it
    return None if dist is None else str(dist.metadata["Name"])


def _source_tree_entries() -> tuple[metadata.EntryPoint, ...]:
    """k3layout's own declarations, read from the ``pyproject.toml`` above the package (a
    source checkout); none where there is none (an installed wheel) or TOML is not readable."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if sys.version_info < (3, 11) or not pyproject.is_file():
        return ()
    import tomllib  # noqa: PLC0415 - only a source checkout without metadata reads it

    project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    if project.get("name") != "k3layout":
        return ()
    declared = project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    return tuple(
        metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)
        for name, value in declared.items()
    )


def _load(entry: metadata.EntryPoint) -> None:
    """Load ``entry`` and register the engine it names; refuses (``engine_plugin``) one that
    does not load or is not the registration of an engine named as the entry is."""
    facts: dict[str, Fact] = {
        "entry_point": entry.name,
        "value": entry.value,
        "group": ENTRY_POINT_GROUP,
    }
    owner = _distribution_of(entry) or "the package that declares it"
    try:
        loaded = entry.load()
    except Exception as error:  # a plugin's import may raise anything: it is named, not lost
        raise Refusal(
            "engine_plugin",
            f"engine entry point {entry.name} = {entry.value!r} (group {ENTRY_POINT_GROUP}) "
            f"does not load: {type(error).__name__}: {error}",
            facts={**facts, "error": type(error).__name__},
            hint=f"fix or uninstall {owner}, or name another engine",
        ) from error
    engine_facts = getattr(loaded, "facts", None)
    if not isinstance(engine_facts, EngineFacts) or engine_facts.name != entry.name:
        raise Refusal(
            "engine_plugin",
            f"engine entry point {entry.name} = {entry.value!r} (group {ENTRY_POINT_GROUP}) "
            f"loads {type(loaded).__name__}, not the registration of an engine named "
            f"{entry.name!r} (an object whose facts are EngineFacts(name={entry.name!r}))",
            facts={**facts, "loaded": type(loaded).__name__},
            hint=f"point the entry point at the engine's registration, in {owner}",
        )
    register(loaded)


def engine_names() -> tuple[str, ...]:
    """The registered engines' names in listing order (aliases not included)."""
    _discover()
    return tuple(sorted(_ENGINES, key=lambda name: (_ENGINES[name].facts.listing_order, name)))


def engine_aliases() -> dict[str, str]:
    """Every deprecated alias and the engine it names (``parent`` -> ``tokenspeed``)."""
    _discover()
    return dict(_ALIASES)


def canonical_name(name: object) -> str:
    """``name``'s engine (an alias resolved); refuses (``invalid_argument``) a name no
    engine registered, and (``engine_plugin``) one whose entry point does not load."""
    if isinstance(name, str):
        if name not in _ENGINES:
            _discover()
        if name in _BROKEN and name not in _ENGINES:
            broken = _BROKEN[name]  # raised afresh each time, with what its import raised
            raise Refusal(
                broken.code, broken.message, facts=broken.facts, hint=broken.hint
            ) from broken.__cause__
        if name in _ENGINES:
            return name
        if name in _ALIASES:
            warnings.warn(
                f"engine={name!r} is a deprecated alias of engine={_ALIASES[name]!r}, "
                "and goes in the next release",
                DeprecationWarning,
                stacklevel=2,
            )
            return _ALIASES[name]
    known = engine_names()
    raise Refusal(
        "invalid_argument",
        f"engine={name!r} is not a registered engine (known: {', '.join(known)})",
        facts={"engine": repr(name), "allowed": known},
        hint=f"use engine in {list(known)}",
    )


def lookup(name: object) -> Registered:
    """The registration of engine ``name`` (refuses a name no engine registered)."""
    return _ENGINES[canonical_name(name)]


def facts_of(name: object) -> EngineFacts:
    """The facts of engine ``name`` (refuses a name no engine registered)."""
    return lookup(name).facts
