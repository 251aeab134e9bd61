"""Which parameters one rank of SGLang 0.5.23 holds for Kimi-K3 / Kimi-Linear (and a DSpark
draft): SGLang's own model class, built for that rank on the ``meta`` device, its parameters
listed. No weights, GPUs or process groups.

This is a conformance harness: it imports only SGLang, torch, the standard library and its
sibling harness modules (``sglang_engine.py`` for the ServerArgs / platform session,
``sglang_platform.py`` through it), never ``k3layout``. Nothing of SGLang's sharding is
reimplemented; every shape comes out of SGLang's ``nn.Module`` tree. The steps are the ones
``ModelRunner.load_model`` runs:

1. ``ServerArgs(...)`` for the case (``tp_size``, ``dp_size`` + ``enable_dp_attention``,
   ``ep_size``, ``pp_size``, extra fields), resolved by SGLang's pipeline under
   ``runtime_context.override_platform`` with the chosen GPU's facts
   (``sglang_engine._session`` / ``_server_args``), then ``runtime_context.publish`` with the
   launcher's rank bundle for the case's rank (``SpawnRanks(world_rank=tp * pp_rank +
   tp_rank)``), which derives ``tp_rank``, ``attn_tp_rank``, ``moe_ep_rank``, ``moe_tp_rank``
   and ``pp_rank`` with SGLang's ``derive_spawn_ranks``.
2. ``ModelConfig.from_server_args`` (for a quantized case the fixture's ``config.json`` gets a
   ``quantization_config`` first, as a checkpoint would carry it);
   ``model_loader.loader._get_quantization_config`` (the loader's own);
   ``model_loader.loader._initialize_model`` under ``set_default_torch_dtype(model dtype)`` and
   ``torch.device("meta")`` (``DefaultModelLoader.initialize_model_for_startup`` does the same
   with the CUDA device).
3. ``named_parameters()`` (and ``named_buffers()``, reported apart) of the built module.

For a DSpark draft (``draft=<draft config>``) the target case is set up with
``speculative_algorithm="DSPARK"`` and that draft; the draft's ``ModelConfig`` is built as the
scheduler builds it (``is_draft_model=True``), and the draft model is built inside the draft
worker's scopes: SGLang's ``resolve_draft_parallel_layout(model_draft_parallel_spec(...))``,
``draft_tp_context(layout)`` and ``patch_pipeline_parallel_group`` with a one-rank PP group
(what ``draft_pp_context`` installs). The draft shares the target's ``embed_tokens`` and
``lm_head`` (``DSparkDraftMixin.attach_shared_modules``), so they are not in its list.

What stands in for a CUDA engine, and why none of it changes a parameter shape:

* Triton, torchvision, GPU facts and memory: as in ``sglang_engine`` (its docstring). The facts
  select kernels / backends; shapes are read from the config and the parallel widths.
* Process groups: ``get_parallel().override_permanently(world_group=..., tp_group=...,
  attn_tp_group=..., attn_cp_group=..., moe_ep_group=..., moe_tp_group=..., moe_dp_group=...,
  pp_group=...)`` with ``_Group`` stand-ins carrying only ``world_size`` / ``rank_in_group`` (the
  values SGLang's own ``publish`` derived for the rank) plus ``ca_comm=None`` and
  ``pynccl_comm=None`` (no custom all-reduce: what an NCCL-only group reports; the K3
  SP-collective probe, ``k3_sp_collective._init_state``, then declines as it does on any
  non-SM100 GPU). Layers read the sizes and ranks to split; they never communicate at
  ``__init__``. SGLang's ``_validate_parallel`` checks each stand-in's width against the
  published width.
* CUDA streams: ``get_resources().override(streams=...)`` (SGLang's documented injection
  point for ``runtime_context.get_stream``) with a mapping that answers every name with an inert
  object, and ``torch.cuda.Stream`` replaced by an inert class while the model is built (K3's
  ``KimiK3LinearModel`` makes three alt streams). Streams are stored on modules for overlap
  at forward time; no parameter depends on them.
* ``torch.device("meta")``: parameters have shapes and dtypes, no storage. Anything a module
  allocates with an explicit device stays off meta and is listed with its device.

Not run: weight loading and ``post_load_weights`` (both need data). What they add is in the
report (``/tmp/research/sglang_weights.md``): e.g. the MLA ``w_kc`` / ``w_vc`` contiguous
copies of ``kv_b_proj`` per MLA layer.

Entry point::

    sglang_weights(config_path, tp=8, dp=1, ep=1, pp=1, pp_rank=0, tp_rank=0,
                   quantization=None, gpu="h200", draft=None, server_args=None) -> dict

A case SGLang refuses returns ``{"refused": message, "where": "file:function"}``. A build takes
well under a second after the one-time import of SGLang (~6 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sglang_engine import (
    FIXTURES,
    GPUS,
    MODEL_FILES,
    _jsonable,
    _model_dir,
    _server_args,
    _session,
    _sgl,
    _where,
    require_sglang,
    sglang_available,
)
from sglang_platform import SGLANG_VERSION

__all__ = [
    "DRAFT_FILES",
    "MODEL_FILES",
    "QUANTIZATIONS",
    "require_sglang",
    "sglang_available",
    "sglang_weights",
]

DRAFT_FILES = {"sglang-dspark": FIXTURES / "sglang-dspark-draft" / "config.json"}


def compressed_tensors(format: str, kind: str) -> dict[str, Any]:
    """A compressed-tensors config of 4-bit ``kind`` ("int" or "float") weights, group 32,
    symmetric, on the routed experts only (the rest ignored, as K2-Thinking's checkpoint)."""
    weights = {
        "num_bits": 4,
        "type": kind,
        "symmetric": True,
        "strategy": "group",
        "group_size": 32,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
    }
    group: dict[str, Any] = {"targets": ["Linear"], "weights": weights}
    group |= {"input_activations": None, "output_activations": None}
    return {
        "quant_method": "compressed-tensors",
        "format": format,
        "config_groups": {"group_0": group},
        "ignore": [
            "lm_head",
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
            "re:.*\\.mlp\\.gate$",
            "re:vision_tower.*",
            "re:mm_projector.*",
        ],
        "quantization_status": "compressed",
        "kv_cache_scheme": None,
    }


# ``quantization_config`` blocks as checkpoints carry them (the names are ours, for the cases).
QUANTIZATIONS: dict[str, dict[str, Any]] = {
    "fp8-block": {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
    },
    # The same, less what TP 8 cannot cut into 128-row blocks (SGLang refuses "fp8-block" at TP 8):
    # Kimi-K3's KDA ``b_proj`` (96 heads / 8 = 12 rows) and its dense layer-0 MLP
    # (intermediate 11008 / 8 = 1376). ``ignored_layers`` matches on dotted module paths.
    "fp8-block-tp8": {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
        "ignored_layers": ["b_proj", "layers.0.mlp"],
    },
    # compressed-tensors W4A16, group 32, symmetric int4 (the "pack-quantized" format of
    # Kimi-K2-Thinking's routed experts): only the routed experts; the rest is ignored.
    "int4-w4a16-g32": compressed_tensors("pack-quantized", "int"),
    # compressed-tensors MXFP4 (e2m1 + ue8m0 scale per 32): K3's MoE switches such a config to
    # ``Mxfp4Config`` for its routed experts (``KimiK3MoE.__init__``).
    "ct-mxfp4": compressed_tensors("mxfp4-pack-quantized", "float"),
    "mxfp4": {"quant_method": "mxfp4"},
    "nvfp4": {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "kv_cache_quant_algo": None,
        "exclude_modules": ["lm_head"],
    },
}


# --------------------------------------------------------------------------------------------
# Stand-ins
# --------------------------------------------------------------------------------------------


class _Group:
    """A process group as model construction reads it: its width and this rank's place. No
    communicator (``ca_comm`` / ``pynccl_comm`` ``None``: an NCCL-only group)."""

    def __init__(self, name: str, world_size: int, rank_in_group: int) -> None:
        self.unique_name = name
        self.world_size = world_size
        self.rank_in_group = rank_in_group
        self.rank = rank_in_group
        self.ranks = list(range(world_size))
        self.local_rank = 0
        self.first_rank = 0
        self.last_rank = world_size - 1
        self.is_first_rank = rank_in_group == 0
        self.is_last_rank = rank_in_group == world_size - 1
        self.device_group = None
        self.cpu_group = None
        self.ca_comm = None
        self.pynccl_comm = None
        self.symm_mem_comm = None
        self.use_custom_allreduce = False

    def __repr__(self) -> str:
        return f"_Group({self.unique_name}, {self.rank_in_group}/{self.world_size})"


class _InertStream:
    """Stands in for ``torch.cuda.Stream`` while a model is built (stored, never used)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args


class _Streams(dict[str, Any]):
    """``Resources.streams``: every named stream SGLang asks for is an inert one."""

    def get(self, name: str, default: Any = None) -> Any:
        return self.setdefault(name, _InertStream(name))


def _install_groups(s: types.SimpleNamespace) -> None:
    """Stand-in groups with the widths and ranks SGLang's ``publish`` derived."""
    par = s.rc.get_parallel()
    world = par.tp_size * par.pp_size
    par.override_permanently(
        world_group=_Group("world", world, par.tp_size * par.pp_rank + par.tp_rank),
        tp_group=_Group("tp", par.tp_size, par.tp_rank),
        attn_tp_group=_Group("attn_tp", par.attn_tp_size, par.attn_tp_rank),
        attn_cp_group=_Group("attn_cp", par.attn_cp_size, par.attn_cp_rank),
        moe_ep_group=_Group("moe_ep", par.moe_ep_size, par.moe_ep_rank),
        moe_tp_group=_Group("moe_tp", par.moe_tp_size, par.moe_tp_rank),
        moe_dp_group=_Group("moe_dp", par.moe_dp_size, par.moe_dp_rank),
        pp_group=_Group("pp", par.pp_size, par.pp_rank),
    )


@contextlib.contextmanager
def _cuda_scope(s: types.SimpleNamespace, gpu: str) -> Iterator[None]:
    """What SGLang's import-time and device probes would have answered on ``gpu``: its compute
    capability, ``_is_cuda`` module constants, the CUDA quantization registry entries."""
    from unittest import mock  # noqa: PLC0415

    from sglang.srt.layers import quantization  # noqa: PLC0415
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config  # noqa: PLC0415
    from sglang.srt.model_loader import loader  # noqa: PLC0415

    torch = s.torch
    capability = tuple(GPUS[gpu]["facts"]["device_capability"])
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            mock.patch.object(torch.cuda, "get_device_capability", lambda *a, **k: capability)
        )
        stack.enter_context(
            mock.patch.object(loader, "get_device_capability", lambda *a, **k: capability)
        )
        for module in _import_time_cuda_flags():
            stack.enter_context(mock.patch.object(module, "_is_cuda", True))
        for registry in (quantization.BASE_QUANTIZATION_METHODS, quantization.QUANTIZATION_METHODS):
            stack.enter_context(mock.patch.dict(registry, {"mxfp4": Mxfp4Config}))
        yield


@contextlib.contextmanager
def _build_scope(s: types.SimpleNamespace, dtype: Any) -> Iterator[None]:
    """What a model build needs: inert streams, the model dtype, the meta device."""
    from unittest import mock  # noqa: PLC0415

    from sglang.srt.model_loader import loader  # noqa: PLC0415

    torch = s.torch
    with contextlib.ExitStack() as stack:
        stack.enter_context(s.rc.get_resources().override(streams=_Streams()))
        stack.enter_context(mock.patch.object(torch.cuda, "Stream", _InertStream))
        stack.enter_context(loader.set_default_torch_dtype(dtype))
        stack.enter_context(torch.device("meta"))
        yield


_MODEL_MODULES = (
    "sglang.srt.model_loader.loader",
    "sglang.srt.models.kimi_k3",
    "sglang.srt.models.kimi_k3_vl",
    "sglang.srt.models.kimi_linear",
    "sglang.srt.models.deepseek_v2",
    "sglang.srt.models.dflash",
    "sglang.srt.models.dspark",
    "sglang.srt.layers.quantization.mxfp4",
    "sglang.srt.layers.quantization.modelopt_quant",
    "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors",
    "sglang.srt.speculative.draft_parallel",
    "sglang.srt.speculative.spec_utils",
)


def _import_models() -> None:
    """Import the model and layer modules first, so their import-time constants exist to be
    answered (``_import_time_cuda_flags``)."""
    import importlib  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _MODEL_MODULES:
            importlib.import_module(name)


def _import_time_cuda_flags() -> list[types.ModuleType]:
    """SGLang modules holding an import-time ``_is_cuda = is_cuda()`` that came out False on
    this CPU box (``runtime_context.override_platform`` answers the runtime probes, not these
    cached module constants)."""
    return [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("sglang.") and m is not None and m.__dict__.get("_is_cuda") is False
    ]


# --------------------------------------------------------------------------------------------
# A case
# --------------------------------------------------------------------------------------------

_QUANT_DIRS: dict[str, str] = {}


def _config_dir(config_path: str | os.PathLike[str], quantization: Mapping[str, Any] | None) -> str:
    """The model directory SGLang reads: the fixture, with ``quantization_config`` set at the
    top level of ``config.json`` (where ``ModelConfig._parse_quant_hf_config`` reads it)."""
    if quantization is None:
        return _model_dir(config_path)
    path = Path(config_path)
    source = path / "config.json" if path.is_dir() else path
    key = json.dumps([str(source.resolve()), quantization], sort_keys=True)
    if key not in _QUANT_DIRS:
        config = json.loads(source.read_text())
        config["quantization_config"] = dict(quantization)
        directory = tempfile.mkdtemp(prefix="sglang-weights-")
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(config, f)
        _QUANT_DIRS[key] = directory
    return _QUANT_DIRS[key]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _kind(name: str) -> str:
    """A parameter's name with layer / expert / block indices replaced by ``N``."""
    return re.sub(r"\.\d+(?=\.|$)", ".N", name)


def _inventory(model: Any) -> dict[str, Any]:
    params: dict[str, dict[str, Any]] = {}
    for name, p in model.named_parameters():
        owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        params[name] = {
            "shape": list(p.shape),
            "dtype": _dtype_name(p.dtype),
            "bytes": p.numel() * p.element_size(),
            "device": p.device.type,
            "module": type(owner).__name__,
        }
    buffers: dict[str, dict[str, Any]] = {}
    for name, b in model.named_buffers():
        buffers[name] = {
            "shape": list(b.shape),
            "dtype": _dtype_name(b.dtype),
            "bytes": b.numel() * b.element_size(),
            "device": b.device.type,
            "persistent": name.rsplit(".", 1)[-1]
            not in getattr(
                model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model,
                "_non_persistent_buffers_set",
                set(),
            ),
        }
    kinds: dict[str, dict[str, Any]] = {}
    for name, p in params.items():
        k = kinds.setdefault(
            _kind(name), {"count": 0, "bytes": 0, "shapes": {}, "module": p["module"]}
        )
        k["count"] += 1
        k["bytes"] += p["bytes"]
        shape = f"{tuple(p['shape'])} {p['dtype']}"
        k["shapes"][shape] = k["shapes"].get(shape, 0) + 1
    dtypes: dict[str, int] = {}
    for p in params.values():
        dtypes[p["dtype"]] = dtypes.get(p["dtype"], 0) + p["bytes"]
    return {
        "params": params,
        "buffers": buffers,
        "kinds": kinds,
        "bytes_by_dtype": dtypes,
        "total_bytes": sum(p["bytes"] for p in params.values()),
        "total_numel": sum(_numel(p["shape"]) for p in params.values()),
        "buffer_bytes": sum(b["bytes"] for b in buffers.values()),
        # what the model allocates on its own device (meta here, the GPU in a server): the
        # buffers a module builds elsewhere (K3's vision ``time_weight``, numpy on the CPU)
        # hold no GPU memory
        "gpu_buffer_bytes": sum(b["bytes"] for b in buffers.values() if b["device"] == "meta"),
        "num_params": len(params),
    }


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _parallel_report(s: types.SimpleNamespace) -> dict[str, Any]:
    par = s.rc.get_parallel()
    names = (
        "tp_size",
        "tp_rank",
        "attn_tp_size",
        "attn_tp_rank",
        "attn_dp_size",
        "attn_dp_rank",
        "moe_ep_size",
        "moe_ep_rank",
        "moe_tp_size",
        "moe_tp_rank",
        "moe_dp_size",
        "pp_size",
        "pp_rank",
    )
    return {n: getattr(par, n) for n in names}


def _layer_range(model: Any) -> dict[str, Any]:
    """``start_layer`` / ``end_layer`` of the decoder stack (what ``make_pp_layers`` stored)."""
    for _, module in model.named_modules():
        start, end = getattr(module, "start_layer", None), getattr(module, "end_layer", None)
        if isinstance(start, int) and isinstance(end, int):
            return {"start_layer": start, "end_layer": end}
    return {}


def sglang_weights(
    config_path: str | os.PathLike[str],
    *,
    tp: int = 1,
    dp: int = 1,
    ep: int = 1,
    pp: int = 1,
    pp_rank: int = 0,
    tp_rank: int = 0,
    quantization: str | Mapping[str, Any] | None = None,
    gpu: str = "h200",
    draft: str | os.PathLike[str] | None = None,
    server_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The parameters SGLang's own model class holds on one rank, as JSON-able values.

    ``dp > 1`` means ``--dp-size dp --enable-dp-attention`` (attention TP = ``tp / dp``);
    ``ep``: ``--ep-size`` (MoE EP; MoE TP = ``tp / ep``); ``pp`` / ``pp_rank``: the pipeline
    and the stage; ``tp_rank``: the rank within the stage's TP group. ``quantization``: a
    ``quantization_config`` dict or a name of ``QUANTIZATIONS``. ``draft``: a draft config
    (SGLang DSpark format); the answer is then the draft model's parameters on that rank (with
    ``config_path`` the target). ``server_args``: extra ServerArgs fields.

    Returns ``{"model_class", "parallel", "quant_method", "params": {name: {shape, dtype,
    bytes, device, module (the owning module's class)}}, "buffers", "kinds": {name with N for
    indices: {count, bytes, shapes, module}},
    "bytes_by_dtype", "total_bytes", "total_numel", "buffer_bytes", "gpu_buffer_bytes",
    "num_params",
    "start_layer", "end_layer", ...}``, or ``{"refused", "where"}``.
    """
    quant = QUANTIZATIONS[quantization] if isinstance(quantization, str) else quantization
    model_dir = _config_dir(config_path, quant)
    extra: dict[str, Any] = {"ep_size": ep, **(server_args or {})}
    spec = None
    if draft is not None:
        spec = {"algorithm": "DSPARK", "draft_model_path": _model_dir(draft)}
    _sgl()
    _import_models()
    try:
        with _session(gpu) as s, _cuda_scope(s, gpu):
            sa = _server_args(
                s,
                model_dir,
                tp=tp,
                dp=dp,
                enable_dp_attention=dp > 1,
                pp=pp,
                dcp=1,
                kv_dtype="auto",
                spec=spec,
                max_running_requests=None,
                mamba_full_memory_ratio=None,
                max_mamba_cache_size=None,
                extra=extra,
            )
            s.rc.publish(
                sa,
                role="scheduler",
                ranks=s.rc.SpawnRanks(world_rank=tp * pp_rank + tp_rank, gpu_id=0),
            )
            _install_groups(s)
            # What the process runs after its groups exist and before it builds the model:
            # the DP-attention flags (``bootstrap._init_parallel_groups``), the MoE runtime
            # flags (scheduler init); ``bootstrap.init_layer_runtime``'s steps run in
            # ``_build`` (they take the model config).
            from sglang.srt.layers.dp_attention import initialize_dp_attention  # noqa: PLC0415
            from sglang.srt.layers.moe.utils import initialize_moe_config  # noqa: PLC0415

            initialize_dp_attention(server_args=sa)
            initialize_moe_config()
            return _build(s, sa, draft=draft is not None, quantization=quant)
    except Exception as error:
        if not _where(error):
            raise
        return {"refused": f"{type(error).__name__}: {error}", "where": _where(error)}


def _build(
    s: types.SimpleNamespace, sa: Any, *, draft: bool, quantization: Mapping[str, Any] | None
) -> dict[str, Any]:
    from sglang.srt.configs.load_config import LoadConfig  # noqa: PLC0415
    from sglang.srt.layers.dp_attention import init_dp_gathered_buffer  # noqa: PLC0415
    from sglang.srt.layers.layernorm_sp import initialize_layernorm_sp  # noqa: PLC0415
    from sglang.srt.model_loader import loader  # noqa: PLC0415
    from sglang.srt.model_loader.utils import get_model_architecture  # noqa: PLC0415

    mc = s.mc.ModelConfig.from_server_args(sa)
    # ``bootstrap.init_layer_runtime``'s two steps (``bootstrap`` itself imports the HTTP
    # server stack, not installed here).
    init_dp_gathered_buffer(mc)
    initialize_layernorm_sp(model_config=mc)
    out: dict[str, Any] = {"sglang_version": SGLANG_VERSION}
    load_config = LoadConfig(load_format="dummy")
    scope: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if draft:
        from sglang.srt.distributed.parallel_state import (  # noqa: PLC0415
            patch_pipeline_parallel_group,
        )
        from sglang.srt.speculative.draft_parallel import (  # noqa: PLC0415
            model_draft_parallel_spec,
            resolve_draft_parallel_layout,
        )
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: PLC0415
        from sglang.srt.speculative.spec_utils import draft_tp_context  # noqa: PLC0415

        draft_mc = s.mc.ModelConfig.from_server_args(
            sa, model_path=sa.speculative_draft_model_path, is_draft_model=True
        )
        algorithm = SpeculativeAlgorithm.from_string(s.rc.get_spec().speculative_algorithm)
        layout = resolve_draft_parallel_layout(
            model_draft_parallel_spec(draft_mc, spec_algorithm=algorithm)
        )
        out["draft_layout"] = {
            "own_tp_group": layout.tp_group is not None,
            "attn_tp_size": layout.attn_tp_size,
        }
        stack = contextlib.ExitStack()
        stack.enter_context(patch_pipeline_parallel_group(_Group("draft_pp", 1, 0)))
        stack.enter_context(draft_tp_context(layout))
        scope = stack
        mc = draft_mc
    with scope:
        quant_config = loader._get_quantization_config(mc, load_config)
        cls, arch = get_model_architecture(mc)
        with _build_scope(s, mc.dtype):
            model = loader._initialize_model(mc, load_config, quant_config)
        out["parallel"] = _parallel_report(s)
    out["model_class"] = f"{cls.__module__}.{cls.__qualname__}"
    out["architecture"] = arch
    out["model_dtype"] = _dtype_name(mc.dtype)
    out["quant_method"] = None if quant_config is None else quant_config.get_name()
    out["quant_config_class"] = None if quant_config is None else type(quant_config).__name__
    out["quantization_config"] = None if quantization is None else dict(quantization)
    out.update(_layer_range(model))
    out.update(_inventory(model))
    answer: dict[str, Any] = _jsonable(out)
    return answer


if __name__ == "__main__":  # a quick look: python sglang_weights.py kimi-k3 [tp] [ep]
    model_arg = sys.argv[1] if len(sys.argv) > 1 else "kimi-k3"
    tp_arg = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    ep_arg = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    result = sglang_weights(MODEL_FILES[model_arg], tp=tp_arg, ep=ep_arg)
    for kind, info in result.get("kinds", {}).items():
        print(f"{info['count']:5d} {kind:78s} {info['bytes']:>16,d} {info['shapes']}")
    print("total", f"{result.get('total_bytes', 0):,d}", result.get("refused", ""))
