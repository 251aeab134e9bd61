"""SGLang 0.5.23's KV budget: ``--mem-fraction-static`` of the memory free before the weights
load, less the weights, with the fraction's default as SGLang resolves it for the GPU and the
parallel sizes (:func:`default_mem_fraction_static`).

Paths below are relative to SGLang 0.5.23's ``sglang/srt/``;
``tests/conformance/test_conformance_sglang_budget.py`` runs SGLang's own resolution and
profiler on the same figures.

**The budget.** SGLang probes the free memory before the weights load (``F0``,
``distributed/bootstrap.py:193``, after the CUDA context and communicators) and again once they
are resident (``F1``), each in GiB; with more than one rank each probe is the MIN over the
ranks, all-reduced through a float32 tensor (``utils/common.py:570``), so the byte count is
rounded to float32 first. ``KVCacheConfigurator._profile_available_bytes``
(``mem_cache/kv_cache_configurator.py:2990``) keeps ``F1 - F0 x (1 - mfs)`` (:3007, :3038) and
turns GiB into bytes with ``int(x * 2**30)`` (:3060). k3layout's ``F0`` is the GPU's total less
what start-up takes (:func:`k3layout.memory.estimates.startup`, or ``reserve_bytes``) and
``F1 = F0 - weights``. The figure is what SGLang divides *before* it holds back its multimodal
reservation (100 MiB for Kimi-K3) and carves out the KDA state pool, both of which
:mod:`.capacity` takes out of it (:meth:`~k3layout.engines.sglang.SglangPlan.capacity` takes
this figure). The reserve is the start-up memory and the headroom the fraction leaves,
``F0 - weights - KV``, about ``(1 - mfs) x F0``, for activations and CUDA graphs.

**The default fraction** (``arg_groups/memory_hook.py:47``, ``handle_gpu_memory_settings``,
read from ``nvidia-smi``'s total in MiB, :data:`k3layout.gpus.Gpu.smi_memory_mib`): the GPU's
tier gives the chunked-prefill size and the decode CUDA graphs' largest batch (capped by
``--max-running-requests``); SGLang then reserves, in MiB,
``512 + 1.5 x max(chunked_prefill, 2048) + tp x pp / 8 x 1024 + 2 x max_bs`` (+ ``3 x max_bs x
dp``, and ``1.5 x max_bs x dp`` more past 300, under DP attention), at least 10 GiB on a GPU
over 60 GiB, and takes ``round((gpu - reserved) / gpu, 3)``; a multimodal model's fraction is
then scaled by ``0.95 x clamp(1 - 0.1 x (L x H^2 / (24 x 1024^2) - 1), 0.8, 1.05)`` for its ViT
of ``L`` layers of width ``H`` (not rounded again). Here ``tp`` is SGLang's ``--tp-size``,
``attn_tp x attn_dp``; the memory settings resolve before DP attention divides the chunked
prefill (``arg_groups/pipeline.py:218`` vs :274, ``parallel_hook.py:327-332``) and before
speculative decoding sets its 48 running requests (:306), so neither enters: only a given
``max_running_requests`` caps the graphs. Kimi-K3 at TP 8 on an H200: ``512 + 1.5 x 8,192 +
1,024 + 2 x 512 = 14,848`` MiB, ``round((143,771 - 14,848) / 143,771, 3) = 0.897``, ``x 0.95 x
0.9875`` (27 layers of 1,024) ``= 0.841498125``.

What a k3layout deployment cannot set stays at SGLang's default and out of the rule: prefill
CUDA graphs (disabled for both models), DeepEP (``moe_a2a_backend`` none), post-capture KV
sizing (off by default, ``environ.py:640``, and never for MLA, ``arg_groups/overrides.py:1791``),
the PD decode role and ``--language-only``. Where SGLang's input is not known, the default is
refused (``engine_setting``), naming ``mem_fraction_static``: a GPU whose resolution was not
read off SGLang, a ``gpu_memory_bytes`` other than the table's (``nvidia-smi``'s total is then
unknown), a multimodal model without its vision tower.
"""

from __future__ import annotations

import math
import struct
from typing import Final

from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import GPUS
from ...memory import GIB, BudgetRule, MemoryBudget, ReserveTerm, checked, gpu_total
from ...memory.estimates import startup
from ...memory.rule import within_default
from ...model import HybridModel
from ...model.architecture import VisionTower
from .rules import MULTIMODAL_MODEL_TYPES, SERVED_GPUS, SGLANG_VERSION

FLAG: Final = "--mem-fraction-static"

FRACTION_STEP: Final = 1000
"""A fraction k3layout recommends is rounded up to 1/1000 (the digits SGLang rounds its own to,
``memory_hook.py:325``)."""

MEMORY_TIERS: Final[tuple[tuple[int, int, int, int], ...]] = (
    (20 * 1024, 2048, 8, 8),  # memory_hook.py:90-100 (T4, 4080)
    (35 * 1024, 4096, 48, 160),  # :101-117 (A10, 4090, 5090)
    (60 * 1024, 4096, 32, 160),  # :118-131 (A100 40GB, L40)
    (90 * 1024, 8192, 256, 512),  # :132-145 (H100, A100 80GB)
    (160 * 1024, 8192, 256, 512),  # :146-159 (H20, H200)
)
"""SGLang's memory tiers by ``nvidia-smi``'s total: (below MiB, chunked-prefill tokens, decode
CUDA graphs' largest batch under TP :data:`SMALL_TP`, and from it)."""

LARGEST_TIER: Final = (16384, 512, 512)
"""The tier of 160 GiB and more (B200, GB200, MI300X): ``memory_hook.py:160-170``."""

SMALL_TP: Final = 4
"""``--tp-size`` below which a tier's smaller decode batch applies (``memory_hook.py:114``)."""

RESERVED_BASE_MIB: Final = 512
"""Constant metadata (``memory_hook.py:309``)."""

ACTIVATION_MIB_PER_TOKEN: Final = 1.5
"""Activation slack per prefill token (``memory_hook.py:310``)."""

MIN_ACTIVATION_TOKENS: Final = 2048
"""The fewest tokens the activation slack counts (``memory_hook.py:305``)."""

PARALLEL_MIB_PER_8_RANKS: Final = 1024
"""``tp x pp / 8 x 1024`` MiB for large parallel sizes (``memory_hook.py:312``)."""

DECODE_GRAPH_MIB_PER_BATCH: Final = 2
"""Decode CUDA graphs: 2 MiB per batch of the largest (``memory_hook.py:368``)."""

DP_GRAPH_MIB_PER_BATCH: Final = 3
"""DP attention's padding: 3 MiB per batch per DP rank (``memory_hook.py:376``) ..."""

DP_LARGE_BATCH: Final = 300
DP_LARGE_MIB_PER_BATCH: Final = 1.5
"""... and 1.5 MiB more past a batch of 300 (``memory_hook.py:377-378``)."""

RESERVED_FLOOR_ABOVE_MIB: Final = 60 * 1024
RESERVED_FLOOR_MIB: Final = 10 * 1024
"""On a GPU over 60 GiB SGLang reserves at least 10 GiB (``memory_hook.py:314-315``)."""

FRACTION_DIGITS: Final = 3
"""``round(..., 3)`` (``memory_hook.py:325``), before the multimodal factor."""

VLM_FACTOR: Final = 0.95
"""A multimodal model's base factor (``memory_hook.py:438``) ..."""

VIT_BASELINE: Final = (24, 1024)
"""... against a ViT-L/14 of 24 layers of 1,024 (``memory_hook.py:444-445``) ..."""

VIT_SENSITIVITY: Final = 0.1
"""... 10% less per doubling of ``layers x hidden^2`` (``memory_hook.py:457``) ..."""

VIT_FACTOR_RANGE: Final = (0.8, 1.05)
"""... clamped to this range (``memory_hook.py:459``)."""


def _refuse_default(deployment: Deployment, why: str, **facts: str | int) -> Refusal:
    return Refusal(
        "engine_setting",
        f"engine=sglang on {deployment.gpu}: SGLang {SGLANG_VERSION}'s default "
        f"mem_fraction_static is not modelled here: {why}",
        facts={"engine": "sglang", "field": "mem_fraction_static", "gpu": deployment.gpu, **facts},
        hint="pass mem_fraction_static (SGLang's --mem-fraction-static), as the server logs it",
    )


def _smi_mib(deployment: Deployment) -> float:
    """``nvidia-smi``'s total (MiB) SGLang reads, as the float it parses."""
    if deployment.gpu not in SERVED_GPUS:
        raise _refuse_default(
            deployment,
            f"its resolution was read off SGLang on {', '.join(SERVED_GPUS)} only",
        )
    gpu = GPUS[deployment.gpu]
    given = deployment.gpu_memory_bytes
    if given is not None and given != gpu.memory_bytes:
        raise _refuse_default(
            deployment,
            f"gpu_memory_bytes={given:,} is not the table's {gpu.memory_bytes:,}, so the "
            "nvidia-smi total SGLang picks its tier and fraction by is unknown",
            gpu_memory_bytes=given,
        )
    return float(gpu.smi_memory_mib)


def _vision(model: HybridModel, deployment: Deployment) -> VisionTower | None:
    """The ViT SGLang scales a multimodal model's fraction by (``None``: text only)."""
    if model.architecture is not None:
        return model.architecture.vision
    if model.model_type in MULTIMODAL_MODEL_TYPES:
        raise _refuse_default(
            deployment,
            f"model {model.name} is multimodal ({model.model_type}) but its vision tower is "
            "not known (a model built by hand; load it from its config.json)",
            model_type=model.model_type,
        )
    return None


def _reserved_mib(deployment: Deployment, gpu_mem: float) -> tuple[float, int, int]:
    """SGLang's reserve (MiB), and the chunked-prefill size and decode batch it counts."""
    tp = deployment.attn_tp * deployment.attn_dp
    dp = deployment.attn_dp
    tier = next((t[1:] for t in MEMORY_TIERS if gpu_mem < t[0]), LARGEST_TIER)
    chunked, small_bs, large_bs = tier
    max_bs = small_bs if tp < SMALL_TP else large_bs
    if deployment.max_running_requests is not None:
        max_bs = min(max_bs, deployment.max_running_requests)
    graphs: float = DECODE_GRAPH_MIB_PER_BATCH * max_bs
    if dp > 1:  # DP attention
        graphs += DP_GRAPH_MIB_PER_BATCH * max_bs * dp
        if max_bs > DP_LARGE_BATCH:
            graphs += DP_LARGE_MIB_PER_BATCH * max_bs * dp
    reserved: float = RESERVED_BASE_MIB
    reserved += ACTIVATION_MIB_PER_TOKEN * max(chunked, MIN_ACTIVATION_TOKENS)
    reserved += tp * deployment.pp / 8 * PARALLEL_MIB_PER_8_RANKS
    reserved += graphs
    if gpu_mem > RESERVED_FLOOR_ABOVE_MIB:
        reserved = max(reserved, RESERVED_FLOOR_MIB)
    return reserved, chunked, max_bs


def vit_factor(vision: VisionTower) -> float:
    """The factor SGLang scales a multimodal model's default fraction by: ``0.95 x clamp(1 -
    0.1 x (layers x hidden^2 / (24 x 1024^2) - 1), 0.8, 1.05)`` (Kimi-K3's 27 x 1,024:
    ``0.95 x 0.9875 = 0.938125``)."""
    layers, hidden = VIT_BASELINE
    ratio = vision.num_layers * vision.hidden_size**2 / (layers * hidden**2)
    low, high = VIT_FACTOR_RANGE
    return VLM_FACTOR * max(low, min(high, 1.0 - VIT_SENSITIVITY * (ratio - 1.0)))


def _default(model: HybridModel, deployment: Deployment) -> tuple[float, str]:
    """The default fraction, and how it follows from SGLang's rule."""
    gpu_mem = _smi_mib(deployment)
    vision = _vision(model, deployment)
    reserved, chunked, max_bs = _reserved_mib(deployment, gpu_mem)
    fraction = round((gpu_mem - reserved) / gpu_mem, FRACTION_DIGITS)
    how = (
        f"round(({gpu_mem:,.0f} - {reserved:,g}) / {gpu_mem:,.0f}, 3) = {fraction:g} "
        f"(nvidia-smi's MiB less SGLang's reserve for chunked prefill {chunked:,} and decode "
        f"graphs to {max_bs:,})"
    )
    if vision is not None:
        factor = vit_factor(vision)
        fraction *= factor
        how += f" x {factor:g} (ViT {vision.num_layers} x {vision.hidden_size:,})"
    return fraction, how


def default_mem_fraction_static(model: HybridModel, deployment: Deployment) -> float:
    """SGLang 0.5.23's default ``--mem-fraction-static`` for ``model`` under ``deployment``
    on its GPU, the float SGLang resolves (module docstring); refuses (``engine_setting``)
    where an input of SGLang's rule is not known, naming ``mem_fraction_static`` to pass."""
    return _default(model, deployment)[0]


def _probe_gib(free_bytes: int, ranks: int) -> float:
    """Free memory as SGLang's probe reports it: GiB, through float32 over several ranks."""
    value = float(free_bytes)
    if ranks > 1:
        value = struct.unpack("<f", struct.pack("<f", value))[0]
    return value / GIB


def _kv_bytes(deployment: Deployment, weights: int, fraction: float) -> int:
    """SGLang's budget at ``fraction``: ``int((F1 - F0 x (1 - fraction)) x 2**30)``."""
    free_before = gpu_total(deployment) - startup(deployment).bytes
    ranks = deployment.world_size
    before = _probe_gib(free_before, ranks)
    after = _probe_gib(free_before - weights, ranks)
    return int((after - before * (1 - fraction)) * GIB)


def _budget(deployment: Deployment, weights: int, fraction: float, source: str) -> MemoryBudget:
    total = gpu_total(deployment)
    start = startup(deployment)
    kv = _kv_bytes(deployment, weights, fraction)
    headroom = max(0, total - start.bytes - weights - kv)
    float32 = " (float32 over the ranks)" if deployment.world_size > 1 else ""
    return checked(
        MemoryBudget(
            engine="sglang",
            gpu=deployment.gpu,
            gpu_memory_bytes=total,
            memory_flag=(FLAG, str(fraction)),
            flag_source=source,
            weights_bytes=weights,
            reserve=(
                start,
                ReserveTerm(
                    name="headroom",
                    bytes=headroom,
                    derivation=f"(1 - {fraction}) x the free memory before the weights "
                    "(SGLang's slack, for activations and CUDA graphs)",
                ),
            ),
            kv_memory_bytes=kv,
            rule=f"{fraction} x (GPU - startup) - weights, in GiB{float32} as SGLang probes "
            "it; SGLang then holds back its multimodal reservation and the KDA state pool",
        )
    )


def _ceiling(model: HybridModel, deployment: Deployment) -> tuple[float, str]:
    """The given fraction, else SGLang's default, with where it comes from."""
    given = deployment.mem_fraction_static
    if given is not None:
        return given, "given"
    fraction, how = _default(model, deployment)
    return fraction, f"SGLang {SGLANG_VERSION}'s default: {how}"


def sglang_budget(model: HybridModel, deployment: Deployment, weights: int) -> MemoryBudget:
    """The KV budget of ``deployment``'s ``mem_fraction_static`` (or SGLang's default), or,
    with ``kv_memory_bytes``, the least fraction that gives it (:func:`sglang_least`)."""
    if deployment.kv_memory_bytes is not None:
        return sglang_least(model, deployment, weights, deployment.kv_memory_bytes)
    fraction, source = _ceiling(model, deployment)
    return _budget(deployment, weights, fraction, source)


def sglang_least(
    model: HybridModel, deployment: Deployment, weights: int, kv_bytes: int
) -> MemoryBudget:
    """The least fraction, in thousandths (SGLang's default where that is less), whose budget
    holds ``kv_bytes``; refused (``memory_exceeded``) beyond what the default (or given)
    fraction leaves for the KV."""
    fraction, source = _ceiling(model, deployment)
    within_default(_budget(deployment, weights, fraction, source), kv_bytes)
    free_before = gpu_total(deployment) - startup(deployment).bytes

    def holds(steps: int) -> bool:
        return _kv_bytes(deployment, weights, min(steps / FRACTION_STEP, fraction)) >= kv_bytes

    top = math.ceil(fraction * FRACTION_STEP)  # holds: it is the ceiling's fraction
    steps = min(top, max(1, math.ceil((kv_bytes + weights) * FRACTION_STEP / free_before)))
    if holds(steps):
        while steps > 1 and holds(steps - 1):
            steps -= 1
    else:
        while not holds(steps):  # ends: past ``top`` the fraction is the ceiling's
            steps += 1
    least = min(steps / FRACTION_STEP, fraction)
    return _budget(deployment, weights, least, "the least that holds the workload")


SGLANG_BUDGET = BudgetRule(budget=sglang_budget, least=sglang_least)
"""SGLang 0.5.23's budget rule (the ``budget`` seam)."""
