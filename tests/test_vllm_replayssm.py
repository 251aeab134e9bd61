"""``use_replayssm=True`` (vLLM's ``--use-replayssm``) where each followed vLLM release refuses it
(:mod:`k3layout.engines.vllm.replay`, the rules of ``VllmRelease.replayssm_refused``), and
plans where it accepts it. The table below is what each release did when its own code ran on
CPU (``tests/conformance/test_conformance_replayssm.py`` runs it again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3layout import (
    Deployment,
    HybridModel,
    KDALayer,
    MLALayer,
    Refusal,
    load_config,
    plan,
    plan_vllm,
    preset,
)
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
        # a FlashInfer rule names the backend, the others the ReplaySSM switch
        field = "mamba_backend" if rule in BACKEND_RULES else "use_replayssm"
        assert refusal.facts["field"] == field
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


# --mamba-backend flashinfer with --use-replayssm: (model, drafter) -> release -> the rule
# refused by (None: it plans) at (pp 1 prefix caching, pp 1 without, pp 2 with, pp 2 without)
FLASHINFER: dict[tuple[str, str | None], dict[str, tuple[str | None, ...]]] = {
    ("kimi-k3", None): {
        "0.33.0": ("flashinfer_prefix_caching", "full_rank_gate_without_drafter") * 2,
        "0.34.0": ("full_rank_gate_without_drafter",) * 2 + ("flashinfer_pipeline",) * 2,
    },
    ("kimi-linear-48b", None): {
        "0.33.0": ("flashinfer_prefix_caching", None) * 2,
        "0.34.0": (None, None, "flashinfer_pipeline", "flashinfer_pipeline"),
    },
    ("kimi-k3", "ngram"): {
        release: ("recover_backend",) * 2 + ("pipeline",) * 2 for release in VLLM_VERSIONS
    },
    ("kimi-linear-48b", "ngram"): {
        release: ("recover_backend",) * 2 + ("pipeline",) * 2 for release in VLLM_VERSIONS
    },
}
CODES |= {
    "recover_backend": "kernel_unsupported",
    "flashinfer_prefix_caching": "kernel_unsupported",
    "flashinfer_pipeline": "pp_unsupported",
}
BACKEND_RULES = ("recover_backend", "flashinfer_prefix_caching", "flashinfer_pipeline")


@pytest.mark.parametrize("release", VLLM_VERSIONS)
@pytest.mark.parametrize(("name", "drafter"), list(FLASHINFER))
def test_each_release_refuses_flashinfer_replayssm_where_vllm_does(
    release: str, name: str, drafter: str | None
) -> None:
    cases = [(pp, pc) for pp in (1, 2) for pc in (True, False)]
    expected = FLASHINFER[(name, drafter)][release]
    for (pp, prefix_caching), rule in zip(cases, expected, strict=True):
        deployment = Deployment(
            engine_version=release,
            attn_tp=8,
            pp=pp,
            prefix_caching=prefix_caching,
            use_replayssm=True,
            mamba_backend="flashinfer",
            spec_tokens=0 if drafter is None else 1,
            speculative_method=drafter,
        )
        assert outcome(preset(name), deployment) == rule, (pp, prefix_caching)


@pytest.mark.parametrize("release", VLLM_VERSIONS)
def test_recoverssm_needs_triton_for_every_drafter(release: str, k3_mtp: HybridModel) -> None:
    for name in ("kimi-k3/ngram", "kimi-k3/mtp", "kimi-k3-dspark/dspark"):
        model, method = model_of(name, k3_mtp)
        deployment = Deployment(
            engine_version=release,
            attn_tp=8,
            use_replayssm=True,
            mamba_backend="flashinfer",
            spec_tokens=1,
            speculative_method=method,
        )
        assert outcome(model, deployment) == "recover_backend"
        triton = deployment.model_copy(update={"mamba_backend": "triton"})
        assert plan(model, triton).deployment.use_replayssm


@pytest.mark.parametrize("release", VLLM_VERSIONS)
@pytest.mark.parametrize("name", ["kimi-k3", "kimi-linear-48b", "glm-5.3-flash"])
def test_flashinfer_without_replayssm_plans_as_triton(release: str, name: str) -> None:
    """Without --use-replayssm both releases accept the FlashInfer backend and lay out
    nothing differently (run: Kimi-K3, Kimi-Linear, GLM-5.3-Flash, drafted or not, PP 2)."""
    for pp, spec_tokens in ((1, 0), (1, 1), (2, 0)):
        if name == "glm-5.3-flash" and pp == 2:
            continue  # refused for its pipeline, whatever the backend
        triton = Deployment(engine_version=release, attn_tp=8, pp=pp, spec_tokens=spec_tokens)
        flashinfer = triton.model_copy(update={"mamba_backend": "flashinfer"})
        ours, theirs = plan_vllm(preset(name), flashinfer), plan_vllm(preset(name), triton)
        assert ours.deployment.mamba_backend == "flashinfer"
        assert (ours.block_tokens, ours.page_bytes) == (theirs.block_tokens, theirs.page_bytes)
        assert ours.block_bytes == theirs.block_bytes


def odd_state_model() -> HybridModel:
    """A hand-built Kimi-Linear-type model whose KDA state (bf16 conv 1188 B + fp32 recurrent
    2904 B = 4092 B at TP 1) is no multiple of 16 (4112 B aligned) and whose 128-token
    attention page (bf16, 16-wide latent) is 4096 B."""
    kda = KDALayer(num_heads=6, head_dim=11, conv_kernel=4)
    mla = MLALayer(num_heads=8, kv_lora_rank=8, qk_rope_head_dim=8)
    return HybridModel(name="odd", model_type="kimi_linear", layers=(kda, kda, mla))


@pytest.mark.parametrize("release", VLLM_VERSIONS)
def test_flashinfer_replayssm_aligns_the_state_where_the_release_raises_the_block(
    release: str,
) -> None:
    from k3layout.engines.vllm.replay import aligned_state_bytes, state_alignment  # noqa: PLC0415

    model = odd_state_model()
    common = {"engine_version": release, "kv_dtype": "bf16", "prefix_caching": False}
    triton = Deployment(**common, use_replayssm=True)
    flashinfer = Deployment(**common, use_replayssm=True, mamba_backend="flashinfer")
    alignment = RELEASES[release].flashinfer_state_alignment
    assert alignment == {"0.33.0": 1, "0.34.0": 16}[release]
    assert state_alignment(flashinfer) == alignment
    assert state_alignment(triton) == 1
    assert state_alignment(Deployment(**common, mamba_backend="flashinfer")) == 1
    planned = plan_vllm(model, flashinfer)
    assert planned.sizes.state_bytes == 4092
    assert aligned_state_bytes(planned.sizes, 16) == 4112
    # vLLM 0.34's MambaSpec of these shapes (run): 4092 B, 4112 B at state_alignment 16
    assert (planned.block_tokens, planned.page_bytes) == (
        {"0.33.0": (128, 4096), "0.34.0": (256, 8192)}[release]
    )
    if release == "0.34.0":  # Triton's ReplaySSM (0.33 refuses it here) keeps the state as is
        assert plan_vllm(model, triton).block_tokens == 128


def test_every_kda_state_of_the_presets_is_already_aligned() -> None:
    from k3layout.engines.vllm.replay import aligned_state_bytes  # noqa: PLC0415

    common = {"engine_version": "0.34.0", "prefix_caching": False, "use_replayssm": True}
    for attn_tp in (1, 8):
        linear = Deployment(**common, attn_tp=attn_tp)
        flashinfer = linear.model_copy(update={"mamba_backend": "flashinfer"})
        ours, theirs = (
            plan_vllm(preset("kimi-linear-48b"), flashinfer),
            plan_vllm(preset("kimi-linear-48b"), linear),
        )
        assert aligned_state_bytes(ours.sizes, 16) == ours.sizes.state_bytes
        assert (ours.block_tokens, ours.page_bytes) == (theirs.block_tokens, theirs.page_bytes)


def test_the_flag_starts_vllm_with_its_mamba_backend() -> None:
    from k3layout.engines.vllm.launch import vllm_flags  # noqa: PLC0415

    linear = preset("kimi-linear-48b")
    on = Deployment(attn_tp=8, use_replayssm=True, mamba_backend="flashinfer")
    assert ("--mamba-backend", "flashinfer") in vllm_flags(on, linear)
    assert not any(flag == "--mamba-backend" for flag, _ in vllm_flags(Deployment(), linear))


def test_the_cli_takes_the_mamba_backend() -> None:
    import argparse  # noqa: PLC0415

    from k3layout.cli.common import add_deployment_options, deployment_from_args  # noqa: PLC0415

    parser = argparse.ArgumentParser()
    add_deployment_options(parser)
    args = parser.parse_args(["--use-replayssm", "--mamba-backend", "flashinfer"])
    deployment = deployment_from_args(args)
    assert (deployment.use_replayssm, deployment.mamba_backend) == (True, "flashinfer")
    assert deployment_from_args(parser.parse_args([])).mamba_backend == "triton"
    with pytest.raises(SystemExit):
        parser.parse_args(["--mamba-backend", "cpu"])


@pytest.mark.parametrize("engine", ["sglang", "tokenspeed"])
def test_only_vllm_takes_its_mamba_backend(engine: str) -> None:
    with pytest.raises(Refusal) as caught:
        plan(preset("kimi-k3"), Deployment(engine=engine, mamba_backend="flashinfer"))
    assert "mamba_backend" in caught.value.message
