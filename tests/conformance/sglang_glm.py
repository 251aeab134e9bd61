"""How SGLang 0.5.23 plans GLM-5.3-Flash's KV cache (``model_type: glm5_next``), computed by
SGLang's own code on CPU, without weights, GPUs or process groups (research for issue 31; the
findings are in ``tests/fixtures/glm-5.3-flash/sglang-0.5.23-notes.md``).

A conformance harness like its sibling ``sglang_engine.py``, whose technique and helpers it
reuses (imported, not copied): it imports only SGLang, torch, the standard library and its
sibling harnesses, never ``k3layout``, and reimplements nothing of SGLang. The steps are the
scheduler's:

1. A model directory holding the fixture ``config.json`` (``GLM_CONFIG``), with
   ``text_config.num_nextn_predict_layers`` set when ``mtp_layers`` is given and
   ``config_override`` merged in (nested dicts merge key by key).
2. ``ServerArgs`` for the case, resolved by SGLang's pipeline
   (``runtime_context.publish``) under ``runtime_context.override_platform`` with the GPU's
   facts (``sglang_engine._session``).
3. Each PP stage's ``KVCacheConfigurator`` built as ``ModelRunner.init_kv_cache_configurator``
   builds it and ``_resolve_memory_pool_config`` run with the budget stood in
   (``sglang_engine._StageRun``, including its two passes for PP's MIN over stages).
4. The pools SGLang allocates at the resolved sizes (``KVCacheConfigurator._init_pools``) on the
   ``meta`` device: every tensor's shape, dtype and bytes, none allocated.
5. With speculative NEXTN, the draft runner's pools: its ``ModelConfig``
   (``ModelConfig.from_server_args(..., is_draft_model=True)``, which rewrites the architecture
   to ``Glm5NextForConditionalGenerationNextN``), its own ``KVCacheConfigurator``
   (``is_draft_worker=True``) given the target's ``MemoryPoolConfig``, request pool and
   allocator, as ``EAGLEWorkerV2.alloc_memory_pool`` passes them, then ``_init_pools``.

Stand-ins beyond ``sglang_engine``'s (Triton, torchvision, GPU facts, GPU memory, the budget,
PP's all-reduce):

* ``torch.cuda.get_device_capability`` returns the GPU's ``(major, minor)``: SGLang's DSA
  resolution asks torch directly (``arg_groups/model_hook.py:341``,
  ``arg_groups/overrides.py:512``, ``:581`` and ``:631``), not the runtime context's platform facts,
  and torch's CPU build raises "Torch not compiled with CUDA enabled" there.
* The fixture's ``text_config.architectures`` is ``null``; SGLang's ``Glm5NextConfig`` lets it
  win over the top-level list (``configs/glm5_next.py:308`` and ``:335-337``), so ``ModelConfig``
  fails (``configs/model_config.py:699``: ``TypeError: 'NoneType' object is not
  subscriptable``). ``fix_architectures="both"`` (the default) passes SGLang's own remedy,
  ``--json-model-override-args`` with ``ARCHITECTURES_OVERRIDE`` (the top-level list and the
  text config's): the top-level list alone (``"top"``) starts and sizes the same pools, but the
  model, which asks ``is_deepseek_dsa(text_config)`` (``models/glm5_next.py:1271``), would be
  built without its DSA indexer; ``None`` passes nothing (SGLang refuses).

A case SGLang refuses returns ``{"refused": "<ExceptionType>: message", "where":
"sglang/...py:LINE:function", ...}``.

Entry point::

    plan_glm(gpu="h200", tp=8, kv_dtype="auto", spec_tokens=0, mtp_layers=None, *,
             budget_bytes=40 << 30, mamba_track_interval=None, dp=1, pp=1,
             config_override=None, fix_architectures="both", server_args=None,
             pools=True, draft=True) -> dict
    summary(answer) -> dict (the headline figures, for a table)

``mamba_track_interval=None`` leaves SGLang's default (256), which SGLang refuses for this
model (its page is 1024 tokens); ``mamba_track_interval=1024`` is the smallest that starts.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import sys
import tempfile
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sglang_engine as se
from sglang_platform import SGLANG_VERSION

GIB = 1 << 30
GLM_CONFIG = se.FIXTURES / "glm-5.3-flash" / "config.json"
ARCHITECTURES = ["Glm5NextForConditionalGeneration"]
"""The fixture's top-level architecture, which SGLang's config class loses (module docstring)."""
ARCHITECTURES_OVERRIDE: dict[str, dict[str, Any]] = {
    "both": {"architectures": ARCHITECTURES, "text_config": {"architectures": ARCHITECTURES}},
    "top": {"architectures": ARCHITECTURES},
}
"""``--json-model-override-args`` for ``fix_architectures``: ``"both"`` is the one that starts
the model SGLang sizes for (DSA in the top-level config and in the text config)."""
LAUNCHABLE_OVERRIDE: dict[str, Any] = {"text_config": {"index_kpool_compress": True}}
"""A ``config_override`` SGLang's model constructor needs and the fixture lacks:
``IndexerKPool`` reads ``config.index_kpool_compress`` and asserts it true
(``layers/attention/dsa/dsa_indexer_kpool.py:170-178``). The sizing path reads it with
``getattr(..., False)`` (``configs/model_config.py:541``): with it, the DSA pool also allocates
its per-request kpool tails (``mem_cache/memory_pool.py:5409-5459``)."""
WORKING_TRACK_INTERVAL = 1024
"""The smallest ``--mamba-track-interval`` SGLang starts GLM-5.3-Flash with (a multiple of its
page, 64 x ``index_kpool``)."""
KV_CACHE_DTYPE = {"bf16": "bfloat16", "fp8": "fp8_e4m3"}
"""Short names -> SGLang's ``--kv-cache-dtype`` spelling; SGLang's own spellings pass through."""


# --------------------------------------------------------------------------------------------
# The model directory and the stand-ins this model needs beyond sglang_engine's
# --------------------------------------------------------------------------------------------

_MODEL_DIRS: dict[str, str] = {}


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` merged into a copy of ``base``: nested dicts key by key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def glm_config(
    mtp_layers: int | None = None, config_override: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The fixture's ``config.json`` as the case gives it to SGLang."""
    config: dict[str, Any] = json.loads(GLM_CONFIG.read_text())
    if mtp_layers is not None:
        config["text_config"]["num_nextn_predict_layers"] = mtp_layers
    if config_override:
        config = _merge(config, config_override)
    return config


def glm_model_dir(
    mtp_layers: int | None = None, config_override: dict[str, Any] | None = None
) -> str:
    """A temporary directory holding the case's ``config.json`` (one per distinct config)."""
    text = json.dumps(glm_config(mtp_layers, config_override), indent=1, sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()
    if key not in _MODEL_DIRS:
        directory = tempfile.mkdtemp(prefix="sglang-glm-")
        Path(directory, "config.json").write_text(text)
        _MODEL_DIRS[key] = directory
    return _MODEL_DIRS[key]


@contextlib.contextmanager
def _device_capability(gpu: str) -> Iterator[None]:
    """``torch.cuda.get_device_capability`` answering the GPU's compute capability."""
    from unittest import mock  # noqa: PLC0415

    import torch  # noqa: PLC0415

    capability = tuple(se.GPUS[gpu]["facts"]["device_capability"])
    with mock.patch.object(torch.cuda, "get_device_capability", lambda *a, **k: capability):
        yield


def _where(error: BaseException) -> str:
    """``file:line:function`` of the innermost SGLang frame that raised ("" if none did)."""
    frames = [
        f for f in traceback.extract_tb(error.__traceback__) if "site-packages/sglang" in f.filename
    ]
    if not frames:
        return ""
    frame = frames[-1]
    return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}:{frame.name}"


def _refusal(error: BaseException, stage: str, **extra: Any) -> dict[str, Any]:
    return {
        "refused": f"{type(error).__name__}: {error}",
        "where": _where(error),
        "stage": stage,
        **extra,
    }


# --------------------------------------------------------------------------------------------
# Reports of what SGLang built
# --------------------------------------------------------------------------------------------


def _tensors(buffers: Any) -> list[dict[str, Any]]:
    return [se._tensor(b) for b in buffers]


def _dsa_report(kv: Any) -> dict[str, Any]:
    """The DSA pool (latent + index keys + kpool tails) of a ``HybridLinearKVPool`` (target)
    or a bare ``DSATokenToKVPool`` (draft)."""
    inner = getattr(kv, "full_kv_pool", None) or kv
    latent = _tensors(getattr(inner, "kv_buffer", []))
    out: dict[str, Any] = {
        "class": type(inner).__name__,
        "size": inner.size,
        "page_size": inner.page_size,
        "dtype": se._dtype_name(inner.dtype),
        "store_dtype": se._dtype_name(inner.store_dtype),
        "layer_num": inner.layer_num,
        "start_layer": inner.start_layer,
        "kv_cache_dim": inner.kv_cache_dim,
        "latent": latent,
        "latent_bytes": sum(t["bytes"] for t in latent),
    }
    if hasattr(inner, "index_key_cache"):
        index = _tensors(inner.index_key_cache.buffer)
        out.update(
            index_head_dim=inner.index_head_dim,
            index_kpool=inner.index_kpool,
            index_page_size=inner.index_page_size,
            index_buf_size=inner.index_buf_size,
            skip_topk_layers=list(inner.skip_topk_layers),
            index_k=index,
            index_k_bytes=sum(t["bytes"] for t in index),
            kpool_use_compress=bool(inner.kpool_use_compress),
        )
        tails_k = getattr(inner, "_compress_tail_k", None)
        tails_score = getattr(inner, "_compress_tail_score", None)
        if tails_k is not None:
            k = _tensors(tails_k)
            score = _tensors(tails_score or [])
            out.update(
                compress_tail_k=k,
                compress_tail_score=score,
                compress_tail_bytes=sum(t["bytes"] for t in k + score),
            )
    out["bytes"] = (
        out["latent_bytes"] + out.get("index_k_bytes", 0) + out.get("compress_tail_bytes", 0)
    )
    return out


def _mamba_report(req: Any) -> dict[str, Any] | None:
    mamba = getattr(req, "mamba_pool", None)
    if mamba is None:
        return None
    cache = mamba.mamba_cache
    out: dict[str, Any] = {
        "class": type(mamba).__name__,
        "size": mamba.size,
        "mamba_layer_ids": list(mamba.mamba_layer_ids),
        "conv": _tensors(cache.conv),
        "temporal": se._tensor(cache.temporal),
        "bytes": int(cache.mem_usage_bytes()),
    }
    for name in ("intermediate_ssm", "intermediate_conv_window"):
        value = getattr(cache, name, None)
        if isinstance(value, (list, tuple)):
            out[name] = _tensors(value)
        elif value is not None:
            out[name] = se._tensor(value)
    slots = out["size"] + 1
    out["bytes_per_slot"] = (
        sum(c["bytes"] for c in out["conv"]) + out["temporal"]["bytes"]
    ) // slots
    return out


def _pools_report(pools: Any) -> dict[str, Any]:
    req = pools.req_to_token_pool
    out: dict[str, Any] = {
        "req_to_token_pool": {
            "class": type(req).__name__,
            "size": req.size,
            "req_to_token": se._tensor(req.req_to_token),
        },
        "token_to_kv_pool_class": type(pools.token_to_kv_pool).__name__,
        "kv": _dsa_report(pools.token_to_kv_pool),
        "allocator": {
            "class": type(pools.token_to_kv_pool_allocator).__name__,
            "size": pools.token_to_kv_pool_allocator.size,
            "page_size": pools.token_to_kv_pool_allocator.page_size,
        },
    }
    mamba = _mamba_report(req)
    if mamba is not None:
        out["mamba_pool"] = mamba
    return out


# --------------------------------------------------------------------------------------------
# The draft (NEXTN) runner's pools
# --------------------------------------------------------------------------------------------


def _draft_pools(s: types.SimpleNamespace, sa: Any, target: Any, config: Any, built: Any) -> Any:
    """The NEXTN draft runner's configurator and pools, built on the target's request pool
    and allocator as ``EAGLEWorkerV2.alloc_memory_pool`` hands them over."""
    rc = s.rc
    spec = rc.get_spec()
    model_config = s.mc.ModelConfig.from_server_args(
        sa,
        model_path=spec.speculative_draft_model_path,
        model_revision=spec.speculative_draft_model_revision,
        is_draft_model=True,
    )
    algorithm = target.spec_algorithm
    dtype_str, kv_dtype = s.kv_cache_dtype.configure_kv_cache_dtype(
        server_args_kv_cache_dtype=rc.get_model().kv_cache_dtype,
        model=None,
        model_dtype=model_config.dtype,
        is_draft_worker=True,
        is_dflash=algorithm.is_dflash_family(),
        speculative_draft_attention_backend=spec.speculative_draft_attention_backend,
        speculative_draft_kv_cache_dtype=spec.speculative_draft_kv_cache_dtype,
    )
    # The draft model (DeepseekV3ForCausalLMNextN) declares no PP range: resolve_layer_indices
    # then spans its num_nextn_predict_layers.
    model = types.SimpleNamespace()
    layer_info = s.layer_setup.resolve_layer_indices(
        model=model, model_config=model_config, is_draft_worker=True
    )
    aux = s.spec_aux.resolve_spec_aux_hidden_state_config(
        server_args=sa, model_config=model_config, spec_algorithm=algorithm, is_draft_worker=True
    )
    kvc = s.kvc.KVCacheConfigurator(
        device="meta",
        gpu_id=0,
        attn_dp_size=rc.get_parallel().attn_dp_size,
        pp_size=1,  # draft_pp_context: the draft never spans stages
        pp_group=types.SimpleNamespace(
            world_size=1, rank_in_group=0, cpu_group=None, is_first_rank=True, is_last_rank=True
        ),
        model=model,
        model_config=model_config,
        server_args=sa,
        kv_cache_dtype=kv_dtype,
        kv_cache_dtype_str=dtype_str or rc.get_model().kv_cache_dtype,
        model_dtype=model_config.dtype,
        page_size=rc.get_schedule().page_size,
        sliding_window_size=None,
        spec_algorithm=algorithm,
        is_draft_worker=True,
        post_capture_kv_active=s.kv_pool_runtime.is_post_capture_kv_active(
            server_args=sa,
            is_draft_worker=True,
            spec_algorithm=algorithm,
            token_to_kv_pool_allocator=built.token_to_kv_pool_allocator,
        ),
        spec_aux_config=aux,
        draft_parallel_layout=None,
        is_hybrid_swa=model_config.is_hybrid_swa,
        is_hybrid_swa_compress=model_config.is_hybrid_swa_compress,
        use_mla_backend=model_config.attention_arch == s.mc.AttentionArch.MLA,
        layer_info=layer_info,
        forward_stream=None,
        req_to_token_pool=built.req_to_token_pool,
        token_to_kv_pool_allocator=built.token_to_kv_pool_allocator,
        memory_pool_config=config,
        draft_model_idx=None,
    )
    sizes = kvc._derive_pool_sizes(config=config)
    pools = kvc._init_pools(
        sizes=sizes,
        req_to_token_pool=built.req_to_token_pool,
        token_to_kv_pool_allocator=built.token_to_kv_pool_allocator,
    )
    text = model_config.hf_text_config
    return {
        "architecture": model_config.hf_config.architectures[0],
        "num_nextn_predict_layers": model_config.num_nextn_predict_layers,
        "is_mambaish": kvc.mambaish_config is not None,
        "kv_cache_dtype": se._dtype_name(kv_dtype),
        "start_layer": layer_info.start_layer,
        "end_layer": layer_info.end_layer,
        "num_effective_layers": layer_info.num_effective_layers,
        "text_linear_attn_config": getattr(text, "linear_attn_config", None),
        "shares_req_to_token_pool": pools.req_to_token_pool is built.req_to_token_pool,
        "shares_allocator": pools.token_to_kv_pool_allocator is built.token_to_kv_pool_allocator,
        "token_to_kv_pool_class": type(pools.token_to_kv_pool).__name__,
        "kv": _dsa_report(pools.token_to_kv_pool),
    }


# --------------------------------------------------------------------------------------------
# A case
# --------------------------------------------------------------------------------------------


def _resolved_extra(s: types.SimpleNamespace, sa: Any) -> dict[str, Any]:
    """Resolved fields beyond ``sglang_engine._resolved``'s that this model's plan reads."""
    rc = s.rc
    cfg = sa.resolved_dict()
    ex = rc.get_exec()
    model_config = s.mc.ModelConfig.from_server_args(sa)
    text = model_config.hf_text_config
    return {
        "architectures": model_config.hf_config.architectures,
        "text_architectures": text.architectures,
        # What the model constructor asks (models/glm5_next.py:1271, deepseek_v2.py:2052).
        "model_uses_dsa": bool(s.mc.is_deepseek_dsa(text)),
        "text_index_kpool_compress": getattr(text, "index_kpool_compress", None),
        "num_nextn_predict_layers": model_config.num_nextn_predict_layers,
        "model_dtype": se._dtype_name(model_config.dtype),
        "dsa_prefill_backend": cfg.get("dsa_prefill_backend"),
        "dsa_decode_backend": cfg.get("dsa_decode_backend"),
        "mamba_track_interval": cfg.get("mamba_track_interval"),
        "linear_attn_backend": cfg.get("linear_attn_backend"),
        "linear_attn_verify_backend": cfg.get("linear_attn_verify_backend"),
        "enable_mamba_extra_buffer_lazy": bool(ex.mamba.enable_mamba_extra_buffer_lazy),
        "speculative_draft_model_path": rc.get_spec().speculative_draft_model_path,
        "dp_size": rc.get_parallel().dp_size,
        "tp_size": rc.get_parallel().tp_size,
    }


def _nextn(spec_tokens: int) -> dict[str, Any] | None:
    """The NEXTN flags of ``spec_tokens`` draft tokens a step (``None``: no drafting)."""
    if not spec_tokens:
        return None
    return {
        "algorithm": "NEXTN",
        "num_steps": spec_tokens,
        "eagle_topk": 1,
        "num_draft_tokens": spec_tokens + 1,
    }


def plan_glm(
    gpu: str = "h200",
    tp: int = 8,
    kv_dtype: str = "auto",
    spec_tokens: int = 0,
    mtp_layers: int | None = None,
    *,
    budget_bytes: int = 40 << 30,
    mamba_track_interval: int | None = None,
    dp: int = 1,
    pp: int = 1,
    config_override: dict[str, Any] | None = None,
    fix_architectures: str | None = "both",
    server_args: dict[str, Any] | None = None,
    pools: bool = True,
    draft: bool = True,
    objects: bool = False,
) -> dict[str, Any]:
    """SGLang 0.5.23's plan of GLM-5.3-Flash's KV cache for one launch, as plain JSON values.

    Arguments (each is the SGLang flag named, on the fixture ``GLM_CONFIG``):

    * ``gpu``: a ``sglang_engine.GPUS`` key (``h100``, ``h200``: SM90; ``b200``: SM100).
    * ``tp``: ``--tp-size``. ``dp`` > 1: ``--dp-size dp --enable-dp-attention`` (attention TP is
      then ``tp // dp``). ``pp``: ``--pp-size``.
    * ``kv_dtype``: ``--kv-cache-dtype``: ``auto``, ``bf16``/``bfloat16``, ``fp8``/``fp8_e4m3``
      or any other SGLang spelling (``KV_CACHE_DTYPE``).
    * ``spec_tokens`` > 0: ``--speculative-algorithm NEXTN --speculative-num-steps N
      --speculative-eagle-topk 1 --speculative-num-draft-tokens N+1``.
    * ``mtp_layers``: ``text_config.num_nextn_predict_layers`` written into the config
      (``None``: absent, as in the fixture; SGLang's config class then defaults it to 1).
    * ``budget_bytes``: what ``KVCacheConfigurator`` divides: the free GPU memory it measures
      after the weights, before its multimodal reservation and the mamba pool.
    * ``mamba_track_interval``: ``--mamba-track-interval`` (``None``: SGLang's default, 256,
      which SGLang refuses for this model).
    * ``config_override``: merged into the config, nested dicts key by key (e.g.
      ``LAUNCHABLE_OVERRIDE``, or ``{"text_config": {"indexer_types": [...]}}``).
    * ``fix_architectures``: ``"both"`` (default), ``"top"`` or ``None``: which
      ``ARCHITECTURES_OVERRIDE`` goes to ``--json-model-override-args`` (module docstring).
    * ``server_args``: further ``ServerArgs`` fields, e.g. ``{"max_running_requests": 256}``
      (they win over the fields above, ``json_model_override_args`` included).
    * ``pools``: build the pools on the meta device and report their tensors; ``draft``: with
      NEXTN, also the draft runner's pools (on the last PP stage, which alone loads the draft).
    * ``objects``: also return SGLang's own objects under ``"objects"`` (``server_args``, and
      per stage its ``ModelConfig`` and built pools), for the bridges.

    Returns ``case`` (the arguments), the resolved flags (``sglang_engine._resolved`` plus the
    DSA backends, the track interval, the architectures the model sees, ...), ``cell_size``
    (bytes per token the configurator budgets), ``max_total_num_tokens``,
    ``max_running_requests`` (per attention-DP worker), ``max_mamba_cache_size``,
    ``mamba_ratio``, and ``stages``: per PP stage the layer split, the same figures, the mamba
    state shapes and, with ``pools``, ``pools`` (``req_to_token_pool``, ``kv`` = the DSA pool's
    latent / index-key / kpool-tail tensors, ``mamba_pool``, ``allocator``) and ``draft``. Token
    and request counts at the top level are the MIN over stages. A case SGLang refuses returns
    ``{"case", "refused": "<ExceptionType>: message", "where": "sglang/...py:LINE:function",
    "stage": "resolution" | "sizing"}``.
    """
    extra: dict[str, Any] = {}
    if fix_architectures is not None:
        extra["json_model_override_args"] = json.dumps(ARCHITECTURES_OVERRIDE[fix_architectures])
    if mamba_track_interval is not None:
        extra["mamba_track_interval"] = mamba_track_interval
    extra.update(server_args or {})
    spec = _nextn(spec_tokens)
    model_dir = glm_model_dir(mtp_layers, config_override)
    case = {
        "gpu": gpu,
        "tp": tp,
        "dp": dp,
        "pp": pp,
        "kv_dtype": kv_dtype,
        "spec_tokens": spec_tokens,
        "mtp_layers": mtp_layers,
        "budget_bytes": budget_bytes,
        "mamba_track_interval": mamba_track_interval,
    }
    with se._session(gpu) as s, _device_capability(gpu):
        try:
            sa = se._server_args(
                s,
                model_dir,
                tp=tp,
                dp=dp,
                enable_dp_attention=dp > 1,
                pp=pp,
                dcp=1,
                kv_dtype=KV_CACHE_DTYPE.get(kv_dtype, kv_dtype),
                spec=spec,
                max_running_requests=None,
                mamba_full_memory_ratio=None,
                max_mamba_cache_size=None,
                extra=extra,
            )
            s.rc.publish(sa, role="scheduler", ranks=s.rc.SpawnRanks(world_rank=0, gpu_id=0))
        except Exception as error:  # SGLang's resolution refused the flags
            if not _where(error):
                raise
            return {"case": case, **_refusal(error, "resolution")}
        resolved = {**se._resolved(s, sa), **_resolved_extra(s, sa)}
        pp_size = s.rc.get_parallel().pp_size
        stages: list[dict[str, Any]] = []
        built_stages: list[tuple[Any, Any]] = []
        try:
            contributions: list[int] = []
            for rank in range(pp_size):
                run = se._StageRun(s, sa, pp_rank=rank, device="meta")
                run.resolve(budget_bytes, reduce_min=None)
                contributions.extend(run.contributed)
            floor = min(contributions) if contributions else None
            for rank in range(pp_size):
                run = se._StageRun(s, sa, pp_rank=rank, device="meta")
                config = run.resolve(budget_bytes, reduce_min=floor if pp_size > 1 else None)
                stage = se._stage_report(run, config, pools=False)
                stage["kv_cache_dtype_str"] = run.kv_cache_dtype_str
                stage["eagle_draft_num_layers"] = run.kvc.spec_aux_config.eagle_draft_num_layers
                if pools:
                    built = se._init_pools(
                        run,
                        max_total_num_tokens=config.max_total_num_tokens,
                        max_running_requests=config.max_running_requests,
                    )
                    stage["pools"] = _pools_report(built)
                    built_stages.append((run.model_config, built))
                    if spec and draft and rank == pp_size - 1:
                        stage["draft"] = _draft_pools(s, sa, run, config, built)
                stages.append(stage)
        except Exception as error:  # SGLang's sizing refused the case
            if not _where(error):
                raise
            return {
                "case": case,
                **_refusal(error, "sizing"),
                "resolved": se._jsonable(resolved),
            }
    first = stages[0]
    result: dict[str, Any] = {
        "sglang_version": SGLANG_VERSION,
        "case": case,
        **resolved,
        "cell_size": first["cell_size"],
        "max_total_num_tokens": min(st["max_total_num_tokens"] for st in stages),
        "max_running_requests": min(st["max_running_requests"] for st in stages),
        "stages": stages,
    }
    if "max_mamba_cache_size" in first:
        result["max_mamba_cache_size"] = min(st["max_mamba_cache_size"] for st in stages)
        result["mamba_ratio"] = first["mamba_ratio"]
    answer: dict[str, Any] = se._jsonable(result)
    if objects:
        answer["objects"] = {"server_args": sa, "stages": built_stages}
    return answer


def summary(answer: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a :func:`plan_glm` answer (or its refusal), for a table."""
    if "refused" in answer:
        return {"refused": answer["refused"], "where": answer["where"]}
    stage = answer["stages"][0]
    out: dict[str, Any] = {
        key: answer.get(key)
        for key in (
            "attention_backend",
            "dsa_prefill_backend",
            "dsa_decode_backend",
            "kv_cache_dtype",
            "kv_cache_torch_dtype",
            "page_size",
            "mamba_radix_cache_strategy",
            "mamba_track_interval",
            "attn_tp_size",
            "attn_dp_size",
            "cell_size",
            "max_total_num_tokens",
            "max_running_requests",
            "max_mamba_cache_size",
            "mamba_ratio",
        )
    }
    pools = stage.get("pools")
    if pools:
        kv = pools["kv"]
        out["latent_row"] = [*kv["latent"][0]["shape"][1:], kv["latent"][0]["dtype"]]
        out["latent_bytes"] = kv["latent_bytes"]
        out["index_k_bytes"] = kv.get("index_k_bytes")
        out["index_k_row_bytes_per_page"] = (
            kv["index_k"][0]["shape"][1] if kv.get("index_k") else None
        )
        out["compress_tail_bytes"] = kv.get("compress_tail_bytes")
        out["mamba_bytes"] = pools.get("mamba_pool", {}).get("bytes")
        out["mamba_bytes_per_slot"] = pools.get("mamba_pool", {}).get("bytes_per_slot")
    if "draft" in stage:
        out["draft_kv_bytes"] = stage["draft"]["kv"]["bytes"]
    return out


if __name__ == "__main__":  # a quick look: python sglang_glm.py
    os.environ.setdefault("SGLANG_LOG_LEVEL", "error")
    for kwargs in (
        dict(gpu="h200", tp=8, kv_dtype="auto"),
        dict(gpu="h200", tp=8, kv_dtype="auto", mamba_track_interval=WORKING_TRACK_INTERVAL),
        dict(gpu="b200", tp=8, kv_dtype="auto", mamba_track_interval=WORKING_TRACK_INTERVAL),
        dict(
            gpu="h200",
            tp=8,
            kv_dtype="fp8",
            spec_tokens=2,
            mtp_layers=1,
            mamba_track_interval=WORKING_TRACK_INTERVAL,
        ),
    ):
        print(kwargs, json.dumps(summary(plan_glm(**kwargs))), file=sys.stdout)  # type: ignore[arg-type]
