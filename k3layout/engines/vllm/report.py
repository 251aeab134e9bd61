"""``k3layout plan --engine vllm --json``: a vLLM plan's report."""

from __future__ import annotations

from typing import Literal

from ...layouts.report import PlanReport, StageReport
from .capacity import VllmCapacity


class VllmStageReport(StageReport):
    """One pipeline stage of a ``vllm`` plan, with the bytes one block costs on it."""

    block_bytes: int


class VllmReport(PlanReport):
    """``k3layout plan --engine vllm --json``."""

    engine: Literal["vllm"] = "vllm"
    block_tokens: int
    page_bytes: int
    block_bytes: int
    kda_page_padding_bytes: int
    attention_span_tokens: int
    kda_span_tokens: int
    scheduler_block_tokens: int
    attention_backend: str
    kernel_block_tokens: int
    kv_cache_layout: str
    stages: tuple[VllmStageReport, ...]
    capacity: VllmCapacity | None = None
    """With ``--kv-memory-gib`` and ``--max-model-len``: ``num_blocks``, blocks per request by
    group and the maximum concurrency, as vLLM counts them."""
