"""Hypothesis strategies and invariant checks for sweeping the planner.

Used by this project's own property tests and importable by engines for theirs::

    from hypothesis import given
    from k3layout import plan
    from k3layout.testing import plannable_inputs, plan_invariant_violations

    @given(plannable_inputs())
    def test_every_plan_holds_together(inputs):
        model, deployment = inputs
        assert plan_invariant_violations(plan(model, deployment)) == []

Needs ``hypothesis`` (``pip install k3layout[dev]``); :func:`plan_invariant_violations` lives in
:mod:`k3layout.layouts.invariants`, which does not, and is re-exported here.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from functools import reduce
from typing import Any

from hypothesis import strategies as st

from ._args import expect_args
from .cache import DSAIndexer
from .deployment import CONV_LAYOUTS, Deployment, EngineFlavour
from .dtypes import KV_CACHE_DTYPES, KvCacheDtype
from .errors import RefusalCode
from .layouts.invariants import plan_invariant_violations
from .layouts.seams import rules_for
from .model import PRESETS, GQALayer, HybridModel, KDALayer, Layer, MLALayer, preset
from .registry import engine_names
from .settings import KvCacheLayout

__all__ = [
    "deployments",
    "dsa_indexers",
    "hybrid_models",
    "indexed_mla_layers",
    "kda_layers",
    "mla_layers",
    "models",
    "pipeline_depths",
    "plan_invariant_violations",
    "plannable_inputs",
    "preset_models",
    "refused_inputs",
    "vllm_pipeline_depths",
]

HEAD_COUNTS = (4, 8, 12, 16, 24, 32, 48, 64, 96)


def mla_layers(num_heads: int | None = None) -> st.SearchStrategy[MLALayer]:
    """MLA layers with small latents, optionally with a DSA index row."""
    return st.builds(
        MLALayer,
        num_heads=st.just(num_heads) if num_heads else st.sampled_from(HEAD_COUNTS),
        kv_lora_rank=st.sampled_from((128, 256, 512)),
        qk_rope_head_dim=st.sampled_from((32, 64)),
        q_lora_rank=st.one_of(st.none(), st.sampled_from((256, 1536))),
        index_bytes_per_token=st.sampled_from((0, 0, 132)),
    )


def kda_layers(num_heads: int | None = None) -> st.SearchStrategy[KDALayer]:
    """KDA layers with a range of heads, head dims and conv kernels."""
    return st.builds(
        KDALayer,
        num_heads=st.just(num_heads) if num_heads else st.sampled_from(HEAD_COUNTS),
        head_dim=st.sampled_from((32, 64, 128)),
        conv_kernel=st.sampled_from((2, 3, 4)),
    )


def dsa_indexers() -> st.SearchStrategy[DSAIndexer]:
    """Pooled DSA indexers (GLM-5.3-Flash's kind): keys pooled over 2 to 32 tokens, key
    widths around GLM's 128, a top-k a whole number of pools."""
    return st.builds(
        DSAIndexer,
        head_dim=st.sampled_from((64, 128, 256)),
        num_heads=st.sampled_from((16, 32, 64)),
        kpool=st.sampled_from((2, 4, 8, 16, 32)),
        topk=st.just(2048),
    )


def indexed_mla_layers(num_heads: int | None = None) -> st.SearchStrategy[MLALayer]:
    """NoPE MLA layers with a pooled DSA indexer (GLM-5.3-Flash's family: a 512 latent, the
    one head the engines' sparse backends take)."""
    return st.builds(
        MLALayer,
        num_heads=st.just(num_heads) if num_heads else st.sampled_from(HEAD_COUNTS),
        kv_lora_rank=st.just(512),
        qk_rope_head_dim=st.just(0),
        q_lora_rank=st.sampled_from((768, 1536)),
        indexer=dsa_indexers(),
    )


@st.composite
def hybrid_models(
    draw: st.DrawFn,
    max_layers: int = 48,
    draft: bool | None = None,
    kda: bool = True,
    indexed: bool | None = False,
) -> HybridModel:
    """Hybrid models: one MLA and one KDA geometry, any layer pattern with at least one MLA
    layer, optionally draft layers (``draft=None``: either; MLA or GQA) and DSA index rows.
    ``indexed`` (``None``: either) gives the MLA layers a pooled indexer instead (the
    GLM-5.3-Flash family, whose drafts are MTP layers of the same kind)."""
    num_layers = draw(st.integers(1, max_layers))
    heads = draw(st.sampled_from(HEAD_COUNTS))
    pooled = draw(st.booleans()) if indexed is None else indexed
    mla = draw(indexed_mla_layers(heads) if pooled else mla_layers(heads))
    kda_layer = draw(kda_layers(draw(st.sampled_from((heads, heads * 2, heads // 2 or 1)))))
    kinds = draw(st.lists(st.booleans(), min_size=num_layers, max_size=num_layers))
    if not kda:
        kinds = [True] * num_layers
    if not any(kinds):
        kinds[draw(st.integers(0, num_layers - 1))] = True
    layers: tuple[Layer, ...] = tuple(mla if is_mla else kda_layer for is_mla in kinds)
    least, most = {None: (0, 6), True: (1, 6), False: (0, 0)}[draft]
    num_draft = draw(st.integers(least, most))
    drafted: Layer = mla
    if (
        num_draft
        and not pooled
        and not mla.index_bytes_per_token
        and mla.latent_dim % 2 == 0
        and draw(st.booleans())
    ):
        # A GQA draft (DSpark may be GQA) whose one replicated KV head's K and V rows are as
        # long as the latent row, so every engine can give it one page size at any TP.
        drafted = GQALayer(num_heads=heads, num_kv_heads=1, head_dim=mla.latent_dim // 2)
    return HybridModel(
        name=f"synthetic-{num_layers}",
        model_type="glm5_next" if pooled else "kimi_k3",
        layers=layers,
        draft_layers=(drafted,) * num_draft,
    )


def preset_models() -> st.SearchStrategy[HybridModel]:
    """The built-in presets."""
    return st.sampled_from(tuple(PRESETS)).map(preset)


def models() -> st.SearchStrategy[HybridModel]:
    """Presets and synthetic hybrid models of both families (K3's, GLM-5.3-Flash's)."""
    return st.one_of(preset_models(), hybrid_models(), hybrid_models(indexed=True))


def _heads(model: HybridModel) -> int:
    return reduce(math.gcd, (layer.num_heads for layer in model.module_layers))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _kv_dtypes(model: HybridModel, engine: EngineFlavour) -> tuple[KvCacheDtype, ...]:
    """The cache dtypes ``model``'s layers and ``engine`` all take: FlashMLA's packed row only
    without GQA, and only where the engine takes it."""
    taken = rules_for(engine).facts.kv_dtypes
    gqa = any(layer.kind == "gqa" for layer in model.module_layers)
    return tuple(d for d in KV_CACHE_DTYPES if d in taken and not (gqa and d == "fp8_ds_mla"))


def _engine_settings(
    draw: st.DrawFn,
    model: HybridModel,
    fields: dict[str, Any],
    layouts: tuple[str, ...],
    plannable: bool,
) -> dict[str, Any]:
    """The engine's own settings, drawn by its package's ``strategies`` module (none where
    it has none): ``settings(draw, model, fields, layouts, plannable)`` returns deployment
    fields, overriding those drawn for every engine (``fields``)."""
    package = rules_for(fields["engine"]).facts.package
    name = f"{package}.strategies"
    if not package or importlib.util.find_spec(name) is None:
        return {}
    module = importlib.import_module(name)
    drawn: dict[str, Any] = module.settings(draw, model, fields, layouts, plannable)
    return drawn


def vllm_pipeline_depths(model: HybridModel, up_to: int) -> tuple[int, ...]:
    """The pipeline depths up to ``up_to`` (vLLM's even split) at which vLLM plans ``model``
    (every depth up to its layers: a stage without attention is planned as vLLM plans it).
    Refuses (``invalid_argument``) arguments of the wrong type."""
    expect_args(("model", model, HybridModel), ("up_to", up_to, int))
    return pipeline_depths(model, "vllm", up_to)


def pipeline_depths(model: HybridModel, engine: EngineFlavour, up_to: int) -> tuple[int, ...]:
    """The pipeline depths up to ``up_to`` at which ``engine`` plans ``model`` (its own
    stage split: vLLM needs an attention layer on every stage holding state layers)."""
    expect_args(("model", model, HybridModel), ("engine", engine, str), ("up_to", up_to, int))
    serves = rules_for(engine).pipeline_ok
    return tuple(pp for pp in range(1, min(model.num_layers, up_to) + 1) if serves(model, pp))


@st.composite
def deployments(
    draw: st.DrawFn,
    model: HybridModel,
    engine: EngineFlavour | None = None,
    plannable: bool = True,
    layouts: tuple[KvCacheLayout, ...] = ("LBNHC",),
) -> Deployment:
    """Deployments of ``model``. With ``plannable`` the parallelism is valid for the model
    (attention TP divides the heads, DCP divides TP, PP fits the layers); the packing may still
    be refused (padding limit), which a sweep must accept as a refusal with a code.
    ``layouts``: the vLLM KV-cache layouts to draw (``BLHNC`` with the one backend that serves
    it; the adapter and the ride take ``LBNHC`` only)."""
    engine = engine or draw(st.sampled_from(engine_names()))
    rules = rules_for(engine)
    heads = _heads(model)
    attn_tp = draw(st.sampled_from(_divisors(heads)) if plannable else st.integers(1, 2 * heads))
    dcp = 1
    if rules.facts.decode_context_parallel:
        dcp = draw(st.sampled_from(_divisors(attn_tp)) if plannable else st.integers(1, 16))
    if plannable:  # the engine's own stage split must serve the depth
        pp = draw(st.sampled_from(pipeline_depths(model, engine, 8)))
    else:
        pp = draw(st.integers(1, min(model.num_layers, 8)))
    block = draw(st.one_of(st.none(), st.sampled_from((16, 64, 128, 256, 512, 2048))))
    # Every raised block is a power-of-two multiple of 128 (the requested blocks are powers
    # of two), so an interleave of up to 16 always divides it.
    interleave = draw(st.sampled_from((1, 1, 2, 4, 8, 16)))
    fields: dict[str, Any] = dict(
        engine=engine,
        attn_tp=attn_tp,
        attn_dp=draw(st.sampled_from((1, 1, 2, 8))),
        pp=pp,
        dcp=dcp,
        dcp_interleave=interleave,
        kv_dtype=draw(st.sampled_from(_kv_dtypes(model, engine))),
        spec_tokens=draw(st.integers(0, 7)),
        max_padding=None,  # tokenspeed's own setting: its strategies draw it
        replayssm=draw(st.booleans()),
        conv_layout=draw(st.sampled_from(CONV_LAYOUTS)),
        block_tokens=block,
    )
    fields.update(_engine_settings(draw, model, fields, layouts, plannable))
    return Deployment(**fields)


@st.composite
def plannable_inputs(
    draw: st.DrawFn,
    engine: EngineFlavour | None = None,
    layouts: tuple[KvCacheLayout, ...] = ("LBNHC",),
) -> tuple[HybridModel, Deployment]:
    """A model and a deployment whose parallelism is valid for it, of a model the engine
    serves (its package's ``strategies.serves``, where it has one) in one of ``layouts`` (a
    model with pooled indexers is laid out block-outermost only)."""
    engine = engine or draw(st.sampled_from(engine_names()))
    blocked = "BLHNC" not in layouts
    model = draw(
        models().filter(
            lambda drawn: _serves(engine, drawn) and not (blocked and drawn.indexer is not None)
        )
    )
    return model, draw(deployments(model, engine=engine, layouts=layouts))


def _serves(engine: EngineFlavour, model: HybridModel) -> bool:
    package = rules_for(engine).facts.package
    name = f"{package}.strategies"
    if not package or importlib.util.find_spec(name) is None:
        return True
    serves = getattr(importlib.import_module(name), "serves", None)
    return True if serves is None else bool(serves(model))


@st.composite
def refused_inputs(draw: st.DrawFn) -> tuple[HybridModel, Deployment, RefusalCode]:
    """Near misses: one rule broken on purpose, with the refusal code it must raise."""
    model = draw(models())
    heads = _heads(model)
    case = draw(st.sampled_from(("heads", "dcp", "pp", "dcp_parent")))
    if case == "heads":
        # without speculative tokens vLLM builds no draft: only the target's heads must divide
        target = _heads(model.without_draft())
        tp = draw(st.integers(2, 4 * target).filter(lambda t: target % t != 0))
        return model, Deployment(attn_tp=tp), "heads_not_divisible"
    if case == "dcp":
        tp = draw(st.sampled_from(_divisors(heads)))
        dcp = draw(st.integers(2, 32).filter(lambda d: tp % d != 0))
        return model, Deployment(attn_tp=tp, dcp=dcp), "dcp_not_dividing_tp"
    if case == "pp":
        pp = draw(st.integers(model.num_layers + 1, model.num_layers + 8))
        return model, Deployment(pp=pp), "pp_too_deep"
    tp = draw(st.sampled_from([d for d in _divisors(heads) if d > 1] or [1]))
    return (
        model,
        Deployment(engine="tokenspeed", attn_tp=tp, dcp=tp if tp > 1 else 2),
        ("dcp_unsupported" if tp > 1 else "dcp_not_dividing_tp"),
    )
