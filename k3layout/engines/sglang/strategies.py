"""SGLang's own deployment settings for :func:`k3layout.testing.deployments` (imports
hypothesis: only the testing module loads it)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ...gpus import GPUS
from ...model import HybridModel
from .rules import DSA_INDEX_HEAD_DIMS, MULTIMODAL_MODEL_TYPES, SERVED_GPUS


def serves(model: HybridModel) -> bool:
    """Whether SGLang's DSA pool takes ``model``'s indexers (their key width, a fixed
    ``index_head_dim``); a model without one always."""
    return all(
        layer.indexer is None or layer.indexer.head_dim in DSA_INDEX_HEAD_DIMS
        for layer in model.mla_layers
    )


def settings(
    draw: st.DrawFn,
    model: HybridModel,
    fields: dict[str, Any],
    layouts: tuple[str, ...],
    plannable: bool,
) -> dict[str, Any]:
    """A GPU SGLang was read on and SGLang's own flags; none of vLLM's settings (SGLang picks
    its page from the GPU, keeps the conv state time-major and deals DCP tokens one at a time)
    and no ReplaySSM records.
    Plannable draws keep what SGLang serves: K3's DCP only on Blackwell, a draft only as
    SGLang's dense K/V draft and without PP."""
    gpus = SERVED_GPUS
    if plannable and fields["dcp"] > 1 and model.model_type in MULTIMODAL_MODEL_TYPES:
        gpus = tuple(g for g in SERVED_GPUS if GPUS[g].capability[0] >= 10)
    drawn: dict[str, Any] = {
        "gpu": draw(st.sampled_from(gpus)),
        "conv_layout": "SD",
        "replayssm": False,
        "block_tokens": None,
        "dcp_interleave": 1,  # SGLang deals DCP tokens one at a time
        "prefix_caching": draw(st.booleans()),
        "mamba_full_memory_ratio": draw(st.one_of(st.none(), st.sampled_from((0.5, 0.9, 2.0)))),
        "max_running_requests": draw(st.one_of(st.none(), st.integers(1, 512))),
    }
    if plannable and model.indexer is not None:
        drawn["dcp"] = 1  # DSA: a pooled key would span DCP ranks
    if plannable and model.draft_layers and fields["spec_tokens"]:
        if model.drafter != "mtp" and any(layer.kind == "mla" for layer in model.draft_layers):
            drawn["spec_tokens"] = 0  # SGLang builds no MLA draft; none is built at 0
        else:
            drawn["pp"] = 1
    return drawn
