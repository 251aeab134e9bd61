"""SPEC section 6 golden cases: K3 from a PP8 x TP1 prefill to a TP8 x DCP8 decode."""

from __future__ import annotations

from collections import defaultdict

import pytest

from k3layout import Deployment, HybridModel, Refusal
from k3layout.transfer import TransferPlan, plan_transfer, transfer_violations

H, D, K = 96, 128, 4  # K3's KDA heads, head dim, short conv kernel
ROW = 576  # fp8 latent: 512 + 64 elements x 1 byte
TOKENS = 4096


def state_bytes(tp: int, s: int) -> int:
    """S(tp, s): one KDA layer's state on one of ``tp`` ranks."""
    conv = (3 * H * D // tp) * (K - 1 + s) * 2  # q|k|v channels x rows of history, bf16
    recurrent = (H // tp) * D * D * 4  # (H/tp, D, D) fp32
    return conv + recurrent


def pp8_to_tp8_dcp8(
    model: HybridModel, s: int = 0, interleave: int = 1, replayssm: bool = False
) -> TransferPlan:
    prefill = Deployment(pp=8, spec_tokens=s, replayssm=replayssm)
    decode = Deployment(
        attn_tp=8, dcp=8, dcp_interleave=interleave, spec_tokens=s, replayssm=replayssm
    )
    return plan_transfer(model, prefill, decode, prompt_tokens=TOKENS)


def slot_bytes_by_layer(result: TransferPlan, consumer: int) -> dict[int | None, int]:
    received: dict[int | None, int] = defaultdict(int)
    for pair in result.pairs_to(consumer):
        for segment in pair.segments:
            if segment.kind == "slot":
                for _, layer in segment.regions:  # (field, None) alone for the cursor
                    received[layer] += segment.region_bytes
    return received


@pytest.mark.parametrize(("s", "golden"), [(0, 814_080), (2, 832_512)])
def test_every_tp8_consumer_receives_s8_for_each_of_the_69_kda_layers(
    k3: HybridModel, s: int, golden: int
) -> None:
    result = pp8_to_tp8_dcp8(k3, s)
    assert state_bytes(8, s) == golden
    for consumer in range(8):
        received = slot_bytes_by_layer(result, consumer)
        assert sorted(layer for layer in received if layer is not None) == list(k3.kda_layer_ids)
        assert len(received) == 69
        assert set(received.values()) == {golden}


@pytest.mark.parametrize("interleave", [1, 64])
def test_every_consumer_receives_the_latent_rows_of_exactly_the_tokens_it_owns(
    k3: HybridModel, interleave: int
) -> None:
    result = pp8_to_tp8_dcp8(k3, interleave=interleave)
    for consumer in range(8):
        # DCP 8 over TP ranks 0..7: DCP rank = TP rank; token t is owned by (t // I) % 8
        owned = [t for t in range(TOKENS) if (t // interleave) % 8 == consumer]
        rows: dict[int | None, list[tuple[int, int]]] = defaultdict(list)
        for pair in result.pairs_to(consumer):
            for segment in pair.segments:
                if segment.field == "latent":
                    for layer in segment.layers:
                        rows[layer] += [
                            (src // ROW + i, dst // ROW + i)
                            for src, dst, length in segment.copies()
                            for i in range(length // ROW)
                        ]
        assert set(rows) == set(k3.attention_layer_ids) and len(rows) == 24  # every MLA layer
        for layer_rows in rows.values():
            assert sorted(layer_rows) == [(t, local) for local, t in enumerate(owned)]


def test_each_consumer_pairs_with_all_8_stages_and_receives_its_share(k3: HybridModel) -> None:
    result = pp8_to_tp8_dcp8(k3)
    assert result.num_pairs == 8 * 8  # 8 consumers x 8 prefill stages (one TP rank each)
    assert {pair.producer for pair in result.pairs_to(3)} == set(range(8))
    # 69 KDA states at S(8, 0) + 24 MLA layers x 4096/8 tokens x 576 B
    assert result.bytes_per_consumer == (69 * state_bytes(8, 0) + 24 * TOKENS // 8 * ROW,) * 8


def test_each_stage_sends_its_tp1_state_and_its_latent_rows_exactly_once(
    k3: HybridModel,
) -> None:
    result = pp8_to_tp8_dcp8(k3)
    for stage in result.producer_stages:
        kda = sum(1 for layer in stage.layers if k3.module_layers[layer].kind == "kda")
        mla = len(stage.layers) - kda
        # 8 consumers x S(8, 0) = S(1, 0): the stage's whole state; DCP splits, never repeats
        assert result.bytes_per_producer[stage.index] == kda * state_bytes(1, 0) + (
            mla * TOKENS * ROW
        )


def test_replayssm_adds_196608_bytes_per_layer_and_one_whole_cursor(
    k3_dspark: HybridModel,
) -> None:
    result = pp8_to_tp8_dcp8(k3_dspark, s=2, replayssm=True)
    records = max(16, 2 * (2 + 1)) * (H // 8) * 128 * (2 + 2 + 4)  # L x heads x D x (k, u, g)
    assert records == 196_608
    for consumer in range(8):
        received = slot_bytes_by_layer(result, consumer)
        assert received.pop(None) == 4  # the int32 cursor, once
        assert set(received.values()) == {state_bytes(8, 2) + records}
    # DSpark's 5 draft layers live on the last stage and send latent rows too
    latent_layers = {
        layer
        for pair in result.pairs_from(7)
        for s in pair.segments
        if s.field == "latent"
        for layer in s.layers
    }
    assert set(k3_dspark.draft_layer_ids) <= latent_layers


def test_the_golden_plan_holds_every_invariant(k3: HybridModel) -> None:
    assert transfer_violations(pp8_to_tp8_dcp8(k3, s=2, interleave=64)) == []


def test_pp8_tp2_to_tp3_is_refused_naming_both(k3: HybridModel) -> None:
    with pytest.raises(Refusal) as refused:
        plan_transfer(k3, Deployment(pp=8, attn_tp=2), Deployment(attn_tp=3), prompt_tokens=64)
    assert refused.value.code == "tp_not_multiple"
    assert refused.value.facts == {"prefill_tp": 2, "decode_tp": 3}


def test_segments_do_not_grow_with_the_prompt(k3: HybridModel) -> None:
    prefill, decode = Deployment(pp=8), Deployment(attn_tp=8, dcp=8)
    short = plan_transfer(k3, prefill, decode, prompt_tokens=TOKENS)
    long = plan_transfer(k3, prefill, decode, prompt_tokens=10 * TOKENS + 3)
    # interleave 1: every run is one token, all of a rank's runs one strided segment
    assert short.num_segments == long.num_segments
    # per pair (8 stages x 8 consumers): the stage's latent rows, its conv and its recurrent
    # state, each one segment naming every layer of the stage that holds the part
    assert short.num_segments == 8 * 8 * 3


def test_a_segment_names_every_layer_of_its_spec_that_one_stage_sends(k3: HybridModel) -> None:
    result = pp8_to_tp8_dcp8(k3)
    for pair in result.pairs:
        stage = result.producer_stages[result.producer_coords(pair.producer)[0]]
        mla = tuple(layer for layer in stage.layers if k3.module_layers[layer].kind == "mla")
        kda = tuple(layer for layer in stage.layers if k3.module_layers[layer].kind == "kda")
        # in the order of each run's first layer: stage 0 starts with KDA layer 0, stage 1 with
        # MLA layer 11; a slot's parts in spec order
        runs = sorted([("conv", kda), ("recurrent", kda), ("latent", mla)], key=lambda r: r[1][0])
        assert [(s.field, s.layers) for s in pair.segments] == runs
