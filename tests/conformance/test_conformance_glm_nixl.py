"""GLM-5.3-Flash's prefill-to-decode transfer on vLLM 0.33.0's NIXL connector, run on CPU by
``vllm_glm_nixl.glm_nixl_transfer`` (both sides' workers, their registration, the engine
core's scheduler, the handshake and the decode's reads): which pairs vLLM serves is what
``k3layout.engines.vllm.pd.nixl_refusal`` says, with the block both sides need where it
refuses; a served pair reads the latent, pooled keys and tail ring from one prefill rank and
the KDA heads from the ranks the TP rule names.

k3layout's ``plan_transfer`` plans the request's bytes (the latent rows, the pooled key
entries, the tail rings, the KDA heads) and pairs each consumer with the producers vLLM's
decode reads; vLLM copies whole pages of those, which the notes beside the fixture (section
7) describe.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from vllm_required import require_vllm, running

require_vllm()
RELEASE = running()
"""The vLLM release installed, which k3layout plans for."""

from vllm_glm import FIXTURE  # noqa: E402
from vllm_glm_nixl import GlmSide, glm_nixl_transfer  # noqa: E402

from k3layout import Deployment, model_from_config, plan, plan_transfer  # noqa: E402
from k3layout.engines.vllm.pd import nixl_refusal  # noqa: E402
from k3layout.transfer import transfer_violations  # noqa: E402
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
        engine_version=RELEASE,
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


@pytest.mark.parametrize("pair", PAIRS[:6], ids=lambda p: "-".join(map(str, p)))
def test_the_transfer_plan_reads_from_the_ranks_vllm_reads(
    pair: tuple[int, int, int | None, int],
) -> None:
    """k3layout's transfer plan of a pair vLLM serves pairs each consumer with the producers
    vLLM's decode reads (its KDA heads from each, its latent, keys and ring from the first);
    every consumer region is written once."""
    prefill_tp, decode_tp, block, _ = pair
    model = model_from_config(json.loads(FIXTURE.read_text()))
    prefill, decode = _deployment(prefill_tp, block, 0), _deployment(decode_tp, block, 0)
    if nixl_refusal(model, prefill, decode) is not None:
        return
    result = plan_transfer(model, prefill, decode, prompt_tokens=5000)
    assert transfer_violations(result) == []
    outcome = glm_nixl_transfer(
        GlmSide(tp=prefill_tp, block_size=block), GlmSide(tp=decode_tp, block_size=block)
    )
    for decode_rank, facts in outcome["ranks"].items():
        reads = {pair.producer for pair in result.pairs if pair.consumer == decode_rank}
        vllms = {s for group in facts["source_ranks_per_group"] for s in group}
        assert reads == vllms, decode_rank
