"""GLM-5.3-Flash checkpoints no preset is, for both engines' conformance suites: the fixture
with these ``text_config`` fields changed. Each suite plans them through its engine's own code
and expects k3layout to plan what the engine plans and refuse what it refuses."""

from __future__ import annotations

from typing import Any

VARIANTS: list[dict[str, Any]] = [
    {"index_kpool": 4},
    {"index_kpool": 8},
    {"index_kpool": 32},
    {"index_head_dim": 64},  # SGLang refuses: its DSA pool asserts 128-wide index keys
    {"index_head_dim": 256},
    {"kv_lora_rank": 256},  # vLLM refuses: its sparse backends take a head of 512 or 576
    {"qk_rope_head_dim": 64},  # both refuse: the config wants NoPE DSA layers
    {"linear_num_heads": 32},
    {"linear_head_dim": 64},
    {"linear_conv_kernel_dim": 3},
    {"num_attention_heads": 32, "num_key_value_heads": 32},
    {
        "num_hidden_layers": 12,
        "layer_types": ["linear_attention"] * 3
        + ["indexed_attention"]
        + ["linear_attention"] * 7
        + ["indexed_attention"],
        "indexer_types": ["full"] * 12,
        "mlp_layer_types": ["dense"] * 12,
    },
]


def variant_id(fields: dict[str, Any]) -> str:
    """A test id for a variant: its changed fields (a layer pattern by its length)."""
    return "-".join(f"{k}={v}" for k, v in fields.items() if not isinstance(v, list))
