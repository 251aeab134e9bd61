"""What an engine keeps on the GPU beside weights and KV that only a run on the GPU measures,
as named, derived estimates (each a :class:`~.records.ReserveTerm` saying how it was derived).

They are estimates, shown in every answer and replaced by the user's own figure
(``Deployment.reserve_bytes``, ``--reserve-gib``):

- **activation_peak** -- the transient peak of one forward pass over ``tokens`` tokens (the
  profile run vLLM measures): for an MoE model, the fused-MoE workspaces of every token's
  ``top_k`` experts, ``tokens x top_k x (3 x I_rank + H_experts) x 2 B`` (the gate-up output,
  the activated half and the down output, bf16, with ``I_rank`` the intermediate width one rank
  computes: the whole expert under expert parallelism, else its TP share); for a dense model the
  MLP's ``tokens x (3 x I_rank + H) x 2 B``; plus the sampler's fp32 logits and probabilities
  over the whole vocabulary for ``seqs`` sequences, ``seqs x V x 4 B x 2``.
- **cuda_graphs** -- the memory CUDA graphs capture: :data:`CUDA_GRAPH_BYTES`, an
  order-of-magnitude figure (vLLM estimates it by capturing two graphs before the KV cache
  exists; it is not knowable without the GPU).
- **non_torch** -- what the engine's communicators and library workspaces add beyond torch's
  allocator after vLLM's start-up snapshot: :data:`NON_TORCH_BYTES` with more than one rank.
- **startup** -- the memory in use before the weights load (the CUDA context, NCCL's buffers):
  :data:`CUDA_CONTEXT_BYTES`, and :data:`COMMUNICATOR_BYTES` more with more than one rank;
  SGLang and tokenspeed take their fraction of what is free after it.
"""

from __future__ import annotations

from typing import Final

from ..deployment import Deployment
from ..model import HybridModel
from .records import ReserveTerm

MIB: Final = 1 << 20

CUDA_GRAPH_BYTES: Final = 1 << 30
"""CUDA graphs of the decode batch sizes: 1 GiB (vLLM's own estimate, which it takes by
capturing two graphs before the KV cache exists, is hundreds of MiB to about a GiB for MoE
models of this size; k3layout cannot capture)."""

NON_TORCH_BYTES: Final = 256 * MIB
"""Memory outside torch's allocator that grows after vLLM's start-up snapshot on a multi-rank
deployment (custom all-reduce buffers, library workspaces)."""

CUDA_CONTEXT_BYTES: Final = 512 * MIB
"""A CUDA context with cuBLAS handles on Hopper / Blackwell: about 0.5 GiB."""

COMMUNICATOR_BYTES: Final = 1 << 30
"""NCCL's communicator buffers of a multi-rank deployment (channels x buffer size, plus the
engines' own all-reduce buffers): about 1 GiB."""

ACTIVATION_BYTES: Final = 2
"""Activations are bf16."""

LOGIT_BYTES: Final = 4
"""The sampler's logits and probabilities are fp32."""


def given(deployment: Deployment) -> tuple[ReserveTerm, ...] | None:
    """The user's own reserve (``reserve_bytes``), which replaces every estimate."""
    if deployment.reserve_bytes is None:
        return None
    return (ReserveTerm(name="reserve", bytes=deployment.reserve_bytes, derivation="given"),)


def activation_peak(
    model: HybridModel, deployment: Deployment, tokens: int, seqs: int
) -> ReserveTerm:
    """The transient peak of a forward over ``tokens`` tokens and the sampler over ``seqs``
    sequences (module docstring)."""
    arch = model.architecture
    assert arch is not None  # the weights were laid out before
    ranks = deployment.attn_tp * deployment.attn_dp
    if arch.num_experts is not None and arch.moe_intermediate_size is not None:
        top_k = arch.num_experts_per_token or 1
        width = arch.moe_intermediate_size
        width_rank = width if deployment.expert_parallel else -(-width // ranks)
        hidden = arch.routed_expert_hidden_size or arch.hidden_size
        forward = tokens * top_k * (3 * width_rank + hidden) * ACTIVATION_BYTES
        what = (
            f"{tokens:,} tokens x top {top_k} x (3 x {width_rank:,} + {hidden:,}) x "
            f"{ACTIVATION_BYTES} B"
        )
    else:
        width_rank = -(-arch.intermediate_size // deployment.attn_tp)
        forward = tokens * (3 * width_rank + arch.hidden_size) * ACTIVATION_BYTES
        what = f"{tokens:,} tokens x (3 x {width_rank:,} + {arch.hidden_size:,}) x 2 B"
    sampler = seqs * arch.vocab_size * LOGIT_BYTES * 2
    return ReserveTerm(
        name="activation_peak",
        bytes=forward + sampler,
        derivation=f"{what} + {seqs:,} sequences x {arch.vocab_size:,} x 4 B x 2 (estimate)",
    )


def cuda_graphs() -> ReserveTerm:
    """:data:`CUDA_GRAPH_BYTES`."""
    return ReserveTerm(name="cuda_graphs", bytes=CUDA_GRAPH_BYTES, derivation="1 GiB (estimate)")


def non_torch(deployment: Deployment) -> ReserveTerm:
    """:data:`NON_TORCH_BYTES` on a multi-rank deployment, else nothing."""
    size = NON_TORCH_BYTES if deployment.world_size > 1 else 0
    return ReserveTerm(
        name="non_torch",
        bytes=size,
        derivation="256 MiB with more than one rank (estimate)" if size else "one rank: 0",
    )


def startup(deployment: Deployment) -> ReserveTerm:
    """The CUDA context, and the communicators of a multi-rank deployment; the user's own
    figure (``reserve_bytes``) where given: what SGLang and tokenspeed find in use before the
    weights load, their one reserve term besides the headroom their fraction leaves."""
    if deployment.reserve_bytes is not None:
        return ReserveTerm(name="startup", bytes=deployment.reserve_bytes, derivation="given")
    many = deployment.world_size > 1
    return ReserveTerm(
        name="startup",
        bytes=CUDA_CONTEXT_BYTES + (COMMUNICATOR_BYTES if many else 0),
        derivation="CUDA context 0.5 GiB" + (" + NCCL 1 GiB" if many else "") + " (estimate)",
    )
