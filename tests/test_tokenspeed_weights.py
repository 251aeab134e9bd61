"""The ``tokenspeed`` engine's weights against tokenspeed's own model classes (#1152's head).

tokenspeed cannot be installed here; ``tests/tools/record_tokenspeed_weights.py`` built one rank
of its ``KimiK3ForConditionalGeneration`` (and the ``K3DSparkModel`` draft) on the ``meta``
device for each case and recorded every parameter and buffer in
``tests/fixtures/tokenspeed-1152/weights.json``. Each recorded case is planned here from the
same config (the K3 fixture, the case's ``text_config`` changes and quantization, the draft's
config) and compared tensor by tensor (name, shape, dtype), per kind and in all; where
tokenspeed refused, the planner refuses with tokenspeed's reason.

The recorded vision modes map to the planner as it models them: ``--mm-encoder-tp-mode
weights`` (tokenspeed's default) is the seam's, ``data`` is :func:`rank_weights`'s ``mode``,
``--language-model-only`` is the checkpoint without its vision tower.

Only #1152's head was recorded: there is no ``weights.json`` for tokenspeed's ``main``
(``tests/fixtures/tokenspeed-main/README.md``), so the cases are planned with
``engine_version="pr1152"``. The planner gives a ``main`` deployment the same weights rule;
nothing here checks that against ``main``'s own classes.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from k3layout import Deployment, HybridModel, Refusal, preset, weights_per_rank
from k3layout.engines.tokenspeed.engine import TOKENSPEED
from k3layout.engines.tokenspeed.releases import PR1152, TOKENSPEED_VERSIONS
from k3layout.engines.tokenspeed.weights import rank_weights
from k3layout.engines.tokenspeed.weights_checks import TEXT_DEFAULTS, tokenspeed_text
from k3layout.model.hf_config import model_from_config
from k3layout.weights import RankWeights

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = FIXTURES / "tokenspeed-1152" / "weights.json"


@cache
def recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDED.read_text())
    assert data["source"]["commit"] == PR1152.commit
    assert data["source"]["ref"] == PR1152.ref
    assert data["source"]["imported_files"]["files_match_commit"]
    return data


def cases() -> list[dict[str, Any]]:
    return list(recorded()["cases"])


def _json(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def model_of(case: dict[str, Any]) -> HybridModel:
    """The case's checkpoint as k3layout loads it: the same files and changes."""
    if case["model"] == "kimi-linear-48b":
        return preset("kimi-linear-48b")
    config = _json(FIXTURES / "kimi-k3.config.json")
    config["text_config"].update(case["text_config"])
    if case["quantization"]:
        config["text_config"]["quantization_config"] = recorded()["quantizations"][
            case["quantization"]
        ]
    draft = _json(FIXTURES / "kimi-k3-dspark-draft" / "config.json") if case["draft"] else None
    model = model_from_config(config, name=case["id"], draft=draft)
    nulls = {key for key, value in case["text_config"].items() if value is None}
    if nulls:  # k3layout reads a null as left out; tokenspeed reads it as None: give it
        assert model.architecture is not None
        kept = tuple(f for f in model.architecture.defaulted if f not in nulls)
        arch = model.architecture.model_copy(update={"defaulted": kept})
        model = HybridModel.model_validate({**dict(model), "architecture": arch})
    if case["language_model_only"]:
        assert model.architecture is not None
        arch = model.architecture.model_copy(update={"vision": None})
        model = HybridModel.model_validate({**dict(model), "architecture": arch})
    return model


def deployment_of(case: dict[str, Any]) -> Deployment:
    return Deployment(
        engine="tokenspeed",
        engine_version=PR1152.name,  # the one revision whose weights were recorded
        attn_tp=case["attn_tp"],
        attn_dp=case["attn_dp"],
        expert_parallel=case["expert_parallel"],
        spec_tokens=8 if case["draft"] else 0,
        gpu="h200",
    )


def planned(case: dict[str, Any]) -> RankWeights:
    model, deployment = model_of(case), deployment_of(case)
    if case["mm_encoder_tp_mode"] == "weights":
        (stage,) = weights_per_rank(model, deployment).stages
        return stage
    return rank_weights(TOKENSPEED.check(model, deployment), deployment, 0, "data")


def _expand(pattern: str, ranges: str) -> list[str]:
    if not ranges:
        return [pattern]
    found = []
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        stop = int(last or first) + 1
        found += [pattern.replace(".*.", f".{i}.", 1) for i in range(int(first), stop)]
    return found


def recorded_tensors(inventory: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    found: dict[str, tuple[tuple[int, ...], str]] = {}
    for row in inventory["tensors"]:
        name = row["name"]
        if name.startswith("layers.*."):  # the draft's own layers
            name = "." + name
        for full in _expand(name, row["layers"]):
            found[full.removeprefix(".")] = (tuple(row["shape"]), row["dtype"])
    return found


def planned_tensors(
    weights: RankWeights, num_layers: int, draft: bool
) -> dict[str, tuple[tuple[int, ...], str]]:
    found: dict[str, tuple[tuple[int, ...], str]] = {}
    for group in weights.draft_groups if draft else weights.groups:
        for tensor in group.tensors:
            if not group.layers:
                names = [tensor.name]
            elif draft:
                names = [f"layers.{i - num_layers}.{tensor.name}" for i in group.layers]
            else:
                names = [f"language_model.model.layers.{i}.{tensor.name}" for i in group.layers]
            for name in names:
                assert name not in found, name
                found[name] = (tensor.shape, tensor.dtype)
    return found


def built() -> list[dict[str, Any]]:
    return [case for case in cases() if case["status"] == "built"]


def refused() -> list[dict[str, Any]]:
    return [case for case in cases() if case["status"] == "refused"]


def case_id(case: dict[str, Any]) -> str:
    return str(case["id"])


@pytest.mark.parametrize("case", built(), ids=case_id)
def test_every_built_case_is_tokenspeeds_tensor_by_tensor(case: dict[str, Any]) -> None:
    weights = planned(case)
    layers = model_of(case).num_layers
    assert planned_tensors(weights, layers, draft=False) == recorded_tensors(case["target"])
    kinds = {k: v for k, v in weights.bytes_by_kind().items() if k != "draft"}
    assert kinds == case["target"]["by_kind"]
    assert weights.target_bytes == case["target"]["total_bytes"]
    if case["draft"] is None:
        assert weights.draft_groups == ()
    else:
        assert planned_tensors(weights, layers, draft=True) == recorded_tensors(case["draft"])
        assert weights.draft_bytes == case["draft"]["total_bytes"]
    assert weights.total_bytes == case["total_bytes"]


REFUSALS: dict[str, tuple[str, str]] = {
    "bf16-tp8": ("heads_not_divisible", "Vision attention has 12 heads, which is not divisible"),
    "bf16-tp16": ("heads_not_divisible", "Vision attention has 12 heads, which is not divisible"),
    "bf16-tp32": ("heads_not_divisible", "Vision attention has 12 heads, which is not divisible"),
    "bf16-tp8-ep": ("engine_setting", "No kernel found for moe.apply"),
    "bf16-tp4-dp2-ep": ("engine_setting", "No kernel found for moe.apply"),
    "bf16-tp32-dp2-data": ("kernel_unsupported", "No kernel found for moe.apply"),
    "bf16-tp8-data-no-attn-res": ("weights_unknown", "TypeError"),
    "ct-mxfp4-tp32-dp2": ("kernel_unsupported", "No kernel found for moe.apply"),
    "ct-mxfp4-no-ignore-tp8": ("quantization_unsupported", "no attribute 'get_quant_method'"),
    "fp8-block-tp8": ("quantization_unsupported", "No kernel found for moe.apply"),
    "fp8-block-tp8-ep": ("quantization_unsupported", "No kernel found for moe.apply"),
    "ct-int4-tp8": ("quantization_unsupported", "No kernel found for moe.apply"),
    "modelopt-nvfp4-tp8": ("quantization_unsupported", "No kernel found for moe.apply"),
    "bf16-tp96-data": ("uneven_split", "163840 is not divisible by 96"),
    "bf16-tp96": ("uneven_split", "163840 is not divisible by 96"),
    "kimi-linear-tp8": ("weights_unknown", "Model architectures ['KimiLinearForCausalLM'] are"),
}
"""Each recorded refusal: the planner's code, and words of tokenspeed's that both say."""


def test_every_recorded_refusal_has_an_expectation() -> None:
    assert {case["id"] for case in refused()} == set(REFUSALS)


@pytest.mark.parametrize("case", refused(), ids=case_id)
def test_every_refused_case_is_refused_for_tokenspeeds_reason(case: dict[str, Any]) -> None:
    code, words = REFUSALS[case["id"]]
    error = case["error"]
    assert words in f"{error['type']}: {error['message']}"
    model, deployment = model_of(case), deployment_of(case)
    with pytest.raises(Refusal) as found:
        if case["model"] == "kimi-linear-48b":  # the cache recipe refuses it before the weights
            rank_weights(model, deployment)
        elif case["mm_encoder_tp_mode"] == "weights":
            weights_per_rank(model, deployment)
        else:
            rank_weights(TOKENSPEED.check(model, deployment), deployment, 0, "data")
    assert found.value.code == code
    assert words in str(found.value)
    assert found.value.facts["engine"] == "tokenspeed"
    assert isinstance(found.value.facts["field"], str)


def test_kimi_linear_is_refused_through_the_public_api() -> None:
    with pytest.raises(Refusal):
        weights_per_rank(preset("kimi-linear-48b"), Deployment(engine="tokenspeed", attn_tp=8))


# --------------------------------------------------------------------------- properties


def k3_plan(**settings: Any) -> RankWeights:
    (stage,) = weights_per_rank(
        preset("kimi-k3"), Deployment(engine="tokenspeed", **settings)
    ).stages
    return stage


def test_the_fixture_is_read_with_tokenspeeds_own_defaults() -> None:
    arch = preset("kimi-k3").architecture
    assert arch is not None
    assert arch.intermediate_size == 11008  # vLLM's and SGLang's reading
    read = tokenspeed_text(arch)
    assert (read.intermediate_size, read.routed_expert_hidden_size) == (33792, 3584)
    assert read.latent_moe_use_norm and read.attn_res_block_size == 12
    assert not set(read.defaulted) & set(TEXT_DEFAULTS)
    given = arch.model_copy(update={"defaulted": ()})  # the same values, all given
    assert tokenspeed_text(given) == given


def test_a_config_that_gives_the_fields_is_read_as_written() -> None:
    aligned = next(case for case in cases() if case["id"] == "bf16-tp8-data-given")
    arch = model_of(aligned).architecture
    assert arch is not None
    assert "intermediate_size" not in arch.defaulted
    assert tokenspeed_text(arch).intermediate_size == 11008


@pytest.mark.parametrize("attn_tp", [1, 2, 4])
def test_every_rank_holds_the_same_and_the_plan_is_deterministic(attn_tp: int) -> None:
    assert k3_plan(attn_tp=attn_tp) == k3_plan(attn_tp=attn_tp)
    again = RankWeights.model_validate_json(k3_plan(attn_tp=attn_tp).model_dump_json())
    assert again == k3_plan(attn_tp=attn_tp)


def test_tensor_parallel_shards_sum_to_the_whole() -> None:
    """The split kinds halve exactly from TP 1 to 2; the replicated ones do not move."""
    one, two = k3_plan(attn_tp=1).bytes_by_kind(), k3_plan(attn_tp=2).bytes_by_kind()
    for kind in ("embedding", "lm_head", "dense_mlp", "shared_experts"):
        assert one[kind] == 2 * two[kind]
    for kind in ("norm", "attention_residual", "moe_router"):
        assert one[kind] == two[kind]


def test_attention_dp_replicates_the_lm_head_and_keeps_the_embedding_split() -> None:
    dp = k3_plan(attn_tp=2, attn_dp=4).bytes_by_kind()
    tp = k3_plan(attn_tp=2).bytes_by_kind()
    assert dp["embedding"] == tp["embedding"] == tp["lm_head"]
    assert dp["lm_head"] == 2 * tp["lm_head"] == 163840 * 7168 * 2  # the full vocabulary


def test_expert_parallel_and_moe_tp_hold_the_same_mxfp4_bytes() -> None:
    ep = next(case for case in cases() if case["id"] == "ct-mxfp4-tp8-ep")
    tp = next(case for case in cases() if case["id"] == "ct-mxfp4-tp8")
    assert planned(ep).total_bytes == planned(tp).total_bytes
    assert planned(ep).groups != planned(tp).groups


def test_the_draft_only_with_speculative_tokens() -> None:
    model = preset("kimi-k3-dspark")
    without = Deployment(engine="tokenspeed", attn_tp=4)
    with_draft = without.model_copy(update={"spec_tokens": 8})
    (plain,) = weights_per_rank(model, without).stages
    (drafted,) = weights_per_rank(model, with_draft).stages
    assert plain.draft_groups == ()
    assert drafted.groups == plain.groups
    assert drafted.draft_bytes > 0


def test_the_seam_is_registered() -> None:
    assert TOKENSPEED.weights is not None


# --------------------------------------------------------------------------- refusals


def test_pipeline_stages_are_refused() -> None:
    with pytest.raises(Refusal) as found:
        k3_plan(attn_tp=4, pp=2)
    assert found.value.facts["field"] == "pp"


@pytest.mark.parametrize("gpu", ["b200", "mi300x", "a100"])
def test_gpus_off_hopper_are_refused(gpu: str) -> None:
    with pytest.raises(Refusal) as found:
        k3_plan(attn_tp=4, gpu=gpu)
    assert (found.value.code, found.value.facts["field"]) == ("weights_unknown", "gpu")


def test_a_draft_without_its_dimensions_is_refused() -> None:
    model = preset("kimi-k3-dspark")
    assert model.architecture is not None
    arch = model.architecture.model_copy(update={"draft": None})
    bare = HybridModel.model_validate({**dict(model), "architecture": arch})
    with pytest.raises(Refusal) as found:
        weights_per_rank(bare, Deployment(engine="tokenspeed", attn_tp=4, spec_tokens=8))
    assert (found.value.code, found.value.facts["field"]) == (
        "weights_unknown",
        "architecture.draft",
    )


def test_a_low_rank_kda_gate_is_refused() -> None:
    model = preset("kimi-k3")
    layers = tuple(
        layer.model_copy(update={"full_rank_gate": False}) if layer.kind == "kda" else layer
        for layer in model.layers
    )
    low = HybridModel.model_validate({**dict(model), "layers": layers})
    with pytest.raises(Refusal) as found:
        rank_weights(low, Deployment(engine="tokenspeed", attn_tp=4))
    assert found.value.facts["field"] == "linear_attn_config.use_full_rank_gate"


@pytest.mark.parametrize("attn_tp", [1, 4])
def test_every_followed_revision_gets_the_one_recorded_weights_rule(attn_tp: int) -> None:
    k3 = preset("kimi-k3-dspark")
    planned = {
        version: weights_per_rank(
            k3, Deployment(engine="tokenspeed", engine_version=version, attn_tp=attn_tp)
        ).stages
        for version in TOKENSPEED_VERSIONS
    }
    assert len({repr(stages) for stages in planned.values()}) == 1
