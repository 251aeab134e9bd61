"""LMCache 0.5.6's own vLLM connector (``LMCacheMPConnector``) over a vLLM plan.

ATOM's plugin rides the KDA state on the PAGE object (:mod:`.ride`); LMCache's connector plans
a hybrid model otherwise, and this module plans it as that connector does (read off LMCache
0.5.6 by running it on vLLM's live worker objects; ``tests/conformance/test_conformance_lmcache.py``
runs it again, ``tests/fixtures/lmcache-0.5.6-notes.md`` has file and line for each rule):

- **Object groups.** One LMCache group per vLLM KV-cache group and per physical part: a KDA
  group is *recurrent*, with a window of one block; an attention group gives one group per
  part (GLM-5.3-Flash's latent and its pooled index keys apart); a scratch group (the tail
  ring) gives none.
- **Tokens per block**: the group's span, so an attention group's block times DCP and a KDA
  group's block. The smallest chunk LMCache accepts is their lcm; a hit is rounded down to it.
- **Bytes per chunk** on a rank, every group sized for the whole chunk, windowed or not: a KDA
  layer sends ``chunk x ceil16(ceil(S / block))`` bytes (its state row re-viewed as one
  16-byte-aligned row per token of the block), an attention part ``chunk / tokens_per_row x
  row bytes / DCP``.
- **Ranks and servers.** A hybrid model is not deduplicated across TP: every rank writes its
  chunk to the server of its block of ``world / servers`` ranks. A pure MLA model writes one
  copy per DCP shard and pipeline stage.
- **Refusals** at start-up, in LMCache's order: a Mamba block wider than
  ``max_num_batched_tokens`` (``align`` mode), a KDA group in ``none`` mode, prefill context
  parallelism with DCP (its DCP interleave rule is vLLM's, refused when planning), servers
  holding fewer ranks than DCP, a world not divisible by the servers, several servers with DP
  or PP, and a chunk off the lcm (each with LMCache's words and the value that works).
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Annotated, Final

from pydantic import Field, NonNegativeInt, PositiveInt

from .._args import expect_args, expect_bounded_int, expect_non_negative
from .._frozen import Frozen
from ..constants import MAX_PROMPT_TOKENS, MAX_RANKS
from ..errors import Fact, Refusal
from ..layouts import EngineLayout, LayoutBase
from ..layouts.groups import Group
from ..registry import facts_of

LMCACHE_VERSION: Final = "0.5.6"
"""The LMCache release whose connector this module follows."""

ROW_ALIGN_BYTES: Final = 16
"""LMCache re-views a KDA state row as one row per token of the block, each rounded up to 16
bytes (``_MambaUnifiedViewEdit``)."""

DEFAULT_MAX_NUM_BATCHED_TOKENS: Final = 2048
"""vLLM's scheduler budget per step when none is given (its ``SchedulerConfig`` default)."""

PER_TOKEN_FORMAT: Final = "NL_X_NB_BS_NH_CS"
"""The format LMCache detects for a cache of one row per token (and for a re-viewed state) in
vLLM's layer-outermost layout (``LBNHC``, its hint ``NHD``)."""

PER_TOKEN_FORMAT_BLOCK_OUTERMOST: Final = "NL_X_NB_NH_BS_CS"
"""The same in the block-outermost layout (``BLHNC``): the head slot before the tokens."""

POOLED_FORMAT: Final = "NL_X_NB_BSV_BSS"
"""The format it detects for a pooled part (one row per several tokens: DSA index keys)."""


class LMCacheOptions(Frozen):
    """The connector's settings: ``vllm serve --kv-transfer-config`` (``LMCacheMPConnector``)
    and the LMCache server's ``--chunk-size``."""

    chunk_tokens: Annotated[int, Field(gt=0, le=MAX_PROMPT_TOKENS)] | None = Field(
        None,
        description="the server's --chunk-size in tokens; None: the smallest LMCache accepts",
    )
    servers: PositiveInt = Field(
        1, le=MAX_RANKS, description="LMCache servers (lmcache.mp.server_urls)"
    )
    max_num_batched_tokens: Annotated[int, Field(gt=0, le=MAX_PROMPT_TOKENS)] | None = Field(
        None,
        description="vLLM's --max-num-batched-tokens; None: vLLM's default "
        f"({DEFAULT_MAX_NUM_BATCHED_TOKENS})",
    )
    pcp: PositiveInt = Field(1, le=MAX_RANKS, description="vLLM's --prefill-context-parallel-size")

    @property
    def batched_tokens(self) -> int:
        """``max_num_batched_tokens``, else vLLM's default."""
        return self.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS


class LMCacheGroup(Frozen):
    """One of LMCache's object groups on a rank of one pipeline stage."""

    vllm_group: str = Field(description="the vLLM KV-cache group it comes from")
    part: str = Field(description="the cache part it holds (state, latent, index)")
    layers: tuple[NonNegativeInt, ...] = Field(description="module layers, in group order")
    recurrent: bool = Field(description="whether it holds recurrent state (a KDA group)")
    window_tokens: int = Field(description="its window: the KDA block, -1 for none")
    tokens_per_block: PositiveInt = Field(description="tokens of one block (times DCP)")
    kv_format: str = Field(description="the layout LMCache's format detection reads")
    bytes_per_chunk: NonNegativeInt = Field(description="bytes one chunk sends per rank")


class LMCachePlan(Frozen):
    """LMCache's plan of a vLLM deployment: its groups per stage, the chunk, and what a cached
    chunk costs per rank and per server (:func:`plan_lmcache`)."""

    lmcache: str = Field(LMCACHE_VERSION, description="the LMCache release followed")
    engine: str = Field(description="the engine")
    engine_version: str = Field(description="the engine release planned for")
    options: LMCacheOptions
    chunk_tokens: PositiveInt = Field(description="the chunk the server stores")
    smallest_chunk_tokens: PositiveInt = Field(
        description="the smallest chunk LMCache accepts: the lcm of every tokens_per_block"
    )
    stages: tuple[tuple[LMCacheGroup, ...], ...] = Field(description="groups, stage by stage")
    mla_only: bool = Field(description="a pure MLA model: one copy per DCP shard, not per rank")
    world: PositiveInt = Field(description="vLLM's world: attention TP x PP")
    writers_per_server: tuple[NonNegativeInt, ...] = Field(description="ranks writing to each")
    bytes_per_chunk_per_server: tuple[NonNegativeInt, ...] = Field(
        description="bytes one cached chunk takes on each server"
    )
    cache_model_suffix: str = Field(
        description="what a DCP layout adds to the cache key ('' for none): objects are not "
        "shared across layouts"
    )

    @cached_property
    def stage_bytes_per_chunk(self) -> tuple[int, ...]:
        """Bytes one chunk sends from a rank of each stage."""
        return tuple(sum(g.bytes_per_chunk for g in groups) for groups in self.stages)

    @cached_property
    def bytes_per_token(self) -> float:
        """Bytes a cached token takes on the busiest server."""
        return max(self.bytes_per_chunk_per_server) / self.chunk_tokens

    def tokens_fit(self, server_bytes: int) -> int:
        """Prefix tokens ``server_bytes`` of LMCache memory on each server hold: whole chunks
        on the busiest server."""
        expect_non_negative(
            "server_bytes", expect_bounded_int("server_bytes", server_bytes, 1 << 62)
        )
        chunks = server_bytes // max(self.bytes_per_chunk_per_server)
        return chunks * self.chunk_tokens

    def memory_for(self, tokens: int) -> int:
        """LMCache memory each server needs to hold ``tokens`` prefix tokens (whole chunks,
        on the busiest server)."""
        expect_non_negative("tokens", expect_bounded_int("tokens", tokens, 1 << 40))
        return -(-tokens // self.chunk_tokens) * max(self.bytes_per_chunk_per_server)


def _refuse(rule: str, said: str, facts: dict[str, Fact], hint: str) -> Refusal:
    return Refusal(
        "connector_unsupported",
        f"LMCache {LMCACHE_VERSION}'s vLLM connector refuses it at start-up: {said}",
        facts={"connector": "lmcache", "rule": rule, **facts},
        hint=hint,
    )


def _cached_groups(plan: EngineLayout, stage: int) -> tuple[Group, ...]:
    """The vLLM groups of ``stage`` LMCache keeps (a scratch group, the tail ring, it does
    not)."""
    return tuple(g for g in plan.stage(stage).groups if g.layers and g.kind != "ring")


def _groups(plan: EngineLayout, stage: int, chunk: int) -> tuple[LMCacheGroup, ...]:
    """LMCache's groups on a rank of ``stage`` and the bytes each sends per ``chunk``."""
    deployment = plan.deployment
    token_format = PER_TOKEN_FORMAT_BLOCK_OUTERMOST if plan.block_outermost else PER_TOKEN_FORMAT
    found = []
    for group in _cached_groups(plan, stage):
        spec = plan.group_spec(group)
        span = plan.span_tokens(group)
        layers = len(group.layers)
        if spec.paging == "slot":
            per_token = -(-spec.payload_bytes(deployment.attn_tp) // span)
            row = ROW_ALIGN_BYTES * -(-per_token // ROW_ALIGN_BYTES)
            found.append(
                LMCacheGroup(
                    vllm_group=group.name,
                    part="state",
                    layers=group.layers,
                    recurrent=True,
                    window_tokens=span,
                    tokens_per_block=span,
                    kv_format=token_format,
                    bytes_per_chunk=layers * chunk * row,
                )
            )
            continue
        # vLLM registers a layer's pooled index keys before its attention (construction
        # order), and LMCache splits a group by physical identity in registration order
        for part in sorted(spec.parts, key=lambda p: p.tokens_per_row == 1):
            rows = chunk // (part.tokens_per_row * deployment.dcp)  # a rank's share of tokens
            found.append(
                LMCacheGroup(
                    vllm_group=group.name,
                    part=part.name,
                    layers=group.layers,
                    recurrent=False,
                    window_tokens=-1,
                    tokens_per_block=span,
                    kv_format=POOLED_FORMAT if part.tokens_per_row > 1 else token_format,
                    bytes_per_chunk=layers * rows * part.local_bytes(deployment.attn_tp),
                )
            )
    return tuple(found)


def _check_engine(plan: EngineLayout) -> None:
    """Refuse (``engine_mismatch``) a plan of an engine whose LMCache connector is not
    followed (``EngineFacts.kv_connectors``)."""
    if "lmcache" not in facts_of(plan.engine).kv_connectors:
        raise Refusal(
            "engine_mismatch",
            f"plan engine={plan.engine}: k3layout follows LMCache {LMCACHE_VERSION}'s vLLM "
            "connector (LMCacheMPConnector) only",
            facts={"engine": plan.engine, "required_engine": "vllm", "connector": "lmcache"},
            hint="plan the deployment with engine=vllm",
        )


def _check_startup(plan: EngineLayout, options: LMCacheOptions, spans: dict[str, int]) -> None:
    """LMCache's start-up refusals before the chunk, in its order (module docstring)."""
    d = plan.deployment
    world = d.attn_tp * d.pp
    state = [span for kind, span in spans.items() if kind.startswith("kda:")]
    if state and d.mamba_cache_mode_run != "align":
        raise Refusal(
            "mamba_cache_mode",
            f"LMCache {LMCACHE_VERSION} cannot serve this model's KV cache groups: a KDA group "
            f"in mamba_cache_mode={d.mamba_cache_mode_run!r} (only 'align' and 'all' keep "
            "reusable state snapshots)",
            facts={"mamba_cache_mode": d.mamba_cache_mode_run, "connector": "lmcache"},
            hint="enable prefix caching (vLLM resolves mamba_cache_mode='align')",
        )
    block = max(state, default=0)
    if block and options.batched_tokens < block:
        raise _refuse(
            "max_num_batched_tokens",
            "Mamba-hybrid models with LMCache require max_num_batched_tokens >= block_size so "
            "every prefill step advances at least one full block; got max_num_batched_tokens="
            f"{options.batched_tokens}, block_size={block}",
            {"max_num_batched_tokens": options.batched_tokens, "block_size": block},
            f"set --max-num-batched-tokens to at least {block}",
        )
    if d.dcp > 1 and options.pcp > 1:
        raise _refuse(
            "pcp_with_dcp",
            f"LMCacheMPConnector does not support prefill-context parallelism together with DCP "
            f"(got pcp={options.pcp}, dcp={d.dcp})",
            {"pcp": options.pcp, "dcp": d.dcp},
            "use pcp=1 with DCP, or dcp=1",
        )
    # LMCache's interleave rule (it divides every attention block) is vLLM's own: a plan
    # with another interleave was refused before (dcp_interleave)
    servers = options.servers
    if d.dcp > 1 and world // servers < d.dcp:
        raise _refuse(
            "servers_for_dcp",
            f"Each LMCache server needs at least decode_context_parallel_size ({d.dcp}) ranks "
            f"to hold a complete set of shards, but {servers} server(s) leave only "
            f"{world // servers} rank(s) each",
            {"servers": servers, "dcp": d.dcp, "world": world},
            f"use at most {world // d.dcp} server(s), or a smaller DCP size",
        )
    if world % servers:
        raise _refuse(
            "servers_divide_world",
            f"world_size ({world}) must be divisible by n_servers ({servers})",
            {"servers": servers, "world": world},
            f"use a server count dividing {world}",
        )
    if servers > 1 and d.attn_dp > 1:
        raise _refuse(
            "servers_with_dp",
            "LMCacheMPConnector multi-server mode (n_servers > 1) does not support data "
            f"parallelism yet; got dp_size={d.attn_dp}",
            {"servers": servers, "attn_dp": d.attn_dp},
            "use one server per data-parallel replica's engine, or attn_dp=1",
        )
    if servers > 1 and d.pp > 1:
        raise _refuse(
            "servers_with_pp",
            "LMCacheMPConnector multi-server mode only supports tensor parallelism (TP), not "
            f"pipeline parallelism (PP). Got pp_size={d.pp}",
            {"servers": servers, "pp": d.pp},
            "use one server with PP, or pp=1",
        )


def _spans(plan: EngineLayout) -> dict[str, int]:
    """Each cached vLLM group's tokens per block, keyed ``kind:name`` (every stage)."""
    found: dict[str, int] = {}
    for stage in plan.stages:
        for group in _cached_groups(plan, stage.index):
            kind = "kda" if plan.group_spec(group).paging == "slot" else "attn"
            found[f"{kind}:{group.name}"] = plan.span_tokens(group)
    return found


def _writers(plan: EngineLayout, servers: int, mla_only: bool) -> list[tuple[int, int]]:
    """(rank's stage, its server) for every rank that writes a chunk: every rank of a hybrid
    model; of a pure MLA model, one per DCP shard in each block of ranks."""
    d = plan.deployment
    world = d.attn_tp * d.pp
    per_server = world // servers
    found = []
    for rank in range(world):
        if mla_only:
            block = min(per_server, d.attn_tp)
            first = rank % block < d.dcp if d.dcp > 1 else rank % (d.attn_tp // servers or 1) == 0
            if not first:
                continue
        found.append((rank // d.attn_tp, rank // per_server))
    return found


def plan_lmcache(plan: EngineLayout, options: LMCacheOptions | None = None) -> LMCachePlan:
    """LMCache's connector over ``plan`` (a vLLM plan), or its start-up refusal.

    Refuses, in LMCache's order: ``engine_mismatch`` (another engine), ``mamba_cache_mode``,
    then ``connector_unsupported`` (``facts["rule"]``: ``max_num_batched_tokens``,
    ``pcp_with_dcp``, ``servers_for_dcp``, ``servers_divide_world``,
    ``servers_with_dp``, ``servers_with_pp``), then ``chunk_off_grid`` for a chunk that is not
    a multiple of every group's tokens per block.

    >>> from k3layout import Deployment, plan, preset
    >>> lm = plan_lmcache(plan(preset("kimi-k3"), Deployment(attn_tp=8)))
    >>> lm.chunk_tokens, [g.tokens_per_block for g in lm.stages[0]], round(lm.bytes_per_token)
    (1536, [1536, 1536, 1536, 1536], 410880)
    """
    expect_args(("plan", plan, (LayoutBase,)), ("options", options, (LMCacheOptions, type(None))))
    options = options or LMCacheOptions()
    _check_engine(plan)
    spans = _spans(plan)
    _check_startup(plan, options, spans)
    smallest = math.lcm(*spans.values())
    chunk = options.chunk_tokens or smallest
    if chunk % smallest:
        d = plan.deployment
        raise Refusal(
            "chunk_off_grid",
            f"LMCache chunk size {chunk} must be a multiple of {smallest} (the vLLM block size "
            "scaled by decode_context_parallel_size)",
            facts={"chunk_tokens": chunk, "smallest_chunk_tokens": smallest, "dcp": d.dcp},
            hint=f"set --chunk-size to a multiple of {smallest} (e.g. {smallest})",
        )
    d = plan.deployment
    stages = tuple(_groups(plan, stage.index, chunk) for stage in plan.stages)
    mla_only = not plan.model.kda_layer_ids
    per_server = [0] * options.servers
    writers = [0] * options.servers
    for stage, server in _writers(plan, options.servers, mla_only):
        per_server[server] += sum(g.bytes_per_chunk for g in stages[stage])
        writers[server] += 1
    suffix = (
        f"##lmcache-dcp-layout-v1-d{d.dcp}-interleave{d.dcp_interleave}"
        if d.dcp > 1 and d.dcp_interleave != 1
        else ""
    )
    return LMCachePlan(
        engine=plan.engine,
        engine_version=d.version_run,
        options=options,
        chunk_tokens=chunk,
        smallest_chunk_tokens=smallest,
        stages=stages,
        mla_only=mla_only,
        world=d.attn_tp * d.pp,
        writers_per_server=tuple(writers),
        bytes_per_chunk_per_server=tuple(per_server),
        cache_model_suffix=suffix,
    )


KV_TRANSFER_CONFIG: Final = '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both"}'
"""vLLM's ``--kv-transfer-config`` that starts LMCache's connector (its server's address is
``lmcache.mp.server_urls`` in ``kv_connector_extra_config``; a local server by default)."""


def lmcache_recommended(plan: EngineLayout, servers: int = 1) -> LMCachePlan:
    """LMCache's connector over ``plan`` with the least settings that start it: the smallest
    chunk, and ``--max-num-batched-tokens`` raised to the KDA block where vLLM's default does
    not cover it (the other refusals stand)."""
    expect_args(("plan", plan, (LayoutBase,)))
    _check_engine(plan)
    spans = _spans(plan)
    block = max((s for kind, s in spans.items() if kind.startswith("kda:")), default=0)
    batched = block if block > DEFAULT_MAX_NUM_BATCHED_TOKENS else None
    return plan_lmcache(plan, LMCacheOptions(servers=servers, max_num_batched_tokens=batched))


def lmcache_flags(lm: LMCachePlan) -> tuple[tuple[str, str], ...]:
    """The ``vllm serve`` flags that start LMCache's connector for ``lm``: the transfer config,
    and ``--max-num-batched-tokens`` where it was set."""
    flags = [("--kv-transfer-config", KV_TRANSFER_CONFIG)]
    if lm.options.max_num_batched_tokens is not None:
        flags.append(("--max-num-batched-tokens", str(lm.options.max_num_batched_tokens)))
    return tuple(flags)


def lmcache_server_command(lm: LMCachePlan) -> str:
    """The LMCache server's command line for ``lm``'s chunk."""
    return f"lmcache server --chunk-size {lm.chunk_tokens}"


__all__ = [
    "KV_TRANSFER_CONFIG",
    "LMCACHE_VERSION",
    "LMCacheGroup",
    "LMCacheOptions",
    "LMCachePlan",
    "lmcache_flags",
    "lmcache_recommended",
    "lmcache_server_command",
    "plan_lmcache",
]
