"""``python -m sglang.launch_server``'s flags for a deployment (SGLang 0.5.23's spelling): its
``--tp-size`` over every attention-DP replica, DP attention, pipeline and expert parallelism,
the cache dtype, speculative decoding, the radix cache and the memory-pool settings the
deployment sets. The memory flag and the workload's limits follow them
(:mod:`k3layout.layouts.recommend`); ``tests/conformance/test_conformance_sglang_recommend.py``
parses them with SGLang's own argument parser."""

from __future__ import annotations

import json

from ...deployment import Deployment
from ...layouts.recommend import DRAFT_PATH
from ...model import HybridModel

KV_CACHE_DTYPE = {"fp8": "fp8_e4m3", "bf16": "auto", "fp8_ds_mla": "fp8_e4m3"}
"""k3layout's cache dtype -> SGLang's ``--kv-cache-dtype``."""

LAUNCH = "python -m sglang.launch_server --model-path"


def sglang_flags(
    d: Deployment, model: HybridModel, track_interval: int | None = None
) -> tuple[tuple[str, str], ...]:
    """The flags that start deployment ``d`` of ``model`` (switches have an empty value);
    ``track_interval``: the ``--mamba-track-interval`` SGLang needs (``None``: its own)."""
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
    indexed = model.indexer is not None
    # DSA's auto is fp8 on Blackwell: an indexed model's bf16 is named.
    flags.append(
        (
            "--kv-cache-dtype",
            "bf16" if indexed and d.kv_dtype == "bf16" else KV_CACHE_DTYPE[d.kv_dtype],
        )
    )
    if indexed and model.architecture is not None:
        flags.append(("--json-model-override-args", architectures_override(model)))
    if not d.prefix_caching:
        flags.append(("--disable-radix-cache", ""))
    if track_interval is not None:
        flags.append(("--mamba-track-interval", str(track_interval)))
    if d.mamba_full_memory_ratio is not None:
        flags.append(("--mamba-full-memory-ratio", f"{d.mamba_full_memory_ratio:g}"))
    flags += _speculative(d, model)
    return tuple(flags)


def architectures_override(model: HybridModel) -> str:
    """``--json-model-override-args`` restoring the model class on a nested checkpoint:
    SGLang's ``Glm5NextConfig`` lets ``text_config.architectures`` (``null`` in the
    checkpoint) win over the top-level list, and its ``ModelConfig`` then fails
    (``TypeError``); both levels are given, so the text model is built as the class too."""
    assert model.architecture is not None
    names = [model.architecture.architecture]
    return json.dumps(
        {"architectures": names, "text_config": {"architectures": names}},
        separators=(",", ":"),
    )


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
