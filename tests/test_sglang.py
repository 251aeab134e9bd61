"""The ``sglang`` engine: SGLang 0.5.23's pools, capacity, P/D mapping and bridge.

Golden values are SGLang's own answers (run on CPU by ``tests/conformance``; the issue's
numbers for K3 on H200 at 60 GiB per rank); the formulas behind them are written out.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import (
    Deployment,
    GQALayer,
    HybridModel,
    Refusal,
    load_plan,
    plan,
    plan_transfer,
    preset,
    transfer_violations,
)
from k3layout.engines.sglang import (
    SglangPlan,
    check_pools,
    deployment_from_sglang,
    plan_from_sglang,
    plan_sglang,
)
from k3layout.engines.sglang.pools import pool_tensors
from k3layout.errors import check_facts_violations
from k3layout.layouts.invariants import plan_invariant_violations

GIB = 1 << 30
K3 = preset("kimi-k3")
LINEAR = preset("kimi-linear-48b")
MLA_ROW = 512 + 64  # kv_lora_rank + qk_rope_head_dim, one fp8 byte each
# one KDA layer's state at attention TP 8: conv (K-1) x 3*H*D/tp bf16 + recurrent H/tp x D x D fp32
S_TP8 = 3 * (3 * 96 * 128 // 8) * 2 + 96 // 8 * 128 * 128 * 4


def sglang(model: HybridModel = K3, **fields: Any) -> SglangPlan:
    result = plan(model, Deployment(engine="sglang", **fields))
    assert isinstance(result, SglangPlan)
    return result


def refused(call: Any) -> Refusal:
    with pytest.raises(Refusal) as caught:
        call()
    return caught.value


def test_k3_on_h200_pages_one_token_on_fa3_and_its_cell_is_the_latent_of_24_mla_layers() -> None:
    p = sglang(attn_tp=8, gpu="h200")
    assert (p.prefill_attention_backend, p.attention_backend, p.page_tokens) == ("fa3", "fa3", 1)
    assert p.bytes_per_token == p.cell_bytes(0) == 24 * MLA_ROW == 13_824
    assert p.state_slot_bytes() == 69 * S_TP8 == 56_171_520
    assert plan_invariant_violations(p) == []


def test_the_issues_golden_capacity_at_60_gib_comes_out_of_the_planner() -> None:
    at_tp8 = sglang(attn_tp=8).capacity(60 * GIB)
    assert (
        at_tp8.max_total_num_tokens,
        at_tp8.max_mamba_cache_size,
        at_tp8.max_running_requests,
    ) == (2_450_425, 541, 108)
    at_tp1 = sglang(attn_tp=1).capacity(60 * GIB)
    # the state pool, not the token pool, limits concurrency at TP 1: 66 slots // 5 per request
    assert (at_tp1.max_mamba_cache_size, at_tp1.max_running_requests) == (66, 13)
    assert at_tp1.max_total_num_tokens == 2_474_805


def test_the_state_pool_takes_r_over_1_plus_r_of_the_budget_less_the_multimodal_reserve() -> None:
    c = sglang(attn_tp=8).capacity(60 * GIB)
    rest = 60 - 100 / 1024  # GiB, as SGLang counts: K3 is multimodal (100 MiB reserved)
    share = rest * 0.9 / 1.9 * GIB
    assert c.max_mamba_cache_size == int((share - 69 * S_TP8) // (69 * S_TP8))
    left = rest - (c.max_mamba_cache_size + 1) * 69 * S_TP8 / GIB
    assert c.max_total_num_tokens == int(left * GIB) // 13_824
    assert c.state_pool_bytes == (541 + 1) * 69 * S_TP8
    assert c.multimodal_reservation_bytes == 100 << 20


def test_blackwell_runs_k3_on_trtllm_mla_in_64_token_pages() -> None:
    p = sglang(attn_tp=8, gpu="b200")
    assert (p.attention_backend, p.page_tokens) == ("trtllm_mla", 64)
    tokens = p.capacity(60 * GIB).max_total_num_tokens
    assert tokens == 2_450_368 == 2_450_425 // 64 * 64
    # Kimi-Linear has no K3 override there: flashinfer, one-token pages
    assert (sglang(LINEAR, attn_tp=8, gpu="b200").attention_backend, 1) == ("flashinfer", 1)


def test_sglang_splits_93_layers_over_two_stages_at_46_and_keeps_the_min() -> None:
    p = sglang(attn_tp=8, pp=2)
    assert [(s.layers[0], s.layers[-1] + 1) for s in p.stages] == [(0, 46), (46, 93)]
    c = p.capacity(60 * GIB)
    assert [s.max_total_num_tokens for s in c.stages] == [5_344_199, 4_522_015]
    assert c.max_total_num_tokens == min(s.max_total_num_tokens for s in c.stages)
    # no overlap scheduler under PP: 3 + 1 tracking slot per request
    assert (c.max_mamba_cache_size, c.state_slots_per_request, c.max_running_requests) == (
        1068,
        4,
        1068 // 4,
    )


def test_decode_context_parallel_multiplies_the_logical_tokens_on_blackwell() -> None:
    c = sglang(attn_tp=8, dcp=8, gpu="b200").capacity(60 * GIB)
    p = sglang(attn_tp=8, dcp=8, gpu="b200")
    assert p.attention_backend == "cutedsl_mla"
    assert c.logical_tokens == 8 * c.max_total_num_tokens == 19_602_944


def test_attention_dp_workers_each_size_their_pool_at_their_own_attention_tp() -> None:
    dp = sglang(attn_tp=1, attn_dp=8).capacity(60 * GIB)
    tp1 = sglang(attn_tp=1).capacity(60 * GIB)
    assert (dp.max_total_num_tokens, dp.max_mamba_cache_size, dp.max_running_requests) == (
        tp1.max_total_num_tokens,
        tp1.max_mamba_cache_size,
        tp1.max_running_requests,
    )


def test_speculative_decoding_keeps_k_minus_1_conv_rows_and_reserves_a_verify_scratch() -> None:
    p = sglang(attn_tp=8, spec_tokens=3)
    assert p.sizes.state_bytes == S_TP8  # no speculative conv rows in SGLang
    c = p.capacity(60 * GIB)
    assert (c.max_total_num_tokens, c.max_mamba_cache_size, c.max_running_requests) == (
        2_641_402,
        298,
        48,  # SGLang's default cap with speculative decoding
    )
    # one scratch of the slot per draft token (3 + 1) per running request, plus padding
    assert c.verify_scratch_bytes == 69 * S_TP8 * (48 + 1) * 4


def test_a_dspark_draft_of_gqa_layers_adds_its_k_and_v_rows_to_the_cell() -> None:
    draft = tuple(GQALayer(num_heads=64, num_kv_heads=64, head_dim=128) for _ in range(5))
    model = HybridModel(
        name="k3-dspark-sglang",
        model_type="kimi_k3",
        layers=K3.layers,
        draft_layers=draft,
        drafter="dspark",
        context_tokens=K3.context_tokens,
    )
    c = sglang(model, attn_tp=8, spec_tokens=7).capacity(60 * GIB)
    assert c.draft_bytes_per_token == 64 // 8 * (128 + 128) * 5 == 10_240
    assert (c.max_total_num_tokens, c.max_mamba_cache_size, c.max_running_requests) == (
        1_407_691,
        205,
        41,
    )


def test_sglang_flags_move_the_split_and_the_caps() -> None:
    base = sglang(attn_tp=8).capacity(60 * GIB)
    wider = sglang(attn_tp=8, mamba_full_memory_ratio=2.0).capacity(60 * GIB)
    assert wider.max_mamba_cache_size > base.max_mamba_cache_size
    assert wider.max_total_num_tokens < base.max_total_num_tokens
    capped = sglang(attn_tp=8, max_running_requests=64).capacity(60 * GIB)
    assert capped.max_running_requests == 64
    fixed = sglang(attn_tp=8, max_mamba_cache_size=200).capacity(60 * GIB)
    assert (fixed.max_mamba_cache_size, fixed.max_running_requests) == (200, 200 // 5)
    no_radix = sglang(attn_tp=8, prefix_caching=False).capacity(60 * GIB)
    assert no_radix.state_slots_per_request == 1
    assert no_radix.max_running_requests == min(2048, no_radix.max_mamba_cache_size)


def test_a_budget_sglang_refuses_is_refused_too() -> None:
    # K3 TP 1 at 1 GiB: not one state slot (449 MB each) in the state pool's share
    assert refused(lambda: sglang(attn_tp=1).capacity(1 * GIB)).code == "budget_too_small"
    # TP 2 at 1 GiB: one slot, fewer than the 5 a request holds
    caught = refused(lambda: sglang(attn_tp=2).capacity(1 * GIB))
    assert caught.code == "budget_too_small"
    assert caught.facts["max_mamba_cache_size"] == 1
    tiny = sglang(attn_tp=8).capacity(1 * GIB)  # TP 8: 7 slots, one request
    assert (tiny.max_mamba_cache_size, tiny.max_running_requests) == (7, 1)


@pytest.mark.parametrize(
    ("fields", "code", "field"),
    [
        ({"kv_dtype": "fp8_ds_mla"}, "dtype_unsupported", None),
        ({"attention_backend": "TRITON_MLA"}, "engine_setting", "attention_backend"),
        ({"block_tokens": 64}, "engine_setting", "block_tokens"),
        ({"conv_layout": "DS"}, "engine_setting", "conv_layout"),
        ({"replayssm": True}, "engine_setting", "replayssm"),
        ({"gpu": "a100"}, "engine_setting", "gpu"),
        ({"gpu": "mi300x"}, "engine_setting", "gpu"),
        ({"attn_tp": 8, "dcp": 2, "gpu": "h200"}, "dcp_unsupported", None),
        ({"attn_tp": 5}, "heads_not_divisible", None),
    ],
)
def test_what_sglang_does_not_serve_is_refused_by_name(
    fields: dict[str, Any], code: str, field: str | None
) -> None:
    caught = refused(lambda: plan(K3, Deployment(engine="sglang", **fields)))
    assert caught.code == code
    if field is not None:
        assert caught.facts["field"] == field


def test_sglangs_flags_on_another_engine_are_refused_not_ignored() -> None:
    for engine in ("vllm", "tokenspeed"):
        caught = refused(lambda e=engine: plan(K3, Deployment(engine=e, max_running_requests=8)))
        assert (caught.code, caught.facts["field"]) == ("engine_setting", "max_running_requests")


def test_an_mla_draft_is_not_sglangs_and_is_planned_only_without_speculative_tokens() -> None:
    dspark = preset("kimi-k3-dspark")
    caught = refused(lambda: plan(dspark, Deployment(engine="sglang", attn_tp=8, spec_tokens=2)))
    assert caught.code == "draft_unsupported"
    built = sglang(dspark, attn_tp=8)  # no draft runner at 0 tokens: the target alone
    assert built.model.draft_layers == ()


def test_a_plan_round_trips_through_json_and_a_tampered_one_is_refused() -> None:
    p = sglang(attn_tp=8, gpu="b200")
    assert load_plan(p.model_dump_json()) == p
    tampered = p.model_dump()
    tampered["page_tokens"] = 1
    caught = refused(lambda: SglangPlan.model_validate(tampered))
    assert (caught.code, caught.facts["field"]) == ("plan_mismatch", "page_tokens")


def test_byte_ranges_sit_inside_the_pool_tensor_that_holds_each_part() -> None:
    p = sglang(attn_tp=8)
    tensors = {t.name: t for t in pool_tensors(p, num_tokens=64, num_slots=11)}
    kv = tensors["kv_buffer[1]"]
    assert kv.layers == (7,) and kv.shape == (64 + 1, 1, MLA_ROW)
    latent = p.byte_range(7, "latent", block=3, num_blocks=65)
    assert (p.tensor_of(7, "latent"), latent.offset_bytes, latent.size_bytes) == (
        "kv_buffer[1]",
        3 * MLA_ROW,
        MLA_ROW,
    )
    conv = tensors["conv[0]"]
    assert conv.shape == (69, 11 + 1, 3, 3 * 96 * 128 // 8) and conv.dtype == "bfloat16"
    # KDA layer 5 is at position 4 of the KDA layers (0, 1, 2, 4, 5): row 4 * 12 + 2 of conv[0]
    state = p.byte_range(5, "conv", block=2, num_blocks=12)
    conv_bytes = 3 * (3 * 96 * 128 // 8) * 2
    assert (state.offset_bytes, state.size_bytes) == ((4 * 12 + 2) * conv_bytes, conv_bytes)
    assert p.tensor_of(5, "recurrent") == "temporal"
    assert tensors["temporal"].shape == (69, 12, 12, 128, 128)


class FakeTensor:
    """What the bridge reads of a tensor: dtype, shape, stride() (contiguous unless given),
    and where its bytes are: its own allocation, 1 MiB apart from every other (unless an
    address and a storage offset are given)."""

    allocated = 0

    def __init__(
        self,
        dtype: str,
        shape: tuple[int, ...],
        strides: tuple[int, ...] | None = None,
        *,
        address: int | None = None,
        offset: int = 0,
    ):
        self.dtype = f"torch.{dtype}"
        self.shape = shape
        self._strides = strides
        self._offset = offset
        if address is None:
            FakeTensor.allocated += 1 << 40  # far apart: no two fakes share a byte
            address = FakeTensor.allocated
        self._address = address

    def element_size(self) -> int:
        return {"uint8": 1, "bfloat16": 2, "float32": 4}[self.dtype.removeprefix("torch.")]

    def storage_offset(self) -> int:
        return self._offset

    def data_ptr(self) -> int:
        return self._address + self._offset * self.element_size()

    def stride(self) -> tuple[int, ...]:
        if self._strides is not None:
            return self._strides
        step, strides = 1, list[int]()
        for size in reversed(self.shape):
            strides.insert(0, step)
            step *= size
        return tuple(strides)


def pools_of(p: SglangPlan, tokens: int = 64, slots: int = 11) -> tuple[Any, Any]:
    tensors = pool_tensors(p, tokens, slots)
    kv = [FakeTensor(t.dtype, t.shape) for t in tensors if t.name.startswith("kv_buffer")]
    conv, temporal = (FakeTensor(t.dtype, t.shape) for t in tensors[-2:])
    mla = [t.layers[0] for t in tensors if t.name.startswith("kv_buffer")]
    token_pool = SimpleNamespace(
        full_attention_layer_ids=mla,
        full_kv_pool=SimpleNamespace(kv_buffer=kv, size=tokens),
    )
    mamba = SimpleNamespace(
        size=slots,
        mamba_layer_ids=list(p.model.kda_layer_ids),
        mamba_cache=SimpleNamespace(conv=[conv], temporal=temporal),
    )
    return SimpleNamespace(mamba_pool=mamba), token_pool


def test_check_pools_passes_sglangs_own_layout_and_blames_the_layer_of_a_wrong_tensor() -> None:
    p = sglang(attn_tp=8)
    req, tok = pools_of(p)
    assert check_pools(p, req, tok) is p
    tok.full_kv_pool.kv_buffer[2] = FakeTensor("bfloat16", (65, 1, MLA_ROW))
    caught = refused(lambda: check_pools(p, req, tok))
    assert check_facts_violations(caught.facts) == []
    assert caught.code == "plan_mismatch"
    assert caught.facts == {
        "check": "check_pools",
        "field": "dtype",
        "stage": 0,
        "layer": 11,  # the third MLA layer
        "layer_name": "kv_buffer[2]",
        "group": "full_attention",
        "position": 2,
        "plane": None,
        "part": "kv_buffer",
        "block": None,
        "expected": "uint8",
        "actual": "bfloat16",
    }
    req, tok = pools_of(p)
    del tok.full_kv_pool.kv_buffer[-1]
    caught = refused(lambda: check_pools(p, req, tok))
    assert (caught.facts["layer"], caught.facts["field"]) == (92, "count")
    assert (caught.facts["expected"], caught.facts["actual"]) == (24, 23)
    req, tok = pools_of(p)
    req.mamba_pool.mamba_cache.temporal = FakeTensor("bfloat16", (69, 12, 12, 128, 128))
    caught = refused(lambda: check_pools(p, req, tok))
    assert (caught.facts["layer_name"], caught.facts["field"]) == ("temporal", "dtype")
    req, tok = pools_of(p)
    conv = req.mamba_pool.mamba_cache.conv[0]
    req.mamba_pool.mamba_cache.conv = [FakeTensor("bfloat16", conv.shape, (1, *conv.stride()[1:]))]
    caught = refused(lambda: check_pools(p, req, tok))
    assert (caught.facts["layer_name"], caught.facts["field"]) == ("conv[0]", "strides")
    req, tok = pools_of(sglang(attn_tp=4))  # a pool built for another TP
    caught = refused(lambda: check_pools(p, req, tok))
    assert (caught.facts["layer_name"], caught.facts["field"]) == ("conv[0]", "shape")
    assert caught.facts["expected"] == (69, 12, 3, 3 * 96 * 128 // 8)
    req, tok = pools_of(p)
    req.mamba_pool.mamba_layer_ids = list(p.model.kda_layer_ids[1:])
    caught = refused(lambda: check_pools(p, req, tok))
    assert (caught.facts["layer"], caught.facts["field"]) == (0, "layers")


def test_check_pools_refuses_one_tensor_bound_to_two_mla_layers() -> None:
    """kv_buffer[0] passed twice: every shape, dtype and stride is right, and two MLA layers
    (3 and 7) would write the same KV. Refused as an overlap, naming the later layer."""
    p = sglang(attn_tp=8)
    req, tok = pools_of(p)
    tok.full_kv_pool.kv_buffer[1] = tok.full_kv_pool.kv_buffer[0]
    caught = refused(lambda: check_pools(p, req, tok))
    assert check_facts_violations(caught.facts) == []
    assert (caught.facts["field"], caught.facts["layer"], caught.facts["layer_name"]) == (
        "overlap",
        7,
        "kv_buffer[1]",
    )
    assert caught.facts["other_layer"] == "kv_buffer[0]"
    assert caught.facts["actual"] == 65 * MLA_ROW  # every byte shared
    assert "would write the same bytes" in str(caught)


def test_check_pools_refuses_pools_that_overlap_or_start_inside_another_allocation() -> None:
    p = sglang(attn_tp=8)
    req, tok = pools_of(p)
    first = tok.full_kv_pool.kv_buffer[0]
    # kv_buffer[5] laid over the last row of kv_buffer[0]
    overlapping = FakeTensor("uint8", first.shape, address=first.data_ptr() + 64 * MLA_ROW)
    tok.full_kv_pool.kv_buffer[5] = overlapping
    caught = refused(lambda: check_pools(p, req, tok))
    assert (caught.facts["field"], caught.facts["layer_name"], caught.facts["actual"]) == (
        "overlap",
        "kv_buffer[5]",
        MLA_ROW,
    )
    req, tok = pools_of(p)
    temporal = req.mamba_pool.mamba_cache.temporal
    # the state cut 16 floats into a storage of its own: not where SGLang's allocation starts
    req.mamba_pool.mamba_cache.temporal = FakeTensor("float32", temporal.shape, offset=16)
    caught = refused(lambda: check_pools(p, req, tok))
    assert (caught.facts["field"], caught.facts["expected"], caught.facts["actual"]) == (
        "offset_bytes",
        0,
        64,
    )
    # the conv state and the recurrent state in one storage, the second over the first
    req, tok = pools_of(p)
    conv = req.mamba_pool.mamba_cache.conv[0]
    req.mamba_pool.mamba_cache.temporal = FakeTensor(
        "float32", temporal.shape, address=conv.data_ptr()
    )
    caught = refused(lambda: check_pools(p, req, tok))
    assert (caught.facts["field"], caught.facts["other_layer"]) == ("overlap", "conv[0]")


def test_the_bridge_reads_sglangs_server_args_and_model_config() -> None:
    server_args = SimpleNamespace(
        tp_size=8,
        dp_size=8,
        enable_dp_attention=True,
        pp_size=1,
        dcp_size=1,
        kv_cache_dtype="fp8_e4m3",
        speculative_algorithm="EAGLE",
        speculative_num_draft_tokens=4,
        disable_radix_cache=False,
        mamba_full_memory_ratio=None,
        max_running_requests=None,
        max_mamba_cache_size=None,
        max_total_tokens=None,
        attn_dp_size=None,
    )
    deployment = deployment_from_sglang(server_args, "b200")
    assert deployment == Deployment(
        engine="sglang", gpu="b200", attn_tp=1, attn_dp=8, kv_dtype="fp8", spec_tokens=3
    )
    config = SimpleNamespace(
        to_dict=lambda: {
            "model_type": "kimi_linear",
            "num_hidden_layers": 27,
            "num_attention_heads": 32,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "linear_attn_config": {
                "num_heads": 32,
                "head_dim": 128,
                "short_conv_kernel_size": 4,
                "kda_layers": [i + 1 for i in range(27) if i not in (3, 7, 11, 15, 19, 23, 26)],
            },
        }
    )
    p = plan_from_sglang(server_args, SimpleNamespace(hf_config=config), "b200")
    assert p.model.layers == LINEAR.layers
    unknown = SimpleNamespace(**{**vars(server_args), "kv_cache_dtype": "mxfp8"})
    caught = refused(lambda: deployment_from_sglang(unknown))
    assert caught.facts["field"] == "kv_cache_dtype"


@pytest.mark.parametrize(
    "field", ["tp_size", "pp_size", "dcp_size", "kv_cache_dtype", "disable_radix_cache"]
)
def test_server_args_without_a_field_every_server_args_has_are_refused(field: str) -> None:
    # a record missing tp_size is not SGLang's: it is never read as TP 1
    server_args = SimpleNamespace(
        tp_size=8,
        attn_dp_size=1,
        dp_size=1,
        enable_dp_attention=False,
        pp_size=1,
        dcp_size=1,
        kv_cache_dtype="fp8_e4m3",
        speculative_algorithm=None,
        speculative_num_draft_tokens=None,
        disable_radix_cache=False,
        mamba_full_memory_ratio=None,
        max_running_requests=None,
        max_mamba_cache_size=None,
        max_total_tokens=None,
    )
    assert deployment_from_sglang(server_args).attn_tp == 8
    delattr(server_args, field)
    caught = refused(lambda: deployment_from_sglang(server_args))
    assert caught.code == "invalid_config" and caught.facts["field"] == field


def test_sglang_pairs_prefill_tp_8_with_decode_tp_2_by_gathering_four_ranks() -> None:
    prefill, decode = (Deployment(engine="sglang", attn_tp=tp) for tp in (8, 2))
    t = plan_transfer(K3, prefill, decode, prompt_tokens=4096)
    assert transfer_violations(t) == []
    by_consumer: dict[int, list[int]] = {}
    for pair in t.pairs:
        by_consumer.setdefault(pair.consumer, []).append(pair.producer)
    assert by_consumer == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    # only the first producer of each group writes the (replicated) latent rows
    writers = {p.producer for p in t.pairs if any(s.field == "latent" for s in p.segments)}
    assert writers == {0, 4}
    pair = next(p for p in t.pairs if (p.producer, p.consumer) == (5, 1))
    conv = next(s for s in pair.segments if s.field == "conv")
    channels = 96 * 128 // 8  # one q, k or v share of a prefill TP 8 rank
    # SGLang's aggregation: each of 3 rows x (q, k, v) lands at its writer's place
    assert (conv.src_offset_bytes, conv.dst_offset_bytes, conv.length_bytes) == (
        0,
        1 * channels * 2,
        channels * 2,
    )
    assert (conv.num_copies, conv.src_stride_bytes, conv.dst_stride_bytes) == (
        9,
        channels * 2,
        4 * channels * 2,
    )


def test_a_pairing_where_neither_tp_divides_the_other_is_refused_with_sglangs_reason() -> None:
    prefill, decode = (Deployment(engine="sglang", attn_tp=tp) for tp in (2, 3))
    caught = refused(lambda: plan_transfer(K3, prefill, decode, prompt_tokens=64))
    assert caught.code == "tp_not_multiple"
    assert "Bootstrap info not found" in str(caught)
    # vLLM 0.33's NIXL mapping gathers too (tests/conformance/test_conformance_nixl_tp.py)
    vllm = plan_transfer(K3, Deployment(attn_tp=8), Deployment(attn_tp=2), prompt_tokens=64)
    assert vllm.num_pairs == 8


def test_a_decode_pipeline_that_does_not_mirror_the_prefill_is_refused() -> None:
    prefill = Deployment(engine="sglang", attn_tp=8)
    decode = Deployment(engine="sglang", attn_tp=8, pp=2)
    caught = refused(lambda: plan_transfer(K3, prefill, decode, prompt_tokens=64))
    assert (caught.code, caught.facts["field"]) == ("model_mismatch", "pp")


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from((1, 2, 4, 8, 16, 32)),
    st.sampled_from(("fp8", "bf16")),
    st.sampled_from(("h100", "h200", "b200")),
    st.integers(8, 200),
    st.integers(1, 1 << 20),  # up to K3's own context
)
def test_more_memory_never_holds_fewer_tokens_slots_or_requests(
    tp: int, dtype: str, gpu: str, gib: int, context: int
) -> None:
    p = plan_sglang(K3, Deployment(engine="sglang", attn_tp=tp, kv_dtype=dtype, gpu=gpu))
    try:
        low = p.capacity(gib * GIB, context)
    except Refusal as refusal:
        assert refusal.code == "budget_too_small"
        return
    high = p.capacity((gib + 8) * GIB, context)
    assert high.max_total_num_tokens >= low.max_total_num_tokens
    assert high.max_mamba_cache_size >= low.max_mamba_cache_size
    assert high.max_running_requests >= low.max_running_requests
    assert low.max_total_num_tokens % p.page_tokens == 0
    assert low.max_running_requests <= low.max_mamba_cache_size // low.state_slots_per_request
    used = (
        low.state_pool_bytes
        + low.multimodal_reservation_bytes
        + low.max_total_num_tokens * p.cell_bytes()
    )
    assert used <= gib * GIB  # the pools fit the budget they were sized from


def test_a_context_over_the_models_own_is_refused_as_sglang_refuses_it() -> None:
    p = sglang(attn_tp=8)
    caught = refused(lambda: p.capacity(60 * GIB, (1 << 20) + 1))
    assert (caught.code, caught.facts["field"], caught.facts["bound"]) == (
        "invalid_argument",
        "max_model_len",
        1 << 20,
    )
    # a model that does not say its context needs one given
    linear = sglang(LINEAR, attn_tp=8)
    assert refused(lambda: linear.capacity(60 * GIB)).facts["field"] == "max_model_len"
    assert linear.capacity(60 * GIB, 4096).max_running_requests > 0


JUNK = (
    st.none()
    | st.booleans()
    | st.integers(-3, 10**20)
    | st.floats(allow_nan=True)
    | st.text(max_size=4)
    | st.lists(st.integers(-2, 70) | st.text(max_size=2), max_size=5)
    | st.dictionaries(st.integers(-1, 99) | st.text(max_size=2), st.integers(-1, 9), max_size=3)
    | st.just(object())
)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            (
                "tp_size",
                "dp_size",
                "attn_dp_size",
                "enable_dp_attention",
                "pp_size",
                "dcp_size",
                "kv_cache_dtype",
                "speculative_algorithm",
                "speculative_num_draft_tokens",
                "disable_radix_cache",
                "max_running_requests",
                "mamba_full_memory_ratio",
                "max_mamba_cache_size",
            )
        ),
        JUNK,
        max_size=5,
    ),
    st.sampled_from(("h200", "b200", "tpu", 3)),
)
def test_junk_in_sglangs_server_args_is_refused_never_raised(
    fields: dict[str, Any], gpu: Any
) -> None:
    with contextlib.suppress(Refusal):
        deployment_from_sglang(SimpleNamespace(**fields), gpu)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(("shape", "dtype", "stride", "size", "ids", "mapping", "conv", "temporal")),
    JUNK,
)
def test_junk_in_sglangs_pools_is_refused_never_raised(where: str, junk: Any) -> None:
    p = sglang(attn_tp=8)
    req, tok = pools_of(p)
    kv = tok.full_kv_pool.kv_buffer[0]
    if where == "shape":
        kv.shape = junk
    elif where == "dtype":
        kv.dtype = junk
    elif where == "stride":
        kv.stride = lambda: junk
    elif where == "size":
        tok.full_kv_pool.size = junk
    elif where == "ids":
        req.mamba_pool.mamba_layer_ids = junk
    elif where == "mapping":
        tok.full_attention_layer_id_mapping = junk
    elif where == "conv":
        req.mamba_pool.mamba_cache.conv = junk
    else:
        req.mamba_pool.mamba_cache.temporal = junk
    with contextlib.suppress(Refusal):
        check_pools(p, req, tok)
