"""A deployment: how one model is spread over ranks and which cache an engine builds for it."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias, cast

from pydantic import Field, field_validator, model_validator

from ._frozen import Frozen, trusted
from .constants import (
    MAX_BLOCK_TOKENS,
    MAX_KV_MEMORY_BYTES,
    MAX_MODULE_LAYERS,
    MAX_PADDING_LIMIT,
    MAX_RANKS,
    MAX_REPLAY_CACHE_LEN,
    REPLAYSSM_DEFAULT_CACHE_LEN,
)
from .dtypes import KvCacheDtype
from .errors import Refusal
from .gpus import DEFAULT_GPU, GpuName
from .placements import Interleave
from .registry import canonical_name, facts_of
from .settings import (
    AttentionBackend,
    KdaPrefillBackend,
    KvCacheLayout,
    MambaCacheMode,
    SpeculativeMethod,
    resolved_mamba_cache_mode,
)

EngineFlavour: TypeAlias = str
"""An engine's registered name (:func:`k3layout.registry.engine_names`): ``vllm`` (vLLM's
hybrid allocator: one page per layer per block, planes shared by groups), ``tokenspeed``
(tokenspeed / ATOM native parent blocks: several pages per plane, searched packing),
``sglang`` (SGLang's token pool and state pool)."""

ConvLayout: TypeAlias = Literal["SD", "DS"]
"""The KDA conv state's layout, named as vLLM's ``VLLM_SSM_CONV_STATE_LAYOUT`` names it:
``SD`` = ``(state_len, dim)``, time-major, vLLM's default; ``DS`` = ``(dim, state_len)``,
channel-major (what NIXL transfers need). ``dim`` is the q|k|v channels side by side."""

CONV_LAYOUTS: tuple[ConvLayout, ...] = ("SD", "DS")
Ranks: TypeAlias = Annotated[int, Field(gt=0, le=MAX_RANKS)]
"""A parallel size: positive, at most ``MAX_RANKS`` (int32 rank ids); beyond: ``size_limit``."""

Tokens: TypeAlias = Annotated[int, Field(gt=0, le=MAX_BLOCK_TOKENS)]
"""A block or interleave in tokens: positive, at most ``MAX_BLOCK_TOKENS``."""


class Deployment(Frozen):
    """Parallelism and cache settings of one deployment (all sizes are per rank).

    - ``attn_tp`` x ``attn_dp``: attention tensor parallel size and attention data-parallel
      replicas per pipeline stage (attention-DP runs ``attn_tp = world / attn_dp``).
    - ``pp``: pipeline stages; ``pp_partition`` overrides vLLM's split (layers per stage, as
      ``VLLM_PP_LAYER_PARTITION`` does). Draft layers live on the last stage.
    - ``dcp`` / ``dcp_interleave``: decode context parallel over the attention TP group.
    - ``kv_dtype``: attention cache dtype; ``spec_tokens``: speculative tokens per step (in
      ``vllm`` the KDA conv state keeps ``K - 1 + spec_tokens`` rows).
    - ``draft_kv_dtype``: the draft layers' attention cache dtype; ``None`` is what the
      engine's followed revision does (tokenspeed #1152: bf16; vLLM and SGLang: the target's).
    - ``block_tokens``: requested attention block (``vllm``; raised to fit the KDA state).
    - ``max_padding``: per-group padding limit of the ``tokenspeed`` engine; ``None`` is the
      engine's own default (0.25, no limit once draft layers join, as tokenspeed does).
    - ``replayssm``: ATOM ReplaySSM records beside each KDA state slot.
    - ``conv_layout``: the KDA conv state's layout, vLLM's ``VLLM_SSM_CONV_STATE_LAYOUT``
      (``SD``, the default, or ``DS``).
    - ``attention_backend``: vLLM's MLA backend (``--attention-backend``; ``None``: the one
      vLLM's selector picks on ``gpu``, :func:`k3layout.engines.vllm.rules.backend_of`; its
      kernel blocks shape the block); ``kv_cache_layout``: vLLM's ``VLLM_KV_CACHE_LAYOUT``
      (``LBNHC`` layer-outermost; ``BLHNC`` block-outermost; ``None``: what vLLM resolves from
      its backends, LBNHC unless a cache takes only BLHNC). Both are ``vllm`` settings.
    - ``prefix_caching`` (vLLM's ``--enable-prefix-caching``, on by default) decides the KDA
      cache mode, ``align`` or ``none``; ``mamba_cache_mode`` is accepted as vLLM 0.33 accepts
      it (``align`` or ``none``) and resolved as it resolves it (:attr:`mamba_cache_mode_run`).
    - ``speculative_method``: vLLM's speculative method (``--speculative-config``'s
      ``method``); ``None``: the model's own drafter (:attr:`HybridModel.drafter`).
    - ``kda_prefill_backend``: vLLM's KDA prefill kernel (``auto``: FlashKDA where the layer
      allows it); FlashKDA holds one more state block per request.

    - ``gpu``: the GPU the engine runs on (engines pick kernels, and so pages, by it).
    - ``expert_parallel``: routed experts split whole over every rank of a stage (vLLM's
      ``--enable-expert-parallel``, SGLang's ``--ep-size`` equal to its ``--tp-size``).
    - The GPU's memory (:mod:`k3layout.memory`): ``gpu_memory_utilization`` (vLLM,
      tokenspeed) or ``mem_fraction_static`` (SGLang), the engine's memory flag, or
      ``kv_memory_bytes``, an explicit KV budget per rank (not both); ``None``: the engine's
      default. ``gpu_memory_bytes`` replaces the GPU table's total, ``reserve_bytes``
      k3layout's estimate of what the engine keeps beside weights and KV.
      ``extensible_kv_cache`` is vLLM 0.34's switch for its extensible KV cache (``None``: on
      unless ``kv_memory_bytes`` is given); a ``vllm`` setting of 0.34 on. ``use_replayssm`` is
      vLLM's own ``--use-replayssm`` (RecoverSSM with a drafter), not ATOM's records
      (``replayssm``); a ``vllm`` setting, refused where the release refuses it.
      ``mamba_backend`` is vLLM's ``--mamba-backend`` (``triton``, its default, or
      ``flashinfer``); with ``use_replayssm`` it picks FlashInfer's ReplaySSM, whose rules
      differ by release; a ``vllm`` setting.
    - ``mamba_full_memory_ratio``, ``max_running_requests``, ``max_mamba_cache_size``,
      ``max_total_tokens``, ``mamba_track_interval``:
      SGLang's flags of those names (``None``: SGLang's own defaults; for the track interval,
      the least that starts: SGLang's 256 unless the page does not divide it); ``sglang``
      settings.
      ``prefix_caching=False`` is SGLang's ``--disable-radix-cache``.

    Sizes above the bounds of :mod:`k3layout.constants` (``MAX_RANKS``, ``MAX_BLOCK_TOKENS``,
    ``MAX_PADDING_LIMIT``, ...) are refused with ``size_limit``.
    """

    engine: EngineFlavour = Field(
        "vllm",
        description="registered engine name: vllm (hybrid allocator), tokenspeed (parent "
        "blocks) or sglang (token pool and state pool)",
    )
    engine_version: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        None,
        description="the engine's release (or revision) to plan for, one k3layout follows "
        "(vllm 0.33.0, sglang 0.5.23, tokenspeed pr1152); None: the newest it follows, which "
        "planning writes into the plan's deployment",
    )
    gpu: GpuName = Field(
        DEFAULT_GPU,
        description="the GPU the engine runs on; engines pick kernels, and so pages, by it",
    )
    attn_tp: Ranks = Field(1, description="attention tensor parallel size, in ranks")
    attn_dp: Ranks = Field(1, description="attention data-parallel replicas per pipeline stage")
    pp: Ranks = Field(1, description="pipeline stages; draft layers live on the last stage")
    pp_partition: tuple[Annotated[int, Field(gt=0, le=MAX_MODULE_LAYERS)], ...] | None = Field(
        None,
        description="layers per pipeline stage, one count per stage, as vLLM's "
        "VLLM_PP_LAYER_PARTITION sets them; None: vLLM's own split",
    )
    dcp: Ranks = Field(
        1, description="decode context parallel size over the attention TP group, in ranks"
    )
    dcp_interleave: Tokens = Field(
        1, description="DCP interleave: consecutive tokens one rank takes before the next rank"
    )
    kv_dtype: KvCacheDtype = Field(
        "fp8",
        description="attention cache dtype: fp8 or bf16 latent rows, or FlashMLA's packed "
        "fp8_ds_mla row",
    )
    spec_tokens: Annotated[int, Field(ge=0, le=64)] = Field(
        0,
        description="speculative tokens per step (in vllm the KDA conv state keeps "
        "K - 1 + spec_tokens rows)",
    )
    draft_kv_dtype: KvCacheDtype | None = Field(
        None,
        description="the draft layers' attention cache dtype; None: the engine's own "
        "(tokenspeed #1152: bf16; vLLM and SGLang: kv_dtype)",
    )
    block_tokens: Tokens | None = Field(
        None,
        description="requested attention block in tokens (vllm; raised to fit the KDA "
        "state); None: the engine's choice",
    )
    max_padding: (
        Annotated[float, Field(ge=0.0, le=MAX_PADDING_LIMIT, allow_inf_nan=False)] | None
    ) = Field(
        None,
        description="tokenspeed's per-group padding limit, (page stride - payload) / payload "
        "bytes; None: its default (0.25, no limit once draft layers join)",
    )
    replayssm: bool = Field(
        False, description="keep ATOM ReplaySSM records beside each KDA state slot"
    )
    use_replayssm: bool = Field(
        False,
        description="vLLM's own --use-replayssm (vllm): with speculative tokens KDA's "
        "RecoverSSM, whose verify records live outside the KV cache and whose state keeps no "
        "per-draft-token blocks; refused where the release refuses it",
    )
    mamba_backend: Literal["triton", "flashinfer"] = Field(
        "triton",
        description="vLLM's --mamba-backend (vllm): triton (its default) or flashinfer; with "
        "use_replayssm it picks FlashInfer's ReplaySSM, refused where the release refuses it "
        "(RecoverSSM, any drafter, needs triton)",
    )
    replayssm_cache_len: Annotated[int, Field(gt=0, le=MAX_REPLAY_CACHE_LEN)] = Field(
        REPLAYSSM_DEFAULT_CACHE_LEN,
        description="ReplaySSM records per KDA state slot, before the 2 x (spec_tokens + 1) floor",
    )
    conv_layout: ConvLayout = Field(
        "SD",
        description="the KDA conv state's layout, vLLM's VLLM_SSM_CONV_STATE_LAYOUT: SD "
        "(state_len, dim), the default, or DS (dim, state_len)",
    )
    attention_backend: AttentionBackend | None = Field(
        None,
        description="vLLM's MLA backend (--attention-backend): a dense one for an MLA layer "
        "without an indexer, a sparse one for an indexed layer; None: the one vLLM's selector "
        "picks on the GPU for the cache dtype; its kernel block sizes shape the attention "
        "block (vllm)",
    )
    kv_cache_layout: KvCacheLayout | None = Field(
        None,
        description="vLLM's VLLM_KV_CACHE_LAYOUT: LBNHC layer-outermost or BLHNC "
        "block-outermost; None: the one vLLM resolves from its backends (LBNHC, or BLHNC where "
        "a cache takes no other, as an indexer's tail ring) (vllm)",
    )
    prefix_caching: bool = Field(
        True,
        description="vLLM's --enable-prefix-caching, which decides the KDA cache mode "
        "(align on, none off); off is SGLang's --disable-radix-cache",
    )
    mamba_cache_mode: MambaCacheMode | None = Field(
        None,
        description="vLLM's --mamba-cache-mode (align or none), accepted as vLLM 0.33 "
        "accepts it; the mode run follows prefix_caching",
    )
    kda_prefill_backend: KdaPrefillBackend = Field(
        "auto",
        description="vLLM's KDA prefill kernel; auto: FlashKDA where the layer allows it "
        "(FlashKDA holds one more state block per request)",
    )
    speculative_method: SpeculativeMethod | None = Field(
        None,
        description="vLLM's --speculative-config method: mtp (the checkpoint's MTP modules), "
        "dspark (a DSpark draft) or ngram (no draft model); None: the model's own drafter",
    )
    expert_parallel: bool = Field(
        False,
        description="expert parallelism over every rank of a stage (vLLM's "
        "--enable-expert-parallel: EP = attn_tp x attn_dp; SGLang's --ep-size equal to its "
        "--tp-size): routed experts split whole over the ranks instead of each expert's "
        "intermediate width",
    )
    mamba_full_memory_ratio: (
        Annotated[float, Field(gt=0.0, le=1000.0, allow_inf_nan=False)] | None
    ) = Field(
        None,
        description="SGLang's --mamba-full-memory-ratio, state pool over token pool; "
        "None: SGLang's default (0.9)",
    )
    max_running_requests: Annotated[int, Field(gt=0, le=MAX_RANKS)] | None = Field(
        None,
        description="SGLang's --max-running-requests, over all attention-DP workers; "
        "None: SGLang's estimate",
    )
    max_mamba_cache_size: Annotated[int, Field(gt=0, le=MAX_RANKS)] | None = Field(
        None,
        description="SGLang's --max-mamba-cache-size: KDA state slots over all attention-DP "
        "workers; None: sized from mamba_full_memory_ratio",
    )
    max_total_tokens: Annotated[int, Field(gt=0, le=MAX_RANKS)] | None = Field(
        None,
        description="SGLang's --max-total-tokens: a cap on the token pool per rank (the pool is "
        "the smaller of it and what the memory gives); None: no cap",
    )
    mamba_track_interval: Annotated[int, Field(gt=0, le=MAX_BLOCK_TOKENS)] | None = Field(
        None,
        description="SGLang's --mamba-track-interval: tokens between the KDA states its radix "
        "cache tracks (a multiple of the page); None: SGLang's 256, or the page where the "
        "page does not divide 256",
    )

    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | None = (
        Field(
            None,
            description="vLLM's and tokenspeed's --gpu-memory-utilization: the share of the GPU "
            "the engine takes for weights, reserve and KV; None: the engine's default",
        )
    )
    mem_fraction_static: Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)] | None = (
        Field(
            None,
            description="SGLang's --mem-fraction-static: the share of the free GPU memory for "
            "weights and pools; None: SGLang's default for the GPU and parallel sizes",
        )
    )
    extensible_kv_cache: bool | None = Field(
        None,
        description="vLLM 0.34's extensible KV cache (--enable-extensible-kv-cache / "
        "--no-enable-extensible-kv-cache), which sizes the cache from the memory measured "
        "after warm-up; None: the release's default (on in 0.34 unless kv_memory_bytes is "
        "given; 0.33 has none)",
    )
    kv_memory_bytes: Annotated[int, Field(gt=0, le=MAX_KV_MEMORY_BYTES)] | None = Field(
        None,
        description="an explicit KV-cache budget per rank, in bytes (vLLM's "
        "--kv-cache-memory-bytes); None: the engine's memory flag decides it",
    )
    gpu_memory_bytes: Annotated[int, Field(gt=0, le=MAX_KV_MEMORY_BYTES)] | None = Field(
        None,
        description="the GPU's total as its driver reports it (torch.cuda.mem_get_info), for a "
        "part or driver the GPU table does not give; None: the table's figure for gpu",
    )
    reserve_bytes: Annotated[int, Field(ge=0, le=MAX_KV_MEMORY_BYTES)] | None = Field(
        None,
        description="what the engine keeps beside weights and KV (activations, CUDA graphs, "
        "context, communicators), replacing k3layout's estimate; None: the estimate",
    )

    @field_validator("engine", mode="before")
    @classmethod
    def _registered_engine(cls, value: object) -> str:
        return canonical_name(value)

    @model_validator(mode="after")
    def _known_version(self) -> Deployment:
        known = facts_of(self.engine).versions
        if self.engine_version is None or self.engine_version in known:
            return self
        raise Refusal(
            "version_unsupported",
            f"engine_version={self.engine_version!r}: k3layout follows {self.engine} "
            f"{', '.join(known)}, and plans no other release with their rules",
            facts={
                "engine": self.engine,
                "field": "engine_version",
                "engine_version": self.engine_version,
                "allowed": known,
            },
            hint=f"use engine_version in {list(known)}, or leave it unset for {known[-1]}",
        )

    @property
    def version_run(self) -> str:
        """The engine release planned for: ``engine_version``, else the newest k3layout
        follows."""
        return self.engine_version or facts_of(self.engine).versions[-1]

    @model_validator(mode="after")
    def _partition_matches_pp(self) -> Deployment:
        if self.pp_partition is not None and len(self.pp_partition) != self.pp:
            raise Refusal(
                "invalid_argument",
                f"pp_partition: {len(self.pp_partition)} stage sizes given for pp={self.pp}",
                facts={"field": "pp_partition", "pp": self.pp},
                hint="give one layer count per pipeline stage",
            )
        return self

    @model_validator(mode="after")
    def _one_memory_input(self) -> Deployment:
        fraction = next(
            (
                name
                for name in ("gpu_memory_utilization", "mem_fraction_static")
                if getattr(self, name) is not None
            ),
            None,
        )
        if self.kv_memory_bytes is not None and fraction is not None:
            raise Refusal(
                "invalid_argument",
                f"kv_memory_bytes and {fraction} both given: the KV budget is either given "
                "or the engine's memory flag decides it",
                facts={"field": "kv_memory_bytes", "other": fraction},
                hint=f"give kv_memory_bytes or {fraction}, not both",
            )
        return self

    @model_validator(mode="after")
    def _draft_dtype_runs(self) -> Deployment:
        facts = facts_of(self.engine)
        chosen = self.draft_kv_dtype
        if chosen is None or chosen == self.kv_dtype or facts.separate_draft_kv_dtype:
            return self
        raise Refusal(
            "engine_setting",
            f"draft_kv_dtype={chosen!r}: engine={self.engine} keeps a draft's attention cache "
            f"in the target's dtype (kv_dtype={self.kv_dtype!r})",
            facts={"engine": self.engine, "field": "draft_kv_dtype", "kv_dtype": self.kv_dtype},
            hint=f"leave draft_kv_dtype unset (or {self.kv_dtype!r}) for engine={self.engine}",
        )

    @property
    def conv_layout_run(self) -> ConvLayout:
        """The KDA conv state layout the engine runs: its own where it has one (tokenspeed's is
        channel-major, ``DS``), else ``conv_layout``."""
        fixed = facts_of(self.engine).conv_layout
        return self.conv_layout if fixed is None else cast(ConvLayout, fixed)

    @property
    def draft_cache_dtype(self) -> KvCacheDtype:
        """The draft layers' attention cache dtype the engine runs: ``draft_kv_dtype``, else the
        engine's own (tokenspeed #1152 keeps bf16; vLLM and SGLang follow ``kv_dtype``)."""
        if self.draft_kv_dtype is not None:
            return self.draft_kv_dtype
        fixed = facts_of(self.engine).draft_kv_dtype
        return self.kv_dtype if fixed is None else cast(KvCacheDtype, fixed)

    @property
    def dcp_placement(self) -> Interleave:
        """How DCP deals an attention block's tokens to ranks (one rank holds all without
        DCP)."""
        # Two validated positive sizes of this deployment: nothing to re-validate.
        return trusted(
            Interleave, kind="interleave", num_ranks=self.dcp, interleave=self.dcp_interleave
        )

    @property
    def mamba_cache_mode_run(self) -> MambaCacheMode:
        """The KDA cache mode vLLM runs: prefix caching decides (``mamba_cache_mode`` is
        deprecated in vLLM 0.33 and overridden)."""
        return resolved_mamba_cache_mode(self.prefix_caching)

    @property
    def world_size(self) -> int:
        """Ranks of the whole deployment: ``attn_tp * attn_dp * pp``."""
        return self.attn_tp * self.attn_dp * self.pp
