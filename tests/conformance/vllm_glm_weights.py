"""The weights one vLLM 0.33 rank holds for GLM-5.3-Flash, from vLLM's own classes on ``meta``.

:func:`glm_weights` builds ``Glm5NextForConditionalGeneration`` (and, with ``mtp_layers``, the
``Glm5NextMTP`` draft) for rank 0 of every pipeline stage with :func:`vllm_weights.vllm_weights`
(the Kimi harness: the fixture written to a directory, vLLM's ``VllmConfig``, one rank's faked
``GroupCoordinator`` objects, ``initialize_model`` under ``torch.device("meta")``), then returns
every parameter and buffer with its per-rank shape, dtype and bytes, grouped by module category
(:data:`CATEGORIES`). Where vLLM refuses, the answer is ``{"refused": "<type>: <message>",
"at": "<vllm file:line>"}``. Nothing of vLLM is copied; every shape is what vLLM's code declares.
Research notes: ``tests/fixtures/glm-5.3-flash/vllm-0.33-weights-notes.md``.

Config. The fixture (transformers' ``Glm5NextConfig``) lacks five fields vLLM's GLM
constructor reads; unless ``engine_fields=False`` they are added from :data:`ENGINE_FIELDS`
(chosen to match transformers' own GLM-5.3-Flash model; ``config_override`` wins over them).
With ``engine_fields=False`` vLLM refuses at ``config.mhc`` (``glm5next/common/model.py:380``).

Stubs, on top of :mod:`vllm_weights`' (platform reported as an H200 or B200, inert CUDA
streams, permissive compiled-op namespaces; see its docstring), each restored on exit, none
changing a declared shape:

* **torchvision**: :func:`vllm_glm.install_torchvision_stub` (GLM's module imports
  ``glm4_1v``, which imports transformers' torchvision image processor) and vLLM's architecture
  inspection run in this process (:func:`vllm_glm._inspect_in_process`).
* **Platform device type**: the reported CUDA platform also answers ``device_type == "cuda"``
  (``Glm5NextModel`` allocates its top-k index buffer on ``current_platform.device_type``;
  the harness sends CUDA allocations to ``meta``).
* **Expert group**: each faked ``GroupCoordinator`` gets a ``device_group`` answering
  ``size()`` / ``rank()`` (``Glm5NextMoE`` reads ``get_ep_group().device_group.size()``);
  the Kimi harness leaves it ``None``.
* **Sparse MLA backend**: the layers are built with the backend vLLM picks for a bf16 cache:
  ``FLASHINFER_MLA_SPARSE_SM90`` on an H200, ``FLASHINFER_MLA_SPARSE`` on a B200 (the Kimi
  harness's ``TRITON_MLA`` is dense: "sparse not supported"). The impl holds no parameters.
* **FlashKDA**: ``vllm._flashkda_C`` is an empty module and
  ``torch.ops._flashkda_C.get_workspace_size`` answers 0, so the KDA layers resolve the
  ``flashkda`` prefill backend as on the GPU; the workspace sized there is an activation
  buffer taken at forward time, not a module tensor.
* **DeepGEMM**: the kpool indexer op requires it on CUDA (``has_deep_gemm`` answers True in
  ``glm5next/nvidia/sparse_indexer.py``); it is a plain object with no tensors.
* **TileLang** (only when not installed): ``vllm.model_executor.kernels.mhc.tilelang_kernels``
  is a module whose kernels accept ``register_warmup`` (the mHC decoder layer registers JIT
  warm-ups at ``__init__``; nothing is allocated).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import traceback
import types
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
import vllm_engine
import vllm_weights
from glm_categories import category, totals
from torch import nn
from vllm_glm import _inspect_in_process, _merge, fixture_config, install_torchvision_stub
from vllm_weights import TensorInfo, Weights, _patched

ENGINE_FIELDS: dict[str, Any] = {
    "text_config": {
        "mhc": True,  # transformers' decoder always runs hc_mult residual streams
        "mla_use_nope": True,  # qk_rope_head_dim 0: no RoPE (False asserts rope_parameters)
        "topk_method": "noaux_tc",  # sigmoid router with e_score_correction_bias
        "scoring_func": "sigmoid",
        "indexer_rope_interleave": False,  # DeepSeek's default; no effect with RoPE dim 0
    }
}
"""Text-config fields vLLM's GLM constructor reads that the fixture lacks (module docstring)."""

GPUS: dict[str, tuple[tuple[int, int], str]] = {
    "h200": ((9, 0), "FLASHINFER_MLA_SPARSE_SM90"),
    "b200": ((10, 0), "FLASHINFER_MLA_SPARSE"),
}
"""CUDA capability and sparse MLA backend of each GPU :func:`glm_weights` takes."""

RUNNER_PP_CALL = "vllm/v1/worker/gpu/model_runner.py:547"
"""Where vLLM's (V2) model runner, loading the model of a non-first pipeline stage, asks it for
``make_empty_intermediate_tensors`` (after the weights are built and loaded; not run here)."""


def draft_part(name: str) -> str:
    """The draft tensor's category by the target's rules (its decoder block is an MLA +
    indexer + MoE layer), or ``mtp_head`` for the MTP layer's own fusion and head norms."""
    rest = name.split(".mtp_block.", 1)
    if len(rest) == 2:
        return category(f"layers.0.{rest[1]}", frozenset())
    return "embedding" if ".embed_tokens." in name else "mtp_head"


# ---------------------------------------------------------------------------------------
# the stubs (module docstring)


class _DeviceGroup:
    """A process group's size and rank, as ``torch.distributed`` answers them."""

    def __init__(self, world: int, rank: int) -> None:
        self.world, self.rank_ = world, rank

    def size(self) -> int:
        return self.world

    def rank(self) -> int:
        return self.rank_


_K3_GROUP = vllm_weights._group
_K3_GPU = vllm_weights._gpu


def _group(name: str, world: int, rank: int) -> Any:
    """:func:`vllm_weights._group` with a ``device_group`` answering size and rank."""
    group = _K3_GROUP(name, world, rank)
    group.device_group = _DeviceGroup(world, rank)
    return group


class _Warmup:
    """A JIT kernel whose warm-up registration does nothing."""

    def register_warmup(self, *args: Any, **kwargs: Any) -> None:
        pass


class _KernelModule(types.ModuleType):
    """A kernel module whose every kernel is a :class:`_Warmup`."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Warmup()


class _FlashKDAOps:
    """``torch.ops._flashkda_C``: the workspace query answers 0; any other op raises."""

    def get_workspace_size(self, *args: Any) -> int:
        return 0

    def __getattr__(self, name: str) -> Any:
        return vllm_weights._Op(f"_flashkda_C.{name}")


@contextmanager
def _module(name: str, module: types.ModuleType) -> Iterator[None]:
    """``sys.modules[name] = module`` for the block (only where ``name`` is not importable)."""
    saved = sys.modules.get(name)
    sys.modules[name] = module
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved


@contextmanager
def _glm_gpu(capability: tuple[int, int] = (9, 0)) -> Iterator[None]:
    """:func:`vllm_weights._gpu` plus GLM's stubs (module docstring)."""
    import vllm.platforms  # noqa: PLC0415
    from vllm.models.glm5next.nvidia import sparse_indexer  # noqa: PLC0415

    with ExitStack() as stack:
        stack.enter_context(_K3_GPU(capability))
        platform = type(vllm.platforms.current_platform)  # the reported CUDA class
        stack.enter_context(_patched(platform, "device_type", "cuda"))
        stack.enter_context(_patched(sparse_indexer, "has_deep_gemm", lambda: True))
        stack.enter_context(_patched(torch.ops, "_flashkda_C", _FlashKDAOps()))
        stack.enter_context(_module("vllm._flashkda_C", types.ModuleType("vllm._flashkda_C")))
        if importlib.util.find_spec("tilelang") is None:
            name = "vllm.model_executor.kernels.mhc.tilelang_kernels"
            stack.enter_context(_module(name, _KernelModule(name)))
        yield


@contextmanager
def _glm_harness(gpu: str) -> Iterator[str]:
    """The Kimi harness made to build GLM on ``gpu``; yields the MLA backend's name."""
    capability, backend = GPUS[gpu]
    stubbed = install_torchvision_stub()
    with ExitStack() as stack:
        stack.enter_context(_inspect_in_process(stubbed))
        stack.enter_context(_patched(vllm_weights, "_group", _group))
        stack.enter_context(_patched(vllm_weights, "_gpu", _glm_gpu))
        stack.enter_context(_patched(vllm_weights, "BACKEND", backend))
        if backend not in vllm_engine.CAPABILITY:  # validate it on its own GPU
            vllm_engine.CAPABILITY[backend] = capability
            stack.callback(vllm_engine.CAPABILITY.pop, backend)
        yield backend


# ---------------------------------------------------------------------------------------
# the harness


def _frames(error: BaseException) -> list[str]:
    """The vLLM (else transformers) frames ``error`` went through, innermost last."""
    frames = traceback.extract_tb(error.__traceback__)
    for package in ("vllm", "transformers"):
        marker = f"/site-packages/{package}/"
        found = [
            f"{f.filename.split('/site-packages/', 1)[1]}:{f.lineno}"
            for f in frames
            if marker in f.filename
        ]
        if found:
            return found
    return [f"{f.filename}:{f.lineno}" for f in frames[-1:]]


def _table(
    tensors: dict[str, TensorInfo], kda: frozenset[int], draft: bool
) -> dict[str, dict[str, Any]]:
    """Plain data for ``tensors``, each with its category (and, for the draft, its part)."""
    return {
        name: {
            "shape": list(t.shape),
            "dtype": t.dtype.removeprefix("torch."),
            "bytes": t.nbytes,
            "kind": t.kind,
            "persistent": t.persistent,
            "category": category(name, kda, draft),
            **({"part": draft_part(name)} if draft else {}),
        }
        for name, t in tensors.items()
    }


def _unregistered(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Non-empty tensors modules hold as plain attributes (not parameters or buffers, so not
    in the totals): e.g. the top-k index buffer every sparse MLA layer shares."""
    seen: set[int] = set()
    found: dict[str, dict[str, Any]] = {}
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter):
                continue
            if value.numel() == 0 or id(value) in seen:
                continue
            seen.add(id(value))
            found[f"{prefix}.{attr}" if prefix else attr] = {
                "shape": list(value.shape),
                "dtype": str(value.dtype).removeprefix("torch."),
                "bytes": value.numel() * value.element_size(),
                "device": value.device.type,
            }
    return found


def _backends(model: nn.Module) -> dict[str, Any]:
    """The kernels vLLM chose at construction (they can decide shapes: a MoE backend pads)."""
    chosen: dict[str, Any] = {}
    for _, module in model.named_modules():
        name = type(module).__name__
        if name == "MLAAttention" and "mla" not in chosen:
            chosen["mla"] = module.attn_backend.get_name()
        elif hasattr(module, "w13_weight") and "moe" not in chosen:
            method = module.quant_method
            chosen["moe"] = str(getattr(method, "unquantized_backend", type(method).__name__))
            chosen["moe_intermediate_per_rank"] = module.intermediate_size_per_partition
            chosen["moe_local_experts"] = module.w13_weight.shape[0]
        elif hasattr(module, "kda_prefill_backend") and "kda_prefill" not in chosen:
            chosen["kda_prefill"] = module.kda_prefill_backend
        elif name == "Glm5NextVisionTransformer" and "vit" not in chosen:
            chosen["vit"] = str(module.attn_backend)
    return chosen


def _stage(weights: Weights, model: nn.Module | None, kda: frozenset[int]) -> dict[str, Any]:
    """One stage's answer: tensors, totals by category and kind, what vLLM chose."""
    target = _table(weights.target, kda, draft=False)
    draft = _table(weights.draft, kda, draft=True)
    categories = totals(target)
    if draft:
        categories["mtp"] = sum(info["bytes"] for info in draft.values())
    both = [*target.values(), *draft.values()]
    return {
        "model_class": weights.model_class,
        "draft_class": weights.draft_class,
        "categories": categories,
        "draft_parts": totals(draft, "part") if draft else {},
        "total_bytes": weights.bytes(),
        "target_bytes": weights.bytes("target"),
        "draft_bytes": weights.bytes("draft"),
        "parameter_bytes": weights.bytes(buffers=False),
        "buffer_bytes": sum(i["bytes"] for i in both if i["kind"] == "buffer"),
        "non_persistent_buffer_bytes": sum(
            i["bytes"] for i in both if i["kind"] == "buffer" and not i["persistent"]
        ),
        "tensors": target,
        "draft_tensors": draft,
        "shared": list(weights.shared),
        "unregistered": _unregistered(model) if model is not None else {},
        "backends": _backends(model) if model is not None else {},
    }


@contextmanager
def _recording() -> Iterator[list[nn.Module]]:
    """The target models :func:`vllm_weights.vllm_weights` builds in the block."""
    built: list[nn.Module] = []
    original = vllm_weights._tensors

    def recording(
        model: nn.Module, seen: dict[int, str], owner: str
    ) -> tuple[dict[str, TensorInfo], list[str]]:
        if owner == "target":
            built.append(model)
        return original(model, seen, owner)

    with _patched(vllm_weights, "_tensors", recording):
        yield built


def _kda_layers(config: dict[str, Any]) -> frozenset[int]:
    """The KDA layers (vLLM's rule: ``layer_types[i] == "linear_attention"``)."""
    text = config.get("text_config", config)
    types_ = text.get("layer_types") or []
    return frozenset(i for i, kind in enumerate(types_) if kind == "linear_attention")


def glm_weights(  # noqa: PLR0917 - (tp, ep, dp, pp, mtp, override) read best positionally
    tp: int,
    ep: bool = False,
    dp: int = 1,
    pp: int = 1,
    mtp_layers: int = 0,
    config_override: dict[str, Any] | None = None,
    *,
    gpu: str = "h200",
    engine_fields: bool = True,
    spec_tokens: int | None = None,
    language_only: bool = False,
    max_model_len: int = 4096,
) -> dict[str, Any]:
    """What rank 0 of every pipeline stage of a vLLM 0.33 engine holds for GLM-5.3-Flash:
    ``tp`` tensor-parallel ranks, ``ep`` (``--enable-expert-parallel``), ``dp`` data-parallel
    ranks (the MoE then spans DP x TP), ``pp`` stages, ``mtp_layers`` MTP modules
    (``num_nextn_predict_layers``, drafted with ``--speculative-config method=mtp`` and
    ``spec_tokens`` tokens, default ``max(1, mtp_layers)``), ``config_override`` merged into the
    fixture (``{"text_config": {...}}`` for text fields), on ``gpu`` (a :data:`GPUS` key).

    Returns ``{"stages": [...], ...}`` with, per stage, every tensor (``tensors``; the draft's
    own in ``draft_tensors``; the draft names aliasing target tensors in ``shared``), bytes per
    category, totals, and the kernels vLLM chose; or ``{"refused": ..., "at": ..., "trace":
    [...]}`` where building refused. A non-first stage whose model lacks what the model runner
    asks of it at load (:data:`RUNNER_PP_CALL`) is refused too, but its ``stages`` are kept:
    they are what vLLM built before it would fail."""
    override = _merge(ENGINE_FIELDS, config_override or {}) if engine_fields else config_override
    config = fixture_config(None, override)
    kda = _kda_layers(config)
    draft = "mtp" if mtp_layers else None
    request: dict[str, Any] = {
        "tp": tp,
        "ep": ep,
        "dp": dp,
        "pp": pp,
        "mtp_layers": mtp_layers,
        "gpu": gpu,
        "engine_fields": engine_fields,
        "config_override": config_override or {},
    }
    stages: list[dict[str, Any]] = []
    refusal: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory() as tmp, _glm_harness(gpu):
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config))
        for pp_rank in range(pp):
            try:
                with _recording() as built:
                    weights = vllm_weights.vllm_weights(
                        path,
                        tp=tp,
                        dp=dp,
                        enable_expert_parallel=ep,
                        pp=pp,
                        pp_rank=pp_rank,
                        draft=draft,
                        mtp_modules=mtp_layers,
                        spec_tokens=spec_tokens or max(1, mtp_layers),
                        max_model_len=max_model_len,
                        language_only=language_only,
                        capability=GPUS[gpu][0],
                    )
            except Exception as error:  # what vLLM raises is the answer
                frames = _frames(error)
                return {
                    **request,
                    "refused": f"{type(error).__name__}: {error}",
                    "at": frames[-1] if frames else "",
                    "trace": frames[-6:],
                    "pp_rank": pp_rank,
                }
            model = built[0] if built else None
            stages.append({"pp_rank": pp_rank, **_stage(weights, model, kda)})
            if pp_rank > 0 and model is not None and refusal is None:
                try:  # what the model runner's load_model asks of a non-first stage
                    model.make_empty_intermediate_tensors  # noqa: B018
                except AttributeError as error:
                    refusal = {
                        "refused": f"AttributeError: {error}",
                        "at": RUNNER_PP_CALL,
                        "pp_rank": pp_rank,
                    }
    return {**request, **(refusal or {}), "stages": stages}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` without the per-tensor tables."""
    if "refused" in result:
        return result
    heavy = ("tensors", "draft_tensors", "unregistered")
    return {
        **{k: v for k, v in result.items() if k != "stages"},
        "stages": [{k: v for k, v in s.items() if k not in heavy} for s in result["stages"]],
    }


def main(argv: list[str] | None = None) -> None:
    """``python vllm_glm_weights.py --tp 8 [--ep] [--pp 2] [--mtp 1] [--full]``: JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", action="store_true")
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--mtp", type=int, default=0)
    parser.add_argument("--gpu", choices=sorted(GPUS), default="h200")
    parser.add_argument("--override", type=json.loads, default=None, help="JSON to merge")
    parser.add_argument("--bare", action="store_true", help="the fixture without ENGINE_FIELDS")
    parser.add_argument("--language-only", action="store_true")
    parser.add_argument("--full", action="store_true", help="every tensor, not only totals")
    args = parser.parse_args(argv)
    result = glm_weights(
        args.tp,
        args.ep,
        args.dp,
        args.pp,
        args.mtp,
        args.override,
        gpu=args.gpu,
        engine_fields=not args.bare,
        language_only=args.language_only,
    )
    print(json.dumps(result if args.full else summary(result), indent=1))


if __name__ == "__main__":
    main()
