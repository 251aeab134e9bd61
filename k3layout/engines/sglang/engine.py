"""SGLang 0.5.23 registered as ``engine="sglang"``: its seams for the planning pipeline."""

from __future__ import annotations

from ...deployment import Deployment
from ...layouts.pipeline import plan_with
from ...layouts.seams import EngineRules, register_engine
from ...model import HybridModel
from ...registry import EngineFacts
from .budget import SGLANG_BUDGET
from .invariants import sglang_violations
from .launch import LAUNCH
from .layout import SglangPlan, built_model, check_sglang, group_sglang, pack_sglang
from .rules import KV_DTYPE_NAMES, PD_REFUSAL_NOTE, SGLANG_VERSION
from .weights import sglang_weights

SGLANG = register_engine(
    EngineRules(
        facts=EngineFacts(
            name="sglang",
            spec_conv_rows=False,  # SGLang verifies draft steps in a scratch buffer
            decode_context_parallel=True,
            kv_dtypes=tuple(KV_DTYPE_NAMES),
            package=__package__ or "",
            launch=LAUNCH,
            listing_order=2,
            versions=(SGLANG_VERSION,),
            gathers_state=True,  # SGLang pairs prefill TP 8 with decode TP 2
            decode_pp_matches_prefill=True,
            pd_refusal_note=PD_REFUSAL_NOTE,
            pp_remainder_skips_last=False,  # get_pp_indices: the last stages take the rest
            scaled_fp8_latent_majors=(9,),  # DSA's flashmla_kv keeps fp8 rows with scales
        ),
        plan_type=SglangPlan,
        check=check_sglang,
        group=group_sglang,
        pack=pack_sglang,
        built_model=built_model,
        violations=sglang_violations,
        weights=sglang_weights,
        budget=SGLANG_BUDGET,
    )
)


def plan_sglang(model: HybridModel, deployment: Deployment) -> SglangPlan:
    """:func:`k3layout.plan` with ``engine="sglang"`` whatever the deployment names."""
    result: SglangPlan = plan_with(SGLANG, model, deployment)
    return result
