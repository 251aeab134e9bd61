"""Built-in models, written from their published ``config.json`` values.

``tests/test_model_loading.py`` checks each preset against the Hugging Face config fixtures, so
the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from .._args import expect_args
from .._validation import describe
from ..cache import DSAIndexer
from ..constants import MAX_MODULE_LAYERS
from ..errors import Refusal
from ..limits import check_bound
from .architecture import Architecture, DSparkDraft, MergerVisionTower, VisionTower
from .hf_layer_types import ENGINE_FIELDS
from .layers import KDALayer, Layer, MLALayer
from .spec import HybridModel

DSPARK_DRAFT_LAYERS: Final = 5
"""Dense MLA layers of K3's DSpark speculative draft (module layers 93..97)."""
DSPARK_DRAFT_HEADS = 64
"""Query heads of each DSpark draft layer (its own config; attention TP must divide them)."""


def is_kimi_mla_layer(layer: int, num_layers: int) -> bool:
    """Whether 0-based ``layer`` is MLA in Kimi's 3:1 pattern: every 4th layer and the last."""
    return layer % 4 == 3 or layer == num_layers - 1


def kimi_layer_pattern(num_layers: int, mla: MLALayer, kda: KDALayer) -> tuple[Layer, ...]:
    """Kimi's 3:1 hybrid pattern: MLA at every 4th layer (0-based 3, 7, ...) and at the last.

    Refuses (``invalid_argument``) arguments of the wrong type or ``num_layers`` below 1,
    (``size_limit``) more than ``MAX_MODULE_LAYERS`` layers."""
    expect_args(("num_layers", num_layers, int), ("mla", mla, MLALayer), ("kda", kda, KDALayer))
    if num_layers < 1:
        raise Refusal(
            "invalid_argument",
            f"num_layers={describe(num_layers)} must be >= 1",
            facts={"field": "num_layers"},
            hint="pass num_layers >= 1",
        )
    check_bound("num_layers", num_layers, MAX_MODULE_LAYERS, why="a model's layers")
    return tuple(mla if is_kimi_mla_layer(i, num_layers) else kda for i in range(num_layers))


K3_CONTEXT_TOKENS: Final = 1 << 20
"""Kimi-K3's ``max_position_embeddings`` (1,048,576), as its config.json says."""


K3_ARCHITECTURE: Final = Architecture(
    architecture="KimiK3ForConditionalGeneration",
    hidden_size=7168,
    vocab_size=163840,
    num_experts=896,
    num_experts_per_token=16,
    num_shared_experts=2,
    moe_intermediate_size=3072,
    first_k_dense_replace=1,
    mla_output_gate=True,
    vision=VisionTower(),  # no vision_config in the fixture: KimiK3VisionConfig's defaults
    defaulted=(
        "intermediate_size",
        "moe_layer_freq",
        "routed_expert_hidden_size",
        "latent_moe_use_norm",
        "attn_res_block_size",
        "min_moe_intermediate_per_partition",
        "tie_word_embeddings",
    ),
)
"""Kimi-K3's weights: hidden 7168, 896 routed experts of 3072 and 2 shared, a dense layer 0
(intermediate_size absent: KimiLinearConfig's 11,008), bf16, with the default vision tower."""

DSPARK_DRAFT: Final = DSparkDraft(
    hidden_size=7168,
    intermediate_size=18432,
    vocab_size=163840,
    target_hidden_size=7168,
    num_target_layers=4,
    markov_rank=64,
    max_position_embeddings=K3_CONTEXT_TOKENS,
)
"""K3's DSpark draft: dense MLA layers of hidden 7168 and MLP 18,432 reading 4 target layers."""


def kimi_k3() -> HybridModel:
    """Kimi-K3: 93 layers, 24 MLA (96 heads, NoPE, q_lora 1536) and 69 KDA (96 x 128)."""
    mla = MLALayer(num_heads=96, q_lora_rank=1536)
    kda = KDALayer(
        num_heads=96, head_dim=128, conv_kernel=4, full_rank_gate=True, gate_lower_bound=-5.0
    )
    return HybridModel(
        name="kimi-k3",
        model_type="kimi_k3",
        layers=kimi_layer_pattern(93, mla, kda),
        context_tokens=K3_CONTEXT_TOKENS,
        architecture=K3_ARCHITECTURE,
    )


def kimi_k3_dspark() -> HybridModel:
    """Kimi-K3 with its DSpark draft: 5 dense MLA layers with the target's 576-element latent
    and 64 query heads (the draft's own config: tokenspeed's ``KimiK3DSparkConfig``)."""
    target = kimi_k3()
    draft = MLALayer(num_heads=DSPARK_DRAFT_HEADS, q_lora_rank=1536)
    return HybridModel(
        name="kimi-k3-dspark",
        model_type=target.model_type,
        layers=target.layers,
        draft_layers=(draft,) * DSPARK_DRAFT_LAYERS,
        drafter="dspark",
        context_tokens=target.context_tokens,
        architecture=Architecture.model_validate({**dict(K3_ARCHITECTURE), "draft": DSPARK_DRAFT}),
    )


def kimi_linear_48b() -> HybridModel:
    """Kimi-Linear-48B-A3B: 27 layers, 7 MLA (32 heads, no q_lora) and 20 KDA (32 x 128)."""
    mla = MLALayer(num_heads=32, q_lora_rank=None)
    kda = KDALayer(num_heads=32, head_dim=128, conv_kernel=4)
    return HybridModel(
        name="kimi-linear-48b",
        model_type="kimi_linear",
        layers=kimi_layer_pattern(27, mla, kda),
        architecture=Architecture(
            architecture="KimiLinearForCausalLM",
            hidden_size=2304,
            vocab_size=163840,
            intermediate_size=9216,
            num_experts=256,
            num_experts_per_token=8,
            num_shared_experts=1,
            moe_intermediate_size=1024,
            first_k_dense_replace=1,
            defaulted=(
                "routed_expert_hidden_size",
                "latent_moe_use_norm",
                "attn_res_block_size",
                "min_moe_intermediate_per_partition",
                "mla_output_gate",
                "num_nextn_predict_layers",
                "tie_word_embeddings",
            ),
        ),
    )


GLM_CONTEXT_TOKENS: Final = 1 << 20
"""GLM-5.3-Flash's ``max_position_embeddings`` (1,048,576)."""

GLM_INDEXER: Final = DSAIndexer(head_dim=128, num_heads=32, topk=2048, kpool=16)
"""GLM-5.3-Flash's DSA indexer: 128-dim fp8 keys pooled over 16 tokens, top 2,048."""


def glm_5_3_flash() -> HybridModel:
    """GLM-5.3-Flash: 45 layers, 11 NoPE MLA with a pooled DSA indexer (64 heads, latent 512,
    q_lora 1536; layers 3, 7, .., 43) and 34 KDA (64 x 128, a bounded safe gate); no MTP
    layers declared (transformers' default config, the fixture)."""
    mla = MLALayer(
        num_heads=64,
        qk_rope_head_dim=0,
        qk_nope_head_dim=256,
        v_head_dim=256,
        q_lora_rank=1536,
        indexer=GLM_INDEXER,
    )
    kda = KDALayer(num_heads=64, head_dim=128, conv_kernel=4, gate_lower_bound=-5.0, safe_gate=True)
    return HybridModel(
        name="glm-5.3-flash",
        model_type="glm5_next",
        layers=tuple(mla if i % 4 == 3 else kda for i in range(45)),
        context_tokens=GLM_CONTEXT_TOKENS,
        architecture=Architecture(
            architecture="Glm5NextForConditionalGeneration",
            hidden_size=4096,
            vocab_size=154880,
            intermediate_size=12288,
            num_experts=288,
            num_experts_per_token=8,
            num_shared_experts=1,
            moe_intermediate_size=2048,
            first_k_dense_replace=3,
            mlp_layer_types=("dense",) * 3 + ("sparse",) * 42,
            hyper_connections=4,
            undeclared=ENGINE_FIELDS,
            merger_vision=MergerVisionTower(
                depth=24,
                hidden_size=1024,
                num_heads=16,
                intermediate_size=4096,
                patch_size=14,
                temporal_patch_size=2,
                in_channels=3,
                out_hidden_size=1536,
                spatial_merge_size=2,
                projection_intermediate_size=10240,
                rotary_positions=GLM_CONTEXT_TOKENS,
            ),
            defaulted=("num_nextn_predict_layers",),
        ),
    )


PRESETS: Final[dict[str, Callable[[], HybridModel]]] = {
    "kimi-k3": kimi_k3,
    "kimi-k3-dspark": kimi_k3_dspark,
    "kimi-linear-48b": kimi_linear_48b,
    "glm-5.3-flash": glm_5_3_flash,
}


def preset(name: str) -> HybridModel:
    """The built-in model called ``name``; refuses (``unknown_model``) naming the known ones."""
    expect_args(("name", name, str))
    try:
        build = PRESETS[name]
    except KeyError:
        raise Refusal(
            "unknown_model",
            f"model {name!r}: not a built-in preset",
            facts={"model": name, "presets": tuple(PRESETS)},
            hint=f"use one of {', '.join(PRESETS)} or a path to a config.json",
        ) from None
    return build()
