"""Engine layout A: vLLM's hybrid allocator (``engine="vllm"``).

1. **Block size raise** (:func:`~k3layout.engines.vllm.rules.aligned_block_tokens`): ``A = max(128,
   requested)``; the attention block becomes ``A * ceil(S / (A * attn_bytes_per_token))``
   tokens on whole kernel blocks of the attention backend, so one attention page can hold one
   KDA state; the KDA page is padded up to the attention page, so every layer has one page
   size. The rules of the vLLM release followed are in :mod:`k3layout.engines.vllm.rules`.
2. **Grouping**: layers with identical specs form a bucket; ``group_size`` is the smallest
   bucket, or the largest when it is under 1.5x the smallest; a bucket of ``n`` splits into
   ``ceil(n / group_size)`` strided groups ``bucket[i::num_groups]``.
3. **Shared planes**: one backing per rank of ``group_size`` planes of ``num_blocks`` pages;
   plane ``j`` is shared by layer ``j`` of every group. ``LBNHC`` (the default) puts plane
   ``j``'s pages in one run; ``BLHNC`` puts block ``b``'s pages of every plane in one run.

An indexed hybrid (GLM-5.3-Flash: pooled DSA keys beside each latent, a tail ring per
request) has pages of several sizes, which vLLM packs block-outermost instead
(:mod:`.packed`, with the sparse backends' rules of :mod:`.sparse`): :attr:`VllmPlan.packed`.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import ClassVar, Literal

from pydantic import PositiveInt, model_validator

from ..._args import expect_args, expect_int, expect_positive
from ..._derivation import SelfChecked, is_deriving
from ..._frozen import trusted
from ..._validation import describe
from ...cache import DSAIndexer
from ...constants import MAX_BLOCK_TOKENS, VLLM_GROUP_SIZE_RATIO
from ...deployment import Deployment
from ...errors import Refusal
from ...layouts.answer import check_context
from ...layouts.groups import (
    Group,
    Stage,
    group_kind,
    group_names,
    projected_stages,
    split_strided,
)
from ...layouts.protocol import ByteRange, LayoutBase, check_block, check_non_negative
from ...layouts.recommend import Recommendation, advise, check_workload
from ...layouts.seams import SGLANG_SETTINGS, TOKENSPEED_SETTINGS, refuse_settings
from ...limits import check_bound, checked_bytes
from ...model import HybridModel
from ...placements import Interleave
from ...settings import KvCacheLayout
from ...sizes import RankSizes
from .budget import extensible
from .capacity import VllmCapacity, vllm_capacity
from .launch import vllm_env, vllm_flags
from .packed import (
    Run,
    alignment_bytes,
    block_stride_bytes,
    group_runs,
    packed_byte_range,
    packed_groups,
)
from .releases import RELEASES, release_of
from .replay import aligned_state_bytes, check_replayssm, state_alignment
from .report import VllmPage, VllmReport
from .rules import (
    ATTENTION_BACKENDS,
    VLLM_VERSION,
    AttentionBackend,
    aligned_block_tokens,
    backend_of,
    check_backend_runs,
    check_block_supported,
    check_dense_backend,
    check_kv_dtype,
    check_layout_serves,
    check_pipeline,
    kernel_block_tokens,
    mamba_block_tokens,
    speculative_model,
)
from .spans import (
    default_max_model_len,
    group_block_tokens,
    scheduler_block_tokens,
    unaligned_state_layers,
)
from .sparse import (
    SparseBackend,
    check_indexed,
    indexed_block_tokens,
    resolved_kv_cache_layout,
    sparse_backend_of,
)


class VllmPlan(SelfChecked, LayoutBase):
    """The vLLM hybrid layout of one model under one deployment.

    ``groups`` and ``num_planes`` (``group_size``: 29 for K3 + DSpark) describe the whole
    model (vLLM groups globally); each of
    ``stages`` holds the groups projected onto one pipeline stage, which allocates its own
    planes (``stage_block_bytes``). Plane ``j`` of block ``b`` starts at
    ``(j * num_blocks + b) * page`` of a rank's allocation (layer-outermost, vLLM's default).

    A plan built outside :func:`~k3layout.plan` (by hand, :func:`~k3layout.load_plan`, or
    ``model_copy(update=...)``, which re-validates here) is re-planned from its own ``model``
    and ``deployment`` and refused (``plan_mismatch``) at the first field that differs.
    """

    engine: Literal["vllm"] = "vllm"
    report_type: ClassVar[type[VllmReport]] = VllmReport
    block_tokens: PositiveInt
    page_bytes: PositiveInt

    @model_validator(mode="after")
    def _is_its_own_derivation(self) -> VllmPlan:
        # Built outside the pipeline (by hand, load_plan, model_copy): re-plan and compare.
        if not is_deriving():
            from ...layouts.rederive import check_plan  # noqa: PLC0415 - rederive imports the pipeline

            check_plan(self)
        return self

    @cached_property
    def packed(self) -> bool:
        """Whether vLLM packs pages of several sizes block-outermost (an indexed hybrid:
        :mod:`.packed`) rather than sharing planes of one page size."""
        return self.model.indexer is not None

    @property
    def kv_cache_layout(self) -> KvCacheLayout:
        """The KV-cache layout vLLM runs: the deployment's, else the one it resolves from its
        backends (``BLHNC`` when a tail ring's backend takes no other, else ``LBNHC``)."""
        return resolved_kv_cache_layout(self.deployment, self.model)

    @property
    def block_outermost(self) -> bool:
        """Whether the backing is block-outermost (``BLHNC``)."""
        return self.kv_cache_layout == "BLHNC"

    @cached_property
    def sparse_backend(self) -> SparseBackend | None:
        """The sparse MLA backend of an indexed hybrid (``None`` otherwise)."""
        return sparse_backend_of(self.deployment) if self.packed else None

    @cached_property
    def packed_alignment_bytes(self) -> int:
        """The packed layout's block stride alignment (1 for shared planes)."""
        backend = self.sparse_backend
        if backend is None:
            return 1
        return alignment_bytes(self.model, self.sizes, self.deployment, backend, self.block_tokens)

    @property
    def block_bytes(self) -> int:
        """Bytes one block costs per rank: one page on every plane (the packed layout: the
        widest group, aligned)."""
        if self.packed:
            return max(self.packed_strides)
        return self.num_planes * self.page_bytes

    @cached_property
    def packed_strides(self) -> tuple[int, ...]:
        """Each stage's block stride in the packed layout: its widest group, aligned
        (derived once per plan; empty for shared planes)."""
        if not self.packed:
            return ()
        return tuple(
            block_stride_bytes(held.groups, self.runs, self.packed_alignment_bytes)
            for held in self.stages
        )

    @cached_property
    def packed_runs(self) -> dict[tuple[str, tuple[int, ...]], tuple[Run, ...]]:
        """Memo of :meth:`runs`, by the group's name and layers (filled on first use)."""
        return {}

    def runs(self, group: Group) -> tuple[Run, ...]:
        """The packed layout's cache tensors of ``group`` inside a block (:mod:`.packed`)."""
        key = (group.name, group.layers)
        found = self.packed_runs.get(key)
        if found is None:
            found = group_runs(self.sizes, group, self.block_tokens, self.page_bytes)
            self.packed_runs[key] = found
        return found

    @cached_property
    def pages(self) -> tuple[VllmPage, ...]:
        """Every distinct page vLLM keeps, by group kind in group order: each layer's cache
        in a block, as its ``KVCacheConfig`` spec's ``page_size_bytes`` says. Shared planes
        keep one size (the attention page, the KDA page padded to it); the packed layout one
        per cache tensor of a group (:func:`.packed.group_runs`: the pooled keys, the latent
        rows, the padded KDA page, the tail ring).

        >>> from k3layout import Deployment, plan, preset
        >>> glm = plan(preset("glm-5.3-flash"), Deployment(attn_tp=8, kv_dtype="fp8_ds_mla"))
        >>> [(p.kind, p.parts[0], p.page_bytes) for p in glm.pages][1:3]
        [('attention', 'index', 12672), ('attention', 'latent', 1007616)]
        """
        found: dict[tuple[str, tuple[str, ...], int], None] = {}
        for group in self.groups:
            if self.packed:
                for run in self.runs(group):
                    found[(group.kind, run.parts, run.page)] = None
            else:
                found[(group.kind, self.group_spec(group).part_names, self.page_bytes)] = None
        return tuple(
            trusted(VllmPage, kind=kind, parts=parts, page_bytes=page)
            for kind, parts, page in found
        )

    @property
    def kda_page_padding_bytes(self) -> int:
        """Bytes a KDA page is padded by to match the attention page (0 without KDA)."""
        return 0 if self.sizes.state is None else self.page_bytes - self.sizes.state_bytes

    @property
    def attention_span_tokens(self) -> int:
        """Tokens one block of the target's attention covers: ``block * dcp`` (DCP deals
        them to ranks)."""
        return self.block_tokens * self.deployment.dcp

    @property
    def kda_span_tokens(self) -> int:
        """Tokens one KDA block covers (vLLM's ``mamba_block_size``) on stages with attention:
        the block in ``align`` mode (one state checkpoint per block), vLLM's default
        ``max_model_len`` in ``none`` mode (one state per request)."""
        return mamba_block_tokens(
            self.deployment.mamba_cache_mode_run,
            self.block_tokens,
            default_max_model_len(self.model),
        )

    @property
    def scheduler_block_tokens(self) -> int:
        """The scheduler's block at vLLM's default ``max_model_len``: the lcm of every
        group's block (:func:`.spans.scheduler_block_tokens`)."""
        return scheduler_block_tokens(self)

    @property
    def bytes_per_token(self) -> float:
        """Per-rank bytes per cached attention token: block bytes over the tokens it spans."""
        return self.block_bytes / self.attention_span_tokens

    @property
    def dcp_placement(self) -> Interleave:
        """Which DCP rank holds each token of an attention block."""
        return self.deployment.dcp_placement

    def stage_block_bytes(self, stage: int) -> int:
        """Bytes one block costs on a rank of pipeline stage ``stage``."""
        held = self.stage(stage)
        if self.packed:
            return self.packed_strides[held.index]
        return held.num_planes * self.page_bytes

    def num_blocks(self, budget_bytes: int, stage: int | None = None) -> int:
        """Blocks a rank allocates from ``budget_bytes`` (``budget // (page * group_size)``);
        with ``stage=None`` the fewest over all stages, as vLLM keeps one count for all."""
        check_non_negative("budget_bytes", budget_bytes)
        indices = range(len(self.stages)) if stage is None else (stage,)
        return min(budget_bytes // self.stage_block_bytes(i) for i in indices)

    # The engine-layout protocol.

    @property
    def state_rides_pages(self) -> bool:
        """A state group's page is one whole page of an attention layer's plane, so the
        state rides the PAGE object (LMCache MP): true of vLLM's hybrid layout with shared
        planes, not of the packed one."""
        return not self.packed

    @property
    def packing_label(self) -> str:
        """How the layout packs, in a few characters: ``block 1536``."""
        return f"block {self.block_tokens}"

    @property
    def worst_padding(self) -> float:
        """The state page's padding over ``S`` (0 without state layers)."""
        state = self.sizes.state_bytes
        return self.kda_page_padding_bytes / state if state else 0.0

    def tokens_per_page(self, group: Group) -> int:
        """Tokens of an attention group's page on a rank (the block, scaled for a spec whose
        rows are smaller, as vLLM unifies page sizes); 1 for a state group."""
        spec = self.group_spec(group)
        if spec.paging == "slot":
            return 1
        if self.packed:
            return self.block_tokens
        return self.page_bytes // spec.bytes_per_token(self.deployment.attn_tp)

    def payload_bytes(self, group: Group) -> int:
        """Payload of one layer of ``group`` on one page: the attention page, or ``S``."""
        return self.group_spec(group).payload_bytes(
            self.deployment.attn_tp, self.tokens_per_page(group)
        )

    def page_stride_bytes(self, group: Group) -> int:
        """Bytes between blocks ``b`` and ``b + 1`` of one layer: the page (packed: the whole
        block)."""
        return self.block_bytes if self.packed else self.page_bytes

    def page_axes(self, group: Group, num_blocks: int) -> tuple[tuple[int, int], ...]:
        """How one layer's pages repeat on its plane: ``(count, stride in bytes)`` per axis;
        ``num_blocks`` blocks of one page each (``LBNHC``)."""
        expect_int("num_blocks", num_blocks)
        return ((num_blocks, self.page_stride_bytes(group)),)

    @property
    def kernel_block_tokens(self) -> int:
        """The attention backend's kernel block: the block is split into these for the
        attention kernels (FlashMLA: 64), or kept whole (``TRITON_MLA``)."""
        if self.packed:  # the sparse kernels take any multiple of theirs: the whole block
            return self.block_tokens
        return kernel_block_tokens(backend_of(self.deployment), self.block_tokens)

    @property
    def attention_backend(self) -> str:
        """The MLA backend vLLM runs: the sparse one of an indexed hybrid, else the dense
        one (the deployment's, else vLLM's pick)."""
        return self.sparse_backend or backend_of(self.deployment)

    def layer_stride_bytes(self, num_blocks: int, stage: int = 0) -> int:
        """Bytes between plane ``j`` and ``j + 1`` of the same block in a rank's backing:
        a whole plane (``LBNHC``) or one page (``BLHNC``)."""
        expect_int("num_blocks", num_blocks)
        if self.kv_cache_layout == "BLHNC":
            return self.page_bytes
        return num_blocks * self.page_bytes

    def block_stride_bytes(self, stage: int = 0) -> int:
        """Bytes between block ``b`` and ``b + 1`` of one layer in a rank's backing: one
        page (``LBNHC``) or the stage's whole block (``BLHNC``)."""
        if self.kv_cache_layout == "BLHNC":
            return self.stage_block_bytes(stage)
        return self.page_bytes

    def plane_span_bytes(self, num_blocks: int) -> int:
        """Bytes of one plane holding ``num_blocks`` blocks."""
        expect_int("num_blocks", num_blocks)
        return num_blocks * self.page_bytes

    def span_tokens(self, group: Group) -> int:
        """Tokens one block of ``group`` covers: ``page tokens * dcp`` for attention; for
        state the group's KDA block (:func:`.spans.group_block_tokens`)."""
        return group_block_tokens(self, group)

    def blocks_in(self, budget_bytes: int, stage: int | None = None) -> int:
        """Blocks in ``budget_bytes`` (:meth:`num_blocks`)."""
        return self.num_blocks(budget_bytes, stage)

    def blocks_bytes(self, num_blocks: int, stage: int | None = None) -> int:
        """Bytes ``num_blocks`` blocks cost on a rank (the costliest stage when ``None``)."""
        check_non_negative("num_blocks", num_blocks)
        indices = range(len(self.stages)) if stage is None else (stage,)
        return max(num_blocks * self.stage_block_bytes(i) for i in indices)

    def byte_range(
        self, layer: int, part: str, block: int, num_blocks: int, stage: int = 0
    ) -> ByteRange:
        """Where ``part`` of module ``layer``'s page of block ``block`` lies in a rank of
        ``stage`` holding ``num_blocks`` blocks: plane ``j`` (the layer's position in its
        group) and block ``b`` at ``j * layer_stride + b * block_stride`` (``LBNHC``: plane
        ``j`` starts at ``j * num_blocks * page``; ``BLHNC``: block ``b`` at ``b * planes *
        page``)."""
        if self.packed:
            return packed_byte_range(
                self, layer, part, block=block, num_blocks=num_blocks, stage=stage
            )
        inner = self.part_range(layer, part)
        offset = self.page_offset_bytes(layer, block, num_blocks, stage) + inner.offset_bytes
        return ByteRange(
            layer=layer, part=part, block=block, offset_bytes=offset, size_bytes=inner.size_bytes
        )

    def page_offset_bytes(self, layer: int, block: int, num_blocks: int, stage: int = 0) -> int:
        """Where module ``layer``'s page of block ``block`` starts in a rank of ``stage``
        holding ``num_blocks`` blocks (vLLM's ``offset + l * layer_stride + b * block_stride``
        of the layer's ``KVCacheTensor``, ``l`` its plane)."""
        check_block(block, num_blocks)
        _, position = self.group_of(layer, stage)
        return position * self.layer_stride_bytes(num_blocks, stage) + block * (
            self.block_stride_bytes(stage)
        )

    def block_caption(self, num_planes: int) -> str:
        """One block in words, for pictures."""
        expect_int("num_planes", num_planes)
        return (
            f"one block: {self.block_tokens:,} tokens, a {self.page_bytes:,} B page per layer "
            f"on each of {num_planes} planes = {num_planes * self.page_bytes:,} B"
        )

    def summary(self) -> list[tuple[str, str]]:
        """The layout's numbers as (label, value) rows."""
        return [
            ("block tokens", f"{self.block_tokens:,}"),
            (
                "attention backend / kernel block",
                f"{self.attention_backend} / {self.kernel_block_tokens:,}",
            ),
            ("KV-cache layout", self.kv_cache_layout),
            *(
                (
                    ("KDA page bytes (padded to the latent's)", f"{self.page_bytes:,}"),
                    (
                        "packed groups: layers",
                        ", ".join(f"{g.name} {len(g.layers)}" for g in self.groups),
                    ),
                    ("block bytes (widest group, aligned)", f"{self.block_bytes:,}"),
                )
                if self.packed
                else (
                    ("page bytes (per layer)", f"{self.page_bytes:,}"),
                    ("planes (group_size)", f"{self.num_planes:,}"),
                    ("block bytes", f"{self.block_bytes:,}"),
                )
            ),
            ("KDA page padding bytes", f"{self.kda_page_padding_bytes:,}"),
            (
                "pages vLLM keeps (group kind, parts)",
                "; ".join(
                    f"{p.kind} {'+'.join(p.parts)} {p.page_bytes:,}" for p in self.pages
                ),
            ),
            (
                "spans: attention / KDA tokens",
                f"{self.attention_span_tokens:,} / {self.kda_span_tokens:,}",
            ),
        ]

    def capacity(
        self, kv_memory_bytes: int | None = None, max_model_len: int | None = None
    ) -> VllmCapacity:
        """What ``kv_memory_bytes`` per rank (``None``: what the GPU gives,
        :meth:`memory`) serves at ``max_model_len`` tokens per request (default: the model's
        context, as vLLM defaults): ``num_blocks``, blocks per request by group and the
        maximum concurrency, as vLLM counts them, and the common answer
        (:mod:`k3layout.engines.vllm.capacity`, :mod:`k3layout.layouts.answer`)."""
        return vllm_capacity(self, self.kv_budget(kv_memory_bytes), max_model_len)

    def launch_flags(self) -> tuple[tuple[str, str], ...]:
        """``vllm serve``'s flags for this deployment (:func:`.launch.vllm_flags`)."""
        return vllm_flags(self.deployment, self.model)

    def launch_env(self) -> tuple[tuple[str, str], ...]:
        """vLLM's environment variables for this deployment (:func:`.launch.vllm_env`)."""
        return vllm_env(self.deployment)

    def recommend(
        self, requests: int, max_model_len: int | None = None, kv_memory_bytes: int | None = None
    ) -> Recommendation:
        """vLLM 0.33's flags for ``requests`` requests of ``max_model_len`` tokens at once:
        the deployment's launch flags (:meth:`launch_flags`), the memory flag (the budget as
        ``--kv-cache-memory-bytes``, the deployment's own, or the least that holds them,
        checked against the GPU: :func:`k3layout.layouts.recommend.gpu_budget`),
        ``--max-num-seqs`` (never over the blocks, which vLLM checks for a Mamba model with
        full CUDA graphs) and ``--max-model-len``. Refuses (``budget_too_small``) a budget
        that cannot hold them, naming the most it holds and the memory they need
        (:mod:`k3layout.layouts.recommend`)."""
        check_workload(requests, kv_memory_bytes)
        length = check_context(self, max_model_len)
        return advise(
            self,
            (requests, length, kv_memory_bytes),
            self.memory_for(requests, length),
            lambda memory: (
                ("--max-num-seqs", str(requests)),
                ("--max-model-len", str(length)),
            ),
            lambda memory: self.capacity(memory, length),
        )

    def capacity_summary(self, budget_bytes: int, max_live: int = 1) -> list[tuple[str, str]]:
        """What ``budget_bytes`` holds, as (label, value) rows."""
        blocks = self.num_blocks(budget_bytes)
        return [
            ("blocks in budget", f"{blocks:,}"),
            ("attention tokens", f"{blocks * self.attention_span_tokens:,}"),
        ]

    def group_columns(self) -> dict[str, dict[str, str]]:
        """Per-group numbers beyond name, kind and layers (none for vLLM)."""
        return {group.name: {} for group in self.groups}

    def report_fields(self) -> tuple[dict[str, object], str]:
        """The report's engine fields, and the name of a stage's block bytes."""
        return {
            "block_tokens": self.block_tokens,
            "page_bytes": self.page_bytes,
            "block_bytes": self.block_bytes,
            "kda_page_padding_bytes": self.kda_page_padding_bytes,
            "attention_span_tokens": self.attention_span_tokens,
            "kda_span_tokens": self.kda_span_tokens,
            "scheduler_block_tokens": self.scheduler_block_tokens,
            "attention_backend": self.attention_backend,
            "kernel_block_tokens": self.kernel_block_tokens,
            "kv_cache_layout": self.kv_cache_layout,
            "pages": self.pages,
        }, "block_bytes"


def block_tokens_for(
    sizes: RankSizes,
    requested: int | None,
    backend: AttentionBackend = "FLASHMLA",
    *,
    engine_version: str | None = None,
    state_alignment: int = 1,
) -> int:
    """vLLM's block size raise: the smallest multiple of ``A = max(128, requested)`` whose
    attention page holds one KDA state, on whole kernel blocks of ``backend``; without a state
    the requested block, else the preferred one of release ``engine_version`` (default: the
    newest followed). ``state_alignment``: the bytes vLLM rounds each state (conv, recurrent)
    up to for this raise (:func:`.replay.state_alignment`: 16 under 0.34's FlashInfer
    ReplaySSM; 1: none).

    >>> 128 * math.ceil(832_512 / (128 * 576))  # K3 tp 8, fp8, 2 spec tokens
    1536

    Refuses (``invalid_argument``) arguments of the wrong type, a ``requested`` block below 1
    or a ``backend`` vLLM does not have; (``size_limit``) a block above ``MAX_BLOCK_TOKENS``.
    """
    expect_args(
        ("sizes", sizes, RankSizes),
        ("requested", requested, (int, type(None))),
        ("backend", backend, str),
    )
    if requested is not None:
        check_bound("requested", requested, MAX_BLOCK_TOKENS, why="a block in tokens")
    if backend not in ATTENTION_BACKENDS:
        raise Refusal(
            "invalid_argument",
            f"backend={describe(backend)} is not one of vLLM's MLA backends",
            facts={"field": "backend", "allowed": ATTENTION_BACKENDS},
            hint=f"use one of {', '.join(ATTENTION_BACKENDS)}",
        )
    release = RELEASES.get(engine_version or VLLM_VERSION)
    if release is None:
        raise Refusal(
            "version_unsupported",
            f"engine_version={describe(engine_version)} is not a vLLM release k3layout follows",
            facts={"field": "engine_version", "allowed": tuple(RELEASES)},
            hint=f"use one of {', '.join(RELEASES)}",
        )
    expect_positive("state_alignment", state_alignment)
    state = aligned_state_bytes(sizes, state_alignment)
    return aligned_block_tokens(
        backend, requested, state, sizes.attention_bytes_per_token, release.default_block_tokens
    )


def check_vllm(model: HybridModel, deployment: Deployment) -> HybridModel:
    """What vLLM refuses before it plans: pipeline stages of a model it cannot load on a later
    stage (:func:`.rules.check_pipeline`), an extensible-KV-cache switch the release refuses
    (:func:`.budget.extensible`), MTP on a model it builds none for, a sparse MLA backend named
    for MLA layers without an indexer, a cache dtype its dense MLA backends do not take (an
    indexed model: the sparse backends' rules, :func:`.sparse.check_indexed`), a requested
    block the attention backend's kernels do not take (its selector refuses it before the
    block is raised), an MTP depth its modules cannot be reused for. Returns the model vLLM
    builds: without speculative tokens there is no drafter, so no draft layers."""
    refuse_settings(deployment, SGLANG_SETTINGS, "SGLang")
    refuse_settings(deployment, TOKENSPEED_SETTINGS, "tokenspeed")
    check_pipeline(model, deployment)
    check_replayssm(model, deployment)  # --use-replayssm where the release refuses it
    extensible(deployment, release_of(deployment))  # a switch the release refuses
    model = speculative_model(model, deployment)
    indexer = model.indexer
    if indexer is not None:
        check_indexed(model, deployment, indexer)
        return built_model(model, deployment)
    backend = backend_of(deployment)
    if model.mla_layers:
        check_dense_backend(backend, model)
        check_kv_dtype(deployment.kv_dtype, backend)
        check_backend_runs(backend, deployment.gpu, deployment.kv_dtype)
    if deployment.block_tokens is not None:
        check_block_supported(backend, deployment.block_tokens)
    return built_model(model, deployment)


def built_model(model: HybridModel, deployment: Deployment) -> HybridModel:
    """The model vLLM builds for ``deployment``: no drafter without speculative tokens, so a
    draft's layers take no cache then (K3 + DSpark at 0 tokens: 24 planes, not 29)."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    return model.without_draft() if deployment.spec_tokens == 0 else model


def group_vllm(
    model: HybridModel, sizes: RankSizes, apart: frozenset[int] = frozenset()
) -> tuple[Group, ...]:
    """vLLM's grouping: one bucket per distinct cache spec, in first-appearance (module)
    order, strided split. ``apart``: state layers whose spec differs by its block alone (a
    stage without attention, :func:`.spans.unaligned_state_layers`), bucketed on their own.

    K3 + DSpark: buckets KDA 69 and attention 29; 69 >= 1.5 x 29 so ``group_size`` = 29 and
    KDA splits into ceil(69/29) = 3 groups of 23, 23, 23 (KDA first: module layer 0 is KDA).
    """
    # One bucket per spec, from the model's (cached) layers of each distinct record: records
    # whose specs coincide under this deployment share a bucket.
    buckets: dict[tuple[int, bool], tuple[int, ...]] = {}
    for ids in model.layer_ids_by_record:
        index = sizes.layer_specs[ids[0]]
        for alone in (False, True):
            held = tuple(i for i in ids if (i in apart) is alone) if apart else ids * (not alone)
            if held:
                key = (index, alone)
                buckets[key] = tuple(sorted((*buckets.get(key, ()), *held)))
    ordered = sorted(buckets.items(), key=lambda item: item[1][0])  # vLLM: first appearance
    smallest = min(len(ids) for _, ids in ordered)
    largest = max(len(ids) for _, ids in ordered)
    ratio_num, ratio_den = VLLM_GROUP_SIZE_RATIO
    group_size = largest if largest * ratio_den < smallest * ratio_num else smallest
    kinds = {index: group_kind(sizes.specs[index]) for (index, _), _ in ordered}
    named: dict[tuple[str, int], int] = {}  # groups named so far per kind and spec
    groups: list[Group] = []
    for (index, _), ids in ordered:
        kind = kinds[index]
        splits = split_strided(ids, -(-len(ids) // group_size))
        prefix = None if list(kinds.values()).count(kind) == 1 else sizes.specs[index].kind
        done = named.get((kind, index), 0)
        names = group_names(kind, done + len(splits), prefix)[done:]
        named[(kind, index)] = done + len(splits)
        groups.extend(
            trusted(Group, name=n, kind=kind, layers=s, first_plane=0)
            for n, s in zip(names, splits, strict=True)
        )
    return tuple(groups)


def pack_vllm(
    model: HybridModel,
    deployment: Deployment,
    sizes: RankSizes,
    groups: tuple[Group, ...],
    stages: tuple[Stage, ...],
) -> VllmPlan:
    """Raise the block, size the shared page and check DCP's interleave against it; regroup
    when a stage without attention keeps its KDA layers at another block (vLLM buckets them
    apart). An indexed hybrid is packed instead (:func:`pack_indexed`)."""
    indexer = model.indexer
    if indexer is not None:
        return pack_indexed(model, deployment, sizes, indexer)
    page = unified_page_bytes(
        sizes,
        block_tokens_for(
            sizes,
            deployment.block_tokens,
            backend_of(deployment),
            engine_version=release_of(deployment).version,
            state_alignment=state_alignment(deployment),
        ),
    )
    block = page // sizes.attention_bytes_per_token
    apart = unaligned_state_layers(model, deployment, block)
    if apart:
        groups = group_vllm(model, sizes, apart)
        stages = projected_stages(model, deployment, groups)
    check_layout_serves(backend_of(deployment), resolved_kv_cache_layout(deployment, model), block)
    check_interleave(deployment, block)
    return _made(model, deployment, groups, stages, block=block, page=page)


def pack_indexed(
    model: HybridModel, deployment: Deployment, sizes: RankSizes, indexer: DSAIndexer
) -> VllmPlan:
    """vLLM's packed layout of an indexed hybrid: the block raised over the indexer's kernel
    pages (:func:`.sparse.indexed_block_tokens`), the KDA page padded to the latent's bytes
    at that block, the packed groups (:func:`.packed.packed_groups`)."""
    # vLLM counts the latent's elements at the cache dtype's width (fp8_ds_mla: 1 byte, its
    # scales and rope slot left out).
    latent_bpt = model.mla_layers[0].latent_dim * (2 if deployment.kv_dtype == "bf16" else 1)
    block = indexed_block_tokens(
        indexer,
        sparse_backend_of(deployment),
        deployment.block_tokens,
        sizes.state_bytes,
        latent_bpt,
    )
    check_bound("block_tokens", block, MAX_BLOCK_TOKENS, why="a block in tokens")
    page = block * latent_bpt
    groups = packed_groups(model, sizes, block, page)
    stages = projected_stages(model, deployment, groups)
    check_interleave(deployment, block)
    return _made(model, deployment, groups, stages, block=block, page=page)


def _made(
    model: HybridModel,
    deployment: Deployment,
    groups: tuple[Group, ...],
    stages: tuple[Stage, ...],
    *,
    block: int,
    page: int,
) -> VllmPlan:
    """The plan of a block and page just derived (bytes checked within int64)."""
    # The pipeline's own validated inputs and the sizes just derived from them: the plan is
    # its own derivation (pack runs inside deriving()), so there is nothing to re-validate.
    return checked_bytes(
        trusted(
            VllmPlan,
            groups=groups,
            model=model,
            deployment=deployment,
            stages=stages,
            engine="vllm",
            block_tokens=block,
            page_bytes=page,
        ),
        "block_bytes",
    )


def check_interleave(deployment: Deployment, block: int) -> None:
    """Refuse (``dcp_interleave``) a DCP interleave that does not divide the block."""
    if block % deployment.dcp_interleave:
        raise Refusal(
            "dcp_interleave",
            f"dcp_interleave={deployment.dcp_interleave} must divide the block "
            f"(block_tokens={block})",
            facts={"dcp_interleave": deployment.dcp_interleave, "block_tokens": block},
            hint=f"use a dcp_interleave that divides {block}, e.g. "
            f"dcp_interleave={math.gcd(block, deployment.dcp_interleave)}",
        )


def unified_page_bytes(sizes: RankSizes, block: int) -> int:
    """One page size for every group, as vLLM unifies them: the largest attention page at
    ``block`` tokens; every other attention spec's page must divide it (its block grows by
    the ratio) and a state slot is padded up to it. Refuses (``page_size``) otherwise."""
    tp = sizes.attn_tp
    pages = {
        spec.kind: block * spec.bytes_per_token(tp)
        for spec in sizes.specs
        if spec.paging == "token"
    }
    page = max(pages.values())
    for kind, size in pages.items():
        if page % size:
            largest = max(pages, key=lambda k: pages[k])
            raise Refusal(
                "page_size",
                f"{kind} page of {size} B does not divide the {largest} page of {page} B at "
                f"block_tokens={block}: vLLM cannot give the groups one page size",
                facts={
                    "kind": kind,
                    "page_bytes": size,
                    "largest_kind": largest,
                    "largest_page_bytes": page,
                    "block_tokens": block,
                },
                hint="pick layer dimensions whose per-token bytes divide one another",
            )
    return page
