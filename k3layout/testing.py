"""Hypothesis strategies and invariant checks for sweeping the planner.

Used by this project's own property tests and importable by engines for theirs::

    from hypothesis import given
    from k3layout import plan, preset
    from k3layout.testing import deployments, plan_invariant_violations

    @given(deployments(preset("kimi-k3-dspark"), "vllm", attn_tp=8))
    def test_every_plan_holds_together(deployment):
        assert plan_invariant_violations(plan(preset("kimi-k3-dspark"), deployment)) == []

:func:`deployments` pins any :class:`~k3layout.Deployment` field (a value, or a strategy for
it) and draws the others among the values with which the deployment plans, by construction:
no filter, no ``assume``, no draw thrown away (:mod:`k3layout._deployment_space` says how).
:func:`plannable_inputs` draws a model an engine plans and such a deployment of it.

Needs ``hypothesis`` (``pip install k3layout[dev]``); :func:`plan_invariant_violations` lives in
:mod:`k3layout.layouts.invariants`, which does not, and is re-exported here.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from hypothesis import strategies as st

from . import _deployment_space as space
from ._args import expect_args
from ._deployment_draws import checked_layouts, deployments, module_heads
from ._deployment_witness import find_witness
from .cache import DSAIndexer
from .deployment import Deployment, EngineFlavour
from .errors import Refusal, RefusalCode
from .layouts.invariants import plan_invariant_violations
from .layouts.seams import rules_for
from .model import PRESETS, GQALayer, HybridModel, KDALayer, Layer, MLALayer, preset
from .registry import canonical_name, engine_names
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
    "served_models",
    "vllm_pipeline_depths",
]

HEAD_COUNTS = (4, 8, 12, 16, 24, 32, 48, 64, 96)
INDEX_HEAD_DIMS = (64, 128, 256)


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


def dsa_indexers(head_dims: tuple[int, ...] = INDEX_HEAD_DIMS) -> st.SearchStrategy[DSAIndexer]:
    """Pooled DSA indexers (GLM-5.3-Flash's kind): keys pooled over 2 to 32 tokens, key
    widths around GLM's 128 (``head_dims``), a top-k a whole number of pools."""
    return st.builds(
        DSAIndexer,
        head_dim=st.sampled_from(head_dims),
        num_heads=st.sampled_from((16, 32, 64)),
        kpool=st.sampled_from((2, 4, 8, 16, 32)),
        topk=st.just(2048),
    )


def indexed_mla_layers(
    num_heads: int | None = None, head_dims: tuple[int, ...] = INDEX_HEAD_DIMS
) -> st.SearchStrategy[MLALayer]:
    """NoPE MLA layers with a pooled DSA indexer (GLM-5.3-Flash's family: a 512 latent, the
    one head the engines' sparse backends take)."""
    return st.builds(
        MLALayer,
        num_heads=st.just(num_heads) if num_heads else st.sampled_from(HEAD_COUNTS),
        kv_lora_rank=st.just(512),
        qk_rope_head_dim=st.just(0),
        q_lora_rank=st.sampled_from((768, 1536)),
        indexer=dsa_indexers(head_dims),
    )


@st.composite
def hybrid_models(
    draw: st.DrawFn,
    max_layers: int = 48,
    draft: bool | None = None,
    kda: bool = True,
    indexed: bool | None = False,
    *,
    kda_groups: int | None = None,
    gqa_drafts: bool = True,
    index_head_dims: tuple[int, ...] = INDEX_HEAD_DIMS,
) -> HybridModel:
    """Hybrid models: one MLA and one KDA geometry, any layer pattern with at least one MLA
    layer, optionally draft layers (``draft=None``: either; MLA or GQA) and DSA index rows.
    ``indexed`` (``None``: either) gives the MLA layers a pooled indexer instead (the
    GLM-5.3-Flash family, whose drafts are MTP layers of the same kind) of a key width in
    ``index_head_dims``. ``kda_groups``: the KDA layers split into that many equal groups,
    none longer than the MLA layers (a recipe whose group's ``j``-th state rides on the
    ``j``-th MLA layer's plane, as tokenspeed's K3 recipe lays them out); ``gqa_drafts=False``:
    MLA drafts only."""
    pooled = draw(st.booleans()) if indexed is None else indexed
    if kda_groups is None:
        num_layers = draw(st.integers(1, max_layers))
        heads = draw(st.sampled_from(HEAD_COUNTS))
        kinds = _layer_kinds(draw, num_layers, kda)
    else:  # groups of g KDA layers riding on the planes of g MLA layers or more
        per_group = draw(st.integers(1, max(1, (max_layers - 1) // (kda_groups + 1))))
        num_mla = draw(st.integers(per_group, max(per_group, max_layers - per_group * kda_groups)))
        heads = draw(st.sampled_from(HEAD_COUNTS))
        kinds = list(draw(st.permutations([True] * num_mla + [False] * per_group * kda_groups)))
        num_layers = len(kinds)
    mla = draw(indexed_mla_layers(heads, index_head_dims) if pooled else mla_layers(heads))
    kda_layer = draw(kda_layers(draw(st.sampled_from((heads, heads * 2, heads // 2 or 1)))))
    layers: tuple[Layer, ...] = tuple(mla if is_mla else kda_layer for is_mla in kinds)
    least, most = {None: (0, 6), True: (1, 6), False: (0, 0)}[draft]
    num_draft = draw(st.integers(least, most))
    drafted: Layer = mla
    if (
        num_draft
        and gqa_drafts
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


def _layer_kinds(draw: st.DrawFn, num_layers: int, kda: bool) -> list[bool]:
    """Which of ``num_layers`` layers are MLA (``True``): any pattern with one at least."""
    kinds = draw(st.lists(st.booleans(), min_size=num_layers, max_size=num_layers))
    if not kda:
        kinds = [True] * num_layers
    if not any(kinds):
        kinds[draw(st.integers(0, num_layers - 1))] = True
    return kinds


def preset_models() -> st.SearchStrategy[HybridModel]:
    """The built-in presets."""
    return st.sampled_from(tuple(PRESETS)).map(preset)


def models() -> st.SearchStrategy[HybridModel]:
    """Presets and synthetic hybrid models of both families (K3's, GLM-5.3-Flash's)."""
    return st.one_of(preset_models(), hybrid_models(), hybrid_models(indexed=True))


MODEL_CANDIDATES = 4
"""Synthetic models a draw of :func:`served_models` plans at most: the first the engine plans
is drawn, else a preset it plans (a recipe as strict as tokenspeed's plans about two in
three synthetic models, so four leave the preset to about one draw in a hundred)."""


@cache
def _preset(name: str) -> HybridModel:
    """One object per preset: plans and verdicts are memoized per model object."""
    return preset(name)


@cache
def _served_presets(engine: str, layouts: tuple[str, ...]) -> tuple[str, ...]:
    """The presets ``engine`` plans in ``layouts`` (a deployment one step from the start;
    an indexed one only where ``layouts`` hold ``BLHNC``, as :func:`served_models` says)."""
    return tuple(
        name
        for name in PRESETS
        if ("BLHNC" in layouts or _preset(name).indexer is None)
        and find_witness(_preset(name), engine, {}, layouts, depth=1) is not None
    )


def served_models(
    engine: EngineFlavour, layouts: tuple[KvCacheLayout, ...] = ("LBNHC",)
) -> st.SearchStrategy[HybridModel]:
    """Models ``engine`` plans in one of ``layouts`` (vLLM's KV-cache layouts): the presets it
    plans, and synthetic hybrids of the shapes its package's ``strategies.model_shapes``
    names (keyword arguments of :func:`hybrid_models`; K3's family and GLM-5.3-Flash's where
    it names none). A model with pooled indexers (GLM-5.3-Flash's family) only where
    ``layouts`` hold ``BLHNC``: its engines lay its caches out block by block, which the
    adapter and the ride, taking ``LBNHC`` only, do not. A synthetic draw plans up to
    :data:`MODEL_CANDIDATES` models, keeping the first with a deployment that plans (a preset
    it plans where none has one): no draw is rejected. Refuses (``invalid_argument``) an
    engine no package registered."""
    expect_args(("engine", engine, str))
    name = canonical_name(engine)
    chosen = checked_layouts(layouts)
    module = space.engine_module(name)
    shapes: tuple[dict[str, Any], ...] = ({"indexed": False}, {"indexed": True})
    if module is not None and hasattr(module, "model_shapes"):
        shapes = module.model_shapes(chosen)
    if "BLHNC" not in chosen:
        shapes = tuple(shape for shape in shapes if shape.get("indexed", False) is False)

    def presets() -> st.SearchStrategy[HybridModel]:  # planned on first draw, then kept
        served = _served_presets(name, chosen)
        return st.sampled_from(served).map(_preset) if served else st.nothing()

    synthetic = [hybrid_models(**shape) for shape in shapes]
    planned = [_planned_model(name, chosen, st.one_of(*synthetic))] if synthetic else []
    return st.one_of(st.deferred(presets), *planned)


@st.composite
def _planned_model(
    draw: st.DrawFn,
    engine: str,
    layouts: tuple[str, ...],
    synthetic: st.SearchStrategy[HybridModel],
) -> HybridModel:
    """The first of :data:`MODEL_CANDIDATES` synthetic models with a deployment one step
    from the start that plans (:func:`k3layout._deployment_witness.find_witness`)."""
    for _ in range(MODEL_CANDIDATES):
        model = draw(synthetic)
        if find_witness(model, engine, {}, layouts, depth=1) is not None:
            return model
    presets = _served_presets(engine, layouts)
    if not presets:
        raise Refusal(
            "invalid_argument",
            f"engine={engine!r} planned none of {MODEL_CANDIDATES} synthetic models and none "
            f"of the presets ({', '.join(PRESETS)}) in layouts {list(layouts)}",
            facts={"engine": engine, "layouts": layouts, "field": "engine"},
            hint="give the engine's strategies.model_shapes the models its recipe groups",
        )
    return _preset(presets[0])


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


def plannable_inputs(
    engine: EngineFlavour | None = None, layouts: tuple[KvCacheLayout, ...] = ("LBNHC",)
) -> st.SearchStrategy[tuple[HybridModel, Deployment]]:
    """A model ``engine`` plans (:func:`served_models`; ``None``: any engine's) and a
    deployment of it that plans (:func:`deployments`), in one of ``layouts``: every case
    drawn plans, none is filtered."""
    names = engine_names() if engine is None else (canonical_name(engine),)
    chosen = checked_layouts(layouts)
    return st.one_of(*(_served_inputs(name, chosen) for name in names))


@st.composite
def _served_inputs(
    draw: st.DrawFn, engine: str, layouts: tuple[KvCacheLayout, ...]
) -> tuple[HybridModel, Deployment]:
    model = draw(served_models(engine, layouts))
    return model, draw(deployments(model, engine, layouts=layouts))


@st.composite
def refused_inputs(draw: st.DrawFn) -> tuple[HybridModel, Deployment, RefusalCode]:
    """Near misses: one rule broken on purpose, with the refusal code it must raise."""
    model = draw(models())
    heads = module_heads(model)
    case = draw(st.sampled_from(("heads", "dcp", "pp", "dcp_parent")))
    if case == "heads":
        # without speculative tokens vLLM builds no draft: only the target's heads must divide
        target = module_heads(model.without_draft())
        tp = draw(st.sampled_from([t for t in range(2, 4 * target + 1) if target % t]))
        return model, Deployment(attn_tp=tp), "heads_not_divisible"
    if case == "dcp":
        tp = draw(st.sampled_from(space.divisors(heads)))
        dcp = draw(st.sampled_from([d for d in range(2, 33) if tp % d]))
        return model, Deployment(attn_tp=tp, dcp=dcp), "dcp_not_dividing_tp"
    if case == "pp":
        pp = draw(st.integers(model.num_layers + 1, model.num_layers + 8))
        return model, Deployment(pp=pp), "pp_too_deep"
    tp = draw(st.sampled_from([d for d in space.divisors(heads) if d > 1] or [1]))
    return (
        model,
        Deployment(engine="tokenspeed", attn_tp=tp, dcp=tp if tp > 1 else 2),
        ("dcp_unsupported" if tp > 1 else "dcp_not_dividing_tp"),
    )
