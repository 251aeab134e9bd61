"""``use_replayssm=True`` (vLLM's ``--use-replayssm``) where each followed vLLM release refuses it
(:mod:`k3layout.engines.vllm.replay`, the rules of ``VllmRelease.replayssm_refused``), and
plans where it accepts it. The table below is what each release did when its own code ran on
CPU (``tests/conformance/test_conformance_replayssm.py`` runs it again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3layout import Deployment, HybridModel, KDALayer, MLALayer, Refusal, load_config, plan, preset
from k3layout.engines.vllm.releases import RELEASES, VLLM_VERSIONS
from k3layout.engines.vllm.replay import (
    STEPS,
    architecture_of,
    check_replayssm,
    serves_replayssm,
)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def k3_mtp(tmp_path_factory: pytest.TempPathFactory) -> HybridModel:
    """Kimi-K3 with one MTP module."""
    data = json.loads((FIXTURES / "kimi-k3.config.json").read_text())
    data["text_config"]["num_nextn_predict_layers"] = 1
    path = tmp_path_factory.mktemp("k3-mtp") / "config.json"
    path.write_text(json.dumps(data))
    model = load_config(path)
    assert model.drafter == "mtp"
    return model


# (model, drafter) -> release -> (no drafter, drafter at pp 1, drafter at pp 2): the rule the
# release refuses by (None: it plans), on an NVIDIA GPU with vLLM's default Mamba backend
KIMI = {
    "0.33.0": ("without_drafter", None, "pipeline"),
    "0.34.0": ("full_rank_gate_without_drafter", None, "pipeline"),
}
LINEAR = {
    "0.33.0": ("without_drafter", None, "pipeline"),
    "0.34.0": (None, None, "pipeline"),
}
CODES = {
    "architecture": "kernel_unsupported",
    "without_drafter": "kernel_unsupported",
    "full_rank_gate_without_drafter": "kernel_unsupported",
    "pipeline": "pp_unsupported",
}


def model_of(name: str, k3_mtp: HybridModel) -> tuple[HybridModel, str | None]:
    """A model and the speculative method it drafts with."""
    return {
        "kimi-k3/ngram": (preset("kimi-k3"), "ngram"),
        "kimi-k3/mtp": (k3_mtp, "mtp"),
        "kimi-k3-dspark/dspark": (preset("kimi-k3-dspark"), "dspark"),
        "kimi-linear-48b/ngram": (preset("kimi-linear-48b"), "ngram"),
    }[name]


def outcome(model: HybridModel, deployment: Deployment) -> str | None:
    """The rule the plan was refused by (``None``: it planned), checked against the refusal."""
    try:
        planned = plan(model, deployment)
    except Refusal as refusal:
        rule = refusal.facts.get("rule")
        assert isinstance(rule, str), refusal
        release = RELEASES[str(deployment.engine_version)]
        assert refusal.code == CODES[rule]
        assert refusal.facts["field"] == "use_replayssm"
        assert refusal.facts["engine_version"] == release.version
        assert release.replayssm_refused[rule] in refusal.message
        assert STEPS[rule] in refusal.message and refusal.hint
        return rule
    assert planned.deployment.use_replayssm
    return None


@pytest.mark.parametrize("release", VLLM_VERSIONS)
@pytest.mark.parametrize(
    "name", ["kimi-k3/ngram", "kimi-k3/mtp", "kimi-k3-dspark/dspark", "kimi-linear-48b/ngram"]
)
@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_each_release_refuses_replayssm_where_vllm_does(
    k3_mtp: HybridModel, release: str, name: str, pp: int, prefix_caching: bool
) -> None:
    model, method = model_of(name, k3_mtp)
    table = LINEAR if name.startswith("kimi-linear") else KIMI
    without, drafted, deeper = table[release]
    common = {
        "engine_version": release,
        "attn_tp": 8,
        "pp": pp,
        "use_replayssm": True,
        "prefix_caching": prefix_caching,
    }
    assert outcome(model, Deployment(**common)) == without
    spec = Deployment(**common, spec_tokens=1, speculative_method=method)
    assert outcome(model, spec) == (drafted if pp == 1 else deeper)


@pytest.mark.parametrize("release", VLLM_VERSIONS)
@pytest.mark.parametrize("spec_tokens", [0, 1])
@pytest.mark.parametrize("gpu", ["mi300x", "mi355x"])
@pytest.mark.parametrize("name", ["kimi-k3", "kimi-k3-dspark", "kimi-linear-48b"])
def test_rocms_kimi_classes_serve_no_replayssm(
    release: str, spec_tokens: int, gpu: str, name: str
) -> None:
    deployment = Deployment(
        engine_version=release, attn_tp=8, gpu=gpu, use_replayssm=True, spec_tokens=spec_tokens
    )
    assert outcome(preset(name), deployment) == "architecture"
    assert plan(preset(name), deployment.model_copy(update={"use_replayssm": False}))


@pytest.mark.parametrize("release", VLLM_VERSIONS)
@pytest.mark.parametrize("spec_tokens", [0, 1])
def test_glms_architecture_serves_no_replayssm(release: str, spec_tokens: int) -> None:
    glm = preset("glm-5.3-flash")
    deployment = Deployment(
        engine_version=release, attn_tp=8, use_replayssm=True, spec_tokens=spec_tokens
    )
    with pytest.raises(Refusal) as caught:
        check_replayssm(glm, deployment)
    assert caught.value.facts["rule"] == "architecture"
    assert "'Glm5NextForConditionalGeneration'" in caught.value.message
    # on more than one stage GLM is refused first for its pipeline (vLLM: at load)
    with pytest.raises(Refusal) as deeper:
        plan(glm, deployment.model_copy(update={"pp": 2}))
    assert (deeper.value.code, deeper.value.facts["field"]) == ("pp_unsupported", "pp")


def test_without_an_engine_version_the_newest_releases_rules_apply() -> None:
    linear = preset("kimi-linear-48b")
    assert plan(linear, Deployment(attn_tp=8, use_replayssm=True)).deployment.use_replayssm
    with pytest.raises(Refusal) as caught:
        plan(preset("kimi-k3"), Deployment(attn_tp=8, use_replayssm=True))
    assert caught.value.facts["engine_version"] == "0.34.0"


def test_replayssm_off_is_never_refused_here() -> None:
    for release in VLLM_VERSIONS:
        for gpu in ("h200", "mi300x"):
            for model in (preset("kimi-k3"), preset("glm-5.3-flash")):
                check_replayssm(model, Deployment(engine_version=release, pp=2, gpu=gpu))


def hand_built(model_type: str, full_rank_gate: bool) -> HybridModel:
    """A model built by hand (no checkpoint architecture)."""
    kda = KDALayer(num_heads=8, head_dim=128, full_rank_gate=full_rank_gate)
    mla = MLALayer(num_heads=8)
    return HybridModel(name="hand", model_type=model_type, layers=(kda, kda, mla))


def test_the_architecture_is_the_checkpoints_else_the_model_types() -> None:
    assert architecture_of(preset("kimi-k3")) == "KimiK3ForConditionalGeneration"
    assert architecture_of(preset("glm-5.3-flash")) == "Glm5NextForConditionalGeneration"
    assert architecture_of(hand_built("kimi_linear", False)) == "KimiLinearForCausalLM"
    assert architecture_of(hand_built("custom", False)) is None


@pytest.mark.parametrize("release", VLLM_VERSIONS)
def test_a_model_of_no_known_architecture_is_judged_by_its_layers(release: str) -> None:
    refused = RELEASES[release].replayssm_refused
    deployment = Deployment(engine_version=release, use_replayssm=True)
    for gated in (False, True):
        for gpu in ("h200", "mi300x"):  # no architecture: no vendor's class list applies
            model = hand_built("custom", gated)
            expected = (
                "without_drafter"
                if "without_drafter" in refused
                else "full_rank_gate_without_drafter"
                if gated
                else None
            )
            assert outcome(model, deployment.model_copy(update={"gpu": gpu})) == expected
            drafted = deployment.model_copy(update={"gpu": gpu, "spec_tokens": 2})
            assert outcome(model, drafted) is None


def test_the_release_records_say_each_rule_and_its_step() -> None:
    for release in RELEASES.values():
        assert set(release.replayssm_refused) <= set(STEPS)
        assert release.replayssm_architectures["amd"] == frozenset()
        assert {"KimiK3ForConditionalGeneration", "KimiLinearForCausalLM"} <= (
            release.replayssm_architectures["nvidia"]
        )
    assert "without_drafter" in RELEASES["0.33.0"].replayssm_refused
    assert "without_drafter" not in RELEASES["0.34.0"].replayssm_refused


@pytest.mark.parametrize("release", VLLM_VERSIONS)
def test_serves_replayssm_says_what_the_check_lets_through(release: str) -> None:
    for name in ("kimi-k3", "kimi-linear-48b", "glm-5.3-flash"):
        for spec_tokens in (0, 1):
            for pp in (1, 2):
                deployment = Deployment(engine_version=release, spec_tokens=spec_tokens, pp=pp)
                model = preset(name)
                try:
                    check_replayssm(model, deployment.model_copy(update={"use_replayssm": True}))
                    served = True
                except Refusal:
                    served = False
                assert serves_replayssm(model, deployment) is served
    assert serves_replayssm(preset("kimi-k3"), Deployment(engine_version=release, spec_tokens=1))


def test_the_flag_starts_vllm_with_its_own_replayssm() -> None:
    from k3layout.engines.vllm.launch import vllm_flags  # noqa: PLC0415

    k3 = preset("kimi-k3")
    on = Deployment(attn_tp=8, spec_tokens=1, speculative_method="ngram", use_replayssm=True)
    assert ("--use-replayssm", "") in vllm_flags(on, k3)
    assert not any(flag == "--use-replayssm" for flag, _ in vllm_flags(Deployment(), k3))
    # ATOM's records (replayssm) are not vLLM's flag
    atom = Deployment(attn_tp=8, spec_tokens=1, speculative_method="ngram", replayssm=True)
    assert not any(flag == "--use-replayssm" for flag, _ in vllm_flags(atom, k3))


def test_only_vllm_takes_its_own_replayssm() -> None:
    with pytest.raises(Refusal) as caught:
        plan(preset("kimi-k3"), Deployment(engine="sglang", use_replayssm=True))
    assert "use_replayssm" in caught.value.message
