"""``python -m sglang.launch_server``'s flags for a deployment (SGLang 0.5.23's spelling): its
``--tp-size`` over every attention-DP replica, DP attention, pipeline and expert parallelism,
the cache dtype, speculative decoding, the radix cache and the memory-pool settings the
deployment sets. The memory flag and the workload's limits follow them
(:mod:`k3layout.layouts.recommend`); ``tests/conformance/test_conformance_sglang_recommend.py``
parses them with SGLang's own argument parser."""

from __future__ import annotations

from ...deployment import Deployment
from ...layouts.recommend import DRAFT_PATH
from ...model import HybridModel

KV_CACHE_DTYPE = {"fp8": "fp8_e4m3", "bf16": "auto", "fp8_ds_mla": "fp8_e4m3"}
"""k3layout's cache dtype -> SGLang's ``--kv-cache-dtype``."""

LAUNCH = "python -m sglang.launch_server --model-path"


def sglang_flags(d: Deployment, model: HybridModel) -> tuple[tuple[str, str], ...]:
    """The flags that start deployment ``d`` of ``model`` (switches have an empty value)."""
    world = d.attn_tp * d.attn_dp
    flags: list[tuple[str, str]] = [("--tp-size", str(world))]
    if d.attn_dp > 1:
        flags += [("--dp-size", str(d.attn_dp)), ("--enable-dp-attention", "")]
    if d.pp > 1:
        flags.append(("--pp-size", str(d.pp)))
    if d.expert_parallel:
        flags.append(("--ep-size", str(world)))
    if d.dcp > 1:
        flags.append(("--dcp-size", str(d.dcp)))
    flags.append(("--kv-cache-dtype", KV_CACHE_DTYPE[d.kv_dtype]))
    if not d.prefix_caching:
        flags.append(("--disable-radix-cache", ""))
    if d.mamba_full_memory_ratio is not None:
        flags.append(("--mamba-full-memory-ratio", f"{d.mamba_full_memory_ratio:g}"))
    if d.spec_tokens and model.drafter is not None:
        algorithm = "DSPARK" if model.drafter == "dspark" else "NEXTN"
        flags += [("--speculative-algorithm", algorithm)]
        if algorithm == "DSPARK":
            flags.append(("--speculative-draft-model-path", DRAFT_PATH))
        flags.append(("--speculative-num-draft-tokens", str(d.spec_tokens + 1)))
    return tuple(flags)
