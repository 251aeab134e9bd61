"""vLLM's own KV-cache objects, built from a plan: each layer's ``KVCacheSpec`` as a worker's
``get_kv_cache_spec`` returns it (:func:`kv_cache_specs`), and one rank's ``KVCacheConfig``
(its groups and their specs, the tensors over the one backing, ``num_blocks``) as vLLM's
engine core hands it to the worker (:func:`kv_cache_config`).

:func:`~k3layout.engines.vllm.check_kv_cache_config` reads vLLM's objects against a plan;
these make them from one, with vLLM's own classes: vLLM is imported when a function is
called (``import k3layout`` imports none of it), and the installed release must be the plan's
``deployment.engine_version`` (:func:`~k3layout.engines.installed.installed_engine`).
``tests/conformance/test_conformance_kv_config.py`` checks them equal, field for field, to
what vLLM 0.33.0 and 0.34.0 build for the same model and flags.

Every field is the plan's, or follows from it and the flags k3layout launches vLLM with
(:mod:`.launch`)::

    MLAAttentionSpec  block_size           the group's page tokens (the raised block)
                      num_kv_heads, head_size   the latent's per-rank row: one head of 576
                      max_tp_shards        1: the latent is replicated over TP
                      dtype                the latent's dtype; an fp8 cache as uint8 (vLLM's)
                      cache_dtype_str, kv_quant_mode   --kv-cache-dtype (launch.KV_CACHE_DTYPE)
                      block_stride_alignment   whole kernel blocks of the backend, when it
                                           takes fixed ones (rules.KERNEL_BLOCK_TOKENS)
                      non_causal_multi_token_decode   a DSpark draft layer
    MambaSpec         shapes, dtypes       the conv and recurrent parts' per-rank tensors
                      block_size           the KDA group's block (spans.group_block_tokens)
                      page_size_padded     the plan's page
                      state_alignment, block_stride_alignment   the release's
                                           (releases.VllmRelease.kda_spec_alignment)
                      mamba_cache_mode, num_speculative_blocks, num_prefill_checkpoint_blocks,
                      prefill_checkpoint_alignment   the deployment's mode, draft tokens and
                                           KDA prefill kernel
    KVCacheGroupSpec  the plan's groups in order, each spec merged by vLLM's own ``merge``;
                      a pipeline stage's groups projected on its layers (empty ones kept)
    KVCacheTensor     one per group holding layers: the backing's bytes, the plan's layer and
                      block strides, its first page's offset (packed: one per run)

A packed plan (an indexed hybrid, GLM-5.3-Flash: pages of several sizes, block-outermost)
builds its three caches per indexed layer, its groups of one spec per cache and a tensor per
run of the block (:mod:`.kv_packed`). A plan with ATOM's ReplaySSM records, or ROCm's KDA
prefill checkpoint, is refused (``engine_setting``): those objects are not built here;
:func:`~k3layout.engines.vllm.check_kv_cache_config` checks what vLLM builds for it.
"""

from __future__ import annotations

import math
from functools import reduce
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Final

from ..._args import expect, expect_int, expect_positive
from ...errors import Refusal
from ...layouts.groups import Group
from ...names import engine_layer_names
from ...placements import Replicate
from ..installed import installed_engine
from .capacity import kda_prefill_backend_of
from .kv_packed import group_caches, indexed_specs, packed_group, packed_tensors
from .launch import KV_CACHE_DTYPE
from .layout import VllmPlan
from .releases import release_of
from .rules import KERNEL_BLOCK_TOKENS, backend_of, prefill_checkpoint_blocks
from .spans import default_max_model_len, group_block_tokens, stages_without_attention

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheSpec

__all__ = ["kv_cache_config", "kv_cache_specs"]

KDA_MAMBA_TYPE: Final = "GDN_ATTN"
"""The ``MambaAttentionBackendEnum`` member of a KDA layer's spec: vLLM runs Kimi-K3's,
Kimi-Linear's and GLM-5.3-Flash's KDA layers as gated delta-net layers (their classes derive
``GatedDeltaNetAttention``), read off both releases' specs."""

FLASHKDA_CHECKPOINT_ALIGNMENT: Final = 16
"""Tokens a FlashKDA prefill's exported state checkpoints are aligned to (vLLM's
``kda_prefill_checkpoint_alignment("flashkda")``, ``model_executor/layers/mamba/
kda_checkpoint.py`` in 0.33.0 and 0.34.0): the spec's ``prefill_checkpoint_alignment``."""

EAGLE_BLOCK_DROP_METHODS: Final = ("mtp",)
"""The speculative methods k3layout plans whose draft KV at a position depends on the next
token, so vLLM drops a request's trailing prefix-cache block in every group holding a draft
layer (``SpeculativeConfig.needs_eagle_block_drop``: EAGLE-style drafters; DSpark builds its
draft KV from the target's hidden state alone): ``KVCacheGroupSpec.is_eagle_group``."""

PREFIX_CACHE_RETENTION_INTERVAL: Final = 0
"""vLLM's default ``CacheConfig.prefix_cache_retention_interval`` (the state kept at one
boundary per prompt, which :func:`~k3layout.engines.vllm.rules.replay_boundary` assumes),
copied into every ``KVCacheConfig``."""

STORED_DTYPES: Final = {"float8_e4m3fn": "uint8"}
"""The dtype vLLM keeps an attention cache element dtype in: an fp8 cache as raw bytes
(``kv_cache_dtype_str_to_dtype``); any other as itself."""


def kv_cache_specs(
    plan: VllmPlan, stage: int = 0, *, max_model_len: int | None = None
) -> dict[str, KVCacheSpec]:
    """What a worker of pipeline stage ``stage`` returns from ``get_kv_cache_spec``: the
    vLLM ``KVCacheSpec`` of each cache its layers register, by the name vLLM registers it
    under, target layers in module order then the draft's (``is_draft`` set on these, as
    vLLM's model runner sets it; an indexed layer's three caches: :mod:`.kv_packed`).
    ``max_model_len`` (default: vLLM's, the model's context) sizes a KDA block when prefix
    caching is off. Refuses (``version_unsupported``) where the plan's vLLM release is not
    installed, (``engine_setting``) a plan whose objects are not built here."""
    expect("plan", plan, VllmPlan)
    held = plan.stage(expect_int("stage", stage))
    build = _Build(plan, max_model_len)
    # A stage without attention finds no attention page to pad its states to: its worker's
    # specs are unpadded (vLLM's grouping pads them to the page of the whole model).
    padded = held.index not in stages_without_attention(plan.model, plan.deployment)
    specs: dict[str, KVCacheSpec] = {}
    for layer in held.layers:
        specs.update(build.layer_specs(layer, padded=padded))
    return specs


def kv_cache_config(
    plan: VllmPlan, num_blocks: int, stage: int = 0, *, max_model_len: int | None = None
) -> KVCacheConfig:
    """The ``KVCacheConfig`` vLLM's engine core gives a rank of pipeline stage ``stage``
    holding ``num_blocks`` blocks (``plan.num_blocks(kv_memory_bytes)`` for a budget: every
    stage keeps the fewest): the plan's groups projected on the stage, each with the spec
    vLLM merges from its layers' (:func:`kv_cache_specs`), and a tensor per group holding
    layers, over one backing of ``plan.blocks_bytes(num_blocks, stage)`` bytes.

    >>> from k3layout import Deployment, plan, preset
    >>> p = plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2))
    >>> config = kv_cache_config(p, p.num_blocks(40 << 30))  # doctest: +SKIP
    >>> [len(g.layer_names) for g in config.kv_cache_groups]  # doctest: +SKIP
    [23, 23, 23, 29]

    Refuses what :func:`kv_cache_specs` refuses, and ``num_blocks`` below 1."""
    expect("plan", plan, VllmPlan)
    blocks = expect_positive("num_blocks", num_blocks)
    held = plan.stage(expect_int("stage", stage))
    build = _Build(plan, max_model_len)
    merged = build.group_specs()
    tensors = []
    for group in held.groups:
        if group.layers:
            tensors += build.tensors(group, blocks, held.index)
    config = build.v.KVCacheConfig(
        num_blocks=blocks,
        kv_cache_tensors=tensors,
        kv_cache_groups=[build.projected(merged[group.name], group) for group in held.groups],
        prefix_cache_retention_interval=PREFIX_CACHE_RETENTION_INTERVAL,
    )
    config.kv_tp_replicas = build.tp_replicas(held.groups)
    return config


def _vllm(plan: VllmPlan) -> SimpleNamespace:
    """vLLM's classes the objects are built from, once the installed release is the plan's."""
    installed_engine(
        "vllm",
        plan.deployment.version_run,
        "check vLLM's own KVCacheConfig against the plan with check_kv_cache_config",
    )
    import torch  # noqa: PLC0415 - vLLM's own dependency, imported only with it
    from vllm.v1.attention.backend import MultipleOf  # noqa: PLC0415
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum  # noqa: PLC0415
    from vllm.v1.kv_cache_interface import (  # noqa: PLC0415
        CircularBufferSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
        KVQuantMode,
        MambaSpec,
        MLAAttentionSpec,
        SparseCacheRole,
        UniformTypeKVCacheSpecs,
        get_kv_quant_mode,
    )

    return SimpleNamespace(
        torch=torch,
        MultipleOf=MultipleOf,
        MambaAttentionBackendEnum=MambaAttentionBackendEnum,
        CircularBufferSpec=CircularBufferSpec,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        KVCacheTensor=KVCacheTensor,
        KVQuantMode=KVQuantMode,
        MambaSpec=MambaSpec,
        MLAAttentionSpec=MLAAttentionSpec,
        SparseCacheRole=SparseCacheRole,
        UniformTypeKVCacheSpecs=UniformTypeKVCacheSpecs,
        get_kv_quant_mode=get_kv_quant_mode,
    )


def _unbuilt(plan: VllmPlan, what: str, why: str) -> Refusal:
    return Refusal(
        "engine_setting",
        f"{what}: k3layout does not build vLLM's KV-cache objects for it ({why})",
        facts={"engine": "vllm", "field": what, "unmodelled": plan.model.name},
        hint="check the KVCacheConfig vLLM builds against the plan with "
        "k3layout.engines.vllm.check_kv_cache_config",
    )


class _Build:
    """The vLLM objects of one plan (vLLM's classes, the layer names, the KDA block length)."""

    def __init__(self, plan: VllmPlan, max_model_len: int | None) -> None:
        deployment = plan.deployment
        if deployment.replayssm:
            raise _unbuilt(plan, "replayssm", "ATOM's ReplaySSM records are not vLLM's caches")
        self.kda_backend = kda_prefill_backend_of(plan)
        if self.kda_backend not in (None, "triton", "flashkda"):
            raise _unbuilt(
                plan, "kda_prefill_backend", f"{self.kda_backend}: ROCm's KDA checkpoint"
            )
        self.plan = plan
        self.length = (
            default_max_model_len(plan.model)
            if max_model_len is None
            else expect_positive("max_model_len", max_model_len)
        )
        self.v = _vllm(plan)
        self.names = engine_layer_names(plan.model, "vllm")
        self.tp = deployment.attn_tp
        method = deployment.speculative_method or plan.model.drafter
        self.drafts = frozenset(range(plan.model.num_layers, len(plan.model.module_layers)))
        self.method = method if deployment.spec_tokens else None

    def layer_specs(self, layer: int, *, padded: bool = True) -> dict[str, KVCacheSpec]:
        """The caches module ``layer`` registers and their specs, as its worker's
        ``get_kv_cache_spec`` returns them (``padded``: a state page padded to the plan's)."""
        group, _ = self.plan.group_of(layer)
        spec = self.plan.sizes.spec_of(layer)
        name = self.names.name(layer)
        if spec.kind == "kda":
            return {name: self._kda(group, padded)}
        if spec.kind == "mla" and self.plan.packed:
            return indexed_specs(self.plan, self.v, layer, name, layer in self.drafts)
        if spec.kind == "mla" and spec.part_names == ("latent",):
            return {name: self._mla(layer, group)}
        raise _unbuilt(self.plan, f"{spec.kind} layer {layer}", f"parts {spec.part_names}")

    def _mla(self, layer: int, group: Group) -> KVCacheSpec:
        v, deployment = self.v, self.plan.deployment
        latent = self.plan.sizes.spec_of(layer).part("latent")
        *heads, head_size = latent.engine_shape(self.tp)
        cache_dtype = KV_CACHE_DTYPE[deployment.kv_dtype]
        kernel = KERNEL_BLOCK_TOKENS[backend_of(deployment)]
        draft = layer in self.drafts
        spec: KVCacheSpec = v.MLAAttentionSpec(
            block_size=self.plan.tokens_per_page(group),
            num_kv_heads=math.prod(heads),
            max_tp_shards=1 if isinstance(latent.tp, Replicate) else self.tp,
            head_size=head_size,
            dtype=self._dtype(STORED_DTYPES.get(latent.dtype, latent.dtype)),
            cache_dtype_str=cache_dtype,
            kv_quant_mode=v.get_kv_quant_mode(cache_dtype),
            non_causal_multi_token_decode=draft and self.method == "dspark",
            block_stride_alignment=v.MultipleOf(max(kernel)) if kernel else None,
            is_draft=draft,
        )
        return spec

    def _kda(self, group: Group, padded: bool) -> KVCacheSpec:
        v, plan = self.v, self.plan
        deployment = plan.deployment
        parts = plan.group_spec(group).parts
        backend = self.kda_backend
        alignment = release_of(deployment).kda_spec_alignment
        aligned = {} if alignment is None else {"state_alignment": alignment}
        spec: KVCacheSpec = v.MambaSpec(
            block_size=group_block_tokens(plan, group, self.length),
            shapes=tuple(part.engine_shape(self.tp) for part in parts),
            dtypes=tuple(self._dtype(part.dtype) for part in parts),
            page_size_padded=plan.page_bytes if padded else None,
            mamba_type=v.MambaAttentionBackendEnum[KDA_MAMBA_TYPE],
            tp_replicated=all(isinstance(part.tp, Replicate) for part in parts),
            mamba_cache_mode=deployment.mamba_cache_mode_run,
            # vLLM's RecoverSSM verifies off one checkpoint: no block per draft token
            num_speculative_blocks=0 if deployment.use_replayssm else deployment.spec_tokens,
            num_prefill_checkpoint_blocks=prefill_checkpoint_blocks(backend or "triton"),
            prefill_checkpoint_alignment=(
                FLASHKDA_CHECKPOINT_ALIGNMENT if backend == "flashkda" else None
            ),
            block_stride_alignment=alignment,
            **aligned,
        )
        return spec

    def _dtype(self, name: str) -> Any:
        return getattr(self.v.torch, name)

    def group_specs(self) -> dict[str, KVCacheGroupSpec]:
        """vLLM's global groups: each of the plan's groups with the spec vLLM merges from
        its layers' (the spec's own ``merge``, as ``create_kv_cache_group_specs`` does; a
        packed group keeps one spec per cache)."""
        plan = self.plan
        specs: dict[str, KVCacheSpec] = {}
        for layer in range(len(plan.model.module_layers)):
            specs.update(self.layer_specs(layer))
        found: dict[str, KVCacheGroupSpec] = {}
        for group in plan.groups:
            eagle = self.method in EAGLE_BLOCK_DROP_METHODS and any(
                layer in self.drafts for layer in group.layers
            )
            names = self.caches(group)
            if plan.packed:
                found[group.name] = packed_group(self.v, names, specs, eagle)
                continue
            members = [specs[name] for name in names]
            found[group.name] = self.v.KVCacheGroupSpec(
                layer_names=names, kv_cache_spec=members[0].merge(members), is_eagle_group=eagle
            )
        return found

    def caches(self, group: Group) -> list[str]:
        """The names of ``group``'s caches, in vLLM's group order."""
        if self.plan.packed:
            return group_caches(group, self.names.name)
        return [self.names.name(layer) for layer in group.layers]

    def projected(self, merged: KVCacheGroupSpec, group: Group) -> KVCacheGroupSpec:
        """A global group on one stage: itself where the stage holds all its caches, else
        its stage's caches (perhaps none) under the global spec (a packed group's restricted
        to them)."""
        names = self.caches(group)
        if names == merged.layer_names:
            return merged
        spec = merged.kv_cache_spec
        if names and isinstance(spec, self.v.UniformTypeKVCacheSpecs):
            spec = self.v.UniformTypeKVCacheSpecs(
                block_size=spec.block_size,
                kv_cache_specs={name: spec.kv_cache_specs[name] for name in names},
            )
        projected: KVCacheGroupSpec = self.v.KVCacheGroupSpec(
            layer_names=names, kv_cache_spec=spec, is_eagle_group=merged.is_eagle_group
        )
        return projected

    def tensors(self, group: Group, num_blocks: int, stage: int) -> list[Any]:
        """The ``KVCacheTensor``\\ s of ``group``'s layers: plane ``j`` holds its layer ``j``
        (packed: one per run of the block, :func:`.kv_packed.packed_tensors`)."""
        plan = self.plan
        if plan.packed:
            return packed_tensors(
                plan, self.v, group, num_blocks=num_blocks, stage=stage, name_of=self.names.name
            )
        return [
            self.v.KVCacheTensor(
                size=plan.blocks_bytes(num_blocks, stage),
                layers=self.caches(group),
                layer_stride=plan.layer_stride_bytes(num_blocks, stage),
                block_stride=plan.block_stride_bytes(stage),
                offset=plan.page_offset_bytes(group.layers[0], 0, num_blocks, stage),
            )
        ]

    def tp_replicas(self, groups: tuple[Group, ...]) -> int:
        """Consecutive TP ranks holding the same KV for every layer of the stage
        (``kv_tp_replicas``): all of them where every group's cache is replicated over TP
        and DCP splits no tokens, else one."""
        deployment = self.plan.deployment

        def replicas(group: Group) -> int:
            spec = self.plan.group_spec(group)
            replicated = all(isinstance(part.tp, Replicate) for part in spec.parts)
            token = spec.paging == "token"
            return self.tp if token and replicated and deployment.dcp == 1 else 1

        return reduce(math.gcd, (replicas(group) for group in groups), self.tp)
