"""The decoder stack of a vLLM 0.33 rank: the parallel sizes vLLM's Kimi model reads and the
tensors of each decoder layer's modules, grouped by kind (:mod:`.weights` places them on
stages; :mod:`.weights_draft` reuses them for MTP modules)."""

from __future__ import annotations

from collections.abc import Iterable

from ...cache.kda import KDALayer
from ...cache.mla import MLALayer
from ...deployment import Deployment
from ...errors import Refusal
from ...model import HybridModel
from ...model.architecture import Architecture
from ...weights import WeightDtype, WeightGroup, WeightTensor
from ...weights.records import WeightKind
from .weights_layers import (
    fused_decode_buffers,
    kda_tensors,
    mla_tensors,
    mlp_tensors,
    routed_tensors,
    router_tensors,
    split,
)
from .weights_quant import Experts, QuantContext

VOCAB_PADDING = 64
"""``DEFAULT_VOCAB_PADDING_SIZE``: vocabularies are padded to a multiple of it before TP."""


def padded_vocab(vocab: int) -> int:
    """The vocabulary rounded up to :data:`VOCAB_PADDING` (``pad_vocab_size``)."""
    return -(-vocab // VOCAB_PADDING) * VOCAB_PADDING


class Parallel:
    """The parallel sizes of a deployment, as vLLM's model reads them."""

    def __init__(self, deployment: Deployment, arch: Architecture) -> None:
        self.tp = deployment.attn_tp
        self.moe_ranks = deployment.attn_tp * deployment.attn_dp
        self.ep_flag = deployment.expert_parallel
        self.ep = self.ep_flag and self.moe_ranks > 1
        self.sequence_parallel = (
            deployment.pp == 1 and self.ep_flag and self.tp > 1 and deployment.attn_dp > 1
        )
        moe = arch.moe_intermediate_size or 0
        floor = arch.min_moe_intermediate_per_partition
        pad = self.tp > 1 and not self.ep_flag and moe // self.tp < floor
        self.moe_intermediate = floor * self.tp if pad else moe


def layer_groups(
    model: HybridModel,
    deployment: Deployment,
    *,
    layer_ids: Iterable[int],
    ctx: QuantContext,
    prefix: str,
    mtp: bool = False,
) -> list[tuple[WeightKind, int, tuple[WeightTensor, ...]]]:
    """``(kind, layer, tensors)`` of each module of each decoder layer in ``layer_ids``
    (target layers, or MTP modules' blocks when ``mtp``: their names under ``mtp_block.``,
    no attention residual); ``prefix`` is the layers' vLLM name before the index."""
    arch = model.architecture
    assert arch is not None
    par = Parallel(deployment, arch)
    hidden = arch.hidden_size
    spec = deployment.spec_tokens if model.drafter is not None else 0
    all_layers = (*model.layers, *model.draft_layers)
    inner = "mtp_block." if mtp else ""
    found: list[tuple[WeightKind, int, tuple[WeightTensor, ...]]] = []

    def add(kind: WeightKind, layer: int, tensors: tuple[WeightTensor, ...]) -> None:
        renamed = tuple(
            WeightTensor(name=inner + t.name, shape=t.shape, dtype=t.dtype) for t in tensors
        )
        found.append((kind, layer, renamed))

    for i in layer_ids:
        module = f"{prefix}{i}" + (".mtp_block" if mtp else "")
        layer = all_layers[i]
        if isinstance(layer, MLALayer):
            gate = arch.mla_output_gate
            add("mla", i, mla_tensors(layer, hidden, gate, module, ctx))
        elif isinstance(layer, KDALayer):
            buffers = layer.full_rank_gate and fused_decode_buffers(
                layer, deployment, ctx.dtype, spec
            )
            add("kda", i, kda_tensors(layer, hidden, module, ctx, buffers))
        else:
            raise Refusal(
                "weights_unknown",
                f"model {model.name}: layer {i} is {layer.kind}, which vLLM's Kimi classes "
                "do not build",
                facts={"model": model.name, "layer": i},
                hint="plan a Kimi-K3 or Kimi-Linear checkpoint",
            )
        norms = (
            WeightTensor(name="input_layernorm.weight", shape=(hidden,), dtype=ctx.dtype),
            WeightTensor(name="post_attention_layernorm.weight", shape=(hidden,), dtype=ctx.dtype),
        )
        add("norm", i, norms)
        if arch.is_moe_layer(i):
            experts = arch.num_experts or 0
            intermediate = par.moe_intermediate
            add("moe_router", i, router_tensors(experts, hidden, ctx.dtype))
            shared = arch.num_shared_experts * (arch.moe_intermediate_size or 0)
            add(
                "shared_experts",
                i,
                mlp_tensors(
                    "block_sparse_moe.shared_experts",
                    hidden,
                    shared,
                    module,
                    ctx,
                    replicated=par.sequence_parallel,
                ),
            )
            local = -(-experts // par.moe_ranks) if par.ep else experts
            shard = (
                intermediate
                if par.ep
                else split(intermediate, par.moe_ranks, "moe_intermediate_size")
            )
            width = arch.routed_expert_hidden_size
            routed = Experts(
                module=f"{module}.block_sparse_moe.experts",
                local=local,
                intermediate=shard,
                hidden=width or hidden,
                moe_tp=1 if par.ep else par.moe_ranks,
            )
            latent = (width, arch.latent_moe_use_norm) if width is not None else None
            add(
                "routed_experts",
                i,
                routed_tensors(
                    routed,
                    hidden,
                    latent=latent,
                    module=module,
                    ctx=ctx,
                    expert_map=experts if par.ep else None,
                ),
            )
        else:
            add(
                "dense_mlp",
                i,
                mlp_tensors(
                    "mlp",
                    hidden,
                    arch.intermediate_size,
                    module,
                    ctx,
                    replicated=par.sequence_parallel,
                ),
            )
        if arch.attn_res_block_size is not None and not mtp:
            add("attention_residual", i, attention_residual(hidden, ctx.dtype))
    return found


def attention_residual(hidden: int, dtype: WeightDtype) -> tuple[WeightTensor, ...]:
    """A layer's attention-residual norms and projections (replicated, never quantized)."""
    return (
        WeightTensor(name="self_attention_res_norm.weight", shape=(hidden,), dtype=dtype),
        WeightTensor(name="mlp_res_norm.weight", shape=(hidden,), dtype=dtype),
        WeightTensor(name="self_attention_res_proj.weight", shape=(1, hidden), dtype=dtype),
        WeightTensor(name="mlp_res_proj.weight", shape=(1, hidden), dtype=dtype),
    )


def grouped(found: Iterable[tuple[WeightKind, int, tuple[WeightTensor, ...]]]) -> list[WeightGroup]:
    """Layers whose module of one kind holds the same tensors, as one group each."""
    layers: dict[tuple[WeightKind, tuple[WeightTensor, ...]], list[int]] = {}
    for kind, layer, tensors in found:
        layers.setdefault((kind, tensors), []).append(layer)
    return [
        WeightGroup(kind=kind, layers=tuple(ids), tensors=tensors)
        for (kind, tensors), ids in layers.items()
    ]
