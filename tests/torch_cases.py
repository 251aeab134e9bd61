"""Small plans for the torch adapter's property tests: Kimi's pattern at sizes a CPU allocates in
microseconds, both engines, pipeline stages, DSA index rows, draft layers and spec tokens."""

from __future__ import annotations

import math

from hypothesis import assume
from hypothesis import strategies as st

from k3layout import (
    Deployment,
    EngineFlavour,
    HybridModel,
    KDALayer,
    MLALayer,
    ParentPlan,
    Refusal,
    VllmPlan,
    plan,
)
from k3layout.cache import DSAIndexer
from k3layout.model import kimi_layer_pattern

GPUS = ("h200", "b200")
"""The GPUs of the indexed family's sparse backends (SM90, SM100)."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def small_models(draw: st.DrawFn, max_drafts: int = 3) -> HybridModel:
    """Kimi's 3:1 pattern, 4..14 layers, small heads (even head dims: whole fp32 words)."""
    heads = draw(st.sampled_from((1, 2, 4)))
    mla = MLALayer(
        num_heads=heads,
        kv_lora_rank=draw(st.sampled_from((8, 16))),
        qk_rope_head_dim=draw(st.sampled_from((4, 8))),
        index_bytes_per_token=draw(st.sampled_from((0, 0, 6))),
    )
    kda = KDALayer(
        num_heads=heads * draw(st.sampled_from((1, 2))),
        head_dim=draw(st.sampled_from((2, 4))),
        conv_kernel=draw(st.sampled_from((2, 3, 4))),
    )
    num_layers = draw(st.integers(4, 14))
    return HybridModel(
        name="small",
        model_type="kimi_k3",
        layers=kimi_layer_pattern(num_layers, mla, kda),
        draft_layers=(mla,) * draw(st.integers(0, max_drafts)),
    )


@st.composite
def small_indexed_models(draw: st.DrawFn) -> HybridModel:
    """GLM-5.3-Flash's family, small: 4..10 layers of Kimi's pattern, small KDA heads, NoPE
    MLA of the 512 latent the sparse backends take with a pooled indexer, MTP layers."""
    heads = draw(st.sampled_from((1, 2, 4)))
    mla = MLALayer(
        num_heads=heads,
        kv_lora_rank=512,
        qk_rope_head_dim=0,
        indexer=DSAIndexer(
            head_dim=draw(st.sampled_from((64, 128))),
            num_heads=4,
            topk=64,
            kpool=draw(st.sampled_from((2, 4, 8))),
        ),
    )
    kda = KDALayer(num_heads=heads, head_dim=draw(st.sampled_from((2, 4))), conv_kernel=4)
    return HybridModel(
        name="small-indexed",
        model_type="glm5_next",
        layers=kimi_layer_pattern(draw(st.integers(4, 10)), mla, kda),
        draft_layers=(mla,) * draw(st.integers(0, 1)),
    )


@st.composite
def small_plans(
    draw: st.DrawFn, engine: EngineFlavour | None = None
) -> tuple[VllmPlan | ParentPlan, int]:
    """A plannable small model and deployment, and one of its pipeline stages: either family
    on vLLM (the indexed one packed block-outermost, on the GPUs its sparse backends run on),
    K3's on tokenspeed."""
    flavour = engine or draw(st.sampled_from(("vllm", "tokenspeed")))
    indexed = flavour == "vllm" and draw(st.booleans())
    model = draw(small_indexed_models() if indexed else small_models())
    heads = math.gcd(*(layer.num_heads for layer in model.module_layers))
    tp = draw(st.sampled_from(divisors(heads)))
    pp = draw(st.integers(1, 2))
    spec = draw(st.integers(0, 2))
    deployment = Deployment(
        engine=flavour,
        attn_tp=tp,
        pp=pp,
        dcp=draw(st.sampled_from(divisors(tp))) if flavour == "vllm" and not indexed else 1,
        kv_dtype=draw(st.sampled_from(("fp8", "bf16"))),
        spec_tokens=spec,
        **(
            {"speculative_method": "mtp" if spec else None, "gpu": draw(st.sampled_from(GPUS))}
            if indexed
            else {}
        ),
    )
    try:
        result = plan(model, deployment)
    except Refusal:
        assume(False)
        raise
    assert isinstance(result, VllmPlan | ParentPlan)  # the engines drawn
    return result, draw(st.integers(0, pp - 1))
