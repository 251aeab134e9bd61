"""``k3layout plan --engine sglang --json``: an SGLang plan's report, in SGLang's names."""

from __future__ import annotations

from typing import Literal

from ...layouts.report import PlanReport, StageReport
from .capacity import SglangCapacity


class SglangStageReport(StageReport):
    """One pipeline stage of an SGLang plan, with the bytes one page of tokens costs there."""

    page_bytes: int


class SglangReport(PlanReport):
    """``k3layout plan --engine sglang --json``: ``bytes_per_token`` is SGLang's cell size of
    the whole model (each stage's under ``capacity.stages``)."""

    engine: Literal["sglang"] = "sglang"
    sglang_version: str
    gpu: str
    prefill_attention_backend: str
    attention_backend: str
    page_size: int
    state_slot_bytes: int
    stages: tuple[SglangStageReport, ...]
    capacity: SglangCapacity | None = None
    """With ``--kv-memory-gib``: ``max_total_num_tokens``, ``max_mamba_cache_size`` and
    ``max_running_requests``, as SGLang computes them."""
