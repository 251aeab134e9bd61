"""Per-rank byte arithmetic (SPEC section 2): every bold number, written as its derivation."""

from __future__ import annotations

from itertools import pairwise

import pytest

from k3layout import ConvLayout, Deployment, HybridModel, MLALayer, conv_channel_offset, rank_sizes

H, D, K = 96, 128, 4  # K3's KDA heads, head dim, short conv kernel


def state_bytes(tp: int, s: int) -> int:
    conv = (3 * H * D // tp) * (K - 1 + s) * 2  # q|k|v channels x rows of history, bf16
    recurrent = (H // tp) * D * D * 4  # (H/tp, D, D) fp32
    return conv + recurrent


@pytest.mark.parametrize(
    ("tp", "s", "expected"),
    [
        (1, 0, 6_512_640),
        (1, 2, 6_660_096),
        (8, 0, 814_080),
        (8, 2, 832_512),
        (32, 0, 203_520),
        (32, 2, 208_128),
    ],
)
def test_kda_state_per_layer_per_rank_is_S_of_tp_and_s(
    k3: HybridModel, tp: int, s: int, expected: int
) -> None:
    sizes = rank_sizes(k3, Deployment(attn_tp=tp, spec_tokens=s))
    assert sizes.kda_state_bytes == expected == state_bytes(tp, s)


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96])
def test_state_without_spec_tokens_is_6512640_over_tp(k3: HybridModel, tp: int) -> None:
    assert rank_sizes(k3, Deployment(attn_tp=tp)).kda_state_bytes * tp == 6_512_640


@pytest.mark.parametrize("layout", ["SD", "DS"])
def test_conv_state_is_one_tensor_in_both_layouts_with_equal_bytes(
    k3: HybridModel, layout: ConvLayout
) -> None:
    sizes = rank_sizes(k3, Deployment(attn_tp=8, spec_tokens=2, conv_layout=layout))
    assert sizes.state is not None
    conv, recurrent = sizes.state.parts
    channels = 3 * H * D // 8  # q|k|v side by side over 8 ranks: 4,608 channels
    rows = K - 1 + 2
    # vLLM's names: SD = (state_len, dim), time-major; DS = (dim, state_len).
    assert conv.engine_shape(8) == ((rows, channels) if layout == "SD" else (channels, rows))
    assert conv.local_bytes(8) == channels * rows * 2
    assert recurrent.engine_shape(8) == (H // 8, D, D)
    assert recurrent.local_bytes(8) == (H // 8) * D * D * 4


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 32, 96])
def test_k_channels_of_the_sd_conv_state_start_after_the_q_channels(
    k3: HybridModel, tp: int
) -> None:
    sizes = rank_sizes(k3, Deployment(attn_tp=tp))
    assert sizes.state is not None
    # Row 0 holds q (H/tp * D channels) then k then v, bf16: k starts at H/tp * D * 2 bytes.
    assert conv_channel_offset(sizes.state, "k", tp) == (H // tp) * D * 2
    assert conv_channel_offset(sizes.state, "v", tp) == 2 * (H // tp) * D * 2
    if tp == 1:
        assert conv_channel_offset(sizes.state, "k", tp) == 24_576


@pytest.mark.parametrize("tp", [1, 8])
def test_k_channels_of_the_ds_conv_state_start_a_whole_part_in(k3: HybridModel, tp: int) -> None:
    sizes = rank_sizes(k3, Deployment(attn_tp=tp, spec_tokens=2, conv_layout="DS"))
    assert sizes.state is not None
    rows = K - 1 + 2
    # Channel-major: the q channels' rows come first, H/tp * D channels x rows x 2 bytes.
    assert conv_channel_offset(sizes.state, "k", tp) == (H // tp) * D * rows * 2


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("tp", [1, 3, 8, 32])
def test_the_parts_of_a_slot_tile_it_exactly(k3: HybridModel, layout: ConvLayout, tp: int) -> None:
    sizes = rank_sizes(k3, Deployment(attn_tp=tp, spec_tokens=1, conv_layout=layout))
    assert sizes.state is not None
    ranges = sizes.state.ranges(tp)
    assert ranges[0].offset_bytes == 0
    assert all(a.end_bytes == b.offset_bytes for a, b in pairwise(ranges))
    assert ranges[-1].end_bytes == sizes.state_bytes


@pytest.mark.parametrize(
    ("kv_dtype", "per_token"), [("fp8", 576), ("bf16", 1152), ("fp8_ds_mla", 656)]
)
def test_mla_latent_bytes_per_token_and_page(
    k3: HybridModel, kv_dtype: str, per_token: int
) -> None:
    sizes = rank_sizes(k3, Deployment.model_validate({"kv_dtype": kv_dtype}))
    # 512 + 64 = 576 latent elements; FlashMLA fp8: 512 fp8 + 512/128 fp32 scales + 64 bf16 rope
    assert sizes.attention_bytes_per_token == per_token
    assert sizes.attention_page_bytes() == 128 * per_token  # 73,728 fp8 / 147,456 bf16


def test_mla_cache_is_replicated_so_tp_does_not_change_it(k3: HybridModel) -> None:
    per_tp = {rank_sizes(k3, Deployment(attn_tp=tp)).attention_bytes_per_token for tp in (1, 8, 32)}
    assert per_tp == {576}


def test_replayssm_records_at_tp8_l16_are_196608_bytes_per_layer(k3: HybridModel) -> None:
    sizes = rank_sizes(k3, Deployment(attn_tp=8, spec_tokens=2, replayssm=True))
    assert sizes.replay is not None and sizes.cursor is not None
    L = max(16, 2 * (2 + 1))  # cache_len 16 beats 2*(s+1) = 6
    per_record = L * (H // 8) * 128
    assert sizes.replay.part("replay_k").shape[0] == L
    assert sizes.replay.payload_bytes(8) == per_record * 2 + per_record * 2 + per_record * 4
    assert sizes.replay.payload_bytes(8) == 196_608
    assert sizes.cursor.payload_bytes(8) == 4


def test_replayssm_record_length_grows_with_spec_tokens(k3: HybridModel) -> None:
    replay = rank_sizes(k3, Deployment(attn_tp=8, spec_tokens=9, replayssm=True)).replay
    assert replay is not None and replay.part("replay_g").shape[0] == 2 * (9 + 1)


def test_no_replayssm_records_unless_the_deployment_keeps_them(k3: HybridModel) -> None:
    assert rank_sizes(k3, Deployment(attn_tp=8)).replay is None


def test_dsa_index_row_folds_into_its_attention_layer() -> None:
    dsa = HybridModel(
        name="dsa",
        model_type="deepseek_v32",
        layers=(MLALayer(num_heads=16, index_bytes_per_token=132),),
    )
    sizes = rank_sizes(dsa, Deployment(kv_dtype="fp8"))
    assert sizes.attention.part("latent").local_bytes(1) == 576
    assert sizes.attention_bytes_per_token == 576 + 132  # 128 fp8 + one fp32 scale
