"""The names an engine registers its cache layers under: one naming rule per engine.

An engine registers every attention and KDA layer under a name (vLLM: the layer's module
path in its static forward context; a KV connector sees the same names). The names matter
beyond cosmetics: an engine that publishes PAGE planes *by name* orders them by these
strings, and the ride's plane order and aliasing check match on them. The rules, as each
engine really names the layers (:data:`NAMING_RULES`):

- ``atom`` (seed 000's connector, the default here): target MLA layer ``i``
  ``model.layers.{i}.self_attn.attn``, target KDA layer ``i`` ``model.layers.{i}.self_attn``,
  draft MLA layer ``k`` (the draft's own count) ``draft.layers.{k}.self_attn.attn``. The
  draft is its own module tree, registered after the target but sorting *before* it
  (``draft.`` < ``model.``): five of K3 + DSpark's 29 attention layers sort ahead of the 23
  the KDA state aliases, which is what the seed's first boot ran into.
- ``vllm`` (vLLM 0.33, read off the names its ``KVCacheConfig`` and bound caches carry):
  every layer ``{prefix}model.layers.{i}.self_attn``, MLA and KDA alike, where the prefix is
  ``language_model.`` for Kimi-K3 (a multimodal wrapper, ``KimiK3ForConditionalGeneration``)
  and empty for Kimi-Linear; a DSpark or MTP draft continues the target's numbering without
  the prefix (``model.layers.93.self_attn``).
- ``tokenspeed`` (both revisions followed, read off its cache recipe and the field ids it
  recorded): every layer ``layer.{i}`` by its global id, the prefix of its fields' ids
  (``layer.3.latent_kv``, ``layer.0.conv_state``); a draft's layers continue the target's
  ids (``layer.93``).
- The DSA index region of an attention layer: ``<attention name>.indexer.k_cache``; its
  indexer's tail ring (GLM-5.3-Flash): ``<attention name>.indexer.tail_cache``.

*Name order* is plain string order (``sorted``), as an engine gets when it publishes planes by
name: ``model.layers.11...`` sorts before ``model.layers.3...``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Final, TypeAlias, cast

from pydantic import model_validator

from ._args import expect, expect_args, expect_int, expect_sequence
from ._frozen import Frozen, trusted
from .errors import Refusal
from .model import HybridModel
from .registry import engine_names, facts_of

NamingEngine: TypeAlias = str
"""An engine whose naming rule is known (:data:`NAMING_RULES`): ``atom`` (the seed's ATOM
ride, the offload helpers' default) or a registered engine with ``layer_naming``."""


class NamingRule(Frozen):
    """How one engine names one model's cache layers. Each template takes ``{layer}`` (the
    module layer id) or, for a draft, ``{index}`` (the draft's own count from 0)."""

    engine: NamingEngine
    model_types: tuple[str, ...]
    """The ``model_type`` values the rule names (empty: any model)."""
    attention: str
    kda: str
    draft: str
    source: str
    """Where the rule was read."""

    def target_name(self, layer: int, *, attention: bool) -> str:
        """The name of target module layer ``layer``."""
        return (self.attention if attention else self.kda).format(layer=layer)

    def draft_name(self, layer: int, index: int) -> str:
        """The name of draft layer ``index`` (module layer ``layer``)."""
        return self.draft.format(layer=layer, index=index)


ATOM_NAMING: Final = NamingRule(
    engine="atom",
    model_types=(),
    attention="model.layers.{layer}.self_attn.attn",
    kda="model.layers.{layer}.self_attn",
    draft="draft.layers.{index}.self_attn.attn",
    source="seed 000 (ATOM's KDA ride over vLLM's mp executor)",
)
"""ATOM's names, as seed 000 shows them (ATOM has no engine package here)."""


@lru_cache(maxsize=1)
def naming_rules() -> tuple[NamingRule, ...]:
    """Every known naming rule: ATOM's, then each registered engine's ``layer_naming``."""
    rules = [ATOM_NAMING]
    for engine in engine_names():
        for naming in facts_of(engine).layer_naming:
            rules.append(
                NamingRule(
                    engine=engine,
                    model_types=naming.model_types,
                    attention=naming.attention,
                    kda=naming.kda,
                    draft=naming.draft,
                    source=naming.source,
                )
            )
    return tuple(rules)


def __getattr__(name: str) -> tuple[NamingRule, ...]:
    # NAMING_RULES: every engine's rules, known once the engine packages have registered.
    if name == "NAMING_RULES":
        return naming_rules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TARGET_ATTENTION_NAME: Final = ATOM_NAMING.attention
"""ATOM's name of a target MLA layer; ``layer`` is the module layer id."""

TARGET_KDA_NAME: Final = ATOM_NAMING.kda
"""ATOM's name of a target KDA layer (the KDA module itself, ``self_attn``)."""

DRAFT_ATTENTION_NAME: Final = ATOM_NAMING.draft
"""ATOM's name of a draft MLA layer; ``index`` counts the draft's own layers from 0."""

INDEX_REGION_SUFFIX: Final = ".indexer.k_cache"
"""Appended to an attention layer's name for its DSA ``index_cache`` region."""

RING_REGION_SUFFIX: Final = ".indexer.tail_cache"
"""Appended to an attention layer's name for its indexer's tail ring (vLLM's
``Glm5NextTailCache``, registered beside the key cache)."""


class LayerNames(Frozen):
    """The registered name of every module layer: ``names[i]`` is module layer ``i``'s.

    >>> from k3layout import preset
    >>> names = engine_layer_names(preset("kimi-k3-dspark"))
    >>> names.name(3), names.name(0), names.name(93)
    ('model.layers.3.self_attn.attn', 'model.layers.0.self_attn', 'draft.layers.0.self_attn.attn')
    """

    names: tuple[str, ...]

    @model_validator(mode="after")
    def _unique(self) -> LayerNames:
        if len(set(self.names)) != len(self.names):
            repeated = sorted(name for name, count in Counter(self.names).items() if count > 1)
            raise ValueError(f"names: {repeated} are given to more than one layer")
        if not all(self.names):
            raise ValueError("names: every layer needs a non-empty name")
        return self

    def name(self, layer: int) -> str:
        """The name of module layer ``layer``."""
        if not 0 <= expect_int("layer", layer) < len(self.names):
            raise Refusal(
                "layer_names",
                f"module layer {layer} has no name ({len(self.names)} layers are named)",
                facts={"layer": layer, "num_names": len(self.names)},
                hint=f"name every module layer 0..{len(self.names) - 1}",
            )
        return self.names[layer]

    def layer_of(self, name: str) -> int:
        """The module layer registered as ``name``."""
        expect("name", name, str)
        try:
            return self.names.index(name)
        except ValueError:
            raise Refusal(
                "layer_names",
                f"layer name {name!r} is not a layer of the model",
                facts={"name": name},
                hint="use the names the engine registered (see engine_layer_names)",
            ) from None

    def check_covers(self, model: HybridModel) -> None:
        """Refuse (``layer_names``) names that are not one per module layer of ``model``."""
        if len(self.names) != len(model.module_layers):
            raise Refusal(
                "layer_names",
                f"model {model.name}: {len(self.names)} layer names given for "
                f"{len(model.module_layers)} module layers",
                facts={
                    "model": model.name,
                    "num_names": len(self.names),
                    "num_module_layers": len(model.module_layers),
                },
                hint="give one name per module layer, target then draft",
            )


@lru_cache(maxsize=1)
def _rules_by_engine() -> dict[str, tuple[NamingRule, ...]]:
    """:data:`NAMING_RULES` by the engine that names by them, in table order."""
    by_engine: dict[str, list[NamingRule]] = {}
    for rule in naming_rules():
        by_engine.setdefault(rule.engine, []).append(rule)
    return {engine: tuple(rules) for engine, rules in by_engine.items()}


def naming_rule(model: HybridModel, engine: NamingEngine = "atom") -> NamingRule:
    """The rule ``engine`` names ``model``'s layers by (refuses an engine with no rule)."""
    expect_args(("model", model, HybridModel))
    expect("engine", engine, str)
    for rule in _rules_by_engine().get(engine, ()):
        if not rule.model_types or model.model_type in rule.model_types:
            return rule
    engines = sorted(_rules_by_engine())
    raise Refusal(
        "invalid_argument",
        f"engine={engine!r} has no naming rule (known: {', '.join(engines)})",
        facts={"engine": engine, "engines": tuple(engines)},
        hint=f"use engine in {engines}",
    )


def engine_layer_names(model: HybridModel, engine: NamingEngine = "atom") -> LayerNames:
    """The names ``engine`` registers every module layer of ``model`` under (target, then
    draft), by its :func:`naming_rule`.

    >>> from k3layout import preset
    >>> names = engine_layer_names(preset("kimi-k3-dspark"), "vllm")
    >>> names.name(3), names.name(93)
    ('language_model.model.layers.3.self_attn', 'model.layers.93.self_attn')
    """
    rule = naming_rule(model, engine)
    # The names depend only on the rule, which module layers are attention layers (the model
    # caches their ids) and where the target ends: one LayerNames per such layout, shared.
    return _names_of(rule, model.num_layers, len(model.module_layers), model.attention_layer_ids)


@lru_cache(maxsize=256)
def _names_of(rule: NamingRule, target: int, total: int, attention: tuple[int, ...]) -> LayerNames:
    is_attention = set(attention)
    names = [rule.target_name(layer, attention=layer in is_attention) for layer in range(target)]
    names.extend(rule.draft_name(target + k, k) for k in range(total - target))
    if len(set(names)) != len(names):  # a rule naming two layers alike: a table bug
        return LayerNames(names=tuple(names))
    # One name per module layer id, distinct (checked above): nothing to re-validate.
    return trusted(LayerNames, names=tuple(names))


def index_region_name(attention_name: str) -> str:
    """The name of an attention layer's DSA index region; refuses (``invalid_argument``) an
    ``attention_name`` that is not a non-empty ``str``."""
    if type(attention_name) is not str or not attention_name:
        expect("attention_name", attention_name, str)
        if not attention_name:
            raise Refusal(
                "invalid_argument",
                "attention_name is empty: an attention layer's name is not",
                facts={"field": "attention_name"},
                hint="pass the name the engine registered the attention layer under",
            )
    return attention_name + INDEX_REGION_SUFFIX


def ring_region_name(attention_name: str) -> str:
    """The name of an attention layer's tail ring region (:data:`RING_REGION_SUFFIX`);
    refuses what :func:`index_region_name` refuses."""
    return index_region_name(attention_name).removesuffix(INDEX_REGION_SUFFIX) + (
        RING_REGION_SUFFIX
    )


def name_order(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` in name order, as an engine publishing by name would list them; refuses
    (``invalid_argument``) ``names`` that are not a sequence of ``str``."""
    return sorted_names(cast(Sequence[str], expect_sequence("names", names, str)))


def sorted_names(names: Sequence[str]) -> tuple[str, ...]:
    """:func:`name_order` of names known to be strings."""
    return tuple(sorted(names))
