"""tokenspeed's Kimi-K3 recipe registered as ``engine="tokenspeed"`` (``parent``, its old
name, is a deprecated alias): its seams for the planning pipeline."""

from __future__ import annotations

from ...deployment import Deployment
from ...layouts.pipeline import plan_with
from ...layouts.seams import EngineRules, register_engine
from ...model import HybridModel
from ...registry import EngineFacts, LayerNaming
from .budget import TOKENSPEED_BUDGET
from .invariants import parent_violations
from .launch import LAUNCH
from .layout import ParentPlan, group_tokenspeed, pack_tokenspeed
from .releases import MAIN, PR1152, TOKENSPEED_VERSIONS
from .rules import KV_CACHE_DTYPES, check_tokenspeed
from .weights import tokenspeed_weights

LAYER_NAMING = (
    LayerNaming(
        model_types=(),
        attention="layer.{layer}",
        kda="layer.{layer}",
        draft="layer.{layer}",
        source=(
            f"tokenspeed {MAIN.commit[:8]} ({MAIN.name}) and {PR1152.commit[:8]} "
            f"(#1152's head): python/tokenspeed/runtime/layers/attention/kv_cache/recipes/"
            "kimi_k3.py, KimiK3Recipe.fields_for_layer (fields layer.{id}.latent_kv, "
            "layer.{id}.conv_state, layer.{id}.recurrent_state), and recipes/setup.py, "
            "CacheSetup (a draft's layer i is global layer num_target_layers + i); recorded "
            "in tests/fixtures/tokenspeed-*/bind.json"
        ),
    ),
)
"""The names tokenspeed's cache plan gives each layer: ``layer.{id}``, the prefix of its
fields' ids (``layer.3.latent_kv``, ``layer.0.conv_state``), by global layer id, a draft's
layers continuing the target's (K3 + DSpark: ``layer.93`` .. ``layer.97``). Every recipe of
both revisions names fields so; the pools find a layer's tensors by it (``_bind_layer_planes``
in ``kv_cache/base.py``)."""

TOKENSPEED = register_engine(
    EngineRules(
        facts=EngineFacts(
            name="tokenspeed",
            spec_conv_rows=False,  # tokenspeed keeps K - 1 conv rows; drafts verify elsewhere
            kv_dtypes=KV_CACHE_DTYPES,
            package=__package__ or "",
            draft_kv_dtype="bf16",  # #1152 and main build the draft's MLA config in bf16
            separate_draft_kv_dtype=True,  # a later branch makes the draft follow the target
            aliases=("parent",),
            conv_layout="DS",  # tokenspeed's conv state is [channels, K - 1]
            launch=LAUNCH,
            listing_order=1,
            versions=TOKENSPEED_VERSIONS,  # #1152's head, then main: releases.REVISIONS
            layer_naming=LAYER_NAMING,
        ),
        plan_type=ParentPlan,
        check=check_tokenspeed,
        group=group_tokenspeed,
        pack=pack_tokenspeed,
        violations=parent_violations,
        pipeline_ok=lambda model, pp: pp == 1,  # tokenspeed has no pipeline stages
        budget=TOKENSPEED_BUDGET,
        weights=tokenspeed_weights,
    )
)
PARENT = TOKENSPEED
"""The same registration under the engine's old name."""


def plan_tokenspeed(model: HybridModel, deployment: Deployment) -> ParentPlan:
    """:func:`k3layout.plan` with ``engine="tokenspeed"`` whatever the deployment names."""
    result: ParentPlan = plan_with(TOKENSPEED, model, deployment)
    return result


plan_parent = plan_tokenspeed
"""The old name of :func:`plan_tokenspeed`."""
