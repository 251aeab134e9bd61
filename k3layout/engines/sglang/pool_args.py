"""SGLang's own pool constructor arguments, built from a plan: what SGLang 0.5.23's
``KVCacheConfigurator`` passes to ``HybridReqToTokenPool``, its ``MambaPool``,
``HybridLinearKVPool`` and the ``MLATokenToKVPool`` inside it for one rank
(:func:`pool_arguments`).

:func:`~k3layout.engines.sglang.check_pools` reads the pools SGLang allocated against a plan;
this gives the arguments that allocate them, as SGLang's own values (its ``torch`` dtypes, its
``KimiLinearCacheParams``): SGLang is imported when the function is called (``import
k3layout`` imports none of it), and the installed release must be the plan's. The arguments
are the ones the plan decides; what the process decides (``device``,
``enable_memory_saver``, ``max_context_len``, the ``mamba_pool`` instance the KV pool is
given) and what an MLA pool does not read (``head_num``, ``head_dim``) are the caller's.
``tests/conformance/test_conformance_sglang_pool_args.py`` checks every one equal to what SGLang
passes for the same model and flags::

    MLATokenToKVPool    size, page_size, dtype        the token pool, the plan's page, the
                                                      latent's element dtype
                        layer_num, kv_lora_rank, qk_rope_head_dim   the stage's MLA layers
    HybridLinearKVPool  those, full_attention_layer_ids, start_layer, use_mla,
                        full_kv_pool_class, enable_kv_cache_copy (speculative decoding)
    MambaPool           size, spec_state_size         the state pool, the running requests
                        cache_params                  the KDA state's shapes and dtypes (the
                                                      plan's conv and recurrent parts), every
                                                      KDA layer of the model
                        mamba_layer_ids, speculative_num_draft_tokens, speculative_eagle_topk
    HybridReqToTokenPool  size (running requests), mamba_size, mamba_spec_state_size,
                        cache_params, mamba_layer_ids, enable_mamba_extra_buffer (the radix
                        cache), enable_overlap_schedule (one stage), start_layer, and the
                        draft settings

The sizes are the caller's (``plan.capacity(kv_memory_bytes)`` gives SGLang's:
``max_total_num_tokens``, ``max_mamba_cache_size``, ``max_running_requests``). A plan of an
indexed hybrid (GLM-5.3-Flash's DSA pool) is refused (``engine_setting``): its arguments are
not built here yet.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Final

from ..._args import expect, expect_int, expect_positive
from ...errors import Refusal
from ..installed import installed_engine
from .layout import SglangPlan

__all__ = ["pool_arguments"]

EAGLE_TOPK: Final = 1
"""``speculative_eagle_topk`` of a drafting plan: k3layout plans one chain of draft tokens
(SGLang's DSpark and EAGLE defaults)."""


def pool_arguments(
    plan: SglangPlan,
    num_tokens: int,
    num_slots: int,
    max_running_requests: int,
    stage: int = 0,
) -> dict[str, dict[str, Any]]:
    """The arguments SGLang gives each pool of a rank of pipeline stage ``stage``, by the
    pool's class name (``HybridReqToTokenPool``, ``MambaPool``, ``HybridLinearKVPool``,
    ``MLATokenToKVPool``), for a token pool of ``num_tokens`` tokens, a state pool of
    ``num_slots`` slots and ``max_running_requests`` requests (SGLang's ``size`` of each).
    A model without KDA layers has no state pool (no ``MambaPool``, no ``cache_params``).

    >>> from k3layout import Deployment, plan, preset
    >>> p = plan(preset("kimi-k3"), Deployment(engine="sglang", attn_tp=8))
    >>> args = pool_arguments(p, 64, 11, 2)  # doctest: +SKIP
    >>> args["MLATokenToKVPool"]["layer_num"]  # doctest: +SKIP
    24

    Refuses (``version_unsupported``) where SGLang of the plan's release is not installed,
    (``engine_setting``) an indexed hybrid's plan, (``invalid_argument``) sizes below 1."""
    expect("plan", plan, SglangPlan)
    tokens = expect_positive("num_tokens", num_tokens)
    slots = expect_positive("num_slots", num_slots)
    requests = expect_positive("max_running_requests", max_running_requests)
    held = plan.stage(expect_int("stage", stage))
    if plan.model.indexer is not None:
        raise Refusal(
            "engine_setting",
            f"{plan.model.name}: k3layout does not build SGLang's DSA pool arguments yet (an "
            "indexed hybrid's pooled keys and tail)",
            facts={"engine": "sglang", "field": "indexer", "unmodelled": plan.model.name},
            hint="check the pools SGLang allocates against the plan with "
            "k3layout.engines.sglang.check_pools",
        )
    sgl = _sglang(plan)
    deployment = plan.deployment
    target = plan.model.num_layers
    mla = [
        layer
        for group in held.groups_of("attention")
        for layer in group.layers
        if layer < target  # the draft runner builds its own pool
    ]
    kda = [layer for group in held.groups_of("kda") for layer in group.layers]
    start = held.layers[0]
    drafting = deployment.spec_tokens > 0
    draft = {
        "speculative_num_draft_tokens": deployment.spec_tokens + 1 if drafting else None,
        "speculative_eagle_topk": EAGLE_TOPK if drafting else None,
    }
    latent = plan.model.mla_layers[0]
    part = plan.sizes.spec_of(mla[0] if mla else plan.model.attention_layer_ids[0]).parts[0]
    mla_pool = {
        "size": tokens,
        "page_size": plan.page_tokens,
        "dtype": getattr(sgl.torch, part.dtype),
        "kv_lora_rank": latent.kv_lora_rank,
        "qk_rope_head_dim": latent.qk_rope_head_dim,
    }
    arguments: dict[str, dict[str, Any]] = {
        "HybridLinearKVPool": {
            **mla_pool,
            "full_attention_layer_ids": mla,
            "start_layer": start,
            "use_mla": True,
            "full_kv_pool_class": sgl.MLATokenToKVPool,
            "enable_kv_cache_copy": drafting,
        },
        "MLATokenToKVPool": {**mla_pool, "layer_num": len(mla)},
    }
    if not plan.model.kda_layers:
        return arguments
    params = _cache_params(plan, sgl)
    arguments["MambaPool"] = {
        "size": slots,
        "spec_state_size": requests,
        "cache_params": params,
        "mamba_layer_ids": kda,
        **draft,
    }
    arguments["HybridReqToTokenPool"] = {
        "size": requests,
        "mamba_size": slots,
        "mamba_spec_state_size": requests,
        "cache_params": params,
        "mamba_layer_ids": kda,
        # the radix cache tracks states in extra buffers; the overlap scheduler does not run
        # with pipeline stages
        "enable_mamba_extra_buffer": deployment.prefix_caching,
        "enable_overlap_schedule": deployment.pp == 1,
        "start_layer": start,
        **draft,
    }
    return {name: arguments[name] for name in sorted(arguments)}


def _sglang(plan: SglangPlan) -> SimpleNamespace:
    """SGLang's classes the arguments are made of, once the installed release is the plan's."""
    installed_engine(
        "sglang",
        plan.deployment.version_run,
        "check the pools SGLang allocates against the plan with check_pools",
    )
    import torch  # noqa: PLC0415 - SGLang's own dependency, imported only with it
    from sglang.srt.configs.mamba_utils import (  # noqa: PLC0415
        KimiLinearCacheParams,
        KimiLinearStateShape,
        Mamba2StateDType,
    )
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool  # noqa: PLC0415

    return SimpleNamespace(
        torch=torch,
        KimiLinearCacheParams=KimiLinearCacheParams,
        KimiLinearStateShape=KimiLinearStateShape,
        Mamba2StateDType=Mamba2StateDType,
        MLATokenToKVPool=MLATokenToKVPool,
    )


def _cache_params(plan: SglangPlan, sgl: SimpleNamespace) -> Any:
    """SGLang's ``KimiLinearCacheParams``: the plan's KDA state on one rank (the conv state
    time-major, ``(K-1, q|k|v)``; the recurrent state ``(H/tp, D, D)``), for every KDA layer
    of the model (each stage's pool keeps the whole list)."""
    layer = plan.model.kda_layers[0]
    tp = plan.deployment.attn_tp
    spec = plan.sizes.spec_of(plan.model.kda_layer_ids[0])
    conv, recurrent = spec.part("conv"), spec.part("recurrent")
    rows, groups, heads, dim = conv.shape  # (K-1+s, q|k|v, H, D): SGLang keeps it time-major
    shape = sgl.KimiLinearStateShape(
        conv=[conv.engine_shape(tp)],
        temporal=recurrent.engine_shape(tp),
        num_heads=heads,
        head_dim=dim,
        num_k_heads=heads,
        head_k_dim=dim,
        conv_kernel=layer.conv_kernel,
        num_spec=rows - (layer.conv_kernel - 1),
        conv_shard_groups=[heads * dim] * groups,
        num_k_heads_per_tp=recurrent.engine_shape(tp)[0],
    )
    dtype = sgl.Mamba2StateDType(
        conv=getattr(sgl.torch, conv.dtype), temporal=getattr(sgl.torch, recurrent.dtype)
    )
    return sgl.KimiLinearCacheParams(
        shape=shape, dtype=dtype, layers=list(plan.model.kda_layer_ids)
    )
