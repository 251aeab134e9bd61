"""The weights per rank of a deployment, as its engine lays them out (the engine's ``weights``
seam), stage by stage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

from .._args import expect_args
from ..deployment import Deployment
from ..errors import Refusal, RefusalCode
from ..model import HybridModel
from ..registry import lookup
from ..weights import RankWeights, WeightsPlan


class WeightRules(Protocol):
    """What the weights ask of an engine's registration (its seams,
    :class:`k3layout.layouts.seams.EngineRules`), read through the registry."""

    @property
    def check(self) -> Callable[[HybridModel, Deployment], HybridModel]: ...
    @property
    def weights(self) -> Callable[[HybridModel, Deployment, int], RankWeights] | None: ...


def weights_per_rank(model: HybridModel, deployment: Deployment) -> WeightsPlan:
    """What one rank of every pipeline stage holds of ``model``'s weights under
    ``deployment`` (the model the engine builds: a draft only with speculative tokens).

    Refuses (``weights_unknown``) a model without an :class:`~k3layout.model.architecture.
    Architecture` (one built by hand rather than loaded from a ``config.json`` or a preset),
    an engine whose weights are not modelled, and (``quantization_unsupported``) what the
    config says that k3layout does not lay out; the engine's own refusals (a quantized shard
    its kernels cannot cut) come from its rule.

    >>> from k3layout import Deployment, preset, weights_per_rank
    >>> plan = weights_per_rank(preset("kimi-linear-48b"), Deployment(attn_tp=8))
    >>> plan.max_bytes > 0
    True
    """
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    rules = cast(WeightRules, lookup(deployment.engine))
    architecture = model.architecture
    if architecture is None:
        raise Refusal(
            "weights_unknown",
            f"model {model.name}: its weights are not known (a model built by hand has layers "
            "but no architecture)",
            facts={"model": model.name, "field": "architecture"},
            hint="load the model from its config.json (load_config) or use a preset",
        )
    if architecture.unsupported:
        field, why = architecture.unsupported[0]
        code: RefusalCode = (
            "quantization_unsupported" if "quantization" in field else "weights_unknown"
        )
        raise Refusal(
            code,
            why,
            facts={"model": model.name, "field": field},
            hint="plan the weights of a checkpoint k3layout lays out",
        )
    if rules.weights is None:
        raise Refusal(
            "weights_unknown",
            f"engine={deployment.engine}: its weights are not modelled",
            facts={"engine": deployment.engine},
            hint="give the KV budget itself (kv_memory_bytes)",
        )
    built = rules.check(model, deployment)
    return WeightsPlan(
        stages=tuple(rules.weights(built, deployment, stage) for stage in range(deployment.pp))
    )
