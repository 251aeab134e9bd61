"""What vLLM refuses of ``--use-replayssm`` (``Deployment.use_replayssm``), release by release.

With speculative tokens a KDA architecture's ReplaySSM is RecoverSSM (the verify records live
outside the KV cache; its state keeps no per-draft-token blocks). vLLM refuses a deployment at
two steps, in this order (read off each release by running its ``create_engine_config`` and
building the model on ``meta``; ``tests/conformance/test_conformance_replayssm.py`` runs them
again):

1. **Config** (``VllmConfig.validate_mamba_cached_kernel``): an architecture whose model class
   on the GPU's platform does not serve ReplaySSM (``VllmRelease.replayssm_architectures``:
   GLM-5.3-Flash's everywhere, every Kimi class on ROCm); then, with speculative tokens,
   RecoverSSM on more than one pipeline stage; without them, the Triton Mamba backend under
   the default model runner (0.33: ``without_drafter``; 0.34 accepts it).
2. **Model load**: a full-rank-gate KDA layer (Kimi-K3's) has ReplaySSM only with speculative
   decoding (both releases; in 0.33 the config step refuses it first).

The rules a release refuses, with its own reason, are ``VllmRelease.replayssm_refused``.
``Deployment.mamba_backend`` (``--mamba-backend``) picks the ReplaySSM kernel. With
``flashinfer`` the config step refuses, after the architecture, RecoverSSM on more than one
stage and then RecoverSSM itself (any drafter: it needs Triton, both releases); without a
drafter, FlashInfer's ReplaySSM under prefix caching (0.33) or on more than one pipeline
stage (0.34); the model load refuses a full-rank-gate KDA layer as with Triton. Without
``--use-replayssm`` the backend changes nothing both releases check or lay out. Under
FlashInfer's ReplaySSM 0.34 aligns each state to ``VllmRelease.flashinfer_state_alignment``
bytes where it raises the hybrid block (:func:`state_alignment`, :func:`aligned_state_bytes`).
"""

from __future__ import annotations

from typing import Final

from ..._args import expect, expect_args
from ...deployment import Deployment
from ...errors import Refusal, RefusalCode
from ...gpus import GPUS
from ...model import HybridModel
from ...model.hf_weights import ARCHITECTURE_OF_TYPE
from ...sizes import RankSizes
from .releases import VllmRelease, release_of

STEPS: Final = {
    "architecture": "when it builds its config",
    "without_drafter": "when it builds its config",
    "pipeline": "when it builds its config",
    "full_rank_gate_without_drafter": "when it loads the model",
    "recover_backend": "when it builds its config",
    "flashinfer_prefix_caching": "when it builds its config",
    "flashinfer_pipeline": "when it builds its config",
}
"""The step at which vLLM refuses each rule of ``VllmRelease.replayssm_refused``."""


def architecture_of(model: HybridModel) -> str | None:
    """The architecture vLLM builds ``model`` as: the checkpoint's, else the one vLLM's
    registry maps its model type to; ``None`` when neither is known (a model built by hand of
    another model type)."""
    expect("model", model, HybridModel)
    if model.architecture is not None:
        return model.architecture.architecture
    return ARCHITECTURE_OF_TYPE.get(model.model_type)


def check_replayssm(model: HybridModel, deployment: Deployment) -> None:
    """Refuse what the deployment's vLLM release refuses of ``use_replayssm=True`` for ``model``
    under its ``mamba_backend`` (the module docstring's steps, in vLLM's order):
    ``kernel_unsupported`` for an architecture without ReplaySSM, for RecoverSSM under the
    FlashInfer backend, for FlashInfer's ReplaySSM under prefix caching (0.33), for no
    speculative tokens where the release's Triton ReplaySSM or the model's KDA layers need
    them; ``pp_unsupported`` for RecoverSSM or FlashInfer's ReplaySSM (0.34) on more than one
    pipeline stage. A model of no known architecture is judged by its layers alone."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    if not deployment.use_replayssm:
        return
    release = release_of(deployment)
    architecture = architecture_of(model)
    vendor = GPUS[deployment.gpu].vendor
    served = release.replayssm_architectures.get(vendor, frozenset())
    if architecture is not None and architecture not in served:
        names = ", ".join(sorted(served)) or "none"
        _refuse(
            release,
            "architecture",
            code="kernel_unsupported",
            what=f"{model.name}'s architecture {architecture} on {vendor} GPU "
            f"{deployment.gpu} (vLLM {release.version} serves ReplaySSM there for: {names})",
            facts={"architecture": architecture, "gpu": deployment.gpu},
            hint="use use_replayssm=False",
            reason=f"{release.replayssm_refused['architecture']} {architecture!r}",
        )
    drafted = deployment.spec_tokens > 0
    flashinfer = deployment.mamba_backend == "flashinfer"
    if drafted:
        if deployment.pp > 1:
            _refuse(
                release,
                "pipeline",
                code="pp_unsupported",
                what=f"pp={deployment.pp} with spec_tokens={deployment.spec_tokens} (RecoverSSM)",
                facts={"pp": deployment.pp, "spec_tokens": deployment.spec_tokens},
                hint="use pp=1 (spread the model over attention TP, DP or expert parallelism), "
                "or use_replayssm=False",
            )
        if flashinfer:
            _refuse(
                release,
                "recover_backend",
                code="kernel_unsupported",
                what=f"spec_tokens={deployment.spec_tokens} (RecoverSSM) with "
                "mamba_backend='flashinfer'",
                facts={"spec_tokens": deployment.spec_tokens, "mamba_backend": "flashinfer"},
                hint="use mamba_backend='triton' (vLLM's default) for RecoverSSM, or "
                "use_replayssm=False",
                field="mamba_backend",
            )
        return
    speculate = "use use_replayssm=False, or speculative decoding (spec_tokens > 0: RecoverSSM)"
    if flashinfer:
        if deployment.mamba_cache_mode_run == "align":
            _refuse(
                release,
                "flashinfer_prefix_caching",
                code="kernel_unsupported",
                what="spec_tokens=0 with mamba_backend='flashinfer' under prefix caching "
                "(mamba cache mode 'align')",
                facts={"spec_tokens": 0, "mamba_backend": "flashinfer", "prefix_caching": True},
                hint="use prefix_caching=False, or mamba_backend='triton' with speculative "
                "decoding (spec_tokens > 0: RecoverSSM), or use_replayssm=False",
                field="mamba_backend",
            )
        if deployment.pp > 1:
            _refuse(
                release,
                "flashinfer_pipeline",
                code="pp_unsupported",
                what=f"pp={deployment.pp} with mamba_backend='flashinfer' (FlashInfer ReplaySSM)",
                facts={"pp": deployment.pp, "spec_tokens": 0, "mamba_backend": "flashinfer"},
                hint="use pp=1 (spread the model over attention TP, DP or expert parallelism), "
                "or use_replayssm=False",
                field="mamba_backend",
            )
    else:
        _refuse(
            release,
            "without_drafter",
            code="kernel_unsupported",
            what="spec_tokens=0 with vLLM's default Triton Mamba backend",
            facts={"spec_tokens": 0, "mamba_backend": "triton"},
            hint=speculate
            + (
                ", or mamba_backend='flashinfer' with prefix_caching=False"
                if "flashinfer_prefix_caching" in release.replayssm_refused
                else ""
            ),
        )
    if any(layer.full_rank_gate for layer in model.kda_layers):
        _refuse(
            release,
            "full_rank_gate_without_drafter",
            code="kernel_unsupported",
            what=f"spec_tokens=0 on {model.name}'s full-rank-gate KDA layers (Kimi-K3's)",
            facts={"spec_tokens": 0, "full_rank_gate": True},
            hint=speculate,
        )


def state_alignment(deployment: Deployment) -> int:
    """The byte alignment vLLM gives each Mamba state where it raises the hybrid block:
    the release's ``flashinfer_state_alignment`` under FlashInfer's ReplaySSM
    (``use_replayssm`` with ``mamba_backend='flashinfer'``; 16 in 0.34, 1 in 0.33), else 1."""
    expect("deployment", deployment, Deployment)
    if deployment.use_replayssm and deployment.mamba_backend == "flashinfer":
        return release_of(deployment).flashinfer_state_alignment
    return 1


def aligned_state_bytes(sizes: RankSizes, alignment: int) -> int:
    """One state layer's bytes per rank with each of its states (conv, recurrent) rounded up
    to ``alignment`` bytes, as vLLM's ``MambaSpec`` sums them; 0 without state layers."""
    expect_args(("sizes", sizes, RankSizes), ("alignment", alignment, int))
    if sizes.state is None:
        return 0
    return sum(
        alignment * -(-part.size_bytes // alignment) for part in sizes.state.ranges(sizes.attn_tp)
    )


def serves_replayssm(model: HybridModel, deployment: Deployment) -> bool:
    """Whether the deployment's vLLM release takes ``use_replayssm=True`` for ``model`` under the
    rest of ``deployment`` (what :func:`check_replayssm` lets through; e.g. for drawing
    deployments that plan)."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    try:
        check_replayssm(model, deployment.model_copy(update={"use_replayssm": True}))
    except Refusal:
        return False
    return True


def _refuse(
    release: VllmRelease,
    rule: str,
    *,
    code: RefusalCode,
    what: str,
    facts: dict[str, int | str | bool],
    hint: str,
    reason: str | None = None,
    field: str = "use_replayssm",
) -> None:
    """Raise ``code`` for ``rule`` where ``release`` refuses it (else return), quoting the
    release's reason and the step it refuses at; ``field``: the deployment field the refusal
    names (``mamba_backend`` for FlashInfer's rules)."""
    why = release.replayssm_refused.get(rule)
    if why is None:
        return
    raise Refusal(
        code,
        f"use_replayssm=True: {what}: vLLM {release.version} refuses it {STEPS[rule]} "
        f"(ValueError: {reason or why})",
        facts={
            "field": field,
            "engine_version": release.version,
            "rule": rule,
            **facts,
        },
        hint=hint,
    )


__all__ = [
    "STEPS",
    "aligned_state_bytes",
    "architecture_of",
    "check_replayssm",
    "serves_replayssm",
    "state_alignment",
]
