"""Engine layout A: vLLM's hybrid allocator (``engine="vllm"``).

1. **Block size raise**: ``A = max(128, requested)``; the attention block becomes
   ``A * ceil(S / (A * attn_bytes_per_token))`` tokens, so one attention page can hold one KDA
   state; the KDA page is padded up to the attention page. Every per-layer page is one unit.
2. **Grouping**: layers with identical specs form a bucket; ``group_size`` is the smallest
   bucket, or the largest when it is under 1.5x the smallest; a bucket of ``n`` splits into
   ``ceil(n / group_size)`` strided groups ``bucket[i::num_groups]``.
3. **Shared planes**: ``group_size`` tensors of ``num_blocks x page``; tensor ``j`` is shared by
   layer ``j`` of every group.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import PositiveInt, model_validator

from .._derivation import SelfChecked, is_deriving
from ..constants import MLA_KERNEL_BLOCK_TOKENS, VLLM_GROUP_SIZE_RATIO
from ..deployment import Deployment
from ..errors import Refusal
from ..model import HybridModel
from ..placements import Interleave
from ..sizes import RankSizes
from .groups import Group, GroupedLayout, GroupKind, Stage, group_names, split_strided, stage_at


class VllmPlan(SelfChecked, GroupedLayout):
    """The vLLM hybrid layout of one model under one deployment.

    ``groups`` and ``num_planes`` (``group_size``: 29 for K3 + DSpark) describe the whole
    model (vLLM groups globally); each of
    ``stages`` holds the groups projected onto one pipeline stage, which allocates its own
    planes (``stage_block_bytes``).

    A plan built outside :func:`~k3layout.plan` (by hand, :func:`~k3layout.load_plan`, or
    ``model_copy(update=...)``, which re-validates here) is re-planned from its own ``model``
    and ``deployment`` and refused (``plan_mismatch``) at the first field that differs.
    """

    engine: Literal["vllm"] = "vllm"
    model: HybridModel
    deployment: Deployment
    sizes: RankSizes
    block_tokens: PositiveInt
    page_bytes: PositiveInt
    stages: tuple[Stage, ...]

    @model_validator(mode="after")
    def _is_its_own_derivation(self) -> VllmPlan:
        # Built outside the pipeline (by hand, load_plan, model_copy): re-plan and compare.
        if not is_deriving():
            from .rederive import check_plan  # noqa: PLC0415 - rederive imports the pipeline

            check_plan(self)
        return self

    @property
    def block_bytes(self) -> int:
        """Bytes one block costs per rank: one page on every plane."""
        return self.num_planes * self.page_bytes

    @property
    def kda_page_padding_bytes(self) -> int:
        """Bytes a KDA page is padded by to match the attention page (0 without KDA)."""
        return 0 if self.sizes.kda is None else self.page_bytes - self.sizes.kda_state_bytes

    @property
    def attention_span_tokens(self) -> int:
        """Tokens one attention block covers: ``block * dcp`` (DCP deals them to ranks)."""
        return self.block_tokens * self.deployment.dcp

    @property
    def kda_span_tokens(self) -> int:
        """Tokens one KDA block (one state checkpoint in ``align`` mode) covers."""
        return self.block_tokens

    @property
    def bytes_per_token(self) -> float:
        """Per-rank bytes per cached attention token: block bytes over the tokens it spans."""
        return self.block_bytes / self.attention_span_tokens

    @property
    def dcp_placement(self) -> Interleave:
        """Which DCP rank holds each token of an attention block."""
        return Interleave(num_ranks=self.deployment.dcp, interleave=self.deployment.dcp_interleave)

    def stage_block_bytes(self, stage: int) -> int:
        """Bytes one block costs on a rank of pipeline stage ``stage``."""
        return stage_at(self.stages, stage).num_planes * self.page_bytes

    def num_blocks(self, budget_bytes: int, stage: int | None = None) -> int:
        """Blocks a rank allocates from ``budget_bytes`` (``budget // (page * group_size)``);
        with ``stage=None`` the fewest over all stages, as vLLM keeps one count for all."""
        if budget_bytes < 0:
            raise Refusal(
                "invalid_argument",
                f"budget_bytes={budget_bytes} must be >= 0",
                facts={"budget_bytes": budget_bytes},
            )
        indices = range(len(self.stages)) if stage is None else (stage,)
        return min(budget_bytes // self.stage_block_bytes(i) for i in indices)


def block_tokens_for(sizes: RankSizes, requested: int | None) -> int:
    """vLLM's block size raise: the smallest multiple of ``A = max(128, requested)`` whose
    attention page holds one KDA state.

    >>> 128 * math.ceil(832_512 / (128 * 576))  # K3 tp 8, fp8, 2 spec tokens
    1536
    """
    align = max(MLA_KERNEL_BLOCK_TOKENS, requested or 0)
    if sizes.kda is None:
        return align
    return align * math.ceil(sizes.kda.state_bytes / (align * sizes.attention.bytes_per_token))


def group_vllm(model: HybridModel) -> tuple[Group, ...]:
    """vLLM's grouping: buckets in first-appearance (module) order, strided split.

    K3 + DSpark: buckets KDA 69 and attention 29; 69 >= 1.5 x 29 so ``group_size`` = 29 and
    KDA splits into ceil(69/29) = 3 groups of 23, 23, 23 (KDA first: module layer 0 is KDA).
    """
    buckets: dict[GroupKind, tuple[int, ...]] = {}
    for layer_id, layer in enumerate(model.module_layers):
        kind: GroupKind = "attention" if layer.kind == "mla" else "kda"
        buckets[kind] = (*buckets.get(kind, ()), layer_id)
    smallest = min(len(ids) for ids in buckets.values())
    largest = max(len(ids) for ids in buckets.values())
    ratio_num, ratio_den = VLLM_GROUP_SIZE_RATIO
    group_size = largest if largest * ratio_den < smallest * ratio_num else smallest
    groups: list[Group] = []
    for kind, ids in buckets.items():
        splits = split_strided(ids, math.ceil(len(ids) / group_size))
        names = group_names(kind, len(splits))
        groups.extend(
            Group(name=n, kind=kind, layers=s) for n, s in zip(names, splits, strict=True)
        )
    return tuple(groups)


def pack_vllm(
    model: HybridModel,
    deployment: Deployment,
    sizes: RankSizes,
    groups: tuple[Group, ...],
    stages: tuple[Stage, ...],
) -> VllmPlan:
    """Raise the block, size the shared page and check DCP's interleave against it."""
    block = block_tokens_for(sizes, deployment.block_tokens)
    if block % deployment.dcp_interleave:
        raise Refusal(
            "dcp_interleave",
            f"dcp_interleave={deployment.dcp_interleave} must divide the block "
            f"(block_tokens={block})",
            facts={"dcp_interleave": deployment.dcp_interleave, "block_tokens": block},
            hint=f"use a dcp_interleave that divides {block}, e.g. "
            f"dcp_interleave={math.gcd(block, deployment.dcp_interleave)}",
        )
    return VllmPlan(
        model=model,
        deployment=deployment,
        sizes=sizes,
        block_tokens=block,
        page_bytes=block * sizes.attention.bytes_per_token,
        groups=groups,
        stages=stages,
    )
