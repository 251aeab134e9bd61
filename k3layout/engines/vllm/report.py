"""``k3layout plan --engine vllm --json``: a vLLM plan's report."""

from __future__ import annotations

from typing import Literal

from ..._frozen import Frozen
from ...layouts.report import PlanReport, StageReport
from .capacity import VllmCapacity


class VllmStageReport(StageReport):
    """One pipeline stage of a ``vllm`` plan, with the bytes one block costs on it."""

    block_bytes: int


class VllmPage(Frozen):
    """One distinct page vLLM keeps: the bytes one layer's cache of a group of ``kind`` takes
    in a block (its ``KVCacheConfig`` spec's ``page_size_bytes``) and the parts of the plan
    it holds. Kimi-K3: the latent page and the KDA page padded to it, one size; GLM-5.3-Flash
    with ``fp8_ds_mla``: the pooled keys, the 656-byte latent rows of a block, the KDA page
    and the tail ring, four sizes."""

    kind: str
    parts: tuple[str, ...]
    page_bytes: int


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
    pages: tuple[VllmPage, ...] = ()
    """Every distinct page vLLM keeps, by group kind in group order (:attr:`VllmPlan.pages`);
    empty in a report written before k3layout listed them."""
    capacity: VllmCapacity | None = None
    """With ``--kv-memory-gib`` and ``--max-model-len``: ``num_blocks``, blocks per request by
    group and the maximum concurrency, as vLLM counts them."""
