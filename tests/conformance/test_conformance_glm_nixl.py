"""GLM-5.3-Flash's prefill-to-decode transfer on vLLM 0.33.0's NIXL connector, run on CPU by
``vllm_glm_nixl.glm_nixl_transfer`` (both sides' workers, their registration, the engine
core's scheduler, the handshake and the decode's reads): which pairs vLLM serves is what
``k3layout.engines.vllm.pd.nixl_refusal`` says, with the block both sides need where it
refuses; a served pair reads the latent, pooled keys and tail ring from one prefill rank and
the KDA heads from the ranks the TP rule names.

k3layout does not plan the transfer's byte copies of a packed layout yet (``plan_transfer``
refuses it, ``layout_unsupported``); the notes beside the fixture (section 7) hold the rules.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from vllm_required import require_vllm

require_vllm()

from vllm_glm import FIXTURE  # noqa: E402
from vllm_glm_nixl import GlmSide, glm_nixl_transfer  # noqa: E402

from k3layout import Deployment, Refusal, model_from_config, plan, plan_transfer  # noqa: E402
from k3layout.engines.vllm.pd import nixl_refusal  # noqa: E402
from k3layout.transfer.pairing import producers_of  # noqa: E402

PAIRS = [
    # prefill TP, decode TP, block on both sides (None: each side's own), MTP (spec tokens)
    (8, 8, None, 0),
    (8, 4, None, 0),
    (4, 8, None, 0),
    (8, 4, 2560, 0),
    (2, 8, 4608, 0),
    (16, 8, 1536, 0),
    (8, 8, None, 2),
    (8, 2, None, 2),
]


def _deployment(tp: int, block: int | None, spec: int) -> Deployment:
    return Deployment(
        attn_tp=tp,
        conv_layout="DS",
        block_tokens=block,
        spec_tokens=spec,
        speculative_method="mtp" if spec else None,
    )


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: "-".join(map(str, p)))
def test_served_pairs_are_vllms(pair: tuple[int, int, int | None, int]) -> None:
    prefill_tp, decode_tp, block, spec = pair
    mtp = 1 if spec else None
    outcome = glm_nixl_transfer(
        GlmSide(tp=prefill_tp, block_size=block, spec_tokens=spec, mtp_layers=mtp),
        GlmSide(tp=decode_tp, block_size=block, spec_tokens=spec, mtp_layers=mtp),
    )
    config = json.loads(FIXTURE.read_text())
    if mtp:
        config["text_config"]["num_nextn_predict_layers"] = mtp
    model = model_from_config(config)
    ours = nixl_refusal(
        model, _deployment(prefill_tp, block, spec), _deployment(decode_tp, block, spec)
    )
    refused = outcome["refused"]
    assert (ours is None) == (refused is None), (ours, refused)
    if ours is not None:
        assert ours.code == "block_unsupported"
        sizes = (ours.facts["prefill_block_tokens"], ours.facts["decode_block_tokens"])
        least = max(size for size in sizes if isinstance(size, int))
        assert f"block_tokens={least}" in str(ours)
        return
    # Each decode rank reads its KDA heads from the producers k3layout's pairing names (the
    # TP rule), and the latent, pooled keys and tail ring from the first of them alone.
    decode_plan = plan(model, _deployment(decode_tp, block, spec))
    ranks: dict[int, Any] = outcome["ranks"]
    for decode_rank, facts in ranks.items():
        producers = list(producers_of(decode_rank, prefill_tp, decode_tp, gathers=True))
        wanted = [
            producers if group.kind == "kda" else producers[:1] for group in decode_plan.groups
        ]
        assert facts["source_ranks_per_group"] == wanted, decode_rank


def test_the_planner_does_not_plan_the_copies_yet() -> None:
    model = model_from_config(json.loads(FIXTURE.read_text()))
    with pytest.raises(Refusal) as caught:
        plan_transfer(model, _deployment(8, None, 0), _deployment(8, None, 0), prompt_tokens=64)
    assert caught.value.code == "layout_unsupported"
