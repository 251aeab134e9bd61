"""vLLM 0.33 registered as ``engine="vllm"``: its seams for the planning pipeline."""

from __future__ import annotations

from ..._args import expect_args
from ...deployment import Deployment
from ...layouts.pipeline import run_pipeline, with_engine
from ...layouts.seams import EngineRules, register_engine
from ...model import HybridModel
from ...registry import EngineFacts
from .invariants import vllm_violations
from .layout import VllmPlan, built_model, check_vllm, group_vllm, pack_vllm, serves_pipeline
from .rules import DENSE_MLA_KV_DTYPES

VLLM = register_engine(
    EngineRules(
        facts=EngineFacts(
            name="vllm",
            spec_conv_rows=True,  # vLLM's conv state keeps K - 1 + s rows
            decode_context_parallel=True,
            kv_dtypes=DENSE_MLA_KV_DTYPES,
            package=__package__ or "",
            listing_order=0,
        ),
        plan_type=VllmPlan,
        check=check_vllm,
        group=group_vllm,
        pack=pack_vllm,
        built_model=built_model,
        violations=vllm_violations,
        pipeline_ok=serves_pipeline,
    )
)


def plan_vllm(model: HybridModel, deployment: Deployment) -> VllmPlan:
    """:func:`k3layout.plan` with ``engine="vllm"`` whatever the deployment names."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    result: VllmPlan = run_pipeline(model, with_engine(deployment, "vllm"), VLLM)
    return result
