"""The weights one SGLang 0.5.23 rank holds for GLM-5.3-Flash, from SGLang's own classes on
``meta``.

:func:`glm_weights` builds ``Glm5NextForConditionalGeneration`` (and, with ``nextn``, the NEXTN
draft ``Glm5NextForConditionalGenerationNextN``) for rank 0 of every pipeline stage with
:func:`sglang_weights.sglang_weights` (the Kimi harness: ``ServerArgs`` resolved under the GPU's
platform facts, SGLang's own rank bundle, stand-in process groups, ``_initialize_model`` under
``torch.device("meta")``), then returns every parameter and buffer with its per-rank shape,
dtype and bytes, grouped by module category (:data:`CATEGORIES`, the categories of the vLLM
sibling ``vllm_glm_weights.py``, so the two answers compare key by key). Where SGLang refuses,
the answer is ``{"refused": "<type>: <message>", "at": "sglang/<file>:<line>:<function>"}``.
Nothing of SGLang is copied; every shape is what SGLang's code declares. Research notes:
``tests/fixtures/glm-5.3-flash/sglang-0.5.23-weights-notes.md``.

Config. The model directory is ``sglang_glm.glm_model_dir``'s (the fixture, ``config_override``
merged in), with ``--json-model-override-args`` naming the architecture at both levels
(``sglang_glm.ARCHITECTURES_OVERRIDE["both"]``: the fixture's ``text_config.architectures`` is
``null``, which SGLang's config class lets win) and ``--mamba-track-interval 1024``
(``sglang_glm.WORKING_TRACK_INTERVAL``: SGLang refuses its default 256 for this model at server
argument resolution; a KV-cache setting, no weight depends on it). Unless
``engine_fields=False`` the text config gets :data:`ENGINE_FIELDS` (``config_override`` wins):

* ``index_kpool_compress: true``: ``IndexerKPool`` asserts it; without it SGLang refuses.
* ``mhc: true``: SGLang's ``Glm5NextTextConfig`` defaults ``mhc`` to false, which silently
  builds the model without its hyper-connection parameters (and sizes it without the
  ``hc_mult`` residual streams); the fixture does not say, vLLM and transformers run them.

The other three fields vLLM needs (``mla_use_nope``, ``topk_method``, ``scoring_func``,
``indexer_rope_interleave``) SGLang either never reads (its GLM layers pass ``skip_rope=True``)
or defaults to the values the vLLM harness chooses; adding them changes nothing (the notes).

``--dtype bfloat16`` is passed (``dtype``): the fixture's ``dtype`` is ``null``, for which
SGLang's ``auto`` picks float16 (same bytes, another dtype name).

Stand-ins, on top of :mod:`sglang_weights`' (Triton / torchvision stubs, GPU facts through
``runtime_context.override_platform``, ``_is_cuda`` import-time constants, stand-in groups,
inert CUDA streams; see its docstring), each restored on exit, none changing a declared
shape by itself:

* **Import-time SM**: modules holding ``_device_sm = get_device_sm()`` computed it as 0 on this
  CPU box; they answer the GPU's SM (90 / 100). GLM's shared-expert fusion gate reads it
  (``models/glm5_next.py:1377-1379``): left at 0 it reports "requires SM80" and keeps the shared
  expert apart, where an H200 fuses it into the routed experts (one more expert).
* **GLM's model modules are imported before the CUDA scope** (``sglang_weights`` imports only the
  Kimi ones), so their ``_is_cuda`` / ``_device_sm`` constants are among those answered.
* **The NEXTN draft** is built as ``EAGLEWorkerV2.__init__`` builds it (on the last PP stage,
  after the target): ``sglang_weights._build``'s draft path (``draft_tp_context`` from
  SGLang's own ``resolve_draft_parallel_layout``, a one-rank PP group) inside SGLang's
  ``speculative_moe_backend_context``, ``speculative_moe_a2a_backend_context`` and
  ``draft_model_build_scope`` (the draft's MoE is built with the speculative MoE backends and
  flagged as a draft). ``sglang_weights._build`` and ``._inventory`` are wrapped for the call
  (the built models are kept for the categories, unregistered tensors and backends).

Entry point::

    glm_weights(tp, ep=False, dp=1, pp=1, nextn=0, config_override=None, *, gpu="h200",
                engine_fields=True, mtp_layers=None, language_only=False, dtype="bfloat16",
                server_args=None) -> dict

A build takes ~1-3 s after the one-time import of SGLang (~8 s).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import sys
import traceback
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import sglang_engine
import sglang_glm
import sglang_weights
from glm_categories import CATEGORIES, category, totals
from sglang_engine import GPUS
from sglang_platform import SGLANG_VERSION

__all__ = [
    "CATEGORIES",
    "ENGINE_FIELDS",
    "category",
    "draft_part",
    "glm_weights",
    "kinds",
    "shared_draft_parts",
    "summary",
]

ENGINE_FIELDS: dict[str, Any] = {
    "text_config": {
        "index_kpool_compress": True,  # IndexerKPool asserts it (the fixture lacks it)
        "mhc": True,  # SGLang's config defaults it to False: no hyper-connections
    }
}
"""Text-config fields SGLang's GLM constructor needs (or silently defaults) that the fixture
lacks (module docstring)."""


def draft_part(name: str) -> str:
    """The draft tensor's category by the target's rules (its ``model.decoder`` is an MLA +
    indexer + MoE layer), ``embedding`` / ``lm_head`` for the draft's own copies (replaced by the
    target's), or ``mtp_head`` for the NEXTN layer's fusion and head norms."""
    if name.startswith("model.decoder."):
        return category(f"layers.0.{name.removeprefix('model.decoder.')}", frozenset())
    if ".embed_tokens." in f".{name}":
        return "embedding"
    if name.startswith("lm_head."):
        return "lm_head"
    return "mtp_head"


def shared_draft_parts(target: dict[str, dict[str, Any]]) -> frozenset[str]:
    """The draft parts the NEXTN worker replaces by the target's tensors after loading
    (``EAGLEWorkerV2.init_lm_head`` -> ``set_embed_and_head``, ``models/deepseek_v2.py:3442-3448``):
    the LM head, and the embedding where the target's stage holds one (``target``: its table).
    A last PP stage has none: SGLang loads the draft's own embedding from the checkpoint
    (``speculative/pp_draft_embedding.py:251-264``), so it stays the draft's."""
    has_embedding = any(info["category"] == "embedding" for info in target.values())
    return frozenset({"lm_head", "embedding"} if has_embedding else {"lm_head"})


# ---------------------------------------------------------------------------------------
# the stand-ins (module docstring)

_GLM_MODULES = (
    "sglang.srt.models.glm5_next",
    "sglang.srt.models.glm5_next_nextn",
    "sglang.srt.models.deepseek_nextn",
    "sglang.srt.layers.attention.dsa.dsa_indexer_kpool",
)


def _import_glm() -> None:
    """SGLang's modules, the Kimi harness's and GLM's, imported before any CUDA scope."""
    sglang_engine._sgl()
    sglang_weights._import_models()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _GLM_MODULES:
            importlib.import_module(name)


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name = value`` for the block."""
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


@contextlib.contextmanager
def _device_sm(gpu: str) -> Iterator[None]:
    """Import-time ``_device_sm`` constants that came out 0 on this CPU box answer the GPU's."""
    sm = int(GPUS[gpu]["facts"]["device_sm"])
    with contextlib.ExitStack() as stack:
        for name, module in list(sys.modules.items()):
            if name.startswith("sglang.") and module and module.__dict__.get("_device_sm") == 0:
                stack.enter_context(_patched(module, "_device_sm", sm))
        yield


def _where(error: BaseException) -> str:
    """``sglang/<file>:<line>:<function>`` of the innermost SGLang frame ("" if none)."""
    return sglang_glm._where(error)


def _trace(error: BaseException) -> list[str]:
    """The SGLang frames ``error`` went through (``file:line``), innermost last."""
    frames = traceback.extract_tb(error.__traceback__)
    return [
        f"{f.filename.split('site-packages/', 1)[1]}:{f.lineno}"
        for f in frames
        if "site-packages/sglang/" in f.filename
    ]


class _Run:
    """What one :func:`sglang_weights.sglang_weights` call built, recorded by the wrappers."""

    def __init__(self, want_draft: bool) -> None:
        self.want_draft = want_draft
        self.models: list[Any] = []
        self.resolved: dict[str, Any] = {}
        self.draft: dict[str, Any] | None = None
        self.draft_error: BaseException | None = None
        self.error: BaseException | None = None


_K3_BUILD = sglang_weights._build
_K3_INVENTORY = sglang_weights._inventory

_RESOLVED = (
    "dtype",
    "attention_backend",
    "moe_runner_backend",
    "moe_a2a_backend",
    "speculative_moe_runner_backend",
    "speculative_moe_a2a_backend",
    "disable_shared_experts_fusion",
    "enable_dp_lm_head",
    "moe_dense_tp_size",
    "mm_enable_dp_encoder",
    "ep_size",
    "dsa_prefill_backend",
    "dsa_decode_backend",
    "linear_attn_backend",
    "speculative_algorithm",
    "speculative_draft_model_path",
)


@contextlib.contextmanager
def _recording(run: _Run) -> Iterator[None]:
    """``sglang_weights._build`` / ``._inventory`` / ``._where`` wrapped for one call: the
    models kept, the NEXTN draft built after the target (module docstring)."""

    def inventory(model: Any) -> dict[str, Any]:
        run.models.append(model)
        answer: dict[str, Any] = _K3_INVENTORY(model)
        return answer

    def where(error: BaseException) -> str:
        run.error = error
        return _where(error)

    def build(
        s: types.SimpleNamespace, sa: Any, *, draft: bool, quantization: Any
    ) -> dict[str, Any]:
        resolved = sa.resolved_dict()
        run.resolved = {k: resolved.get(k) for k in _RESOLVED}
        target: dict[str, Any] = _K3_BUILD(s, sa, draft=False, quantization=quantization)
        if run.want_draft:
            from sglang.srt.layers.moe.utils import (  # noqa: PLC0415
                draft_model_build_scope,
                speculative_moe_a2a_backend_context,
                speculative_moe_backend_context,
            )

            try:
                with (
                    speculative_moe_backend_context(),
                    speculative_moe_a2a_backend_context(),
                    draft_model_build_scope(),
                ):
                    run.draft = _K3_BUILD(s, sa, draft=True, quantization=quantization)
            except Exception as error:  # SGLang refused the draft: the stage answer says so
                if not _where(error):
                    raise
                run.draft_error = error
        return target

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(sglang_weights, "_inventory", inventory))
        stack.enter_context(_patched(sglang_weights, "_build", build))
        stack.enter_context(_patched(sglang_weights, "_where", where))
        yield


# ---------------------------------------------------------------------------------------
# reports of what SGLang built


def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _owner(model: Any, name: str) -> Any:
    return model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model


def _table(model: Any, kda: frozenset[int], draft: bool) -> dict[str, dict[str, Any]]:
    """Every parameter and buffer of ``model``: per-rank shape, dtype, bytes, category."""
    table: dict[str, dict[str, Any]] = {}
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in named:
            owner = _owner(model, name)
            leaf = name.rsplit(".", 1)[-1]
            persistent = kind == "parameter" or leaf not in getattr(
                owner, "_non_persistent_buffers_set", set()
            )
            table[name] = {
                "shape": list(t.shape),
                "dtype": _dtype(t.dtype),
                "bytes": t.numel() * t.element_size(),
                "kind": kind,
                "persistent": persistent,
                "device": t.device.type,
                "module": type(owner).__name__,
                "category": category(name, kda, draft),
                **({"part": draft_part(name)} if draft else {}),
            }
    return table


def _unregistered(model: Any) -> dict[str, dict[str, Any]]:
    """Non-empty tensors modules hold as plain attributes (not parameters or buffers, so not
    in the totals)."""
    import torch  # noqa: PLC0415

    seen: set[int] = set()
    found: dict[str, dict[str, Any]] = {}
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if not isinstance(value, torch.Tensor) or isinstance(value, torch.nn.Parameter):
                continue
            # a view (``_base`` set) shares a registered tensor's storage, e.g. the KDA
            # ``attn.conv_weights``, ``qkv_conv1d.weight`` squeezed
            if value.numel() == 0 or id(value) in seen or value._base is not None:
                continue
            seen.add(id(value))
            found[f"{prefix}.{attr}" if prefix else attr] = {
                "shape": list(value.shape),
                "dtype": _dtype(value.dtype),
                "bytes": value.numel() * value.element_size(),
                "device": value.device.type,
            }
    return found


def _backends(model: Any) -> dict[str, Any]:
    """What SGLang chose at construction that can decide shapes (MoE runner and padding,
    shared-expert fusion, the KDA projection fusion, the vision tower's DP mode)."""
    chosen: dict[str, Any] = {}
    for _, module in model.named_modules():
        name = type(module).__name__
        if hasattr(module, "w13_weight") and "moe" not in chosen:
            chosen["moe"] = str(getattr(module, "runner_backend", None))
            chosen["moe_class"] = name
            chosen["moe_quant_method"] = type(module.quant_method).__name__
            chosen["moe_intermediate_per_rank"] = module.intermediate_size_per_partition
            chosen["moe_local_experts"] = module.num_local_experts
            chosen["moe_num_experts"] = module.num_experts
            chosen["num_fused_shared_experts"] = module.num_fused_shared_experts
        elif name == "Glm5NextLinearAttention" and "kda_fused_qkvbfg" not in chosen:
            chosen["kda_fused_qkvbfg"] = bool(module.do_fuse_qkvbfg)
            chosen["kda_fused_bfg"] = bool(module.fuse_bfg)
        elif name == "Glm5NextVisionModel" and "vit_data_parallel" not in chosen:
            chosen["vit_data_parallel"] = bool(module.use_data_parallel)
        elif name in ("IndexerKPool", "Indexer") and "indexer" not in chosen:
            chosen["indexer"] = name
    return chosen


def _fused_shared_expert_bytes(model: Any) -> int:
    """Bytes of the shared-expert slots SGLang fused into the routed experts (counted in
    ``routed_experts``; what vLLM keeps in ``shared_experts``)."""
    total = 0
    for _, module in model.named_modules():
        fused = getattr(module, "num_fused_shared_experts", 0)
        if hasattr(module, "w13_weight") and fused:
            for name in ("w13_weight", "w2_weight"):
                t = getattr(module, name)
                total += t.numel() * t.element_size() * fused // t.shape[0]
    return total


def _kda_layers(config: dict[str, Any]) -> frozenset[int]:
    """The KDA layers (SGLang's rule, ``configs/glm5_next.py:198-225``: ``layer_types[i] ==
    "linear_attention"``, else every layer ``i % 4 != 3``)."""
    text = config.get("text_config", config)
    kinds = text.get("layer_types")
    if kinds is None:
        return frozenset(i for i in range(text.get("num_hidden_layers", 45)) if i % 4 != 3)
    return frozenset(i for i, kind in enumerate(kinds) if kind == "linear_attention")


def _stage(built: dict[str, Any], run: _Run, kda: frozenset[int], pp_rank: int) -> dict[str, Any]:
    """One stage's answer: tensors, totals by category, what SGLang chose."""
    model = run.models[0]
    target = _table(model, kda, draft=False)
    draft_model = run.models[1] if len(run.models) > 1 else None
    draft = _table(draft_model, kda, draft=True) if draft_model is not None else {}
    shared = shared_draft_parts(target)
    own = {n: i for n, i in draft.items() if i["part"] not in shared}
    categories = totals(target)
    fused = _fused_shared_expert_bytes(model)
    if draft:
        categories["mtp"] = sum(info["bytes"] for info in own.values())
    both = [*target.values(), *own.values()]
    stage: dict[str, Any] = {
        "pp_rank": pp_rank,
        "model_class": built["model_class"],
        "draft_class": run.draft["model_class"] if run.draft else None,
        "model_dtype": built["model_dtype"],
        "parallel": built["parallel"],
        "start_layer": built.get("start_layer"),
        "end_layer": built.get("end_layer"),
        "categories": categories,
        "fused_shared_expert_bytes": fused,
        "draft_parts": totals(own, "part") if own else {},
        "total_bytes": sum(i["bytes"] for i in both),
        "target_bytes": sum(i["bytes"] for i in target.values()),
        "draft_bytes": sum(i["bytes"] for i in own.values()),
        "draft_replaced_bytes": sum(i["bytes"] for i in draft.values() if i["part"] in shared),
        "parameter_bytes": sum(i["bytes"] for i in both if i["kind"] == "parameter"),
        "buffer_bytes": sum(i["bytes"] for i in both if i["kind"] == "buffer"),
        "non_persistent_buffer_bytes": sum(
            i["bytes"] for i in both if i["kind"] == "buffer" and not i["persistent"]
        ),
        "tensors": target,
        "draft_tensors": draft,
        "shared": [n for n, i in draft.items() if i["part"] in shared],
        "unregistered": _unregistered(model),
        "draft_unregistered": _unregistered(draft_model) if draft_model is not None else {},
        "backends": _backends(model),
        "draft_backends": _backends(draft_model) if draft_model is not None else {},
        "resolved": run.resolved,
    }
    if run.draft is not None:
        stage["draft_layout"] = run.draft.get("draft_layout")
        stage["draft_parallel"] = run.draft.get("parallel")
    return stage


# ---------------------------------------------------------------------------------------
# the harness


def glm_weights(  # noqa: PLR0917 - (tp, ep, dp, pp, nextn, override) read best positionally
    tp: int,
    ep: bool = False,
    dp: int = 1,
    pp: int = 1,
    nextn: int = 0,
    config_override: dict[str, Any] | None = None,
    *,
    gpu: str = "h200",
    engine_fields: bool = True,
    mtp_layers: int | None = None,
    language_only: bool = False,
    dtype: str = "bfloat16",
    server_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What rank 0 of every pipeline stage of an SGLang 0.5.23 server holds for GLM-5.3-Flash:
    ``--tp-size tp`` (all ranks of a stage), ``ep`` (``--ep-size tp``: the routed experts split
    over the stage's ranks, MoE TP 1), ``dp`` > 1 (``--dp-size dp --enable-dp-attention``:
    attention TP ``tp / dp``; vLLM's DP ``d`` x TP ``t`` is ``tp = d * t, dp = d`` here),
    ``--pp-size pp``, ``nextn`` > 0 (``--speculative-algorithm NEXTN`` with ``nextn`` steps,
    top-k 1, ``nextn + 1`` draft tokens: SGLang's draft is always one NextN layer),
    ``mtp_layers`` written as ``text_config.num_nextn_predict_layers`` (``None``: absent, SGLang's
    default 1), ``config_override`` merged into the fixture (``{"text_config": {...}}``), on
    ``gpu`` (an ``sglang_engine.GPUS`` key). ``language_only``: ``--language-only`` (no vision
    tower). ``dtype``: ``--dtype``. ``server_args``: further ``ServerArgs`` fields (they win).

    Returns ``{"stages": [...], ...}`` with, per stage, every tensor (``tensors``; the draft's in
    ``draft_tensors``, its embedding / LM head, replaced by the target's after loading, named in
    ``shared``), bytes per category, totals, what SGLang resolved and chose; or
    ``{"refused": ..., "at": ..., "trace": [...], "pp_rank": ...}`` where building refused."""
    override = (
        sglang_glm._merge(ENGINE_FIELDS, config_override or {})
        if engine_fields
        else config_override
    )
    config = sglang_glm.glm_config(mtp_layers, override)
    kda = _kda_layers(config)
    model_dir = sglang_glm.glm_model_dir(mtp_layers, override)
    extra: dict[str, Any] = {
        "json_model_override_args": json.dumps(sglang_glm.ARCHITECTURES_OVERRIDE["both"]),
        "mamba_track_interval": sglang_glm.WORKING_TRACK_INTERVAL,
        "dtype": dtype,
    }
    if nextn:
        extra.update(
            speculative_algorithm="NEXTN",
            speculative_num_steps=nextn,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=nextn + 1,
        )
    if language_only:
        extra["language_only"] = True
    extra.update(server_args or {})
    request: dict[str, Any] = {
        "sglang_version": SGLANG_VERSION,
        "tp": tp,
        "ep": ep,
        "dp": dp,
        "pp": pp,
        "nextn": nextn,
        "mtp_layers": mtp_layers,
        "gpu": gpu,
        "engine_fields": engine_fields,
        "language_only": language_only,
        "dtype": dtype,
        "config_override": config_override or {},
        "server_args": server_args or {},
    }
    _import_glm()
    stages: list[dict[str, Any]] = []
    for pp_rank in range(pp):
        run = _Run(want_draft=bool(nextn) and pp_rank == pp - 1)
        try:
            with _recording(run), _device_sm(gpu):
                built = sglang_weights.sglang_weights(
                    model_dir,
                    tp=tp,
                    dp=dp,
                    ep=tp if ep else 1,
                    pp=pp,
                    pp_rank=pp_rank,
                    gpu=gpu,
                    server_args=extra,
                )
        except Exception as error:  # a refusal from outside SGLang's frames
            return {**request, **_refusal(error, pp_rank)}
        if "refused" in built:
            recorded = run.error
            refusal = _refusal(recorded, pp_rank) if recorded else {"refused": built["refused"]}
            return {**request, **refusal}
        stage = _stage(built, run, kda, pp_rank)
        if run.draft_error is not None:
            stage["draft_refused"] = _refusal(run.draft_error, pp_rank)
        stages.append(stage)
    return {**request, "stages": stages}


def _refusal(error: BaseException, pp_rank: int) -> dict[str, Any]:
    trace = _trace(error)
    return {
        "refused": f"{type(error).__name__}: {error}",
        "at": _where(error) or (trace[-1] if trace else ""),
        "trace": trace[-6:],
        "pp_rank": pp_rank,
    }


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` without the per-tensor tables."""
    if "refused" in result:
        return result
    heavy = ("tensors", "draft_tensors", "unregistered", "draft_unregistered")
    return {
        **{k: v for k, v in result.items() if k != "stages"},
        "stages": [{k: v for k, v in s.items() if k not in heavy} for s in result["stages"]],
    }


def kinds(table: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``table`` folded by name with layer / expert indices as ``N``: count, bytes, shapes."""
    out: dict[str, dict[str, Any]] = {}
    for name, info in table.items():
        key = re.sub(r"\.\d+(?=\.|$)", ".N", name)
        entry = out.setdefault(key, {"count": 0, "bytes": 0, "shapes": {}, "categories": {}})
        entry["categories"][info["category"]] = entry["categories"].get(info["category"], 0) + 1
        entry["count"] += 1
        entry["bytes"] += info["bytes"]
        shape = f"{tuple(info['shape'])} {info['dtype']}"
        entry["shapes"][shape] = entry["shapes"].get(shape, 0) + 1
    return out


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> None:
    """``python sglang_glm_weights.py --tp 8 [--ep] [--dp 2] [--pp 2] [--nextn 1] [--full]
    [--kinds]``: JSON."""
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", action="store_true")
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--nextn", type=int, default=0)
    parser.add_argument("--mtp-layers", type=int, default=None)
    parser.add_argument("--gpu", choices=sorted(GPUS), default="h200")
    parser.add_argument("--override", type=json.loads, default=None, help="JSON to merge")
    parser.add_argument("--server-args", type=json.loads, default=None, help="JSON fields")
    parser.add_argument("--bare", action="store_true", help="the fixture without ENGINE_FIELDS")
    parser.add_argument("--language-only", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--full", action="store_true", help="every tensor, not only totals")
    parser.add_argument("--kinds", action="store_true", help="tensors folded by layer index")
    args = parser.parse_args(argv)
    result = glm_weights(
        args.tp,
        args.ep,
        args.dp,
        args.pp,
        args.nextn,
        args.override,
        gpu=args.gpu,
        engine_fields=not args.bare,
        mtp_layers=args.mtp_layers,
        language_only=args.language_only,
        dtype=args.dtype,
        server_args=args.server_args,
    )
    if args.kinds and "stages" in result:
        for stage in result["stages"]:
            stage["kinds"] = kinds(stage["tensors"])
            stage["draft_kinds"] = kinds(stage["draft_tensors"])
    out(json.dumps(result if args.full else summary(result), indent=1))


if __name__ == "__main__":
    main()
