"""A stored prefix moved across TP by the transfer plan's segments: every consumer rank ends up
with its head slice of the KDA state and every latent row, byte for byte, in its own blocks."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

import torch

from k3layout import (
    ConvLayout,
    Deployment,
    HybridModel,
    KDALayer,
    MLALayer,
    Refusal,
    VllmPlan,
    engine_layer_names,
    plan_transfer,
    plan_vllm,
)
from k3layout.model import kimi_layer_pattern
from k3layout.torch import (
    Allocation,
    BlockTables,
    LiveLayout,
    Registered,
    Tier,
    allocate,
    apply_segments,
    block_tables,
    restore_across_tp,
    store_prefix,
    tier_regions,
    validate,
    write_regions,
)

NUM_BLOCKS = 8


def small_model(index_bytes: int = 0) -> HybridModel:
    """Kimi's pattern over 8 layers, 4 KDA heads of 4 and an MLA latent of 16 + 8."""
    mla = MLALayer(
        num_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, index_bytes_per_token=index_bytes
    )
    kda = KDALayer(num_heads=4, head_dim=4, conv_kernel=4)
    return HybridModel(name="small", model_type="kimi_k3", layers=kimi_layer_pattern(8, mla, kda))


def random_cache(p: VllmPlan, seed: int, stage: int = 0) -> Allocation:
    cache = allocate(p, NUM_BLOCKS, stage=stage)
    gen = torch.Generator().manual_seed(seed)
    for plane in cache.planes:
        plane.copy_(torch.randint(0, 256, plane.shape, generator=gen, dtype=torch.uint8))
    return cache


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


class Case:
    """A prefix of two blocks stored on every rank of a PP_p x TP_p prefill (one tier per rank,
    stage outer, TP rank inner), restored onto TP_d ranks."""

    def __init__(
        self,
        tp_p: int,
        tp_d: int,
        conv_layout: ConvLayout,
        *,
        index_bytes: int = 0,
        pp: int = 1,
        form: str = "registered",
        **common: object,
    ) -> None:
        self.form = form  # "registered": the adapter's parts; "bound": what vLLM binds
        self.model = small_model(index_bytes)
        both = {"conv_layout": conv_layout, **common}
        self.prefill = Deployment.model_validate({"attn_tp": tp_p, "pp": pp, **both})
        self.decode = Deployment.model_validate({"attn_tp": tp_d, **both})
        self.p_plan, self.d_plan = (
            plan_vllm(self.model, self.prefill),
            plan_vllm(self.model, self.decode),
        )
        self.conv_layout = conv_layout
        self.tokens = 2 * self.p_plan.block_tokens
        self.producers = [
            random_cache(self.p_plan, rank, stage=rank // tp_p) for rank in range(pp * tp_p)
        ]
        self.consumers = [random_cache(self.d_plan, 99 + rank) for rank in range(tp_d)]
        self.p_tables = [
            block_tables(self.p_plan, self.tokens, range(NUM_BLOCKS), stage=stage)
            for stage in range(pp)
        ]
        self.d_tables = block_tables(self.d_plan, self.tokens, range(NUM_BLOCKS - 1, -1, -1))
        self.tiers = [
            store_prefix(
                validate(self.p_plan, getattr(c, form), stage=rank // tp_p),
                getattr(c, form),
                self.p_tables[rank // tp_p],
                self.tokens,
            )
            for rank, c in enumerate(self.producers)
        ]

    def producer_of(self, layer: int, consumer_tp_rank: int) -> tuple[Allocation, BlockTables]:
        """The cache and tables of the prefill rank holding ``layer`` for a consumer."""
        stage = next(s.index for s in self.p_plan.stages if layer in s.layers)
        tp_p = self.prefill.attn_tp
        rank = stage * tp_p + consumer_tp_rank // (self.decode.attn_tp // tp_p)
        return self.producers[rank], self.p_tables[stage]

    def transfer(self) -> None:
        plan = plan_transfer(self.model, self.prefill, self.decode, prompt_tokens=self.tokens)
        assert plan.decode.conv_layout == self.conv_layout
        restore_across_tp(plan, self.tiers, self.targets())

    def targets(self) -> list[tuple[LiveLayout, Registered, BlockTables]]:
        return [
            (validate(self.d_plan, getattr(c, self.form)), getattr(c, self.form), self.d_tables)
            for c in self.consumers
        ]


@pytest.mark.parametrize(
    ("pp", "tp_p", "tp_d", "conv_layout", "spec_tokens"),
    [
        (1, 1, 2, "SD", 0),
        (1, 1, 4, "DS", 2),
        (1, 2, 4, "SD", 1),
        (1, 2, 2, "DS", 0),
        (2, 1, 2, "SD", 2),  # each stage stores its own layers' prefix
    ],
)
def test_each_consumer_gets_its_heads_of_the_state_and_every_latent_row(
    pp: int, tp_p: int, tp_d: int, conv_layout: ConvLayout, spec_tokens: int
) -> None:
    case = Case(tp_p, tp_d, conv_layout, pp=pp, spec_tokens=spec_tokens)
    case.transfer()
    k = tp_d // tp_p  # consumers per producer: d takes slice d % k of producer d // k
    names = case.tiers[0].layout.names
    row = 1  # the state after 2 blocks sits in row (n - 1) // block
    for d, consumer in enumerate(case.consumers):
        for group in case.d_plan.groups:
            dst_block = case.d_tables.table(group.name)
            for layer in group.layers:
                name = names.name(layer)
                producer, tables = case.producer_of(layer, d)
                src_block = tables.table(group.name)
                if group.kind == "attention":  # latent rows are replicated: all of them
                    for r in range(2):
                        assert torch.equal(
                            as_bytes(consumer.layers[name][0][dst_block[r]]),
                            as_bytes(producer.layers[name][0][src_block[r]]),
                        )
                    continue
                conv, state = producer.layers[name]
                got_conv, got_state = consumer.layers[name]
                heads = state.shape[1] // k
                mine = slice(d % k * heads, (d % k + 1) * heads)
                assert torch.equal(
                    as_bytes(got_state[dst_block[row]]), as_bytes(state[src_block[row]][mine])
                )
                # ONE conv tensor, q|k|v side by side on its channel axis (SD: axis 1 of a
                # block, DS: axis 0): the consumer's share of each of q, k and v, in order
                axis = 1 if conv_layout == "SD" else 0
                source = conv[src_block[row]]
                got = got_conv[dst_block[row]]
                width = got.shape[axis] // 3  # a consumer's channels of one of q, k, v
                held = source.shape[axis] // 3  # the producer's
                assert held == k * width
                want = torch.cat(
                    [
                        source.narrow(axis, g * held + d % k * width, width)
                        for g in range(3)  # q, k, v
                    ],
                    dim=axis,
                )
                assert torch.equal(as_bytes(got), as_bytes(want))


@pytest.mark.parametrize(
    ("pp", "tp_p", "tp_d", "conv_layout"),
    [(1, 1, 2, "SD"), (1, 2, 4, "DS"), (2, 1, 2, "SD")],
)
def test_vllms_binding_restores_the_same_bytes(
    pp: int, tp_p: int, tp_d: int, conv_layout: ConvLayout
) -> None:
    """Tiers stored from, and a transfer restored into, the views vLLM binds (its names, raw
    KDA pages, MLA kernel blocks) move the same bytes as through the adapter's parts."""
    parts, bound = (Case(tp_p, tp_d, conv_layout, pp=pp, form=f) for f in ("registered", "bound"))
    assert bound.tiers[0].layout.names == engine_layer_names(bound.model, "vllm")
    before = [plane.clone() for c in bound.consumers for plane in c.planes]
    parts.transfer()
    bound.transfer()
    after = [plane for c in bound.consumers for plane in c.planes]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    for ours, theirs in zip(parts.consumers, bound.consumers, strict=True):
        for a, b in zip(ours.planes, theirs.planes, strict=True):
            assert torch.equal(a, b)


def test_dsa_index_rows_travel_with_their_latent_rows() -> None:
    case = Case(1, 2, "SD", index_bytes=6)
    case.transfer()
    name = "model.layers.3.self_attn.attn.indexer.k_cache"
    src = case.producers[0].layers[name][0]
    for consumer in case.consumers:
        for r in range(2):
            got = consumer.layers[name][0][case.d_tables.table("full_attention")[r]]
            assert torch.equal(got, src[case.p_tables[0].table("full_attention")[r]])


def refusal(action: Callable[[], object]) -> Refusal:
    with pytest.raises(Refusal) as refused:
        action()
    assert refused.value.hint
    return refused.value


def test_a_transfer_planned_for_another_conv_layout_or_prefix_is_refused() -> None:
    case = Case(1, 2, "SD")
    ds = {"conv_layout": "DS"}
    other = plan_transfer(
        case.model,
        case.prefill.model_copy(update=ds),
        case.decode.model_copy(update=ds),
        prompt_tokens=case.tokens,
    )
    refused = refusal(lambda: restore_across_tp(other, case.tiers, case.targets()))
    assert (refused.code, refused.facts) == (
        "tensor_mismatch",
        {"side": "producer", "conv_layout": "SD", "transfer_conv_layout": "DS"},
    )
    shorter = plan_transfer(case.model, case.prefill, case.decode, prompt_tokens=128)
    refused = refusal(lambda: restore_across_tp(shorter, case.tiers, case.targets()))
    assert (refused.code, refused.facts) == (
        "invalid_argument",
        {"computed_tokens": case.tokens, "prompt_tokens": 128},
    )
    # read directly, the regions of the shorter prefix do not match the tier's
    refused = refusal(lambda: tier_regions(case.tiers[0], shorter.producer_regions(0)))
    assert refused.code == "tensor_mismatch"
    row = 24  # 16 + 8 fp8 latent elements
    assert refused.facts == {
        "field": "latent",
        "layer": 3,
        "size_bytes": 128 * row,
        "tier_bytes": case.tokens * row,
    }


def test_rank_counts_must_match_the_transfer() -> None:
    case = Case(1, 2, "SD")
    plan = plan_transfer(case.model, case.prefill, case.decode, prompt_tokens=case.tokens)
    refused = refusal(lambda: restore_across_tp(plan, case.tiers, case.targets()[:1]))
    assert (refused.code, refused.facts) == (
        "invalid_argument",
        {"num_consumers": 2, "num_layouts": 1},
    )
    refused = refusal(lambda: apply_segments(plan, []))
    assert (refused.code, refused.facts) == (
        "invalid_argument",
        {"num_producers": 1, "num_sources": 0},
    )


def test_replayssm_records_have_no_bytes_in_the_vllm_layout() -> None:
    case = Case(1, 2, "SD")
    replay = Deployment(attn_tp=2, replayssm=True)
    plan = plan_transfer(case.model, Deployment(replayssm=True), replay, prompt_tokens=case.tokens)
    regions = plan.producer_regions(0)
    refused = refusal(lambda: tier_regions(case.tiers[0], regions))
    assert refused.code == "tensor_mismatch"
    assert refused.facts == {"field": "replay_k", "layer": 0}
    assert isinstance(case.tiers[0], Tier)


@pytest.mark.parametrize(
    ("prefill", "decode"),
    [
        (Deployment(attn_tp=1), Deployment(attn_tp=2, dcp=2)),  # interleaved latent rows
        (Deployment(attn_tp=2, conv_layout="DS"), Deployment(attn_tp=4, conv_layout="DS")),
        (Deployment(pp=2, spec_tokens=2), Deployment(attn_tp=2, spec_tokens=2)),
    ],
)
def test_moving_straight_into_the_blocks_writes_what_the_staged_steps_write(
    prefill: Deployment, decode: Deployment
) -> None:
    """restore_across_tp copies from the tiers into the consumers' pages, cutting and folding
    the segments' copies; the steps (tier_regions, apply_segments, write_regions) stage every
    region: both leave every consumer plane byte for byte the same, nothing else touched."""
    model = small_model()
    p_plan, d_plan = plan_vllm(model, prefill), plan_vllm(model, decode)
    tokens = 2 * p_plan.block_tokens
    transfer = plan_transfer(model, prefill, decode, prompt_tokens=tokens)
    tiers = []
    for rank in range(transfer.num_producers):
        stage = rank // prefill.attn_tp
        cache = random_cache(p_plan, rank, stage=stage)
        tables = block_tables(p_plan, tokens, range(NUM_BLOCKS), stage=stage)
        live = validate(p_plan, cache.registered, stage=stage)
        tiers.append(store_prefix(live, cache.registered, tables, tokens))
    d_tables = block_tables(d_plan, tokens, range(NUM_BLOCKS - 1, -1, -1))
    moved = [random_cache(d_plan, 50 + rank) for rank in range(transfer.num_consumers)]
    staged = [random_cache(d_plan, 50 + rank) for rank in range(transfer.num_consumers)]
    restore_across_tp(
        transfer, tiers, [(validate(d_plan, c.registered), c.registered, d_tables) for c in moved]
    )
    sources = [tier_regions(t, transfer.producer_regions(r)) for r, t in enumerate(tiers)]
    for cache, regions in zip(staged, apply_segments(transfer, sources), strict=True):
        live = validate(d_plan, cache.registered)
        write_regions(live, cache.registered, d_tables, tokens, regions, transfer=transfer)
    for a, b in zip(moved, staged, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.planes, b.planes, strict=True))
    assert any(  # and the transfer did write: the consumers differ from their fresh bytes
        not torch.equal(x, y)
        for a, fresh in zip(moved, range(transfer.num_consumers), strict=True)
        for x, y in zip(a.planes, random_cache(d_plan, 50 + fresh).planes, strict=True)
    )


@settings(max_examples=25, deadline=None)
@given(
    deployments=st.sampled_from(
        [
            (Deployment(attn_tp=1), Deployment(attn_tp=2)),
            (Deployment(attn_tp=2, conv_layout="DS"), Deployment(attn_tp=4, conv_layout="DS")),
            (Deployment(attn_tp=1), Deployment(attn_tp=2, dcp=2)),
            (Deployment(pp=2, spec_tokens=1), Deployment(attn_tp=2, spec_tokens=1)),
        ]
    ),
    order=st.randoms(use_true_random=False),
)
def test_each_rank_may_have_its_own_block_tables(
    deployments: tuple[Deployment, Deployment], order: random.Random
) -> None:
    """Every producer and consumer rank hands out its blocks in its own order: the copies
    planned once for a plan's ranks still land in each rank's own blocks (the staged steps,
    rank by rank, are the reference)."""
    prefill, decode = deployments
    model = small_model()
    p_plan, d_plan = plan_vllm(model, prefill), plan_vllm(model, decode)
    tokens = 2 * p_plan.block_tokens
    transfer = plan_transfer(model, prefill, decode, prompt_tokens=tokens)

    def shuffled() -> list[int]:
        ids = list(range(NUM_BLOCKS))
        order.shuffle(ids)
        return ids

    tiers = []
    for rank in range(transfer.num_producers):
        stage = rank // prefill.attn_tp
        cache = random_cache(p_plan, rank, stage=stage)
        tables = block_tables(p_plan, tokens, shuffled(), stage=stage)
        live = validate(p_plan, cache.registered, stage=stage)
        tiers.append(store_prefix(live, cache.registered, tables, tokens))
    d_tables = [block_tables(d_plan, tokens, shuffled()) for _ in range(transfer.num_consumers)]
    moved = [random_cache(d_plan, 50 + rank) for rank in range(transfer.num_consumers)]
    staged = [random_cache(d_plan, 50 + rank) for rank in range(transfer.num_consumers)]
    restore_across_tp(
        transfer,
        tiers,
        [
            (validate(d_plan, c.registered), c.registered, t)
            for c, t in zip(moved, d_tables, strict=True)
        ],
    )
    sources = [tier_regions(t, transfer.producer_regions(r)) for r, t in enumerate(tiers)]
    for cache, tables, regions in zip(
        staged, d_tables, apply_segments(transfer, sources), strict=True
    ):
        live = validate(d_plan, cache.registered)
        write_regions(live, cache.registered, tables, tokens, regions, transfer=transfer)
    for a, b in zip(moved, staged, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.planes, b.planes, strict=True))


def test_a_layout_of_another_deployment_than_the_transfers_is_refused() -> None:
    case = Case(1, 2, "SD")
    plan = plan_transfer(case.model, case.prefill, Deployment(attn_tp=4), prompt_tokens=case.tokens)
    consumers = [*case.targets(), *case.targets()]  # four layouts, each of TP 2
    refused = refusal(lambda: restore_across_tp(plan, case.tiers, consumers))
    assert (refused.code, refused.facts) == (
        "tensor_mismatch",
        {"side": "consumer", "attn_tp": 2, "transfer_attn_tp": 4},
    )
