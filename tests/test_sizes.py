"""Per-rank byte arithmetic (SPEC section 2): every bold number, written as its derivation."""

from __future__ import annotations

import pytest

from k3layout import Deployment, HybridModel, MLALayer, rank_sizes

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


def test_conv_state_has_both_layouts_with_equal_bytes(k3: HybridModel) -> None:
    kda = rank_sizes(k3, Deployment(attn_tp=8, spec_tokens=2)).kda
    assert kda is not None
    channels = 3 * H * D // 8  # q|k|v over 8 ranks: 4,608 channels
    rows = K - 1 + 2
    assert kda.conv_shape("channel_major") == (channels, rows)
    assert kda.conv_shape("time_major") == (rows, channels)
    assert kda.conv_part_shape("channel_major") == (channels // 3, rows)
    assert kda.conv_bytes == channels * rows * 2 == 3 * kda.conv_part_bytes
    assert kda.recurrent_shape == (H // 8, D, D)
    assert kda.recurrent_bytes == (H // 8) * D * D * 4


@pytest.mark.parametrize(
    ("kv_dtype", "per_token"), [("fp8", 576), ("bf16", 1152), ("fp8_ds_mla", 656)]
)
def test_mla_latent_bytes_per_token_and_page(
    k3: HybridModel, kv_dtype: str, per_token: int
) -> None:
    attention = rank_sizes(k3, Deployment.model_validate({"kv_dtype": kv_dtype})).attention
    # 512 + 64 = 576 latent elements; FlashMLA fp8: 512 fp8 + 512/128 fp32 scales + 64 bf16 rope
    assert attention.bytes_per_token == per_token
    assert attention.page_bytes() == 128 * per_token  # 73,728 fp8 / 147,456 bf16


def test_mla_cache_is_replicated_so_tp_does_not_change_it(k3: HybridModel) -> None:
    per_tp = {rank_sizes(k3, Deployment(attn_tp=tp)).attention for tp in (1, 8, 32)}
    assert len(per_tp) == 1


def test_replayssm_records_at_tp8_l16_are_196608_bytes_per_layer(k3: HybridModel) -> None:
    replay = rank_sizes(k3, Deployment(attn_tp=8, spec_tokens=2)).replay
    assert replay is not None
    L = max(16, 2 * (2 + 1))  # cache_len 16 beats 2*(s+1) = 6
    per_record = L * (H // 8) * 128
    assert replay.record_len == L
    assert replay.layer_bytes == per_record * 2 + per_record * 2 + per_record * 4 == 196_608
    assert replay.cursor_bytes == 4


def test_replayssm_record_length_grows_with_spec_tokens(k3: HybridModel) -> None:
    replay = rank_sizes(k3, Deployment(attn_tp=8, spec_tokens=9)).replay
    assert replay is not None and replay.record_len == 2 * (9 + 1)


def test_dsa_index_row_folds_into_its_attention_layer() -> None:
    dsa = HybridModel(
        name="dsa",
        model_type="deepseek_v32",
        layers=(MLALayer(num_heads=16, index_bytes_per_token=132),),
    )
    attention = rank_sizes(dsa, Deployment(kv_dtype="fp8")).attention
    assert attention.latent_bytes_per_token == 576
    assert attention.bytes_per_token == 576 + 132  # 128 fp8 + one fp32 scale
