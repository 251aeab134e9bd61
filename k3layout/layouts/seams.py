"""What an engine adds to the planning pipeline: its seams, registered by its own package.

:func:`rules_for` answers, for ``deployment.engine``, the engine's refusals, grouping rule,
layout and invariants; the pipeline (:mod:`.pipeline`) calls them in one fixed order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from ..deployment import Deployment
from ..errors import Refusal
from ..memory import BudgetRule
from ..model import HybridModel
from ..registry import EngineFacts, lookup, register
from ..sizes import RankSizes
from ..weights import RankWeights
from .groups import Group, Stage
from .protocol import LayoutBase

__all__ = [
    "SGLANG_SETTINGS",
    "TOKENSPEED_SETTINGS",
    "UTILIZATION_SETTINGS",
    "VLLM_SETTINGS",
    "EngineRules",
    "refuse_settings",
    "register_engine",
    "rules_for",
]


def _builds_all(model: HybridModel, deployment: Deployment) -> HybridModel:
    return model


def _no_violations(plan: Any) -> list[str]:
    return []


def _any_pipeline(model: HybridModel, pp: int) -> bool:
    return True


@dataclass(frozen=True)
class EngineRules:
    """One engine's seams and facts.

    - ``check``: the engine's refusals (settings it does not take included); returns the
      model the engine builds (vLLM builds no drafter without speculative tokens);
    - ``group``: its grouping rule; ``pack``: its layout, returning the plan (of
      ``plan_type``);
    - ``built_model``: the model it builds (``check``'s answer, without refusals);
    - ``violations``: the engine's own plan invariants (:mod:`.invariants` adds the common);
    - ``pipeline_ok``: whether it plans ``model`` on ``pp`` stages of its own split;
    - ``weights``: the weights one rank of a pipeline stage holds, laid out as the engine's
      model classes lay them (``None``: the engine's weights are not modelled);
    - ``budget``: how it turns the GPU into a KV budget (``None``: not modelled).
    """

    facts: EngineFacts
    plan_type: type[LayoutBase]
    check: Callable[[HybridModel, Deployment], HybridModel]
    group: Callable[[HybridModel, RankSizes], tuple[Group, ...]]
    pack: Callable[[HybridModel, Deployment, RankSizes, tuple[Group, ...], tuple[Stage, ...]], Any]
    built_model: Callable[[HybridModel, Deployment], HybridModel] = _builds_all
    violations: Callable[[Any], list[str]] = _no_violations
    pipeline_ok: Callable[[HybridModel, int], bool] = _any_pipeline
    weights: Callable[[HybridModel, Deployment, int], RankWeights] | None = None
    budget: BudgetRule | None = None


TOKENSPEED_SETTINGS: tuple[tuple[str, object], ...] = (("max_padding", None),)
"""tokenspeed's settings (its recipe's padding limit) that the other engines do not take."""

SGLANG_SETTINGS: tuple[tuple[str, object], ...] = (
    ("mem_fraction_static", None),
    ("mamba_full_memory_ratio", None),
    ("max_running_requests", None),
    ("max_mamba_cache_size", None),
    ("max_total_tokens", None),
    ("mamba_track_interval", None),
)
"""Deployment fields only SGLang takes, at their unset values."""

UTILIZATION_SETTINGS: tuple[tuple[str, object], ...] = (("gpu_memory_utilization", None),)
"""vLLM's and tokenspeed's memory flag, which SGLang does not take (its own is
``mem_fraction_static``)."""

VLLM_SETTINGS: tuple[tuple[str, object], ...] = (
    ("attention_backend", None),
    ("kv_cache_layout", None),
    ("kda_prefill_backend", "auto"),
    ("mamba_cache_mode", None),
    ("block_tokens", None),
    ("dcp_interleave", 1),
    ("speculative_method", None),
    ("extensible_kv_cache", None),
    ("use_replayssm", False),
    ("mamba_backend", "triton"),
)
"""Deployment fields only vLLM takes, at their unset values: its attention backend, cache
layout, KDA prefill kernel, mamba cache mode, block size, DCP interleave, speculative method,
extensible KV cache, own ReplaySSM and Mamba backend."""


def refuse_settings(
    deployment: Deployment, settings: tuple[tuple[str, object], ...], owner: str
) -> None:
    """Refuse (``engine_setting``) a deployment field of ``settings`` set away from its unset
    value: a setting of ``owner``'s that ``deployment.engine`` would ignore silently."""
    for name, unset in settings:
        value = getattr(deployment, name)
        if value != unset:
            raise Refusal(
                "engine_setting",
                f"{name}={value!r} is {owner}'s setting; engine={deployment.engine} does not "
                "take it (it would be ignored)",
                facts={"engine": deployment.engine, "field": name},
                hint=f"leave {name} at {unset!r} for engine={deployment.engine}",
            )


def register_engine(rules: EngineRules) -> EngineRules:
    """Register ``rules`` (an engine package does this on import); returns them."""
    register(rules)
    return rules


def rules_for(name: object) -> EngineRules:
    """The rules of engine ``name`` (refuses a name no engine registered)."""
    return cast(EngineRules, lookup(name))
