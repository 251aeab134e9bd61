"""``vllm serve``'s flags and environment for a deployment (vLLM 0.33's and 0.34's spelling):
the parallel sizes, expert parallelism, the cache dtype and layout settings, speculative
decoding. The memory flag and the workload's limits follow them (:mod:`k3layout.layouts.recommend`).
``tests/conformance/test_conformance_recommend.py`` parses them with vLLM's own
``EngineArgs`` and builds its config from them."""

from __future__ import annotations

import json

from ...deployment import Deployment
from ...layouts.recommend import DRAFT_PATH
from ...model import HybridModel

KV_CACHE_DTYPE = {"fp8": "fp8", "bf16": "auto", "fp8_ds_mla": "fp8_ds_mla"}
"""k3layout's cache dtype -> vLLM's ``--kv-cache-dtype`` (``auto``: the model's, bf16)."""

LAUNCH = "vllm serve"


def vllm_flags(d: Deployment, model: HybridModel) -> tuple[tuple[str, str], ...]:
    """The flags that start deployment ``d`` of ``model`` (switches have an empty value)."""
    flags: list[tuple[str, str]] = [("--tensor-parallel-size", str(d.attn_tp))]
    if d.attn_dp > 1:
        flags.append(("--data-parallel-size", str(d.attn_dp)))
    if d.pp > 1:
        flags.append(("--pipeline-parallel-size", str(d.pp)))
    if d.expert_parallel:
        flags.append(("--enable-expert-parallel", ""))
    if d.dcp > 1:
        flags.append(("--decode-context-parallel-size", str(d.dcp)))
    if d.dcp_interleave != 1:
        flags.append(("--dcp-kv-cache-interleave-size", str(d.dcp_interleave)))
    flags.append(("--kv-cache-dtype", KV_CACHE_DTYPE[d.kv_dtype]))
    if d.block_tokens is not None:
        flags.append(("--block-size", str(d.block_tokens)))
    if d.attention_backend is not None:
        flags.append(("--attention-backend", d.attention_backend))
    if not d.prefix_caching:
        flags.append(("--no-enable-prefix-caching", ""))
    if d.extensible_kv_cache is not None:  # vLLM 0.34's switch (refused on 0.33)
        flags.append(
            (
                "--enable-extensible-kv-cache"
                if d.extensible_kv_cache
                else "--no-enable-extensible-kv-cache",
                "",
            )
        )
    if d.use_replayssm:
        flags.append(("--use-replayssm", ""))
    if d.mamba_backend != "triton":  # vLLM's default
        flags.append(("--mamba-backend", d.mamba_backend))
    if d.kda_prefill_backend != "auto":
        flags.append(
            ("--additional-config", json.dumps({"kda_prefill_backend": d.kda_prefill_backend}))
        )
    speculative = _speculative(d, model)
    if speculative is not None:
        flags.append(("--speculative-config", json.dumps(speculative, separators=(",", ":"))))
    return tuple(flags)


def _speculative(d: Deployment, model: HybridModel) -> dict[str, object] | None:
    """vLLM's ``--speculative-config`` for the drafter vLLM builds (none without speculative
    tokens)."""
    tokens = d.spec_tokens
    drafter = d.speculative_method or model.drafter
    if tokens == 0 or drafter is None:
        return None
    if drafter == "ngram":
        return {"method": "ngram", "num_speculative_tokens": tokens}
    if drafter == "dspark":
        return {"method": "dspark", "model": DRAFT_PATH, "num_speculative_tokens": tokens}
    return {"method": "mtp", "num_speculative_tokens": tokens}


def vllm_env(deployment: Deployment) -> tuple[tuple[str, str], ...]:
    """The environment variables vLLM reads the deployment's other settings from."""
    env: list[tuple[str, str]] = []
    if deployment.kv_cache_layout is not None:
        env.append(("VLLM_KV_CACHE_LAYOUT", deployment.kv_cache_layout))
    if deployment.conv_layout != "SD":
        env.append(("VLLM_SSM_CONV_STATE_LAYOUT", deployment.conv_layout))
    if deployment.pp_partition is not None:
        env.append(("VLLM_PP_LAYER_PARTITION", ",".join(map(str, deployment.pp_partition))))
    return tuple(env)
