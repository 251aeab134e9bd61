"""k3layout's vLLM weights of GLM-5.3-Flash against vLLM 0.33's own classes built on ``meta``.

``vllm_glm_weights.glm_weights`` builds ``Glm5NextForConditionalGeneration`` (and its MTP draft)
for rank 0 under TP, expert parallelism, attention DP and MTP on H200 and B200; every tensor
k3layout lays out must be vLLM's (name, shape, dtype), none missing, and the totals equal.
Where vLLM refuses (the fixture without the fields its constructor reads, vision heads the TP
does not divide), k3layout refuses the weights too.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from vllm_required import require_vllm, running

require_vllm()
RELEASE = running()
"""The vLLM release installed, which k3layout plans for."""

from vllm_glm import FIXTURE  # noqa: E402
from vllm_glm_weights import ENGINE_FIELDS, glm_weights  # noqa: E402

from k3layout import Deployment, Refusal, model_from_config, weights_per_rank  # noqa: E402
from k3layout.weights import RankWeights  # noqa: E402

TARGET = "language_model.model.layers."
DRAFT = "model.layers."

CASES: dict[str, dict[str, Any]] = {
    "tp1": {"tp": 1},
    "tp2-b200": {"tp": 2, "gpu": "b200"},
    "tp8": {"tp": 8},
    "tp8-ep": {"tp": 8, "ep": True},
    "tp8-b200": {"tp": 8, "gpu": "b200"},
    "tp16": {"tp": 16},
    "dp2-tp4": {"tp": 4, "dp": 2},
    "dp2-tp8-ep": {"tp": 8, "dp": 2, "ep": True},
    "dp2-tp16-b200": {"tp": 16, "dp": 2, "gpu": "b200"},  # TRT-LLM pads 64 columns to 128
    "tp8-mtp1": {"tp": 8, "mtp": 1},
    "tp4-ep-mtp2": {"tp": 4, "ep": True, "mtp": 2},
    "tp32": {"tp": 32},  # vLLM asserts 16 vision heads divide the TP
    "tp8-bare": {"tp": 8, "bare": True},  # the fixture as it ships: no mhc, ...
}


@cache
def engine(name: str) -> dict[str, Any]:
    case = CASES[name]
    return glm_weights(
        case["tp"],
        case.get("ep", False),
        case.get("dp", 1),
        1,
        case.get("mtp", 0),
        gpu=case.get("gpu", "h200"),
        engine_fields=not case.get("bare", False),
    )


def planner(name: str) -> RankWeights | Refusal:
    case = CASES[name]
    config = json.loads(FIXTURE.read_text())
    if not case.get("bare"):
        config["text_config"].update(ENGINE_FIELDS["text_config"])
    if case.get("mtp"):
        config["text_config"]["num_nextn_predict_layers"] = case["mtp"]
    deployment = Deployment(
        engine_version=RELEASE,
        attn_tp=case["tp"],
        attn_dp=case.get("dp", 1),
        expert_parallel=case.get("ep", False),
        gpu=case.get("gpu", "h200"),
        spec_tokens=case.get("mtp", 0),
        speculative_method="mtp" if case.get("mtp") else None,
    )
    try:
        return weights_per_rank(model_from_config(config, name="glm"), deployment).stages[0]
    except Refusal as refusal:
        return refusal


def planned(rank: RankWeights) -> dict[tuple[str, str], tuple[Any, ...]]:
    out: dict[tuple[str, str], tuple[Any, ...]] = {}
    for part, groups, prefix in (
        ("target", rank.groups, TARGET),
        ("draft", rank.draft_groups, DRAFT),
    ):
        for group in groups:
            for layer in group.layers or (None,):
                for tensor in group.tensors:
                    name = tensor.name if layer is None else f"{prefix}{layer}.{tensor.name}"
                    assert (part, name) not in out, name
                    out[part, name] = (tuple(tensor.shape), tensor.dtype)
    return out


def built(stage: dict[str, Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        (part, name): (tuple(info["shape"]), info["dtype"])
        for part, key in (("target", "tensors"), ("draft", "draft_tensors"))
        for name, info in stage[key].items()
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_tensor_of_the_rank_is_vllms(name: str) -> None:
    theirs, mine = engine(name), planner(name)
    if "refused" in theirs:
        assert isinstance(mine, Refusal), f"vLLM refused ({theirs['refused']}); k3layout planned"
        assert mine.code == "weights_unknown", mine
        return
    assert not isinstance(mine, Refusal), f"k3layout refused what vLLM builds: {mine}"
    stage = theirs["stages"][0]
    ours, vllms = planned(mine), built(stage)
    missing, extra = sorted(set(vllms) - set(ours)), sorted(set(ours) - set(vllms))
    assert not missing and not extra, (missing[:5], extra[:5])
    assert {k: v for k, v in ours.items() if vllms[k] != v} == {}
    assert (mine.target_bytes, mine.draft_bytes) == (stage["target_bytes"], stage["draft_bytes"])


def test_the_grid_holds_refusals() -> None:
    refused = {name for name in CASES if "refused" in engine(name)}
    assert refused == {"tp32", "tp8-bare"}
