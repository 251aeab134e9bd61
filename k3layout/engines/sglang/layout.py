"""SGLang 0.5.23's pools for a hybrid model (``engine="sglang"``).

SGLang keeps attention and state apart, with no aliasing:

- a **token pool** (``MLATokenToKVPool``): one ``[num_tokens + page, 1, 576]`` tensor per MLA
  layer of the stage (fp8 stored as ``uint8``), paged by the attention backend's page
  (``fa3``: 1 token on Hopper; ``trtllm_mla``: 64 on Blackwell); page 0 is padding;
- a **state pool** (``MambaPool``): ``conv [L_kda, num_slots + 1, K-1, q|k|v]`` bf16 and
  ``temporal [L_kda, num_slots + 1, H/tp, K, V]`` fp32 over the stage's KDA layers; one slot
  is padding.

Each layer is its own plane here (attention layers first, then KDA layers: no plane is
shared), so the plan answers the engine-layout protocol like the other engines, with a page of
``page`` tokens for an attention layer and one slot for a KDA layer. Byte offsets are inside
the tensor that holds the part (:meth:`SglangPlan.tensor_of`). How much of each a budget buys
is :mod:`.capacity`.
"""

from __future__ import annotations

from typing import ClassVar, Literal, cast

from pydantic import PositiveInt, model_validator

from ..._args import expect_int
from ..._derivation import SelfChecked, is_deriving
from ..._frozen import trusted
from ...deployment import Deployment
from ...errors import Refusal
from ...layouts.answer import check_context
from ...layouts.groups import Group, Stage
from ...layouts.pipeline import plan
from ...layouts.protocol import ByteRange, LayoutBase, check_block, check_non_negative
from ...layouts.recommend import Recommendation, advise, check_workload
from ...layouts.seams import (
    TOKENSPEED_SETTINGS,
    UTILIZATION_SETTINGS,
    VLLM_SETTINGS,
    refuse_settings,
)
from ...model import HybridModel
from ...sizes import RankSizes
from .capacity import SglangCapacity, sglang_capacity
from .launch import sglang_flags
from .report import SglangReport
from .rules import (
    DSA_INDEX_HEAD_DIMS,
    SGLANG_VERSION,
    attention_backends,
    state_slots_per_request,
    track_interval,
)

_KDA_STATE_SETTINGS: tuple[tuple[str, object], ...] = (
    ("conv_layout", "SD"),
    ("replayssm", False),
)
"""vLLM's KDA state settings (tokenspeed takes them too) that SGLang does not: SGLang keeps
the conv state time-major and writes no ReplaySSM records. Of vLLM's own settings
(:data:`VLLM_SETTINGS`): SGLang picks its attention backend and page from the GPU, has no
``align`` block checkpoints, and deals a DCP decode's tokens one at a time (its CUDA P/D
relayout has no interleave)."""


class SglangPlan(SelfChecked, LayoutBase):
    """SGLang's token pool and state pool of one model under one deployment, per rank.

    ``prefill_attention_backend``, ``attention_backend`` (the decode's, which reads the token
    pool) and ``page_tokens`` are what SGLang resolves on ``deployment.gpu``.
    A plan built outside :func:`~k3layout.plan` is re-planned from its own model and
    deployment and refused (``plan_mismatch``) at the first field that differs.

    >>> from k3layout import Deployment, plan, preset
    >>> p = plan(preset("kimi-k3"), Deployment(engine="sglang", attn_tp=8, gpu="h200"))
    >>> p.attention_backend, p.page_tokens, p.bytes_per_token, p.state_slot_bytes()
    ('fa3', 1, 13824, 56171520)
    """

    engine: Literal["sglang"] = "sglang"
    report_type: ClassVar[type[SglangReport]] = SglangReport
    prefill_attention_backend: str
    attention_backend: str
    page_tokens: PositiveInt

    @model_validator(mode="after")
    def _is_its_own_derivation(self) -> SglangPlan:
        if not is_deriving():
            from ...layouts.rederive import check_plan  # noqa: PLC0415 - rederive imports the pipeline

            check_plan(self)
        return self

    # SGLang's numbers.

    def cell_bytes(self, stage: int = 0) -> int:
        """SGLang's cell size on ``stage``: bytes per token per rank of every token-paged
        layer the stage holds (``576 * elem`` per MLA layer; a draft's K/V rows too, since
        its pool shares the budget)."""
        held = self.stage(stage)
        target = sum(
            self.layer_cell_bytes(layer)
            for group in held.groups
            if group.kind == "attention"
            for layer in group.layers
            if layer < self.model.num_layers
        )
        # Every stage prices the draft's rows (only the last allocates its pool).
        return target + sum(self.layer_cell_bytes(layer) for layer in self.model.draft_layer_ids)

    def layer_cell_bytes(self, layer: int) -> int:
        """What SGLang's configurator budgets per token for one attention layer: its rows,
        and a pooled part's row over its tokens, rounded up (GLM-5.3-Flash's index keys:
        ``ceil(132 / 16)`` = 9 bytes), although the pool allocates them by the page."""
        tp = self.deployment.attn_tp
        spec = self.sizes.spec_of(layer)
        pooled = sum(
            -(-part.local_bytes(tp) // part.tokens_per_row)
            for part in spec.parts
            if part.tokens_per_row > 1
        )
        return spec.bytes_per_token(tp) + pooled

    @property
    def mamba_track_interval(self) -> int | None:
        """The ``--mamba-track-interval`` SGLang needs to start with the radix cache (``None``:
        its default 256 starts; no radix cache: none)."""
        if not self.deployment.prefix_caching:
            return None
        return track_interval(
            self.page_tokens, self.deployment.mamba_track_interval, _draft_tokens(self.deployment)
        )

    def state_slot_bytes(self, stage: int | None = None) -> int:
        """Bytes of one state slot per rank: every KDA layer's conv and temporal state (of
        the whole model, or of ``stage``)."""
        groups = self.groups_of("kda", stage)
        return sum(len(group.layers) for group in groups) * self.sizes.state_bytes

    @property
    def bytes_per_token(self) -> int:
        """SGLang's cell size of the whole model on one rank (each stage's:
        :meth:`cell_bytes`)."""
        return sum(self.cell_bytes(stage.index) for stage in self.stages)

    def capacity(
        self, kv_memory_bytes: int | None = None, max_model_len: int | None = None
    ) -> SglangCapacity:
        """What ``kv_memory_bytes`` per rank (the memory SGLang's configurator divides;
        ``None``: what the GPU gives, :meth:`memory`) serves at
        a context of ``max_model_len`` tokens (SGLang's ``--context-length``; ``None``: the
        model's ``context_tokens``, as SGLang defaults): ``max_total_num_tokens``,
        ``max_mamba_cache_size`` and ``max_running_requests``, as SGLang computes them
        (:mod:`k3layout.engines.sglang.capacity`)."""
        # SGLang defaults --context-length to the model's and refuses a longer one
        context = check_context(self, max_model_len)
        return sglang_capacity(self, self.kv_budget(kv_memory_bytes), context)

    def launch_flags(self) -> tuple[tuple[str, str], ...]:
        """``python -m sglang.launch_server``'s flags for this deployment
        (:func:`.launch.sglang_flags`), the track interval SGLang needs to start included."""
        return sglang_flags(self.deployment, self.model, self.mamba_track_interval)

    def tensor_of(self, layer: int, part: str, stage: int = 0) -> str:
        """The name of the pool tensor holding ``part`` of module ``layer``:
        ``kv_buffer[j]`` (the ``j``-th MLA layer of the stage; its pooled index keys:
        ``index_k[j]``, the DSA pool's ``IndexKeyCache``), ``conv[0]`` or ``temporal``
        (indexed by the KDA layer's position)."""
        group, position = self.group_of(layer, stage)
        self.part_range(layer, part)  # refuses a part the layer does not have
        if group.kind == "kda":
            return "conv[0]" if part == "conv" else "temporal"
        if group.name != "full_attention":
            raise _draft_refusal(layer)
        return f"index_k[{position}]" if part == "index" else f"kv_buffer[{position}]"

    # The engine-layout protocol.

    @property
    def state_rides_pages(self) -> bool:
        """SGLang keeps state in its own pool: it does not ride attention pages."""
        return False

    @property
    def one_backing(self) -> bool:
        """SGLang allocates a tensor per MLA layer and per state part: offsets count from the
        start of the tensor holding the part (:meth:`tensor_of`)."""
        return False

    @property
    def packing_label(self) -> str:
        """``page 1`` (the token pool's page, in tokens)."""
        return f"page {self.page_tokens}"

    @property
    def worst_padding(self) -> float:
        """No padding: pools are sized to their parts."""
        return 0.0

    @property
    def block_bytes(self) -> int:
        """Bytes one page of tokens costs per rank (the costliest stage's)."""
        return max(self.stage_block_bytes(stage.index) for stage in self.stages)

    def stage_block_bytes(self, stage: int) -> int:
        """Bytes one page of tokens costs on a rank of ``stage``."""
        return self.page_tokens * self.cell_bytes(stage)

    def tokens_per_page(self, group: Group) -> int:
        """Tokens of an attention page (the backend's page), 1 for a state slot."""
        return 1 if self.group_spec(group).paging == "slot" else self.page_tokens

    def payload_bytes(self, group: Group) -> int:
        """One layer's page (attention) or slot (state) on one rank."""
        return self.group_spec(group).payload_bytes(
            self.deployment.attn_tp, self.tokens_per_page(group)
        )

    def plane_bytes_of(self, group: Group) -> int:
        """One page (slot) of ``group``'s layers: each layer has its own tensor."""
        return self.page_stride_bytes(group)

    def page_stride_bytes(self, group: Group) -> int:
        """Bytes between pages (slots) of one layer's ``kv_buffer``: the payload, unpadded
        (a pooled part's rows are in a tensor of their own: not in the stride)."""
        spec = self.group_spec(group)
        if spec.paging == "token" and spec.pooled:
            return spec.bytes_per_token(self.deployment.attn_tp) * self.page_tokens
        return self.payload_bytes(group)

    def page_axes(self, group: Group, num_blocks: int) -> tuple[tuple[int, int], ...]:
        """``num_blocks`` pages (slots) of one layer, back to back."""
        expect_int("num_blocks", num_blocks)
        return ((num_blocks, self.page_stride_bytes(group)),)

    def plane_span_bytes(self, num_blocks: int) -> int:
        """Bytes of the largest layer tensor holding ``num_blocks`` pages (slots)."""
        expect_int("num_blocks", num_blocks)
        return num_blocks * max(self.page_stride_bytes(g) for g in self.groups if g.layers)

    def span_tokens(self, group: Group) -> int:
        """Tokens one attention page covers (``page * dcp``); a state slot holds a whole
        request's state, one token's worth of span here."""
        if self.group_spec(group).paging == "slot":
            return 1
        return self.page_tokens * self.deployment.dcp

    def blocks_in(self, budget_bytes: int, stage: int | None = None) -> int:
        """Pages of the token pool ``budget_bytes`` buys at SGLang's split (its
        ``max_total_num_tokens`` over the page, at the model's longest context)."""
        tokens = sglang_capacity(self, budget_bytes, 1).max_total_num_tokens  # any context
        return tokens // self.page_tokens

    def blocks_bytes(self, num_blocks: int, stage: int | None = None) -> int:
        """Bytes ``num_blocks`` pages of the token pool cost on a rank (costliest stage)."""
        check_non_negative("num_blocks", num_blocks)
        indices = range(len(self.stages)) if stage is None else (stage,)
        return max(num_blocks * self.stage_block_bytes(i) for i in indices)

    def byte_range(
        self, layer: int, part: str, block: int, num_blocks: int, stage: int = 0
    ) -> ByteRange:
        """Where ``part`` of module ``layer``'s page ``block`` (a state layer's slot
        ``block``) lies in the tensor holding it (:meth:`tensor_of`), in a rank of ``stage``
        whose pool holds ``num_blocks`` pages (slots), padding included.

        - attention layer: page ``b`` of its ``kv_buffer`` at ``b * page * row`` (page 0 is
          SGLang's padding page); its pooled index keys, page ``b`` of ``index_k`` at ``b *
          page / index_kpool * 132``;
        - KDA layer at position ``j`` of the stage: row ``s`` at ``(j * num_blocks + s) *
          part`` of ``conv[0]`` or ``temporal`` (``num_blocks`` = slots + the padding slot).
        """
        check_block(block, num_blocks)
        self.tensor_of(layer, part, stage)  # refuses a draft layer or a missing part
        group, position = self.group_of(layer, stage)
        inner = self.part_range(layer, part)
        if group.kind == "kda":
            offset = (position * num_blocks + block) * inner.size_bytes
        elif self.sizes.spec_of(layer).part(part).tokens_per_row > 1:
            offset = block * inner.size_bytes  # the pooled keys: a tensor of their own
        else:
            offset = block * self.page_stride_bytes(group) + inner.offset_bytes
        return ByteRange(
            layer=layer, part=part, block=block, offset_bytes=offset, size_bytes=inner.size_bytes
        )

    def block_caption(self, num_planes: int) -> str:
        """One page in words, for pictures."""
        expect_int("num_planes", num_planes)
        return (
            f"one page: {self.page_tokens:,} token(s) of {self.cell_bytes():,} B on "
            f"{num_planes} layer tensors; state slots in their own pool"
        )

    def summary(self) -> list[tuple[str, str]]:
        """The layout's numbers as (label, value) rows."""
        return [
            ("SGLang", SGLANG_VERSION),
            (
                "gpu / prefill, decode backend / page tokens",
                f"{self.deployment.gpu} / {self.prefill_attention_backend}, "
                f"{self.attention_backend} / {self.page_tokens:,}",
            ),
            (
                "bytes per token (cell size, attention cache, whole model)",
                f"{self.bytes_per_token:,}",
            ),
            ("state slot bytes (KDA state, whole model)", f"{self.state_slot_bytes():,}"),
            *(
                (("--mamba-track-interval (the page: SGLang's 256 would not start)", str(n)),)
                if (n := self.mamba_track_interval) is not None
                else ()
            ),
            *(
                (
                    (
                        "--json-model-override-args (SGLang's nested config loses them)",
                        override,
                    ),
                )
                if (override := dict(self.launch_flags()).get("--json-model-override-args"))
                else ()
            ),
        ]

    def recommend(
        self, requests: int, max_model_len: int | None = None, kv_memory_bytes: int | None = None
    ) -> Recommendation:
        """SGLang 0.5.23's flags for ``requests`` requests of ``max_model_len`` tokens at once:
        ``--max-running-requests`` (so SGLang's own cap is stated, not guessed from its log),
        ``--max-mamba-cache-size`` (exactly the state slots they hold, whatever the context),
        ``--max-total-tokens`` (the token pool of the least memory: a larger budget's rest is
        left idle, not guessed into the pool) and ``--context-length``; the memory is the
        budget or the least that holds them with these flags. Refuses (``budget_too_small``)
        a budget that cannot, naming the most it holds and the memory they need."""
        check_workload(requests, kv_memory_bytes)
        length = check_context(self, max_model_len)
        d = self.deployment
        # both flags count over every attention-DP worker; the requests are per replica
        running = requests * d.attn_dp
        slots = running * state_slots_per_request(d.prefix_caching, overlap=d.pp == 1)
        flags = {"max_running_requests": running, "max_mamba_cache_size": slots}
        flagged = self._replanned(flags)
        needed = flagged.memory_for(requests, length)
        # the token pool the least memory gives: a cap that leaves a larger budget's rest idle
        pool = flagged.capacity(needed, length).max_total_num_tokens
        capped = self._replanned({**flags, "max_total_tokens": pool})
        return advise(
            self,
            (requests, length, kv_memory_bytes),
            needed,
            lambda memory: (
                ("--max-running-requests", str(running)),
                ("--max-mamba-cache-size", str(slots)),
                ("--max-total-tokens", str(pool)),
                ("--context-length", str(length)),
            ),
            lambda memory: capped.capacity(memory, length),
        )

    def _replanned(self, flags: dict[str, int]) -> SglangPlan:
        """This plan's model and deployment with SGLang ``flags`` set."""
        fields = {name: getattr(self.deployment, name) for name in Deployment.model_fields}
        return cast("SglangPlan", plan(self.model, Deployment.model_validate({**fields, **flags})))

    def capacity_summary(self, budget_bytes: int, max_live: int = 1) -> list[tuple[str, str]]:
        """What ``budget_bytes`` holds, as (label, value) rows, at the model's context."""
        return self.capacity(budget_bytes).rows()

    def group_columns(self) -> dict[str, dict[str, str]]:
        """Per-group numbers beyond name, kind and layers (none for SGLang)."""
        return {group.name: {} for group in self.groups}

    def report_fields(self) -> tuple[dict[str, object], str]:
        """The report's engine fields, and the name of a stage's page bytes."""
        return {
            "sglang_version": SGLANG_VERSION,
            "gpu": self.deployment.gpu,
            "prefill_attention_backend": self.prefill_attention_backend,
            "attention_backend": self.attention_backend,
            "page_size": self.page_tokens,
            "state_slot_bytes": self.state_slot_bytes(),
        }, "page_bytes"


def _draft_refusal(layer: int) -> Refusal:
    return Refusal(
        "draft_unsupported",
        f"layer {layer} is a draft layer: SGLang's draft runner keeps its own pool, whose "
        "tensors were not read off SGLang (its cost is in the cell size)",
        facts={"engine": "sglang", "layer": layer},
        hint="ask about a target layer",
    )


NEXTN_DEFAULT_LAYERS = 1
"""The MTP layers SGLang's ``Glm5NextConfig`` reads when the checkpoint names none
(``num_nextn_predict_layers`` absent); its NEXTN draft prices that many."""


def built_model(model: HybridModel, deployment: Deployment) -> HybridModel:
    """The model SGLang builds: no draft runner without speculative tokens; with them, an
    indexed hybrid whose config leaves ``num_nextn_predict_layers`` out drafts with
    SGLang's default MTP layer (one indexed MLA layer, the target's)."""
    if deployment.spec_tokens == 0:
        return model.without_draft()
    architecture = model.architecture
    if (
        model.draft_layers
        or model.indexer is None
        or architecture is None
        or "num_nextn_predict_layers" not in architecture.defaulted
    ):
        return model
    fields = {name: getattr(model, name) for name in HybridModel.model_fields}
    return HybridModel.model_validate(
        {
            **fields,
            "draft_layers": (model.mla_layers[0],) * NEXTN_DEFAULT_LAYERS,
            "drafter": "mtp",
        }
    )


def check_sglang(model: HybridModel, deployment: Deployment) -> HybridModel:
    """What SGLang 0.5.23 refuses, or what the planner would otherwise ignore: vLLM's own
    settings, a cache dtype it has no name for, a GPU not read off it, DCP where K3's DCP
    backend does not run (Hopper), an indexed hybrid its DSA pool does not take
    (:func:`check_indexed`), and a draft that is not SGLang's dense K/V draft.
    Returns the model SGLang builds (:func:`built_model`)."""
    model = built_model(model, deployment)
    if model.indexer is not None:
        check_indexed(model, deployment)
    refuse_settings(deployment, VLLM_SETTINGS + _KDA_STATE_SETTINGS, "vLLM")
    refuse_settings(deployment, TOKENSPEED_SETTINGS, "tokenspeed")
    refuse_settings(deployment, UTILIZATION_SETTINGS, "vLLM's and tokenspeed")
    if deployment.kv_dtype == "fp8_ds_mla":
        raise Refusal(
            "dtype_unsupported",
            "kv_dtype=fp8_ds_mla is not an SGLang --kv-cache-dtype for a dense MLA pool",
            facts={"engine": "sglang", "kv_dtype": deployment.kv_dtype},
            hint="use kv_dtype='fp8' (SGLang's fp8_e4m3) or 'bf16'",
        )
    prefill, _, page = resolved_backends(model, deployment)
    if deployment.prefix_caching:  # the radix cache's extra buffer validates its interval
        track_interval(page, deployment.mamba_track_interval, _draft_tokens(deployment))
    if deployment.dcp > 1 and prefill == "fa3" and model.model_type == "kimi_k3":
        raise Refusal(
            "dcp_unsupported",
            f"dcp={deployment.dcp} on gpu={deployment.gpu}: SGLang runs Kimi-K3's DCP decode on "
            "CuteDSL MLA, which is only supported on Blackwell GPUs (SM100)",
            facts={"engine": "sglang", "dcp": deployment.dcp, "gpu": deployment.gpu},
            hint="use dcp=1 on Hopper, or gpu='b200'",
        )
    if model.drafter != "mtp" and any(layer.kind == "mla" for layer in model.draft_layers):
        raise Refusal(
            "draft_unsupported",
            f"model {model.name}: its draft layers are MLA; SGLang's DSpark draft is a dense "
            "per-head K/V draft (its config loader refuses an MLA draft checkpoint)",
            facts={"engine": "sglang", "model": model.name},
            hint="plan the target alone (spec_tokens without a draft plans SGLang's EAGLE "
            "sizing), or give the draft as GQA layers",
        )
    if model.draft_layers and model.drafter != "mtp" and deployment.pp > 1:
        raise Refusal(
            "draft_unsupported",
            f"pp={deployment.pp}: SGLang's DSpark draft does not run under pipeline parallelism",
            facts={"engine": "sglang", "pp": deployment.pp},
            hint="use pp=1 with a draft",
        )
    return model


def resolved_backends(model: HybridModel, deployment: Deployment) -> tuple[str, str, int]:
    """The prefill and decode backends and the page SGLang resolves for ``deployment``
    (:func:`.rules.attention_backends`)."""
    return attention_backends(
        deployment.gpu,
        model.model_type,
        deployment.dcp,
        deployment.kv_dtype,
        None if model.indexer is None else model.indexer.kpool,
    )


def _draft_tokens(deployment: Deployment) -> int:
    """SGLang's ``speculative_num_draft_tokens``: the verify window (0 without drafting)."""
    return deployment.spec_tokens + 1 if deployment.spec_tokens else 0


def check_indexed(model: HybridModel, deployment: Deployment) -> None:
    """What SGLang refuses of an indexed hybrid (DSA) beyond K3's rules: an index key width
    its DSA pool does not take (:data:`.rules.DSA_INDEX_HEAD_DIMS`; SGLang fails on a bare
    assertion while building the pools), and DCP (a pooled key spans positions of several
    DCP ranks)."""
    indexers = [layer.indexer for layer in model.mla_layers if layer.indexer is not None]
    odd = next((i for i in indexers if i.head_dim not in DSA_INDEX_HEAD_DIMS), None)
    if odd is not None:
        widths = " or ".join(map(str, DSA_INDEX_HEAD_DIMS))
        raise Refusal(
            "kernel_unsupported",
            f"index_head_dim={odd.head_dim}: SGLang {SGLANG_VERSION}'s DSA pool keeps one index "
            f"head of {widths} values a key (DSATokenToKVPool fails on a bare AssertionError "
            "when it builds the pools)",
            facts={
                "engine": "sglang",
                "field": "index_head_dim",
                "index_head_dim": odd.head_dim,
                "allowed": DSA_INDEX_HEAD_DIMS,
            },
            hint=f"plan a checkpoint whose indexer has index_head_dim {widths}",
        )
    indexer = indexers[0]
    if deployment.dcp > 1:
        raise Refusal(
            "dcp_unsupported",
            f"dcp={deployment.dcp}: SGLang {SGLANG_VERSION} does not run DCP for DSA with "
            f"index_kpool={indexer.kpool} (a pooled index key spans positions owned by "
            "different DCP ranks)",
            facts={"engine": "sglang", "dcp": deployment.dcp, "field": "dcp"},
            hint="use dcp=1",
        )


def group_sglang(model: HybridModel, sizes: RankSizes) -> tuple[Group, ...]:
    """The target's MLA layers (each on its own ``kv_buffer``), then a draft's layers, then
    the KDA layers (one state pool): groups in that order, each layer its own plane."""
    target = set(range(len(model.layers)))
    mla = tuple(i for i in model.attention_layer_ids if i in target)
    draft = tuple(i for i in model.attention_layer_ids if i not in target)
    kda = model.kda_layer_ids
    groups = [trusted(Group, name="full_attention", kind="attention", layers=mla)]
    if draft:
        groups.append(
            trusted(Group, name="draft", kind="attention", layers=draft, first_plane=len(mla))
        )
    groups.append(
        trusted(Group, name="mamba", kind="kda", layers=kda, first_plane=len(mla) + len(draft))
    )
    return tuple(groups)


def pack_sglang(
    model: HybridModel,
    deployment: Deployment,
    sizes: RankSizes,
    groups: tuple[Group, ...],
    stages: tuple[Stage, ...],
) -> SglangPlan:
    """The plan: the backend and page SGLang resolves on the deployment's GPU."""
    prefill, decode, page = resolved_backends(model, deployment)
    return SglangPlan(
        model=model,
        deployment=deployment,
        groups=groups,
        stages=stages,
        prefill_attention_backend=prefill,
        attention_backend=decode,
        page_tokens=page,
    )


__all__ = [
    "SglangPlan",
    "built_model",
    "check_sglang",
    "group_sglang",
    "pack_sglang",
]
