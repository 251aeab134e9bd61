"""A tiny K3-shaped model that runs on an allocated layout: the cold-vs-resumed check end to end.

Kimi's layer pattern (:func:`~k3layout.model.kimi_layer_pattern`: MLA at every 4th layer and the
last, KDA elsewhere) at small dims, random weights drawn from one seed. Each layer reads and
writes its cache *in the layout*, through the registered tensors and the request's block
tables, as the engine does with chunked prefill on the block grid:

- KDA: conv q|k|v history and the fp32 recurrent state are read from row ``c - 1`` of the
  layer's group table and written to row ``c`` for chunk ``c`` (``align`` mode), run through
  the reference kernels (:func:`~k3layout.torch.kernels.short_conv`, ``kda_chunked``);
- MLA: the chunk's latent rows are written in the cache dtype through the attention table, then
  :func:`~k3layout.torch.kernels.mla_decode` attends over the paged cache.

Heads are split over the TP ranks given (KDA and MLA heads; the latent is replicated); each
layer's partial outputs are summed in rank order, as an all-reduce would. The residual stream,
RMS norms without weights, an embedding and an LM head complete it; the MLP, output gates and
rotary embedding are left out (they touch no cache).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

import torch
from pydantic import Field, NonNegativeInt, PositiveInt

from .._frozen import Frozen
from ..cache import LayerCacheSpec
from ..errors import Fact, Refusal
from ..layouts import EngineLayout
from ..layouts.seams import rules_for
from ..model import HybridModel, KDALayer, MLALayer, kimi_layer_pattern
from ..offload import NamingEngine
from ..offload.stage import ridable
from .allocation import Registered, allocate
from .kernels import kda_chunked, mla_decode, short_conv
from .live import LiveLayout, layer_parts, validate
from .tables import BlockTables

RMS_EPS = 1e-6


class TinyK3Config(Frozen):
    """Dimensions of the tiny model (K3's: 93 layers, KDA 96 x 128, MLA latent 512 + 64).

    ``decay_bias`` shifts the KDA log decay ``-softplus(x W_g + bias)`` so the state remembers
    tens of tokens: a restored state then shapes a whole block of outputs, not just its first.
    """

    num_layers: Annotated[int, Field(ge=4)] = 8
    num_draft_layers: NonNegativeInt = 0
    hidden_size: PositiveInt = 32
    vocab_size: PositiveInt = 64
    kda_heads: PositiveInt = 4
    kda_head_dim: PositiveInt = 8
    conv_kernel: Annotated[int, Field(ge=2)] = 4
    mla_heads: PositiveInt = 4
    kv_lora_rank: PositiveInt = 16
    qk_rope_head_dim: PositiveInt = 8
    qk_nope_head_dim: PositiveInt = 8
    v_head_dim: PositiveInt = 8
    decay_bias: float = -4.0
    seed: int = 0

    def model(self) -> HybridModel:
        """The model the planner sees (``model_type="kimi_k3"``, so the state may ride)."""
        mla = MLALayer(
            num_heads=self.mla_heads,
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            qk_nope_head_dim=self.qk_nope_head_dim,
            v_head_dim=self.v_head_dim,
        )
        kda = KDALayer(
            num_heads=self.kda_heads, head_dim=self.kda_head_dim, conv_kernel=self.conv_kernel
        )
        return HybridModel(
            name="tiny-k3",
            model_type="kimi_k3",
            layers=kimi_layer_pattern(self.num_layers, mla, kda),
            draft_layers=(mla,) * self.num_draft_layers,
        )


@dataclass(frozen=True, eq=False)
class TinyK3:
    """The tiny model's weights in ``dtype`` (fp32 or fp64), keyed ``"{layer}.{name}"``."""

    config: TinyK3Config
    dtype: torch.dtype
    weights: Mapping[str, torch.Tensor]

    @classmethod
    def build(cls, config: TinyK3Config, dtype: torch.dtype = torch.float64) -> TinyK3:
        """Draw every weight from ``config.seed`` (fp64, then cast: fp32 and fp64 share them)."""
        if dtype not in (torch.float32, torch.float64):
            raise Refusal(
                "invalid_argument",
                f"the tiny model computes in fp32 or fp64 (the reference kernels' dtypes), "
                f"not {dtype}",
                facts={"dtype": str(dtype)},
                hint="use torch.float64 (exact comparisons) or torch.float32",
            )
        gen = torch.Generator().manual_seed(config.seed)
        c = config

        def draw(*shape: int, fan_in: int) -> torch.Tensor:
            drawn = torch.randn(shape, generator=gen, dtype=torch.float64)
            return (drawn / math.sqrt(fan_in)).to(dtype)

        weights = {
            "embed": draw(c.vocab_size, c.hidden_size, fan_in=1),
            "lm_head": draw(c.hidden_size, c.vocab_size, fan_in=c.hidden_size),
        }
        channels = c.kda_heads * c.kda_head_dim
        for index, layer in enumerate(c.model().layers):
            at = f"{index}."
            if isinstance(layer, KDALayer):
                for name in ("q", "k", "v", "g"):
                    weights[at + name] = draw(c.hidden_size, channels, fan_in=c.hidden_size)
                for name in ("conv_q", "conv_k", "conv_v"):
                    weights[at + name] = draw(channels, c.conv_kernel, fan_in=c.conv_kernel)
                weights[at + "beta"] = draw(c.hidden_size, c.kda_heads, fan_in=c.hidden_size)
                weights[at + "o"] = draw(channels, c.hidden_size, fan_in=channels)
                continue
            query = c.qk_nope_head_dim + c.qk_rope_head_dim
            weights[at + "q"] = draw(c.hidden_size, c.mla_heads * query, fan_in=c.hidden_size)
            latent = c.kv_lora_rank + c.qk_rope_head_dim
            weights[at + "kv"] = draw(c.hidden_size, latent, fan_in=c.hidden_size)
            weights[at + "w_uk"] = draw(
                c.mla_heads, c.qk_nope_head_dim, c.kv_lora_rank, fan_in=c.kv_lora_rank
            )
            weights[at + "w_uv"] = draw(
                c.mla_heads, c.v_head_dim, c.kv_lora_rank, fan_in=c.kv_lora_rank
            )
            values = c.mla_heads * c.v_head_dim
            weights[at + "o"] = draw(values, c.hidden_size, fan_in=values)
        return cls(config=config, dtype=dtype, weights=weights)


@dataclass(frozen=True, eq=False)
class Rank:
    """One TP rank of a run: its validated layout and the tensors it registered."""

    layout: LiveLayout
    registered: Registered


def tp_ranks(
    plan: EngineLayout,
    num_blocks: int,
    *,
    fill: int | None = 0,
    naming: NamingEngine = "vllm",
) -> tuple[Rank, ...]:
    """Allocate and validate one cache per attention TP rank of ``plan``, registered as
    ``naming``'s engine does: ``vllm`` (a ``vllm`` plan) as vLLM 0.33 binds it, one view per
    layer under vLLM's names; ``atom`` (and every ``tokenspeed`` plan) the adapter's parts under
    ATOM's names (:data:`~k3layout.offload.NAMING_RULES`)."""
    ranks = []
    for _ in range(plan.deployment.attn_tp):
        cache = allocate(plan, num_blocks, fill=fill)
        # the run goes through what the engine binds
        registered = cache.registered if naming == "atom" or not cache.bound else cache.bound
        ranks.append(Rank(layout=validate(plan, registered), registered=registered))
    return tuple(ranks)


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS)


def _share(extent: int, num_ranks: int, rank: int) -> slice:
    size = extent // num_ranks
    return slice(rank * size, (rank + 1) * size)


@dataclass(frozen=True)
class _Step:
    """One layer of one chunk on one rank."""

    model: TinyK3
    rank: Rank
    tp_rank: int
    tables: BlockTables
    start: int
    layer: int

    @property
    def w(self) -> Mapping[str, torch.Tensor]:
        return {
            key.split(".", 1)[1]: value
            for key, value in self.model.weights.items()
            if key.startswith(f"{self.layer}.")
        }

    @property
    def parts(self) -> tuple[torch.Tensor, ...]:
        name = self.rank.layout.names.name(self.layer)
        return layer_parts(self.rank.layout, self.rank.registered, name)

    @property
    def table(self) -> tuple[int, ...]:
        name = self.rank.layout.names.name(self.layer)
        return self.tables.table(self.rank.layout.spec.layer(name).group)

    @property
    def plan(self) -> EngineLayout:
        return ridable(self.rank.layout.plan)

    @property
    def sd(self) -> bool:
        """Whether the conv state is time-major (vLLM's default ``SD``)."""
        return self.plan.deployment.conv_layout_run == "SD"

    @property
    def layer_spec(self) -> LayerCacheSpec:
        return self.plan.sizes.spec_of(self.layer)


def _conv(
    step: _Step, conv: torch.Tensor, which: int, x: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """Causal conv of ``x [T, C]`` from the history in row ``c - 1``; history to row ``c``.

    ``conv`` is the layer's ONE conv tensor per block, channel group ``which`` (q, k, v) of
    ``C`` channels: ``[rows, 3C]`` in SD, ``[3C, rows]`` in DS."""
    rows = step.layer_spec.part("conv").shape[0 if step.sd else 3]
    width = x.shape[1]
    lo, hi = which * width, (which + 1) * width

    def channels(block: int) -> torch.Tensor:  # [rows, C] view of one block
        held = conv[block]
        return held[:, lo:hi] if step.sd else held[lo:hi, :].T

    chunk = step.start // step.plan.state_span_tokens
    if chunk == 0:
        history = x.new_zeros(rows, width)
    else:
        history = channels(step.table[chunk - 1]).to(x.dtype)
    cache = history[rows - (weight.shape[1] - 1) :].T.unsqueeze(0)  # [1, C, W - 1]
    y, _ = short_conv(x.unsqueeze(0), weight, cache=cache)
    kept = torch.cat([history, x])[-rows:]
    channels(step.table[chunk]).copy_(kept)
    return y[0]


def _kda(step: _Step, x: torch.Tensor) -> torch.Tensor:
    c, w = step.model.config, step.w
    tp = step.plan.deployment.attn_tp
    heads = c.kda_heads // tp
    cols = _share(c.kda_heads * c.kda_head_dim, tp, step.tp_rank)
    conv, state = step.parts
    q = _conv(step, conv, 0, x @ w["q"][:, cols], w["conv_q"][cols])
    k = _conv(step, conv, 1, x @ w["k"][:, cols], w["conv_k"][cols])
    v = _conv(step, conv, 2, x @ w["v"][:, cols], w["conv_v"][cols])
    g = -torch.nn.functional.softplus(x @ w["g"][:, cols] + c.decay_bias)
    beta = torch.sigmoid(x @ w["beta"][:, _share(c.kda_heads, tp, step.tp_rank)])
    chunk = step.start // step.plan.state_span_tokens
    initial = None if chunk == 0 else state[step.table[chunk - 1]].to(x.dtype).unsqueeze(0)
    shape = (1, x.shape[0], heads, c.kda_head_dim)
    o, final = kda_chunked(
        q.reshape(shape),
        k.reshape(shape),
        v.reshape(shape),
        g.reshape(shape),
        beta.unsqueeze(0),
        initial_state=initial,
        use_qk_l2norm_in_kernel=True,
    )
    state[step.table[chunk]].copy_(final[0])
    return o.reshape(x.shape[0], -1) @ w["o"][cols]


def _mla(step: _Step, x: torch.Tensor) -> torch.Tensor:
    c, w = step.model.config, step.w
    tp = step.plan.deployment.attn_tp
    block, tokens = step.plan.state_span_tokens, x.shape[0]
    (cache,) = step.parts
    cache[step.table[step.start // block]][:tokens].copy_(x @ w["kv"])
    query = c.qk_nope_head_dim + c.qk_rope_head_dim
    heads = _share(c.mla_heads, tp, step.tp_rank)
    q = (x @ w["q"][:, _share(c.mla_heads * query, tp, step.tp_rank)]).view(tokens, -1, query)
    seen = step.start + tokens
    table = torch.tensor([step.table[: -(-seen // block)]])
    paged = cache if cache.dtype in (torch.bfloat16, x.dtype) else cache.to(x.dtype)
    out = mla_decode(
        q[None, :, :, : c.qk_nope_head_dim],
        q[None, :, :, c.qk_nope_head_dim :],
        paged,
        table,
        torch.tensor([seen]),
        w_uk=w["w_uk"][heads],
        w_uv=w["w_uv"][heads],
    )
    return out.reshape(tokens, -1) @ w["o"][_share(c.mla_heads * c.v_head_dim, tp, step.tp_rank)]


def _refuse_run(message: str, hint: str, **facts: Fact) -> Refusal:
    return Refusal("invalid_argument", f"tiny model run: {message}", facts=facts, hint=hint)


def _check_run(
    model: TinyK3, ranks: Sequence[Rank], tokens: torch.Tensor, start: int
) -> EngineLayout:
    """The plan every rank validated against, once the run's inputs are known to fit it."""
    if not ranks:
        raise _refuse_run("no ranks given", "pass tp_ranks(plan, ...)", num_ranks=0)
    plan = ridable(ranks[0].layout.plan)
    deployment = plan.deployment
    built = rules_for(deployment.engine).built_model(model.config.model(), deployment)
    if any(rank.layout.plan != plan for rank in ranks) or plan.model != built:
        raise Refusal(
            "model_mismatch",
            "tiny model run: the ranks' plans differ, or are not plans of the model run",
            facts={"model": plan.model.name, "num_ranks": len(ranks)},
            hint="validate every rank against one plan of model.config.model()",
        )
    if (deployment.pp, deployment.dcp) != (1, 1) or deployment.kv_dtype not in ("fp8", "bf16"):
        raise _refuse_run(
            f"runs pp=1, dcp=1 and an fp8 or bf16 latent (got pp={deployment.pp}, "
            f"dcp={deployment.dcp}, kv_dtype={deployment.kv_dtype})",
            "plan the tiny model with one stage, no DCP and kv_dtype fp8 or bf16",
            pp=deployment.pp,
            dcp=deployment.dcp,
            kv_dtype=deployment.kv_dtype,
        )
    if len(ranks) != deployment.attn_tp or start % plan.state_span_tokens:
        raise _refuse_run(
            f"needs one rank per attn_tp={deployment.attn_tp} (got {len(ranks)}) and a start "
            f"on the block grid of {plan.state_span_tokens} (got start={start})",
            "pass tp_ranks(plan, ...) and a start that is a multiple of the block",
            attn_tp=deployment.attn_tp,
            num_ranks=len(ranks),
            start=start,
            block_tokens=plan.state_span_tokens,
        )
    vocab = model.config.vocab_size
    if (
        tokens.dim() != 1
        or tokens.dtype not in (torch.int32, torch.int64)
        or bool(((tokens < 0) | (tokens >= vocab)).any())
    ):
        raise _refuse_run(
            f"tokens must be a 1-D integer tensor of ids in [0, {vocab})",
            "draw token ids below the vocabulary size",
            shape=tuple(tokens.shape),
            dtype=str(tokens.dtype),
            vocab_size=vocab,
        )
    return plan


def run(
    model: TinyK3,
    ranks: Sequence[Rank],
    tables: BlockTables,
    tokens: torch.Tensor,
    *,
    start: int = 0,
) -> torch.Tensor:
    """Logits ``[T - start, vocab]`` of ``tokens[start:]``, one block-sized chunk at a time,
    with the cache holding tokens ``[0, start)`` already (``start`` on the block grid)."""
    plan = _check_run(model, ranks, tokens, start)
    logits = []
    for begin in range(start, tokens.shape[0], plan.state_span_tokens):
        x = model.weights["embed"][tokens[begin : begin + plan.state_span_tokens]]
        for layer, kind in enumerate(model.config.model().layers):
            normed = _rms(x)
            partials = [
                (_kda if kind.kind == "kda" else _mla)(
                    _Step(model, rank, tp_rank, tables, begin, layer), normed
                )
                for tp_rank, rank in enumerate(ranks)
            ]
            total = partials[0]
            for partial in partials[1:]:
                total = total + partial  # the all-reduce, in rank order
            x = x + total
        logits.append(_rms(x) @ model.weights["lm_head"])
    return torch.cat(logits)
