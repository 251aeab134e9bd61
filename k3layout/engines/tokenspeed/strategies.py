"""tokenspeed's own deployment settings for :func:`k3layout.testing.deployments` (imports
hypothesis: only the testing module loads it)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ...errors import Refusal
from ...model import HybridModel
from .rules import check_model


def serves(model: HybridModel) -> bool:
    """Whether tokenspeed's K3 recipe groups ``model`` at attention TP 1 (both layer kinds, KDA
    layers in 3 equal groups, MLA drafts only)."""
    try:
        check_model(model, 1)
    except Refusal:
        return False
    return True


def settings(
    draw: st.DrawFn,
    model: HybridModel,
    fields: dict[str, Any],
    layouts: tuple[str, ...],
    plannable: bool,
) -> dict[str, Any]:
    """None of vLLM's or SGLang's settings, no pipeline stages or DCP (tokenspeed has neither)
    and its own conv layout (channel-major); plannable draws keep a draft's dtype its own."""
    drawn: dict[str, Any] = {
        "replayssm": draw(st.booleans()),
        "block_tokens": None,
        "dcp_interleave": 1,
        "max_padding": draw(st.one_of(st.none(), st.floats(0.05, 1.0))),
    }
    if plannable:
        drawn["pp"] = 1
        drawn["dcp"] = 1
        drawn["draft_kv_dtype"] = draw(st.sampled_from((None, "fp8", "bf16")))
    return drawn
