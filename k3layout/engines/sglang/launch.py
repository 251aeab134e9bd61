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
    flags += _speculative(d, model)
    return tuple(flags)


def _speculative(d: Deployment, model: HybridModel) -> list[tuple[str, str]]:
    """SGLang's speculative flags for ``spec_tokens`` draft tokens per step, verified as
    ``spec_tokens + 1``: DSpark with the draft's block set to them (SGLang otherwise takes the
    draft checkpoint's own block and refuses a verify window other than it plus one), else its
    EAGLE-family MTP (``NEXTN``) drafting one token a step (all three of its sizes given:
    SGLang refuses a draft-token count without the steps)."""
    tokens = d.spec_tokens
    if tokens == 0:
        return []
    window = ("--speculative-num-draft-tokens", str(tokens + 1))
    if model.drafter == "dspark":
        return [
            ("--speculative-algorithm", "DSPARK"),
            ("--speculative-draft-model-path", DRAFT_PATH),
            ("--speculative-dspark-block-size", str(tokens)),
            window,
        ]
    return [
        ("--speculative-algorithm", "NEXTN"),
        ("--speculative-num-steps", str(tokens)),
        ("--speculative-eagle-topk", "1"),
        window,
    ]
