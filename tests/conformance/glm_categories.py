"""The module categories both GLM-5.3-Flash weights harnesses (``vllm_glm_weights``,
``sglang_glm_weights``) total a rank's tensors by, from the engines' tensor names: pure Python,
so that each engine's environment imports it without the other engine."""

from __future__ import annotations

import re
from typing import Any

CATEGORIES = (
    "embedding",
    "lm_head",
    "kda",
    "mla",
    "indexer",
    "router",
    "routed_experts",
    "shared_experts",
    "dense_mlp",
    "norms",
    "hyper_connections",
    "vision_tower",
    "projector",
    "mtp",
)
"""Module categories, in report order. ``mla`` is the latent attention (projections, norms,
vLLM's scale buffers); ``indexer`` the DSA kpool indexer beside it; ``router`` the MoE gate and
its score-correction bias; ``routed_experts`` the fused experts (with the shared expert where
SGLang fuses it in); ``norms`` the decoder's and the final RMSNorm; ``projector`` the vision
``downsample`` conv and patch ``merger``; ``mtp`` the draft's own tensors."""

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.*)$")


def category(name: str, kda_layers: frozenset[int], draft: bool = False) -> str:
    """The category of tensor ``name`` (a target's, or the draft's when ``draft``)."""
    if draft:
        return "mtp"
    if name.startswith("visual."):
        rest = name.removeprefix("visual.")
        return "projector" if rest.startswith(("merger.", "downsample.")) else "vision_tower"
    if ".embed_tokens." in f".{name}":
        return "embedding"
    if "lm_head." in name:
        return "lm_head"
    match = _LAYER.search(name)
    if match is None:
        return "norms" if re.search(r"(?:^|\.)norm\.", name) else "other"
    layer, rest = int(match.group(1)), match.group(2)
    if rest.startswith("hc_"):
        return "hyper_connections"
    if rest.startswith(("input_layernorm.", "post_attention_layernorm.")):
        return "norms"
    if rest.startswith("self_attn."):
        if layer in kda_layers:
            return "kda"
        return "indexer" if ".indexer" in rest else "mla"
    if rest.startswith("mlp.experts."):
        return "routed_experts"
    if rest.startswith("mlp.gate."):
        return "router"
    if rest.startswith("mlp.shared_experts."):
        return "shared_experts"
    if rest.startswith("mlp."):
        return "dense_mlp"
    return "other"


def totals(table: dict[str, dict[str, Any]], key: str = "category") -> dict[str, int]:
    """Bytes per ``key`` value of a harness's tensor table, in :data:`CATEGORIES` order."""
    found: dict[str, int] = {}
    for info in table.values():
        found[info[key]] = found.get(info[key], 0) + info["bytes"]
    order = {name: i for i, name in enumerate(CATEGORIES)}
    return dict(sorted(found.items(), key=lambda item: order.get(item[0], len(order))))
