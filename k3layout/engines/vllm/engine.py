"""vLLM (0.33.0 and 0.34.0) registered as ``engine="vllm"``: its seams for the planning pipeline."""

from __future__ import annotations

from ...deployment import Deployment
from ...layouts.pipeline import plan_with
from ...layouts.seams import EngineRules, register_engine
from ...model import HybridModel
from ...registry import EngineFacts, LayerNaming
from .budget import VLLM_BUDGET
from .invariants import vllm_violations
from .launch import LAUNCH
from .layout import VllmPlan, built_model, check_vllm, group_vllm, pack_vllm
from .releases import VLLM_VERSIONS
from .rules import DENSE_MLA_KV_DTYPES, PIPELINE_UNSERVED
from .weights import rank_weights

SOURCE = "vLLM 0.33.0's and 0.34.0's KVCacheConfig and bound caches (tests/conformance)"

LAYER_NAMING = (
    LayerNaming(
        # the multimodal checkpoints: their text model is nested
        model_types=("kimi_k3", "glm5_next"),
        attention="language_model.model.layers.{layer}.self_attn",
        kda="language_model.model.layers.{layer}.self_attn",
        draft="model.layers.{layer}.self_attn",
        source=SOURCE,
    ),
    LayerNaming(
        model_types=(),
        attention="model.layers.{layer}.self_attn",
        kda="model.layers.{layer}.self_attn",
        draft="model.layers.{layer}.self_attn",
        source=SOURCE,
    ),
)
"""The names vLLM (0.33, 0.34) registers layers under (drafts continue the numbering)."""

VLLM = register_engine(
    EngineRules(
        facts=EngineFacts(
            name="vllm",
            spec_conv_rows=True,  # vLLM's conv state keeps K - 1 + s rows
            decode_context_parallel=True,
            kv_dtypes=DENSE_MLA_KV_DTYPES,
            package=__package__ or "",
            launch=LAUNCH,
            listing_order=0,
            versions=VLLM_VERSIONS,
            kv_connectors=("lmcache",),
            layer_naming=LAYER_NAMING,
        ),
        plan_type=VllmPlan,
        check=check_vllm,
        group=group_vllm,
        pack=pack_vllm,
        built_model=built_model,
        violations=vllm_violations,
        pipeline_ok=lambda model, pp: pp == 1 or model.model_type not in PIPELINE_UNSERVED,
        weights=rank_weights,
        budget=VLLM_BUDGET,
    )
)


def plan_vllm(model: HybridModel, deployment: Deployment) -> VllmPlan:
    """:func:`k3layout.plan` with ``engine="vllm"`` whatever the deployment names."""
    result: VllmPlan = plan_with(VLLM, model, deployment)
    return result
