"""The names an engine registers its cache layers under, defined once.

vLLM registers every attention and KDA layer in its static forward context under the module
path of the layer; the KV connector sees the same names. The convention here:

- target MLA layer ``i``: ``model.layers.{i}.self_attn.attn``
- target KDA layer ``i``: ``model.layers.{i}.self_attn``
- draft MLA layer ``k`` (the draft's own count from 0): ``draft.layers.{k}.self_attn.attn``
- the DSA index region of an attention layer: ``<attention name>.indexer.k_cache``

The speculative draft (K3's DSpark) is its own module tree, loaded after the target, so its
layers are *registered* after the target's (module layers 93..97) but their names begin with
``draft.``, which sorts before ``model.``. In name order the five draft layers therefore come
first: five of K3 + DSpark's 29 attention layers sort ahead of the 23 the KDA state aliases,
which is what the seed's first boot ran into.

*Name order* is plain string order (``sorted``), as an engine gets when it publishes planes by
name: ``model.layers.11...`` sorts before ``model.layers.3...``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Final

from pydantic import model_validator

from .._args import expect_args
from .._frozen import Frozen, trusted
from ..errors import Refusal
from ..model import HybridModel

TARGET_ATTENTION_NAME: Final = "model.layers.{layer}.self_attn.attn"
"""An MLA layer of the target; ``layer`` is the module layer id."""

TARGET_KDA_NAME: Final = "model.layers.{layer}.self_attn"
"""A KDA layer of the target (vLLM registers the KDA module itself under ``self_attn``)."""

DRAFT_ATTENTION_NAME: Final = "draft.layers.{index}.self_attn.attn"
"""A draft MLA layer; ``index`` counts the draft's own layers from 0."""

INDEX_REGION_SUFFIX: Final = ".indexer.k_cache"
"""Appended to an attention layer's name for its DSA ``index_cache`` region."""


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
        if not 0 <= layer < len(self.names):
            raise Refusal(
                "layer_names",
                f"module layer {layer} has no name ({len(self.names)} layers are named)",
                facts={"layer": layer, "num_names": len(self.names)},
                hint=f"name every module layer 0..{len(self.names) - 1}",
            )
        return self.names[layer]

    def layer_of(self, name: str) -> int:
        """The module layer registered as ``name``."""
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


def engine_layer_names(model: HybridModel) -> LayerNames:
    """The convention's names for every module layer of ``model`` (target, then draft)."""
    expect_args(("model", model, HybridModel))
    # The names depend only on which module layers are attention layers (the model caches
    # their ids) and where the target ends: one LayerNames per such layout, shared.
    return _names_of(model.num_layers, len(model.module_layers), model.attention_layer_ids)


@lru_cache(maxsize=256)
def _names_of(target: int, total: int, attention: tuple[int, ...]) -> LayerNames:
    # The templates split once around their one field: a concatenation per layer.
    attention_head, attention_tail = TARGET_ATTENTION_NAME.split("{layer}")
    kda_head, kda_tail = TARGET_KDA_NAME.split("{layer}")
    draft_head, draft_tail = DRAFT_ATTENTION_NAME.split("{index}")
    is_attention = set(attention)
    names = [
        f"{attention_head}{layer_id}{attention_tail}"
        if layer_id in is_attention
        else f"{kda_head}{layer_id}{kda_tail}"
        for layer_id in range(target)
    ]
    names.extend(f"{draft_head}{k}{draft_tail}" for k in range(total - target))
    # One name per module layer id, distinct by construction: nothing to re-validate.
    return trusted(LayerNames, names=tuple(names))


def index_region_name(attention_name: str) -> str:
    """The name of an attention layer's DSA index region."""
    return attention_name + INDEX_REGION_SUFFIX


def name_order(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` in name order, as an engine publishing by name would list them."""
    return tuple(sorted(names))
