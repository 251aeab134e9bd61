"""tokenspeed's launch flags for a deployment (its ``server_args.py``, the same flags at #1152's
head and ``main``): the attention TP and DP, expert parallelism, the cache dtype, speculative
decoding and prefix caching. The memory flag and the workload's limits follow them
(:mod:`k3layout.layouts.recommend`)."""

from __future__ import annotations

import json

from ...deployment import Deployment
from ...layouts.recommend import DRAFT_PATH
from ...model import HybridModel

KV_CACHE_DTYPE = {"fp8": "fp8", "bf16": "auto", "fp8_ds_mla": "fp8"}
"""k3layout's cache dtype -> tokenspeed's ``--kv-cache-dtype``."""

LAUNCH = "tokenspeed serve"


def tokenspeed_flags(d: Deployment, model: HybridModel) -> tuple[tuple[str, str], ...]:
    """The flags that start deployment ``d`` of ``model`` (switches have an empty value)."""
    flags: list[tuple[str, str]] = [("--attn-tp-size", str(d.attn_tp))]
    if d.attn_dp > 1:
        flags.append(("--data-parallel-size", str(d.attn_dp)))
    if d.expert_parallel:
        flags.append(("--enable-expert-parallel", ""))
    flags.append(("--kv-cache-dtype", KV_CACHE_DTYPE[d.kv_dtype]))
    if not d.prefix_caching:
        flags.append(("--no-enable-prefix-caching", ""))
    if d.spec_tokens and model.drafter == "dspark":
        config = {"method": "DSPARK", "model": DRAFT_PATH, "num_speculative_tokens": d.spec_tokens}
        flags.append(("--speculative-config", json.dumps(config, separators=(",", ":"))))
    return tuple(flags)
