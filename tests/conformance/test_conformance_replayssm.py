"""``--use-replayssm`` on the installed vLLM release (0.33 or 0.34), run on CPU: k3layout
refuses ``use_replayssm=True`` (under either ``mamba_backend``) exactly where the release
refuses it, with its reason, and plans where it accepts it (:mod:`k3layout.engines.vllm.replay`).

Each case is a ``vllm serve`` command line through vLLM's own parser and
``create_engine_config`` (``vllm_budget.engine_config``: ``VllmConfig`` runs its
``validate_mamba_cached_kernel``); where the config is accepted, the model of every pipeline
stage is built on ``meta`` with vLLM's ``initialize_model`` under ``vllm_weights``' stubs
(where a full-rank-gate KDA layer refuses ReplaySSM without speculative decoding). The grid:
Kimi-K3 (no drafter, MTP, DSpark, ngram), Kimi-Linear (no drafter, ngram) and GLM-5.3-Flash (no
drafter, MTP) x prefix caching on / off x PP 1 / 2 under vLLM's default Mamba backend
(``--mamba-backend triton``); then ``--mamba-backend flashinfer`` (``Deployment.mamba_backend``)
for Kimi-K3 (no drafter, MTP), Kimi-Linear (no drafter, ngram) x prefix caching x PP and GLM
(no drafter, PP 1 / 2), and a few FlashInfer cases without ``--use-replayssm``, which both
releases accept as they accept Triton. GLM's model is not built here (its classes never read
the Mamba backend; the config step is what refuses it). ROCm's model classes are asked
directly (this CPU platform resolves the CUDA ones).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from vllm_required import require_vllm, running

require_vllm()

import torch  # noqa: E402
from test_glm import DECLARED  # noqa: E402
from vllm_budget import engine_config  # noqa: E402
from vllm_engine import DSPARK_DRAFT, FIXTURES  # noqa: E402
from vllm_glm import _inspect_in_process, install_torchvision_stub  # noqa: E402
from vllm_weights import _distributed, _gpu  # noqa: E402

from k3layout import Deployment, HybridModel, Refusal, load_config, plan  # noqa: E402
from k3layout.engines.vllm.releases import RELEASES  # noqa: E402
from k3layout.engines.vllm.replay import STEPS  # noqa: E402

BACKEND_RULES = ("recover_backend", "flashinfer_prefix_caching", "flashinfer_pipeline")
"""The rules of ``--mamba-backend flashinfer``, whose refusals name ``mamba_backend``."""
RELEASE = RELEASES[running()]
"""k3layout's record of the installed release."""
TP = 4
SPEC_TOKENS = {"mtp": 1, "dspark": 3, "ngram": 3}
STUBBED = install_torchvision_stub()  # GLM's model module imports torchvision


@dataclass(frozen=True)
class Case:
    model: str  # k3, linear, glm
    drafter: str | None  # mtp, dspark, ngram
    prefix_caching: bool = True
    pp: int = 1
    backend: str = "triton"  # --mamba-backend
    replayssm: bool = True  # --use-replayssm

    @property
    def id(self) -> str:
        cache = "pc" if self.prefix_caching else "nopc"
        replay = "" if self.replayssm else "-noreplay"
        return f"{self.model}-{self.drafter or 'none'}-{cache}-pp{self.pp}-{self.backend}{replay}"


CASES = [
    Case(model, drafter, prefix_caching, pp)
    for model, drafters in (
        ("k3", (None, "mtp", "dspark", "ngram")),
        ("linear", (None, "ngram")),
    )
    for drafter in drafters
    for prefix_caching in (True, False)
    for pp in (1, 2)
] + [Case("glm", drafter, True, pp) for drafter in (None, "mtp") for pp in (1, 2)]
FLASHINFER = [
    Case(model, drafter, prefix_caching, pp, "flashinfer")
    for model, drafters in (("k3", (None, "mtp")), ("linear", (None, "ngram")))
    for drafter in drafters
    for prefix_caching in (True, False)
    for pp in (1, 2)
] + [Case("glm", None, True, pp, "flashinfer") for pp in (1, 2)]
"""The FlashInfer Mamba backend: with ``--use-replayssm`` (its own ReplaySSM), and without it
(where ``--use-replayssm`` is all it changes)."""
FLASHINFER += [
    Case(model, drafter, prefix_caching, pp, "flashinfer", replayssm=False)
    for model, drafter, prefix_caching, pp in (
        ("k3", None, True, 1),
        ("k3", "mtp", True, 1),
        ("k3", None, False, 2),
        ("linear", None, True, 1),
        ("glm", None, True, 1),
    )
]
CASES += FLASHINFER


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model directory per fixture config (with one MTP module where the name says)."""
    k3 = json.loads((FIXTURES / "kimi-k3.config.json").read_text())
    glm = json.loads((FIXTURES / "glm-5.3-flash" / "config.json").read_text())
    glm["text_config"].update(DECLARED)
    mtp = {"num_nextn_predict_layers": 1}
    configs = {
        "k3": k3,
        "k3-mtp": {**k3, "text_config": {**k3["text_config"], **mtp}},
        "linear": json.loads((FIXTURES / "kimi-linear-48b-a3b.config.json").read_text()),
        "glm": glm,
    }
    configs["glm-mtp"] = {**glm, "text_config": {**glm["text_config"], **mtp}}
    directories = {}
    for name, config in configs.items():
        directory = tmp_path_factory.mktemp(name)
        (directory / "config.json").write_text(json.dumps(config))
        directories[name] = directory
    return directories


def directory_of(case: Case, models: dict[str, Path]) -> Path:
    mtp = case.drafter == "mtp"
    return models[f"{case.model}-mtp" if mtp else case.model]


def argv(case: Case, directory: Path) -> list[str]:
    """The ``vllm serve`` command line of ``case``."""
    flags = ["--model", str(directory), "--skip-tokenizer-init"]
    if case.replayssm:
        flags.append("--use-replayssm")
    if case.backend != "triton":
        flags += ["--mamba-backend", case.backend]
    flags += ["-tp", str(TP), "-pp", str(case.pp), "--attention-backend", "TRITON_MLA"]
    if not case.prefix_caching:
        flags.append("--no-enable-prefix-caching")
    if case.drafter is not None:
        spec: dict[str, object] = {
            "method": case.drafter,
            "num_speculative_tokens": SPEC_TOKENS[case.drafter],
        }
        if case.drafter == "dspark":
            spec["model"] = str(DSPARK_DRAFT)
        if case.drafter == "ngram":
            spec["prompt_lookup_max"] = 4
        flags += ["--speculative-config", json.dumps(spec)]
    return flags


def vllms_verdict(case: Case, directory: Path) -> tuple[str, str] | None:
    """Where the installed vLLM refuses ``case`` (``config`` or ``load``) and its message;
    ``None`` where it builds the config and every stage's model."""
    try:
        with _inspect_in_process(STUBBED):
            config = engine_config(argv(case, directory))
    except ValueError as error:  # pydantic's ValidationError is one
        return "config", str(error)
    assert config.cache_config.use_kda_recoverssm is (case.replayssm and case.drafter is not None)
    assert config.mamba_config.backend.name.lower() == case.backend
    if case.model == "glm":  # its model classes never read the Mamba backend (nor build here)
        return None
    from vllm.model_executor.model_loader.utils import initialize_model  # noqa: PLC0415
    from vllm.utils.torch_utils import set_default_torch_dtype  # noqa: PLC0415

    for stage in range(case.pp):
        try:
            with (
                _gpu(),
                _distributed(tp=TP, tp_rank=0, pp=case.pp, pp_rank=stage, dp=1, dp_rank=0),
                set_default_torch_dtype(config.model_config.dtype),
                torch.device("meta"),
            ):
                initialize_model(vllm_config=config, model_config=config.model_config)
        except ValueError as error:
            return "load", str(error)
    return None


def planned(case: Case, directory: Path) -> Refusal | None:
    """k3layout's answer for ``case``: the refusal, or ``None`` where it plans."""
    draft = DSPARK_DRAFT if case.drafter == "dspark" else None
    model: HybridModel = load_config(directory / "config.json", draft=draft)
    fields: dict[str, object] = {
        "engine_version": running(),
        "attn_tp": TP,
        "pp": case.pp,
        "use_replayssm": case.replayssm,
        "mamba_backend": case.backend,
        "prefix_caching": case.prefix_caching,
    }
    if case.model != "glm":  # the backend and cache dtype of the command line
        fields |= {"attention_backend": "TRITON_MLA", "kv_dtype": "bf16"}
    if case.drafter is not None:
        fields |= {"spec_tokens": SPEC_TOKENS[case.drafter], "speculative_method": case.drafter}
    try:
        planned = plan(model, Deployment.model_validate(fields)).deployment
        assert (planned.use_replayssm, planned.mamba_backend) == (case.replayssm, case.backend)
    except Refusal as refusal:
        return refusal
    return None


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_k3layout_refuses_replayssm_where_vllm_does(case: Case, models: dict[str, Path]) -> None:
    directory = directory_of(case, models)
    theirs = vllms_verdict(case, directory)
    ours = planned(case, directory)
    if theirs is None:
        assert ours is None, f"vLLM {running()} accepts {case.id}, k3layout refuses: {ours}"
        return
    step, message = theirs
    assert ours is not None, f"vLLM {running()} refuses {case.id} at {step}: {message}"
    rule = ours.facts.get("rule")
    if rule is None:  # refused first by another rule: GLM on two stages (its pipeline)
        assert (case.model, case.pp, ours.code) == ("glm", 2, "pp_unsupported"), ours
        return
    assert isinstance(rule, str)
    quoted = ours.message[ours.message.index("(ValueError: ") + len("(ValueError: ") : -1]
    assert RELEASE.replayssm_refused[rule] in quoted and quoted in message
    assert ("config" if step == "config" else "loads the model") in STEPS[rule]
    field = "mamba_backend" if rule in BACKEND_RULES else "use_replayssm"
    assert ours.facts["field"] == field and ours.facts["engine_version"] == running()


@pytest.mark.parametrize(
    ("platform", "module", "architecture"),
    [
        ("nvidia", "vllm.models.kimi_k3.nvidia.model", "KimiK3ForConditionalGeneration"),
        ("nvidia", "vllm.models.kimi_k3.nvidia.model", "KimiLinearForCausalLM"),
        ("amd", "vllm.models.kimi_k3.amd.model", "KimiK3ForConditionalGeneration"),
        ("amd", "vllm.models.kimi_k3.amd.linear", "KimiLinearForCausalLM"),
    ],
)
def test_each_platforms_kimi_classes_serve_replayssm_as_the_record_says(
    platform: str, module: str, architecture: str
) -> None:
    """The class vLLM's ``kimi_k3`` package registers for the architecture on CUDA and on
    ROCm (its platform switch), asked what ``validate_mamba_cached_kernel`` asks."""
    from vllm.model_executor.models.interfaces import supports_replayssm  # noqa: PLC0415

    model_class = getattr(importlib.import_module(module), architecture)
    served = RELEASE.replayssm_architectures[platform]
    assert supports_replayssm(model_class) is (architecture in served)
