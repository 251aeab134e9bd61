"""vLLM's own cache specs and tensors for a packed plan (an indexed hybrid, GLM-5.3-Flash),
for :mod:`.kv_config`.

An indexed MLA layer registers three caches with vLLM, in this order: its indexer's pooled
keys (``<layer>.indexer.k_cache``, a ``Glm5NextIndexerCache``), their tail ring
(``<layer>.indexer.tail_cache``, a ``Glm5NextTailCache``) and its latent (``<layer>.attn``, an
``MLAAttention``); a KDA layer one state page. Each comes from the plan::

    k_cache   MLAAttentionSpec  head_size: the key entry's bytes (132), uint8, one entry per
                                kpool tokens (tokens_per_state), role INDEXER, blocks aligned
                                to the indexer kernel's largest page (64 entries)
    tail      CircularBufferSpec  block_size: the ring's tokens; its two parts (k, score) as
                                two heads of index_head_dim, bf16, every DCP rank whole
    attn      MLAAttentionSpec  head_size: the latent (512), the cache dtype's element
                                (fp8_ds_mla: its packed row as state_content_bytes), the sparse
                                top-k buffer, the index group's leader, blocks aligned as the
                                sparse backend customises them

A packed plan's groups hold one spec per cache (vLLM's ``UniformTypeKVCacheSpecs``); each of
the plan's runs inside a block (:func:`~.packed.group_runs`) is one ``KVCacheTensor``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ...cache import RING_PARTS
from ...gpus import GPUS
from ...layouts.groups import Group
from ...model import MLALayer
from ...names import INDEX_REGION_SUFFIX, RING_REGION_SUFFIX
from .launch import KV_CACHE_DTYPE
from .layout import VllmPlan
from .sparse import INDEXER_KERNEL_ENTRIES, SPARSE_KERNEL_BLOCK

__all__ = ["LATENT_SUFFIX", "group_caches", "indexed_specs", "packed_group", "packed_tensors"]

LATENT_SUFFIX: Final = ".attn"
"""Appended to an indexed MLA layer's name for its latent (vLLM's ``MLAAttention`` under the
layer's ``self_attn``, beside the indexer's caches)."""

TOPK_BUFFER_ALIGNMENT: Final = 128
"""Tokens the sparse MLA kernels' top-k index buffer is padded to, after room for the pool
still being filled (``index_topk + index_kpool - 1``): vLLM's GLM model's
``get_sparse_topk_buffer_width`` (0.33.0 and 0.34.0), the latent spec's
``topk_buffer_width``."""

PART_CACHES: Final = {"index": INDEX_REGION_SUFFIX, "latent": LATENT_SUFFIX}
"""The cache vLLM registers for each part of an indexed layer's page, by name suffix."""


def indexed_specs(plan: VllmPlan, v: Any, layer: int, name: str, draft: bool) -> dict[str, Any]:
    """Module ``layer``'s (registered as ``name``) three caches and their specs, in vLLM's
    registration order: keys, tail ring, latent (``is_draft`` set on a draft's)."""
    deployment = plan.deployment
    model_layer = plan.model.module_layers[layer]
    indexer = plan.model.indexer
    # a packed plan's indexed layer: an MLA layer with a pooled indexer and its ring
    assert isinstance(model_layer, MLALayer) and indexer is not None and plan.sizes.ring
    spec = plan.sizes.spec_of(layer)
    block = plan.block_tokens
    cache_dtype = KV_CACHE_DTYPE[deployment.kv_dtype]
    quant = v.get_kv_quant_mode(cache_dtype)
    index = spec.part("index")
    ring = plan.sizes.ring.parts
    latent_part = spec.part("latent")
    head = model_layer.latent_dim
    row = latent_part.local_bytes(plan.deployment.attn_tp)
    element = "uint8" if quant != v.KVQuantMode.NONE else "bfloat16"
    # fp8_ds_mla keeps a packed row (fp8 latent, scales, rope slot) wider than the head
    content = None if row == head * getattr(v.torch, element).itemsize else row
    latent = v.MLAAttentionSpec(
        block_size=block,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=head,
        dtype=getattr(v.torch, element),
        cache_dtype_str=cache_dtype,
        kv_quant_mode=quant,
        state_content_bytes=content,
        topk_buffer_width=_round_up(indexer.topk + indexer.kpool - 1, TOPK_BUFFER_ALIGNMENT),
        is_index_group_leader=True,  # every indexed layer builds its own indexer
        block_stride_alignment=_latent_alignment(plan, v, row, quant != v.KVQuantMode.NONE),
        is_draft=draft,
    )
    keys = v.MLAAttentionSpec(
        block_size=block,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=index.shape[0],
        dtype=getattr(v.torch, index.dtype),
        cache_role=v.SparseCacheRole.INDEXER,
        tokens_per_state=index.tokens_per_row,
        # the indexer kernel's pages of 32 or 64 entries: whole largest pages
        block_stride_alignment=v.MultipleOf(INDEXER_KERNEL_ENTRIES[-1] * index.tokens_per_row),
        is_draft=draft,
    )
    tail = v.CircularBufferSpec(
        block_size=ring[0].shape[0],
        num_kv_heads=len(ring),
        head_size=ring[0].shape[1],
        head_size_v=0,
        dtype=getattr(v.torch, ring[0].dtype),
        dcp_sharded=False,
        is_draft=draft,
    )
    return {
        name + INDEX_REGION_SUFFIX: keys,
        name + RING_REGION_SUFFIX: tail,
        name + LATENT_SUFFIX: latent,
    }


def _latent_alignment(plan: VllmPlan, v: Any, row: int, quantized: bool) -> Any:
    """The latent's ``block_stride_alignment`` as the sparse backend's ``customize_spec``
    writes it (the bytes are :func:`~.sparse.latent_alignment_bytes`'): FlashMLA's sparse
    kernel, quantized off SM 10x, whole 64-token kernel pages; FlashInfer's SM 10x kernel 32
    rows; otherwise one row."""
    backend = plan.sparse_backend
    assert backend is not None
    if backend == "FLASHMLA_SPARSE" and quantized and GPUS[plan.deployment.gpu].capability[0] != 10:
        return v.MultipleOf(SPARSE_KERNEL_BLOCK[backend])
    rows = SPARSE_KERNEL_BLOCK[backend] if backend == "FLASHINFER_MLA_SPARSE" else 1
    return rows * row


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def group_caches(group: Group, name_of: Callable[[int], str]) -> list[str]:
    """The caches of ``group``'s layers in vLLM's group order: a KDA layer's page; an indexed
    layer's keys then latent; a ring group's rings."""
    names: list[str] = []
    for layer in group.layers:
        name = name_of(layer)
        if group.kind == "kda":
            names.append(name)
        elif group.kind == "ring":
            names.append(name + RING_REGION_SUFFIX)
        else:
            names += [name + INDEX_REGION_SUFFIX, name + LATENT_SUFFIX]
    return names


def packed_group(v: Any, names: list[str], specs: dict[str, Any], eagle: bool) -> Any:
    """One packed group: a spec per cache (vLLM's ``UniformTypeKVCacheSpecs``)."""
    members = {name: specs[name] for name in names}
    block = next(iter(members.values())).block_size
    return v.KVCacheGroupSpec(
        layer_names=names,
        kv_cache_spec=v.UniformTypeKVCacheSpecs(block_size=block, kv_cache_specs=members),
        is_eagle_group=eagle,
    )


def packed_tensors(
    plan: VllmPlan,
    v: Any,
    group: Group,
    *,
    num_blocks: int,
    stage: int,
    name_of: Callable[[int], str],
) -> list[Any]:
    """``group``'s tensors on ``stage``: one per run of the plan's block (its caches of one
    spec back to back, ``offset`` bytes into the block), each over the whole backing."""
    tensors = []
    for run in plan.runs(group):
        if group.kind == "kda":
            suffix = ""
        elif run.parts == RING_PARTS:
            suffix = RING_REGION_SUFFIX
        else:
            suffix = PART_CACHES[run.parts[0]]
        tensors.append(
            v.KVCacheTensor(
                size=plan.blocks_bytes(num_blocks, stage),
                layers=[name_of(layer) + suffix for layer in run.layers],
                layer_stride=run.page,
                block_stride=plan.stage_block_bytes(stage),
                offset=run.offset,
            )
        )
    return tensors
