"""k3layout's SGLang weights of GLM-5.3-Flash against SGLang 0.5.23's own classes on ``meta``.

``sglang_glm_weights.glm_weights`` builds ``Glm5NextForConditionalGeneration`` (and its NEXTN
draft) for rank 0 of each stage under TP, DP attention, expert parallelism, PP and NEXTN on
H200 and B200; every tensor k3layout lays out must be SGLang's (name, shape, dtype), none
missing, and the totals equal. Where SGLang refuses (the fixture without
``index_kpool_compress``, vision heads the attention TP does not divide), k3layout refuses too.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from sglang_weights import require_sglang

require_sglang()

from sglang_glm import GLM_CONFIG  # noqa: E402
from sglang_glm_weights import ENGINE_FIELDS, glm_weights  # noqa: E402

from k3layout import Deployment, Refusal, model_from_config, weights_per_rank  # noqa: E402
from k3layout.weights import RankWeights  # noqa: E402

CASES: dict[str, dict[str, Any]] = {
    # attention TP, attention DP, expert parallelism, PP, NEXTN steps, GPU
    "tp1": {"tp": 1},
    "tp8": {"tp": 8},
    "tp8-ep": {"tp": 8, "ep": True},
    "tp8-b200": {"tp": 8, "gpu": "b200"},  # TRT-LLM runner: the shared expert stays apart
    "tp16": {"tp": 16},
    "tp2-dp2": {"tp": 2, "dp": 2},
    "tp4-dp2": {"tp": 4, "dp": 2},
    "tp1-dp8-ep": {"tp": 1, "dp": 8, "ep": True},
    "tp4-pp2": {"tp": 4, "pp": 2},
    "tp8-nextn": {"tp": 8, "nextn": 1},
    "tp8-ep-nextn": {"tp": 8, "ep": True, "nextn": 2},
    "tp4-pp2-nextn": {"tp": 4, "pp": 2, "nextn": 1},
    "mhc-absent": {"tp": 8, "fields": {"index_kpool_compress": True}},  # SGLang builds no mHC
    "tp32": {"tp": 32},  # the vision tower's 16 heads
    "bare": {"tp": 8, "fields": {}},  # the fixture as it ships: no index_kpool_compress
}


def fields(case: dict[str, Any]) -> dict[str, Any]:
    text: dict[str, Any] = case.get("fields", ENGINE_FIELDS["text_config"])
    return text


@cache
def engine(name: str) -> dict[str, Any]:
    case = CASES[name]
    dp = case.get("dp", 1)
    return glm_weights(
        case["tp"] * dp,
        case.get("ep", False),
        dp,
        case.get("pp", 1),
        case.get("nextn", 0),
        {"text_config": fields(case)},
        gpu=case.get("gpu", "h200"),
        engine_fields=False,
    )


def planner(name: str) -> tuple[RankWeights, ...] | Refusal:
    case = CASES[name]
    config = json.loads(GLM_CONFIG.read_text())
    config["text_config"].update(fields(case))
    deployment = Deployment(
        engine="sglang",
        attn_tp=case["tp"],
        attn_dp=case.get("dp", 1),
        expert_parallel=case.get("ep", False),
        pp=case.get("pp", 1),
        spec_tokens=case.get("nextn", 0),
        gpu=case.get("gpu", "h200"),
    )
    try:
        return weights_per_rank(model_from_config(config, name="glm"), deployment).stages
    except Refusal as refusal:
        return refusal


def planned(rank: RankWeights) -> dict[tuple[str, str], tuple[Any, ...]]:
    out: dict[tuple[str, str], tuple[Any, ...]] = {}
    for part, groups in (("target", rank.groups), ("draft", rank.draft_groups)):
        for group in groups:
            for layer in group.layers or (None,):
                for tensor in group.tensors:
                    name = tensor.name
                    if layer is not None:
                        name = f"model.layers.{layer}.{tensor.name}"
                    assert (part, name) not in out, name
                    out[part, name] = (tuple(tensor.shape), tensor.dtype)
    return out


def built(stage: dict[str, Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
    """SGLang's tensors of a stage, less the draft's embedding and LM head that loading swaps
    for the target's (``shared``)."""
    shared = set(stage.get("shared", ()))
    return {
        (part, name): (tuple(info["shape"]), info["dtype"])
        for part, key in (("target", "tensors"), ("draft", "draft_tensors"))
        for name, info in stage[key].items()
        if not (part == "draft" and name in shared)
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_tensor_of_each_stage_is_sglangs(name: str) -> None:
    theirs, mine = engine(name), planner(name)
    if "refused" in theirs:
        assert isinstance(mine, Refusal), f"SGLang refused ({theirs['refused']}); k3layout planned"
        assert mine.code == "weights_unknown", mine
        return
    assert not isinstance(mine, Refusal), f"k3layout refused what SGLang builds: {mine}"
    assert len(mine) == len(theirs["stages"])
    for rank, stage in zip(mine, theirs["stages"], strict=True):
        ours, sglangs = planned(rank), built(stage)
        missing, extra = sorted(set(sglangs) - set(ours)), sorted(set(ours) - set(sglangs))
        assert not missing and not extra, (missing[:5], extra[:5])
        assert {k: v for k, v in ours.items() if sglangs[k] != v} == {}
        assert (rank.target_bytes, rank.draft_bytes) == (
            stage["target_bytes"],
            stage["draft_bytes"],
        )


def test_the_grid_holds_refusals() -> None:
    refused = {name for name in CASES if "refused" in engine(name)}
    assert refused == {"tp32", "bare"}
