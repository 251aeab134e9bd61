"""The tensors of one decoder layer's modules as vLLM 0.33's Kimi classes declare them on a rank.

Each function returns the tensors of one module kind, named within the decoder layer
(``self_attn.o_proj.weight``), for the rank's TP share (``tp``: the attention TP; 1 where
vLLM replicates the module). Read off ``models/kimi_k3/nvidia`` (``mla.py``, ``kda.py``,
``model.py``) and ``layers/mamba/gdn/kimi_gdn_linear_attn.py`` by building them on ``meta``
(``tests/conformance/vllm_weights.py``):

- MLA (``MultiHeadLatentAttention``): with a q-LoRA, one replicated input projection of the
  q and kv latents (``fused_qkv_a_proj``; with the output gate ``fused_qkv_a_g_proj``, whose
  gate part is TP-split), ``q_b_proj`` column-split; without (Kimi-Linear) ``q_proj``
  column-split and ``kv_a_proj_with_mqa`` replicated; ``kv_b_proj`` column-, ``o_proj``
  row-split; five fp32 scale buffers (``_k_scale``, ``_v_scale``, ``_q_scale``,
  ``_prob_scale``, ``_one_scale``).
- K3 KDA (``KimiK3DeltaAttention``): ``in_proj_qkvgfab`` = q, k, v, g (``P / tp`` rows each),
  ``f_a`` (``head_dim`` rows, whole on every rank), beta (``heads / tp``), padded to a multiple
  of 16 rows; ``f_b_proj``, fp32 ``dt_bias`` / ``A_log`` / ``conv1d``, ``o_norm``, ``o_proj``;
  with the native fused decode (:func:`fused_decode_buffers`) two fp32 buffers, a width-major
  copy of the conv weight ``[3, K, P / tp]`` and the norm ``[head_dim]``.
- Kimi-Linear KDA (``KimiLinearGatedDeltaNetAttention``): ``in_proj_qkvgfab`` = q, k, v, beta,
  f_a (unpadded), the low-rank gate ``g_a_proj`` (replicated) and ``g_b_proj``.
- MLP (``KimiMLP``): ``gate_up_proj`` and ``down_proj``; replicated under sequence parallel.
- MoE (``KimiMoE``): the router (bf16, never quantized) and its fp32 correction bias, shared
  experts (a ``KimiMLP`` of ``num_shared_experts x moe_intermediate_size``), the latent MoE's
  replicated projections, the routed experts (:mod:`.weights_quant`) and, under expert
  parallelism, the int32 expert map buffer.
"""

from __future__ import annotations

from ...cache.kda import KDALayer
from ...cache.mla import MLALayer
from ...deployment import Deployment
from ...errors import Refusal
from ...gpus import GPUS
from ...weights import WeightDtype, WeightTensor
from .weights_quant import Experts, Linear, QuantContext, Split, expert_tensors, linear_tensors

KDA_PROJECTION_ALIGN = 16
"""Rows K3's KDA input projection is padded to a multiple of, per rank (``kda.py``)."""

FUSED_DECODE_HEADS = (12, 24, 48, 96)
"""Heads per rank the native fused KDA decode kernel takes (``is_fused_kda_decode_supported``)."""

FLASHINFER_SPEC_DECODE_HEADS = (12, 24, 32, 48, 96)
"""Heads per rank FlashInfer's packed fused KDA speculative decode takes."""

MLA_SCALE_BUFFERS = (
    WeightTensor(name="self_attn._k_scale", shape=(), dtype="float32"),
    WeightTensor(name="self_attn._v_scale", shape=(), dtype="float32"),
    WeightTensor(name="self_attn._q_scale", shape=(), dtype="float32"),
    WeightTensor(name="self_attn._prob_scale", shape=(), dtype="float32"),
    WeightTensor(name="self_attn._one_scale", shape=(1,), dtype="float32"),
)
"""The scale buffers every MLA layer registers (``_init_kv_cache_quant`` and the fused fp8
prefill's unit scale): 20 bytes a layer."""


def split(extent: int, ranks: int, what: str) -> int:
    """``extent / ranks``; refuses (``uneven_split``) what vLLM's ``divide`` asserts."""
    if extent % ranks:
        raise Refusal(
            "uneven_split",
            f"{what}: {extent} does not split evenly over {ranks} ranks (vLLM asserts it)",
            facts={"field": what, "extent": extent, "ranks": ranks},
            hint=f"use a TP size that divides {extent}",
        )
    return extent // ranks


def fused_decode_buffers(
    layer: KDALayer, deployment: Deployment, dtype: WeightDtype, spec_tokens: int
) -> bool:
    """Whether vLLM keeps K3 KDA's decode copies (``decode_conv1d_weight``,
    ``decode_norm_weight``) on a rank: its decode backend is not Triton, i.e. the native fused
    decode runs (SM 90, 10x or 12x; 12, 24, 48 or 96 heads a rank; head_dim 128; conv width 4;
    no speculative tokens; bf16 model, so bf16 conv state beside the fp32 recurrent one), or
    FlashInfer's packed speculative decode does (SM 10x, 1-7 speculative tokens, 12 to 96 heads
    a rank, a bounded gate, the SD conv layout, no RecoverSSM).

    >>> from k3layout import Deployment
    >>> k3 = KDALayer(num_heads=96, head_dim=128, full_rank_gate=True, gate_lower_bound=-5.0)
    >>> fused_decode_buffers(k3, Deployment(attn_tp=8), "bfloat16", 0)  # H200: native
    True
    >>> fused_decode_buffers(k3, Deployment(attn_tp=8, gpu="a100"), "bfloat16", 0)
    False
    """
    device = GPUS[deployment.gpu]
    heads = layer.num_heads // deployment.attn_tp
    shape_ok = layer.head_dim == 128 and layer.conv_kernel == 4 and dtype == "bfloat16"
    if device.vendor != "nvidia" or not shape_ok:
        return False
    major = device.capability[0]
    if spec_tokens == 0:
        return heads in FUSED_DECODE_HEADS and (device.capability == (9, 0) or major in (10, 12))
    recover = deployment.use_replayssm  # --use-replayssm with a drafter: KDA's RecoverSSM
    return (
        major == 10
        and heads in FLASHINFER_SPEC_DECODE_HEADS
        and 1 <= spec_tokens <= 7
        and layer.gate_lower_bound is not None
        and not recover
        and deployment.conv_layout_run == "SD"
    )


def mla_tensors(
    layer: MLALayer,
    hidden: int,
    gate: bool,
    module: str,
    ctx: QuantContext,
) -> tuple[WeightTensor, ...]:
    """One MLA layer's projections, norms and scale buffers on a rank (``module``: the decoder
    layer's vLLM name, for the ignore list)."""
    tp = ctx.attn_tp
    heads = split(layer.num_heads, tp, "num_attention_heads")
    qk = layer.qk_nope_head_dim + layer.qk_rope_head_dim
    latent = layer.kv_lora_rank + layer.qk_rope_head_dim

    def linear(
        name: str, parts: tuple[int, ...], cols: int, kind: Split
    ) -> tuple[WeightTensor, ...]:
        return linear_tensors(
            Linear(f"self_attn.{name}", f"{module}.self_attn.{name}", parts, cols, kind),
            ctx,
        )

    out: list[WeightTensor] = []
    if layer.q_lora_rank is not None:
        q_lora = layer.q_lora_rank
        if gate:
            out += linear(
                "fused_qkv_a_g_proj", (q_lora, latent, heads * layer.v_head_dim), hidden, "col"
            )
        else:
            out += linear("fused_qkv_a_proj", (q_lora, latent), hidden, "rep")
        out.append(
            WeightTensor(name="self_attn.q_a_layernorm.weight", shape=(q_lora,), dtype=ctx.dtype)
        )
        out += linear("q_b_proj", (heads * qk,), q_lora, "col")
    else:
        out += linear("q_proj", (heads * qk,), hidden, "col")
        out += linear("kv_a_proj_with_mqa", (latent,), hidden, "rep")
        if gate:
            out += linear("g_proj", (heads * layer.v_head_dim,), hidden, "col")
    out.append(
        WeightTensor(
            name="self_attn.kv_a_layernorm.weight", shape=(layer.kv_lora_rank,), dtype=ctx.dtype
        )
    )
    nope_v = layer.qk_nope_head_dim + layer.v_head_dim
    out += linear("kv_b_proj", (heads * nope_v,), layer.kv_lora_rank, "col")
    out += linear("o_proj", (hidden,), heads * layer.v_head_dim, "row")
    return (*out, *MLA_SCALE_BUFFERS)


def kda_tensors(
    layer: KDALayer, hidden: int, module: str, ctx: QuantContext, decode_buffers: bool
) -> tuple[WeightTensor, ...]:
    """One KDA layer's tensors on a rank: K3's (full-rank gate) or Kimi-Linear's."""
    tp = ctx.attn_tp
    heads = split(layer.num_heads, tp, "linear_attn_config.num_heads")
    dim = layer.head_dim
    local = heads * dim

    def linear(
        name: str, parts: tuple[int, ...], cols: int, kind: Split
    ) -> tuple[WeightTensor, ...]:
        return linear_tensors(
            Linear(f"self_attn.{name}", f"{module}.self_attn.{name}", parts, cols, kind),
            ctx,
        )

    fp32: WeightDtype = "float32"
    if layer.full_rank_gate:
        parts: tuple[int, ...] = (local, local, local, local, dim, heads)
        pad = -sum(parts) % KDA_PROJECTION_ALIGN
        parts += (pad,) if pad else ()
    else:
        parts = (local, local, local, heads, dim)
    out = [
        *linear("in_proj_qkvgfab", parts, hidden, "col"),
        *linear("f_b_proj", (local,), dim, "col"),
        WeightTensor(name="self_attn.dt_bias", shape=(local,), dtype=fp32),
        WeightTensor(
            name="self_attn.conv1d.weight", shape=(3 * local, 1, layer.conv_kernel), dtype=fp32
        ),
        WeightTensor(name="self_attn.A_log", shape=(heads,), dtype=fp32),
    ]
    if not layer.full_rank_gate:
        out += linear("g_a_proj", (dim,), hidden, "rep")
        out += linear("g_b_proj", (local,), dim, "col")
    out.append(WeightTensor(name="self_attn.o_norm.weight", shape=(dim,), dtype=ctx.dtype))
    out += linear("o_proj", (hidden,), local, "row")
    if decode_buffers:
        out += [
            WeightTensor(
                name="self_attn.decode_conv1d_weight",
                shape=(3, layer.conv_kernel, local),
                dtype=fp32,
            ),
            WeightTensor(name="self_attn.decode_norm_weight", shape=(dim,), dtype=fp32),
        ]
    return tuple(out)


def mlp_tensors(
    name: str, hidden: int, intermediate: int, module: str, ctx: QuantContext, *, replicated: bool
) -> tuple[WeightTensor, ...]:
    """A ``KimiMLP`` (``name``: ``mlp`` or ``block_sparse_moe.shared_experts``) on a rank;
    whole on every rank when ``replicated`` (sequence parallel)."""
    tp = 1 if replicated else ctx.attn_tp
    width = split(intermediate, tp, f"{name} intermediate size")
    gate_up: Split = "rep" if replicated else "col"
    down: Split = "rep" if replicated else "row"
    return (
        *linear_tensors(
            Linear(
                f"{name}.gate_up_proj",
                f"{module}.{name}.gate_up_proj",
                (width, width),
                hidden,
                gate_up,
            ),
            ctx,
        ),
        *linear_tensors(
            Linear(f"{name}.down_proj", f"{module}.{name}.down_proj", (hidden,), width, down),
            ctx,
        ),
    )


def router_tensors(experts: int, hidden: int, dtype: WeightDtype) -> tuple[WeightTensor, ...]:
    """The router (``GateLinear``, never quantized) and its fp32 correction bias."""
    return (
        WeightTensor(name="block_sparse_moe.gate.weight", shape=(experts, hidden), dtype=dtype),
        WeightTensor(
            name="block_sparse_moe.gate.e_score_correction_bias", shape=(experts,), dtype="float32"
        ),
    )


def routed_tensors(
    experts: Experts,
    hidden: int,
    *,
    latent: tuple[int, bool] | None,
    module: str,
    ctx: QuantContext,
    expert_map: int | None,
) -> tuple[WeightTensor, ...]:
    """The routed experts on a rank, the latent MoE's replicated projections (``latent``:
    the experts' width and whether a norm sits between) and the EP expert map (``expert_map``:
    the global expert count, under expert parallelism)."""
    out: list[WeightTensor] = []
    if latent is not None:
        width, norm = latent
        out += linear_tensors(
            Linear(
                "block_sparse_moe.routed_expert_down_proj",
                f"{module}.block_sparse_moe.routed_expert_down_proj",
                (width,),
                hidden,
                "rep",
            ),
            ctx,
        )
        if norm:
            out.append(
                WeightTensor(
                    name="block_sparse_moe.routed_expert_norm.weight",
                    shape=(width,),
                    dtype=ctx.dtype,
                )
            )
        out += linear_tensors(
            Linear(
                "block_sparse_moe.routed_expert_up_proj",
                f"{module}.block_sparse_moe.routed_expert_up_proj",
                (hidden,),
                width,
                "rep",
            ),
            ctx,
        )
    prefix = "block_sparse_moe.experts.routed_experts."
    out += [
        WeightTensor(name=prefix + t.name, shape=t.shape, dtype=t.dtype)
        for t in expert_tensors(experts, ctx)
    ]
    if expert_map is not None:
        out.append(WeightTensor(name=prefix + "_expert_map", shape=(expert_map,), dtype="int32"))
    return tuple(out)
