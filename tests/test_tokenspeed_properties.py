"""tokenspeed's formulas hold for every attention TP and DP, dtype, draft and budget (SPEC
section 4) at both followed revisions (#1152's head and ``main``): the revision's packing, the
planes and parent, what each refuses, the arena's plane order and page slots, and capacity both
ways with its verify workspace (dense state rows, or ``main``'s replay commit on NVIDIA)."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import Deployment, ParentPlan, Refusal, load_plan, plan, plan_tokenspeed, preset
from k3layout.engines.tokenspeed.releases import TOKENSPEED_VERSIONS

K3_TPS = [tp for tp in range(1, 97) if 96 % tp == 0]
DSPARK_TPS = [tp for tp in K3_TPS if 64 % tp == 0]
KDA_LAYERS, KDA_HEADS, HEAD_DIM, STATE_ROWS = 69, 96, 128, 23
"""Kimi-K3's KDA: 69 layers of 96 heads of 128, 23 per state group."""
revisions = st.sampled_from(TOKENSPEED_VERSIONS)


def lcm(*values: int) -> int:
    return math.lcm(*values)


def packing_of(revision: str, page: int, state: int) -> tuple[int, int]:
    """The revision's rule: #1152 grows ``p_m`` until a plane holds a state, ``main`` pins 12."""
    mla_pages = max(1, -(-state // page)) if revision == "pr1152" else 12
    return mla_pages, max(1, mla_pages * page // state)


def state_plane(page: int, latent_bytes: int, state: int, pages: tuple[int, int]) -> int:
    """A target plane that holds state: the wider of ``p_m`` MLA pages and ``p_l`` states,
    aligned to 256, ``p_m x`` the latent element and ``p_l x`` the fp32 recurrent element."""
    mla_pages, state_pages = pages
    width = max(mla_pages * page, state_pages * state)
    align = lcm(256, mla_pages * latent_bytes, 4 * state_pages)
    return -(-width // align) * align


def tokenspeed(model: str, **fields: object) -> ParentPlan | Refusal:
    try:
        result = plan(preset(model), Deployment.model_validate({"engine": "tokenspeed", **fields}))
    except Refusal as refusal:
        return refusal
    assert isinstance(result, ParentPlan)
    return result


cells = st.one_of(
    st.tuples(st.just("kimi-k3"), st.sampled_from(K3_TPS)),
    st.tuples(st.just("kimi-k3-dspark"), st.sampled_from(DSPARK_TPS)),
)


@settings(max_examples=300, deadline=None)
@given(
    revision=revisions,
    cell=cells,
    attn_dp=st.sampled_from((1, 2, 4, 8)),
    kv_dtype=st.sampled_from(("fp8", "bf16")),
    draft_kv_dtype=st.sampled_from((None, "fp8", "bf16")),
    spec_tokens=st.integers(0, 8),
)
def test_the_packing_planes_and_parent_follow_the_recipe(
    *,
    revision: str,
    cell: tuple[str, int],
    attn_dp: int,
    kv_dtype: str,
    draft_kv_dtype: str | None,
    spec_tokens: int,
) -> None:
    model, attn_tp = cell
    result = tokenspeed(
        model,
        engine_version=revision,
        attn_tp=attn_tp,
        attn_dp=attn_dp,
        kv_dtype=kv_dtype,
        draft_kv_dtype=draft_kv_dtype,
        spec_tokens=spec_tokens,
    )
    latent = 1 if kv_dtype == "fp8" else 2
    page = 128 * 576 * latent
    state = 6_512_640 // attn_tp  # S(tp, 0): tokenspeed keeps no speculative conv rows
    mla_pages, state_pages = packing_of(revision, page, state)
    raw_state = STATE_ROWS * state
    shared = state_plane(page, latent, state, (mla_pages, state_pages))
    if isinstance(result, Refusal):
        if result.code == "layout_unsupported":
            # main: a plane that holds state is not exactly p_m MLA pages (#1152 never is)
            assert revision == "main" and shared != mla_pages * page
            assert result.facts["stride"] == shared // mla_pages
            return
        # a state group padded past 0.25 (none once a draft joins)
        assert result.code == "padding_limit" and model == "kimi-k3"
        assert shared == mla_pages * page
        assert (24 * mla_pages * page // state_pages - raw_state) / raw_state > 0.25
        return
    assert shared == mla_pages * page
    assert (result.packing.mla_pages, result.packing.state_pages) == (mla_pages, state_pages)
    assert result.packing_rule.mla_pages == mla_pages
    assert (result.rule_1152 is not None) == (revision == "pr1152")
    draft = 128 * 576 * (1 if (draft_kv_dtype or "bf16") == "fp8" else 2)
    planes = [mla_pages * page] * 24 + [mla_pages * draft] * len(result.model.draft_layers)
    assert list(result.plane_sizes) == planes  # every plane 256-aligned already
    assert result.parent_bytes == sum(planes)
    assert (
        result.padding_fraction["linear_attention_0"]
        == (result.parent_bytes // state_pages - raw_state) / raw_state
    )
    assert load_plan(result.model_dump_json()) == result


@settings(max_examples=150, deadline=None)
@given(
    revision=revisions,
    cell=cells,
    kv_dtype=st.sampled_from(("fp8", "bf16")),
    num_parents=st.integers(1, 40),
    data=st.data(),
)
def test_every_page_sits_in_its_slot_and_no_two_pages_of_a_group_overlap(
    revision: str, cell: tuple[str, int], kv_dtype: str, num_parents: int, data: st.DataObject
) -> None:
    model, attn_tp = cell
    result = tokenspeed(
        model, engine_version=revision, attn_tp=attn_tp, kv_dtype=kv_dtype, spec_tokens=2
    )
    if isinstance(result, Refusal):
        return
    binding = result.bind(num_parents)
    order = sorted(range(result.num_planes), key=lambda j: f"slot.{j}")
    start = 0
    for plane in order:  # the planes tile the arena in string order of their ids
        assert binding.plane_starts[plane] == start
        start += (num_parents + 1) * result.plane_sizes[plane]
    assert start <= binding.arena_bytes == (num_parents + 1) * result.parent_bytes
    layers = result.model.attention_layer_ids + result.model.kda_layer_ids
    layer = data.draw(st.sampled_from(layers))
    group, position = result.group_of(layer)
    plane = group.plane_of(position)
    size = result.plane_sizes[plane]
    stride = size // result.pages_per_parent(group)
    pages = 1 + num_parents * result.pages_per_parent(group)
    part = result.sizes.spec_of(layer).parts[-1].name
    inner = result.part_range(layer, part)
    ends = []
    for page in sorted({0, 1, pages // 2, pages - 1}):
        where = result.byte_range(layer, part, page, num_parents)
        expected = binding.plane_starts[plane] + size - stride + page * stride + inner.offset_bytes
        assert where.offset_bytes == expected
        ends.append((where.offset_bytes, where.end_bytes))
        # the page stays on its plane
        assert binding.plane_starts[plane] <= where.offset_bytes
        assert where.end_bytes <= binding.plane_starts[plane] + (num_parents + 1) * size
    for (_, end), (following, _) in itertools.pairwise(ends):
        assert end <= following
    with pytest.raises(Refusal):
        result.byte_range(layer, part, pages, num_parents)


def verify_workspace(revision: str, gpu: str, attn_tp: int, spec_tokens: int, live: int) -> int:
    """The verify workspace: none without speculation; ``main`` on NVIDIA (K3's bf16
    activations) replays from a conv checkpoint row per request and ``live x T`` compact rows
    per layer (a bf16 qkv, ``f_a`` and beta row and an fp32 gate row); else dense state rows."""
    if not spec_tokens:
        return 0
    heads = KDA_HEADS // attn_tp
    if revision == "main" and gpu in ("h100", "h200", "b200"):
        conv = 3 * heads * HEAD_DIM * 3 * 2  # K - 1 = 3 bf16 rows of the q|k|v channels
        row = 2 * 3 * heads * HEAD_DIM + 2 * HEAD_DIM + 2 * heads + 4 * heads * HEAD_DIM
        return live * KDA_LAYERS * conv + KDA_LAYERS * live * spec_tokens * row
    return live * (spec_tokens + 1) * KDA_LAYERS * (6_512_640 // attn_tp)


@settings(max_examples=200, deadline=None)
@given(
    revision=revisions,
    gpu=st.sampled_from(("h200", "h100", "b200", "mi300x", "mi355x")),
    cell=cells,
    kv_dtype=st.sampled_from(("fp8", "bf16")),
    spec_tokens=st.integers(0, 8),
    load=st.tuples(st.integers(1, 64), st.sampled_from((0, 1))),
    budget_gib=st.integers(1, 140),
)
def test_a_budget_buys_parents_after_the_workspace_and_capacity_inverts_parents_for(
    *,
    revision: str,
    gpu: str,
    cell: tuple[str, int],
    kv_dtype: str,
    spec_tokens: int,
    load: tuple[int, int],
    budget_gib: int,
) -> None:
    model, attn_tp = cell
    max_live, overlap_depth = load
    result = tokenspeed(
        model,
        engine_version=revision,
        gpu=gpu,
        attn_tp=attn_tp,
        kv_dtype=kv_dtype,
        spec_tokens=spec_tokens,
    )
    if isinstance(result, Refusal):
        return
    budget = budget_gib << 30
    workspace = verify_workspace(revision, gpu, attn_tp, spec_tokens, max_live)
    protected = max_live * math.ceil(overlap_depth * max(1, spec_tokens) / 128)
    parents = (budget - workspace) // result.parent_bytes - 1
    try:
        got = result.capacity(budget, max_live=max_live, overlap_depth=overlap_depth)
    except Refusal as refusal:
        assert refusal.code == "budget_too_small"
        assert parents < 1 or result.parents_for(1, max_live, protected) > parents
        return
    assert (got.workspace_bytes, got.num_parents, got.protected_pages) == (
        workspace,
        parents,
        protected,
    )
    tokens = got.token_capacity
    assert result.parents_for(tokens, max_live, protected) <= parents
    assert result.parents_for(tokens + 1, max_live, protected) > parents
    assert got.page_counts["full_attention"] == 1 + parents * result.packing.mla_pages


def test_the_old_name_plans_the_same_and_warns() -> None:
    with pytest.warns(DeprecationWarning, match="parent"):
        old = Deployment(engine="parent", attn_tp=8)
    assert old.engine == "tokenspeed"
    result = plan(preset("kimi-k3"), old)
    assert result == plan(preset("kimi-k3"), Deployment(engine="tokenspeed", attn_tp=8))
    stored = result.model_dump_json().replace('"tokenspeed"', '"parent"')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert load_plan(stored) == result  # a plan stored under the old name still loads


def test_the_draft_cache_dtype_is_an_engine_rule() -> None:
    dspark = preset("kimi-k3-dspark")
    # tokenspeed #1152 keeps the draft bf16; vLLM and SGLang keep the target's dtype
    assert Deployment(engine="tokenspeed").draft_cache_dtype == "bf16"
    assert Deployment(engine="vllm").draft_cache_dtype == "fp8"
    followed = plan_tokenspeed(dspark, Deployment(attn_tp=8, draft_kv_dtype="fp8"))
    assert set(followed.plane_sizes) == {884_736}
    for engine in ("vllm", "sglang"):
        with pytest.raises(Refusal) as caught:
            Deployment(engine=engine, draft_kv_dtype="bf16")
        assert (caught.value.code, caught.value.facts["field"]) == (
            "engine_setting",
            "draft_kv_dtype",
        )
    assert Deployment(engine="vllm", kv_dtype="bf16", draft_kv_dtype="bf16").draft_kv_dtype
