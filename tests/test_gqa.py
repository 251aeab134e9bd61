"""A GQA full-attention layer kind, added as one module (k3layout/cache/gqa.py): a DSpark-style
draft of GQA layers beside K3's MLA and KDA layers, planned and transferred."""

from __future__ import annotations

import importlib

import pytest

from k3layout import (
    Deployment,
    GQALayer,
    HybridModel,
    Refusal,
    ReplicaShard,
    plan,
    plan_parent,
    plan_transfer,
    plan_vllm,
    preset,
    rank_sizes,
    transfer_violations,
)

KV_HEADS, HEAD_DIM = 4, 144  # 2 x 4 x 144 = 1,152 B per token at fp8: twice K3's 576


def k3_with_gqa_draft(kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM) -> HybridModel:
    k3 = preset("kimi-k3")
    draft = GQALayer(num_heads=96, num_kv_heads=kv_heads, head_dim=head_dim)
    return HybridModel(
        name="k3-gqa-draft", model_type="kimi_k3", layers=k3.layers, draft_layers=(draft,) * 5
    )


@pytest.mark.parametrize(("tp", "local_heads"), [(1, 4), (2, 2), (4, 1), (8, 1), (16, 1)])
def test_kv_heads_are_sharded_then_replicated_over_attention_tp(tp: int, local_heads: int) -> None:
    sizes = rank_sizes(k3_with_gqa_draft(), Deployment(attn_tp=tp))
    gqa = sizes.spec_of(93)
    assert gqa.kind == "gqa" and gqa.paging == "token"
    assert gqa.part("k").tp == ReplicaShard(dim=0)
    # K then V rows of one token: local KV heads x head_dim, fp8.
    assert gqa.bytes_per_token(tp) == 2 * local_heads * HEAD_DIM


def test_kv_heads_over_a_tp_they_neither_divide_nor_fill_are_refused() -> None:
    with pytest.raises(Refusal) as refused:
        rank_sizes(k3_with_gqa_draft(kv_heads=3, head_dim=192), Deployment(attn_tp=2))
    assert refused.value.code == "uneven_split"
    assert refused.value.facts == {"extent": 3, "num_ranks": 2}


@pytest.mark.parametrize("tp", [1, 2, 8, 16])
def test_vllm_gives_every_group_one_page_and_scales_the_smaller_rows_block(tp: int) -> None:
    p = plan_vllm(k3_with_gqa_draft(), Deployment(attn_tp=tp, spec_tokens=2))
    sizes = p.sizes
    mla_row = sizes.attention_bytes_per_token  # 576: replicated latent
    gqa_row = sizes.spec_of(93).bytes_per_token(tp)
    state = sizes.state_bytes
    raised = 128 * -(-state // (128 * mla_row))  # the block raise for the MLA layers
    page = max(raised * mla_row, raised * gqa_row)  # vLLM unifies on the largest page
    assert p.page_bytes == page
    assert p.block_tokens == page // mla_row
    gqa = p.group("full_attention_gqa")
    assert p.tokens_per_page(gqa) == page // gqa_row
    assert p.payload_bytes(gqa) == page
    assert p.span_tokens(gqa) == page // gqa_row
    # one bucket per spec: KDA, MLA, GQA; the smallest (5 drafts) sets the group size
    assert p.num_planes == 5
    assert sorted(layer for g in p.groups for layer in g.layers) == list(range(98))


def test_a_gqa_page_that_does_not_divide_the_mla_page_is_refused_naming_both() -> None:
    # At TP 8 one of 8 KV heads per rank: 2 x 1 x 128 = 256 B per token, which does not
    # divide the MLA's 576.
    with pytest.raises(Refusal) as refused:
        plan(k3_with_gqa_draft(kv_heads=8, head_dim=128), Deployment(attn_tp=8, spec_tokens=2))
    assert refused.value.code == "page_size"
    assert refused.value.facts["kind"] == "gqa"
    assert refused.value.facts["largest_kind"] == "mla"
    assert refused.value.facts["page_bytes"] == 1536 * 256


def test_byte_range_of_a_gqa_part_follows_the_k_rows() -> None:
    p = plan_vllm(k3_with_gqa_draft(), Deployment(attn_tp=8, spec_tokens=2))
    gqa = p.group("full_attention_gqa")
    position = gqa.layers.index(95)
    k = p.byte_range(95, "k", 3, num_blocks=10)
    v = p.byte_range(95, "v", 3, num_blocks=10)
    assert k.offset_bytes == (position * 10 + 3) * p.page_bytes
    assert v.offset_bytes == k.end_bytes  # V rows follow K rows inside the page
    assert v.end_bytes == (position * 10 + 4) * p.page_bytes


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(1, 8), (2, 8), (4, 16), (2, 2)])
def test_gqa_rows_transfer_between_tps_and_every_byte_lands_once(
    prefill_tp: int, decode_tp: int
) -> None:
    transfer = plan_transfer(
        k3_with_gqa_draft(),
        Deployment(attn_tp=prefill_tp, spec_tokens=2),  # vLLM builds no draft without them
        Deployment(attn_tp=decode_tp, spec_tokens=2),
        prompt_tokens=100,
    )
    assert transfer_violations(transfer) == []
    consumer = transfer.consumer_regions(0)
    k_rows = next(r for r in consumer if r.key == ("k", 93))
    assert k_rows.size_bytes == 100 * max(1, KV_HEADS // decode_tp) * HEAD_DIM


def test_tokenspeed_refuses_a_gqa_draft_its_k3_recipe_cannot_page() -> None:
    # tokenspeed's recipe lays every attention layer out as a 576-element MLA latent page
    with pytest.raises(Refusal) as caught:
        plan_parent(k3_with_gqa_draft(), Deployment(attn_tp=8, spec_tokens=2))
    assert (caught.value.code, caught.value.facts["kind"]) == ("draft_unsupported", "gqa")


@pytest.mark.parametrize("engine", ["vllm"])
def test_the_adapter_allocates_and_validates_a_gqa_draft(engine: str) -> None:
    pytest.importorskip("torch")
    adapter = importlib.import_module("k3layout.torch")

    fields = {"attn_tp": 8, "engine": engine, "spec_tokens": 2}
    p = plan(k3_with_gqa_draft(), Deployment.model_validate(fields))
    cache = adapter.allocate(p, 3)
    adapter.validate(p, cache.registered)
    k, v = (
        cache.registered[n]
        for n in ("draft.layers.2.self_attn.attn", "draft.layers.2.self_attn.attn.v")
    )
    assert not isinstance(k, tuple) and not isinstance(v, tuple)
    assert k.shape[-2:] == v.shape[-2:] == (1, HEAD_DIM)  # one of 4 KV heads on each of 8 ranks
    row = p.part_range(95, "v")
    assert v.data_ptr() - k.data_ptr() == row.offset_bytes  # V rows follow K rows in the page
