"""What differs between the vLLM releases k3layout follows, as one record per release.

Every rule the releases share lives in :mod:`.rules`, :mod:`.budget` and the layout modules;
what one release does otherwise is a field here, chosen by ``Deployment.engine_version``
(:func:`release_of`). Each field was read off the release by running its code on CPU
(``tests/conformance`` runs every release's own code again; ``tests/fixtures/vllm-0.34-notes.md``
says where in 0.34.0 each difference lives). The next release is one more record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from ...deployment import Deployment


@dataclass(frozen=True)
class VllmRelease:
    """The rules of one vLLM release that the others do not share.

    - ``default_block_tokens``: ``CacheConfig.DEFAULT_BLOCK_SIZE``, the block before a backend
      or a hybrid's state raises it (what a pipeline stage without attention keeps);
    - ``utilization_flag_default``: what ``--gpu-memory-utilization`` parses to when not given
      (``None``: the release resolves it, below);
    - ``default_utilization``: the share of the GPU taken without the extensible KV cache;
    - ``extensible_kv_cache``: whether the release has the extensible KV cache, on by default on
      CUDA and ROCm unless ``--kv-cache-memory-bytes`` is given; with it the default share is
      ``extensible_utilization``, no CUDA-graph estimate is reserved up front, and the cache
      shrinks after warm-up to what the worker measures;
    - ``fused_kda_conv``: GLM-5.3-Flash's three KDA short-conv weights are one tensor;
    - ``mtp_unserved``: model types whose MTP modules the release does not build, and why;
    - ``replayssm_architectures``: per GPU vendor, the architectures (vLLM's names) whose
      model class there serves ``--use-replayssm`` and, with speculative tokens, runs KDA's
      RecoverSSM (``VllmConfig.validate_mamba_cached_kernel``; ROCm's Kimi classes serve none);
    - ``replayssm_refused``: the ``--use-replayssm`` rules of :mod:`.replay` that the release
      refuses, each with the release's own reason (its exception text): ``architecture`` (an
      architecture not in ``replayssm_architectures``), ``without_drafter`` (no speculative
      tokens, with the default Triton Mamba backend and model runner), ``pipeline`` (RecoverSSM
      on more than one stage), ``full_rank_gate_without_drafter`` (a full-rank-gate KDA layer,
      Kimi-K3's, built without speculative tokens, when the model loads), and with
      ``--mamba-backend flashinfer``: ``recover_backend`` (RecoverSSM, any drafter, needs
      Triton), ``flashinfer_prefix_caching`` (FlashInfer's ReplaySSM without a drafter under
      prefix caching, the ``align`` cache mode), ``flashinfer_pipeline`` (the same on more
      than one pipeline stage);
    - ``flashinfer_state_alignment``: the byte alignment of each Mamba state inside a page
      (``MambaSpec.state_alignment``) under FlashInfer's ReplaySSM (``--use-replayssm`` with
      ``--mamba-backend flashinfer``), which the hybrid block raise rounds every state to
      (1: none; 0.33 has no alignment).
    - ``kda_spec_alignment``: the ``state_alignment`` and ``block_stride_alignment`` a KDA
      layer's own ``MambaSpec`` carries (``None``: the release's spec has no state alignment
      and leaves the block's unset; 0.34's ``MambaBase`` gives both its ``state_alignment``,
      1 for every KDA layer, FlashInfer's ReplaySSM aligning Mamba2 layers only).
    """

    version: str
    default_block_tokens: int
    utilization_flag_default: float | None
    default_utilization: float
    extensible_kv_cache: bool
    extensible_utilization: float
    fused_kda_conv: bool
    mtp_unserved: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    replayssm_architectures: Mapping[str, frozenset[str]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    replayssm_refused: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    flashinfer_state_alignment: int = 1
    kda_spec_alignment: int | None = None


V0_33: Final = VllmRelease(
    version="0.33.0",
    default_block_tokens=16,
    utilization_flag_default=0.92,
    default_utilization=0.92,
    extensible_kv_cache=False,
    extensible_utilization=0.92,
    fused_kda_conv=False,
    mtp_unserved=MappingProxyType(
        {
            "kimi_linear": "its SpeculativeConfig raises NotImplementedError (unsupported "
            "speculative method 'mtp'): the draft keeps model type kimi_linear, which is not "
            "an MTP model type",
        }
    ),
    replayssm_architectures=MappingProxyType(
        {
            "nvidia": frozenset({"KimiK3ForConditionalGeneration", "KimiLinearForCausalLM"}),
            "amd": frozenset(),
        }
    ),
    replayssm_refused=MappingProxyType(
        {
            "architecture": "--use-replayssm is not supported for architecture",
            "without_drafter": "Triton ReplaySSM requires Model Runner V1; use --mamba-backend "
            "flashinfer or Model Runner V1",
            "pipeline": "RecoverSSM currently requires pipeline_parallel_size=1",
            "full_rank_gate_without_drafter": "Kimi-K3 supports --use-replayssm only with "
            "speculative decoding",
            "recover_backend": "RecoverSSM requires --mamba-backend triton",
            "flashinfer_prefix_caching": "FlashInfer ReplaySSM does not support prefix caching "
            "yet; use --disable-prefix-caching",
        }
    ),
)

V0_34: Final = VllmRelease(
    version="0.34.0",
    default_block_tokens=64,
    utilization_flag_default=None,
    default_utilization=0.92,
    extensible_kv_cache=True,
    extensible_utilization=1.0,
    fused_kda_conv=True,
    mtp_unserved=MappingProxyType(
        {
            "kimi_linear": "it accepts the speculative config, then fails loading the draft "
            "(ValueError: duplicate layer name): Kimi-Linear has no MTP module class, so the "
            "draft is a second whole model",
        }
    ),
    replayssm_architectures=MappingProxyType(
        {
            "nvidia": frozenset(
                {
                    "KimiK3ForConditionalGeneration",
                    "KimiK31ForConditionalGeneration",
                    "KimiLinearForCausalLM",
                }
            ),
            "amd": frozenset(),
        }
    ),
    replayssm_refused=MappingProxyType(
        {
            "architecture": "--use-replayssm is not supported for architecture",
            "pipeline": "RecoverSSM currently requires pipeline_parallel_size=1",
            "full_rank_gate_without_drafter": "Kimi-K3 supports --use-replayssm only with "
            "speculative decoding",
            "recover_backend": "RecoverSSM requires --mamba-backend triton",
            "flashinfer_pipeline": "FlashInfer ReplaySSM currently requires "
            "pipeline_parallel_size=1",
        }
    ),
    flashinfer_state_alignment=16,
    kda_spec_alignment=1,
)

RELEASES: Final[Mapping[str, VllmRelease]] = MappingProxyType(
    {release.version: release for release in (V0_33, V0_34)}
)
"""The releases k3layout follows, oldest first (the last is the default)."""

VLLM_VERSIONS: Final = tuple(RELEASES)
"""The vLLM releases k3layout follows, oldest first."""

VLLM_RELEASES_TEXT: Final = "vLLM " + " and ".join(VLLM_VERSIONS)
"""How a refusal names the releases when the rule is every followed release's."""


def release_of(deployment: Deployment) -> VllmRelease:
    """The release ``deployment`` plans for: its ``engine_version``, else the newest. A
    deployment of another engine (a vLLM rule asked directly) gets the newest."""
    if deployment.engine == "vllm" and deployment.engine_version is not None:
        return RELEASES[deployment.engine_version]
    return RELEASES[VLLM_VERSIONS[-1]]


__all__ = ["RELEASES", "VLLM_RELEASES_TEXT", "VLLM_VERSIONS", "VllmRelease", "release_of"]
