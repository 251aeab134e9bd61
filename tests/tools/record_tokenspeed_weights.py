"""Record the weights each rank of tokenspeed's own Kimi-K3 holds: the truth for the
``tokenspeed`` engine's ``weights`` seam (``k3layout.engines.tokenspeed.weights``).

tokenspeed (github.com/lightseekorg/tokenspeed) is not installable here (it needs CUDA). This
tool imports its model classes from an extracted tree, builds one rank of
``KimiK3ForConditionalGeneration`` (and the ``K3DSparkModel`` draft) on the ``meta`` device as
tokenspeed's loader does, lists every parameter and buffer, and writes what it found as JSON to
``tests/fixtures/tokenspeed-1152/weights.json``. Refusals (tokenspeed's exception at
construction) are recorded with their type and text. No tokenspeed code is copied into this
project.

Revision
    PR #1152 of lightseekorg/tokenspeed, ref ``refs/pull/1152/head``, commit
    ``a6ee91b3e612d111b0ad6361607f221419d139f7`` (the revision of the KV-cache recording).

Fetching
    Get a git directory of tokenspeed (in this workplace: the ``fetch`` tool with
    ``github:lightseekorg/tokenspeed``, which leaves ``/work/.mirror/lightseekorg+tokenspeed/
    repo``; anywhere else ``git clone --bare`` and ``git fetch origin refs/pull/1152/head``),
    then::

        .venv/bin/python tests/tools/record_tokenspeed_weights.py extract \\
            --git-dir /work/.mirror/lightseekorg+tokenspeed/repo --dest /tmp/tsw
        .venv/bin/python tests/tools/record_tokenspeed_weights.py record --source /tmp/tsw

    (any CPU torch with transformers and numpy: ``.venv-sglang`` records the same cases.)
    ``extract`` writes ``python/tokenspeed``, ``tokenspeed-kernel/python/tokenspeed_kernel``
    and ``REVISION`` (the blob id of every file). ``record`` checks the blob id of every
    tokenspeed file it imported against REVISION and refuses a tree that differs
    (``--allow-other-revision`` records another commit, naming it).

What is real
    Every ``tokenspeed.*`` module on the import path of ``models/kimi_k3.py`` and
    ``models/kimi_k3_dspark.py``: the model classes, ``layers/linear.py``,
    ``layers/vocab_parallel_embedding.py``, ``layers/moe/expert.py`` and
    ``layers/moe/weights/*``, ``layers/moe/latent.py``, ``models/deepseek_v3.py``,
    ``models/moonvit.py``, ``layers/attention/mm_encoder_attention.py``, the quantization
    configs, ``distributed/mapping.py``, ``configs/kimi_k3_config.py``,
    ``configs/kimi_k3_dspark_config.py``, ``models/registry.py``. From tokenspeed-kernel:
    ``platform.py``, ``registry.py``, ``selection.py``, ``signature.py`` and the whole
    ``ops/moe`` package: the MoE kernel registrations and ``moe_plan``'s selection are
    tokenspeed-kernel's own (which kernel builds the experts, and ``NoKernelFoundError``
    where none serves the traits).

What is stubbed or emulated, and why
    - The rest of ``tokenspeed_kernel`` (attention, GEMM, quantization and communication
      kernels: CUDA/Triton code) and the third-party packages a tokenspeed module imports that
      are missing or need a GPU here (triton, tvm_ffi, flashinfer, deep_gemm, ...): inert
      placeholder modules. No constructor on this path runs a kernel.
    - The platform: tokenspeed-kernel's ``Platform.override`` with an NVIDIA H200
      (SM 9.0, 132 SMs); the Marlin MoE extension is reported available (tokenspeed's AUTO pick
      on Hopper) and FlashInfer's SiTU check passes.
    - ``torch.cuda.Stream`` / ``Event`` and ``torch.compile``: inert / identity.
    - The parallel layout: tokenspeed's own ``Mapping`` (pure Python), built with the sizes
      ``ServerArgs.resolve_parallelism`` derives from the flags in each case's ``server_args``
      (``dense_tp`` = attention TP, ``moe_tp`` = world / EP, vision TP = attention TP in
      ``--mm-encoder-tp-mode weights`` (the default) or 1 in ``data``); its ``MoE TP and EP
      cannot be both > 1`` check is repeated. No process group is created (none is needed).
    - The loader: ``set_default_dtype(bfloat16)`` and ``torch.device("meta")``, as
      ``model_loader/loader.py`` builds under the model dtype and the target device; the
      quantization config is resolved as ``ModelConfig._verify_quantization`` resolves it
      (each method's ``override_quantization_method``, then ``get_quantization_config``).
    - ``K3AttnCommState``: its ones-tensor is created on ``cuda:current_device``; the singleton
      is seeded with the same fields on meta (a plain attribute, not counted).
    - The DSpark draft's ``mask_token_id``: tokenspeed requires one; the fixture has none, so
      163838 is added (it changes no shape).

Counted
    Every parameter and every buffer of the built modules (``named_parameters`` and
    ``named_buffers``): they are allocated on the GPU at construction. Not counted: what
    weight loading adds later (MLA's ``w_kc`` / ``w_vc``, Marlin repacks), buffers registered
    lazily in ``forward`` (the vision rope's ``freqs_cis``) and process singletons.

This file is not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import platform
import re
import sys
import tarfile
import types
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# The same tokenspeed revision, read and hashed the same way as the layout recorder's.
from record_tokenspeed import COMMIT, REF, REPO, _error, _git, git_blob_id

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
DEFAULT_OUT = FIXTURES / "tokenspeed-1152" / "weights.json"

TREES = ("python/tokenspeed", "tokenspeed-kernel/python/tokenspeed_kernel")
REAL_KERNEL_MODULES = (
    "tokenspeed_kernel.platform",
    "tokenspeed_kernel.registry",
    "tokenspeed_kernel.selection",
    "tokenspeed_kernel.signature",
    "tokenspeed_kernel.ops.moe",
)
STUBBED_ROOTS = (
    "tokenspeed_kernel",
    "tokenspeed_mla",
    "tokenspeed_scheduler",
    "flashinfer",
    "deep_gemm",
    "deep_ep",
    "sgl_kernel",
    "cuda",
    "iris",
    "mooncake",
    "nixl",
    "pynvml",
    "amdsmi",
    "aiter",
    "cutlass",
    "triton",
    "tvm_ffi",
)
DRAFT_MASK_TOKEN_ID = 163838


# --------------------------------------------------------------------------------------
# extract
# --------------------------------------------------------------------------------------


def extract(git_dir: Path, rev: str, dest: Path) -> str:
    """Write the two trees at ``rev`` under ``dest`` with a REVISION file; return the commit."""
    commit = _git(git_dir, "rev-parse", "--verify", f"{rev}^{{commit}}").decode().strip()
    archive = _git(git_dir, "archive", "--format=tar", commit, "--", *TREES)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    blobs = {}
    for line in _git(git_dir, "ls-tree", "-r", commit, "--", *TREES).decode().splitlines():
        meta, path = line.split("\t", 1)
        blobs[path] = meta.split()[2]
    (dest / "REVISION").write_text(
        json.dumps({"repo": REPO, "commit": commit, "blobs": blobs}, indent=1) + "\n"
    )
    return commit


def read_revision(source: Path, allow_other: bool) -> dict[str, Any]:
    recorded: dict[str, Any] = json.loads((source / "REVISION").read_text())
    if recorded.get("commit") != COMMIT and not allow_other:
        raise SystemExit(
            f"{source}: commit {recorded.get('commit')!r}; extract {COMMIT} or pass "
            "--allow-other-revision"
        )
    return recorded


def imported_files(source: Path, revision: dict[str, Any]) -> dict[str, Any]:
    """Blob ids of every file of the extracted tree that was imported, checked against
    REVISION."""
    root = source.resolve()
    found: dict[str, str] = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if root in path.parents:
            rel = path.relative_to(root).as_posix()
            found[rel] = git_blob_id(path.read_bytes())
    expected = revision["blobs"]
    drift = sorted(path for path, blob in found.items() if expected.get(path) != blob)
    if drift:
        raise SystemExit(f"files differing from REVISION: {drift}")
    return {"count": len(found), "files_match_commit": True}


# --------------------------------------------------------------------------------------
# loading tokenspeed with stubs
# --------------------------------------------------------------------------------------


class _Inert:
    """Permissive placeholder: callable, subscriptable, usable as decorator or base."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # decorator use
        return _Inert()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())

    def __getitem__(self, key: Any) -> Any:
        return _Inert()

    def __mro_entries__(self, bases: Any) -> tuple[type, ...]:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value: Any = type(name, (_Inert,), {}) if name[:1].isupper() else _Inert()
        setattr(self, name, value)
        return value


STUBBED: set[str] = set()


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Placeholder modules: the stubbed roots, and any third-party module a tokenspeed module
    imports that is not installed."""

    def __init__(self, kernel_root: Path) -> None:
        self.kernel_root = kernel_root
        self.missing: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        root = fullname.split(".", maxsplit=1)[0]
        if any(fullname == m or fullname.startswith(m + ".") for m in REAL_KERNEL_MODULES):
            return self._real_kernel(fullname)
        if root in STUBBED_ROOTS or root in self.missing:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def _real_kernel(self, fullname: str) -> Any:
        base = self.kernel_root.joinpath(*fullname.split("."))
        if base.is_dir():
            return importlib.util.spec_from_file_location(
                fullname, base / "__init__.py", submodule_search_locations=[str(base)]
            )
        return importlib.util.spec_from_file_location(fullname, base.with_suffix(".py"))

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        STUBBED.add(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _Missing(importlib.abc.MetaPathFinder):
    """Last resort: a top-level module nothing else finds, imported from tokenspeed code."""

    def __init__(self, stubs: _Stubs) -> None:
        self.stubs = stubs

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        root = fullname.split(".", maxsplit=1)[0]
        if root == "tokenspeed" or "." in fullname or not _imported_from_tokenspeed():
            return None
        self.stubs.missing.add(root)
        return importlib.machinery.ModuleSpec(fullname, self.stubs, is_package=True)


def _imported_from_tokenspeed() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib")) and name != __name__:
            return bool(name.startswith("tokenspeed"))
        frame = frame.f_back  # type: ignore[assignment]
    return False


class _InertStream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _no_compile(fn: Any = None, **kwargs: Any) -> Any:
    return fn if fn is not None else (lambda f: f)


EMULATED_GPU = {"vendor": "nvidia", "device_name": "NVIDIA H200", "arch": "9.0", "sm_count": 132}


def load_tokenspeed(source: Path) -> types.SimpleNamespace:
    """Import tokenspeed's classes from the extracted tree with the stubs above."""
    sys.path.insert(0, str(source / "python"))
    stubs = _Stubs(source / "tokenspeed-kernel" / "python")
    sys.meta_path.insert(0, stubs)
    sys.meta_path.append(_Missing(stubs))
    import torch  # noqa: PLC0415 - after the finders

    torch.compile = _no_compile  # type: ignore[assignment]
    torch.cuda.Stream = _InertStream  # type: ignore[assignment,misc]
    torch.cuda.Event = _InertStream  # type: ignore[assignment,misc]

    plat: Any = importlib.import_module("tokenspeed_kernel.platform")
    arch = plat.ArchVersion(9, 0)
    plat.Platform.override(
        plat.PlatformInfo(
            vendor="nvidia",
            arch_version=arch,
            device_name=EMULATED_GPU["device_name"],
            device_count=8,
            total_memory=150_000_000_000,
            memory_bandwidth=4800.0,
            sm_count=132,
            max_threads_per_sm=2048,
            max_shared_memory_per_sm=233_472,
            sm_features=plat._get_cuda_sm_features(arch),
        )
    )
    moe: Any = importlib.import_module("tokenspeed_kernel.ops.moe")
    kernel: Any = importlib.import_module("tokenspeed_kernel")
    kernel.moe_plan = moe.moe_plan
    kernel.moe_process_weights = lambda plan, module: None  # a load-time step
    marlin: Any = importlib.import_module("tokenspeed_kernel.thirdparty.cuda.marlin_moe")
    marlin.is_marlin_moe_available = lambda: True  # the Marlin extension on H200
    k3: Any = importlib.import_module("tokenspeed.runtime.models.kimi_k3")
    k3.situ_moe_unavailable_reason = lambda: None
    ns = types.SimpleNamespace(
        torch=torch,
        k3=k3,
        dspark=importlib.import_module("tokenspeed.runtime.models.kimi_k3_dspark"),
        k3_config=importlib.import_module("tokenspeed.runtime.configs.kimi_k3_config"),
        dspark_config=importlib.import_module("tokenspeed.runtime.configs.kimi_k3_dspark_config"),
        mapping=importlib.import_module("tokenspeed.runtime.distributed.mapping"),
        env=importlib.import_module("tokenspeed.runtime.utils.env"),
        quant=importlib.import_module("tokenspeed.runtime.layers.quantization"),
        layernorm=importlib.import_module("tokenspeed.runtime.layers.layernorm"),
        comm=importlib.import_module("tokenspeed.runtime.models.kimi_k3_comm"),
        registry=importlib.import_module("tokenspeed.runtime.models.registry"),
        server_args=importlib.import_module("tokenspeed.runtime.utils.server_args"),
    )
    return ns


# --------------------------------------------------------------------------------------
# the cases
# --------------------------------------------------------------------------------------

_IGNORE_ALL_BUT_EXPERTS = [
    "lm_head",
    "re:.*self_attn.*",
    "re:.*shared_experts.*",
    "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    "re:.*\\.mlp\\.gate$",
    "re:vision_tower.*",
    "re:mm_projector.*",
]


def _compressed(fmt: str, kind: str) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 4,
                    "type": kind,
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": 32,
                    "dynamic": False,
                    "actorder": None,
                    "observer": "minmax",
                },
                "input_activations": None,
                "output_activations": None,
            }
        },
        "ignore": _IGNORE_ALL_BUT_EXPERTS,
        "quantization_status": "compressed",
        "kv_cache_scheme": None,
    }


QUANTIZATIONS: dict[str, dict[str, Any]] = {
    "ct-mxfp4": _compressed("mxfp4-pack-quantized", "float"),
    "ct-mxfp4-no-ignore": {**_compressed("mxfp4-pack-quantized", "float"), "ignore": []},
    "mxfp4": {"quant_method": "mxfp4"},
    "ct-int4": _compressed("pack-quantized", "int"),
    "fp8-block": {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
    },
    "modelopt-nvfp4": {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": ["lm_head", "*self_attn*", "*shared_experts*", "*mlp*", "*vision*"],
    },
}
"""The ``quantization_config`` each quantized case puts in the K3 fixture's text_config."""

GIVEN_AS_VLLM_READS = {
    "intermediate_size": 11008,
    "routed_expert_hidden_size": None,
    "latent_moe_use_norm": False,
}
"""The fields the K3 fixture omits, given as vLLM and SGLang default them (tokenspeed's own
defaults are the checkpoint's: 33,792, 3,584 and true)."""


def case(
    case_id: str,
    attn_tp: int,
    *,
    dp: int = 1,
    ep: bool = False,
    mm: str = "weights",
    language_only: bool = False,
    quant: str | None = None,
    draft: bool = False,
    rank: int = 0,
    text: dict[str, Any] | None = None,
    model: str = "kimi-k3",
) -> dict[str, Any]:
    """One recorded launch: tokenspeed's flags and the fixture changes."""
    flags = [f"--tp {attn_tp}"]
    if dp > 1:
        flags.append(f"--data-parallel-size {dp}")
    if ep:
        flags.append("--enable-expert-parallel")
    if mm != "weights":
        flags.append(f"--mm-encoder-tp-mode {mm}")
    if language_only:
        flags.append("--language-model-only")
    if draft:
        flags.append("--speculative-algorithm DSPARK")
    return {
        "id": case_id,
        "model": model,
        "attn_tp": attn_tp,
        "attn_dp": dp,
        "expert_parallel": ep,
        "mm_encoder_tp_mode": mm,
        "language_model_only": language_only,
        "quantization": quant,
        "draft": draft,
        "rank": rank,
        "text_config": text or {},
        "server_args": " ".join(flags),
    }


CASES: tuple[dict[str, Any], ...] = (
    # bf16, tokenspeed's defaults (--mm-encoder-tp-mode weights: the ViT over attention TP)
    case("bf16-tp1", 1),
    case("bf16-tp2", 2),
    case("bf16-tp4", 4),
    case("bf16-tp8", 8),
    case("bf16-tp16", 16),
    case("bf16-tp32", 32),
    # the vision tower replicated (--mm-encoder-tp-mode data)
    case("bf16-tp8-data", 8, mm="data"),
    case("bf16-tp8-data-rank7", 8, mm="data", rank=7),
    case("bf16-tp16-data", 16, mm="data"),
    case("bf16-tp32-data", 32, mm="data"),
    # without the vision tower (--language-model-only)
    case("bf16-tp1-language", 1, language_only=True),
    case("bf16-tp8-language", 8, language_only=True),
    case("bf16-tp16-language", 16, language_only=True),
    # attention DP (world = attn_tp x dp; MoE over the world, lm_head replicated)
    case("bf16-tp4-dp2", 4, dp=2),
    case("bf16-tp2-dp4", 2, dp=4),
    case("bf16-tp2-dp4-rank7", 2, dp=4, rank=7),
    case("bf16-tp1-dp8", 1, dp=8),
    case("bf16-tp8-dp2-data", 8, dp=2, mm="data"),
    # MoE TP 64: 3,072 / 64 = 48 rows a rank, not a multiple of the kernels' 32
    case("bf16-tp32-dp2-data", 32, dp=2, mm="data"),
    # bf16 experts with expert parallelism: no SiTU kernel
    case("bf16-tp8-ep", 8, ep=True, mm="data"),
    case("bf16-tp4-dp2-ep", 4, dp=2, ep=True),
    # fields the fixture omits, given as vLLM / SGLang read them; the MLA gate off
    case("bf16-tp8-data-given", 8, mm="data", text=GIVEN_AS_VLLM_READS),
    case("bf16-tp8-data-no-gate", 8, mm="data", text={"mla_use_output_gate": False}),
    case("bf16-tp8-data-no-attn-res", 8, mm="data", text={"attn_res_block_size": None}),
    # MXFP4 experts (compressed-tensors, everything else ignored)
    case("ct-mxfp4-tp8-ep", 8, ep=True, mm="data", quant="ct-mxfp4"),
    case("ct-mxfp4-tp8", 8, mm="data", quant="ct-mxfp4"),
    case("ct-mxfp4-tp4-dp2-ep", 4, dp=2, ep=True, quant="ct-mxfp4"),
    case("ct-mxfp4-tp2", 2, quant="ct-mxfp4"),
    case("ct-mxfp4-tp32-dp2", 32, dp=2, mm="data", quant="ct-mxfp4"),
    case("ct-mxfp4-tp32-dp2-ep", 32, dp=2, ep=True, mm="data", quant="ct-mxfp4"),
    case("mxfp4-tp8-ep", 8, ep=True, mm="data", quant="mxfp4"),
    case("mxfp4-tp8", 8, mm="data", quant="mxfp4"),
    # every Linear quantized (nothing ignored): tokenspeed has no such compressed-tensors path
    case("ct-mxfp4-no-ignore-tp8", 8, ep=True, mm="data", quant="ct-mxfp4-no-ignore"),
    # quantizations without a SiTU kernel on Hopper
    case("fp8-block-tp8", 8, mm="data", quant="fp8-block"),
    case("fp8-block-tp8-ep", 8, ep=True, mm="data", quant="fp8-block"),
    case("ct-int4-tp8", 8, mm="data", quant="ct-int4"),
    case("modelopt-nvfp4-tp8", 8, mm="data", quant="modelopt-nvfp4"),
    # the DSpark draft
    case("dspark-tp8-data", 8, mm="data", draft=True),
    case("dspark-tp4", 4, draft=True),
    case("dspark-tp1-dp8", 1, dp=8, draft=True),
    # the vocabulary does not split
    case("bf16-tp96-data", 96, mm="data"),
    case("bf16-tp96", 96),
    # Kimi-Linear: no tokenspeed model
    case("kimi-linear-tp8", 8, model="kimi-linear-48b"),
)


# --------------------------------------------------------------------------------------
# build and list
# --------------------------------------------------------------------------------------


def _mapping(ts: types.SimpleNamespace, c: dict[str, Any]) -> Any:
    """tokenspeed's Mapping as ServerArgs.resolve_parallelism builds it from the flags."""
    attn_tp, dp = c["attn_tp"], c["attn_dp"]
    world = attn_tp * dp
    ep = world if c["expert_parallel"] else 1
    vision_tp, vision_dp = (1, attn_tp) if c["mm_encoder_tp_mode"] == "data" else (attn_tp, 1)
    mapping = ts.mapping.Mapping(
        world_size=world,
        attn_tp_size=attn_tp,
        attn_cp_size=1,
        attn_dp_size=dp,
        dense_tp_size=attn_tp,
        dense_dp_size=None,
        moe_tp_size=world // ep,
        moe_ep_size=ep,
        moe_dp_size=None,
        vision_tp_size=vision_tp,
        vision_dp_size=vision_dp,
        nprocs_per_node=world,
        nnodes=1,
    )
    mapping.rank = c["rank"]
    if mapping.moe.has_tp and mapping.moe.has_ep:
        raise ValueError("MoE TP and EP cannot be both > 1")
    return mapping


def _quant_config(ts: types.SimpleNamespace, config: dict[str, Any] | None) -> Any:
    """As ModelConfig._verify_quantization and get_quant_config resolve it."""
    if config is None:
        return None
    method = str(config.get("quant_method", "")).lower()
    for cls in ts.quant.QUANTIZATION_METHODS.values():
        override = cls.override_quantization_method(config, None)
        if override:
            method = override
            break
    return ts.quant.get_quantization_config(method).from_config(config)


def _seed_comm_state(ts: types.SimpleNamespace, mapping: Any, hidden: int) -> None:
    state = ts.comm.K3AttnCommState.__new__(ts.comm.K3AttnCommState)
    state.mapping, state.hidden_size, state.attn_ar_fusion_ok = mapping, hidden, False
    with ts.torch.device("meta"):
        state.dummy_norm = ts.layernorm.RMSNorm(hidden, eps=1e-6)
    ts.comm.K3AttnCommState._instance = state
    ts.comm.K3MoeTailCommState._instance = None


def build(ts: types.SimpleNamespace, c: dict[str, Any]) -> tuple[Any, Any, list[int]]:
    """One rank of tokenspeed's Kimi-K3 (and draft) on meta; the K3 config's KDA layers."""
    torch = ts.torch
    mapping = _mapping(ts, c)
    ts.env.global_server_args_dict["mapping"] = mapping
    raw = json.loads((FIXTURES / "kimi-k3.config.json").read_text())
    raw["text_config"].update(c["text_config"])
    quant = QUANTIZATIONS[c["quantization"]] if c["quantization"] else None
    if quant is not None:
        raw["text_config"]["quantization_config"] = quant
    config = ts.k3_config.KimiK3Config(**raw)
    quant_config = _quant_config(ts, quant)
    _seed_comm_state(ts, mapping, config.text_config.hidden_size)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = ts.k3.KimiK3ForConditionalGeneration(
                config=config,
                mapping=mapping,
                quant_config=quant_config,
                is_multimodal_active=not c["language_model_only"],
                mm_attention_backend=None,
            )
            draft = None
            if c["draft"]:
                raw_draft = json.loads(
                    (FIXTURES / "kimi-k3-dspark-draft" / "config.json").read_text()
                )
                raw_draft.pop("model_type", None)
                raw_draft.setdefault("mask_token_id", DRAFT_MASK_TOKEN_ID)
                draft_config = ts.dspark_config.KimiK3DSparkConfig(**raw_draft)
                draft = ts.dspark.K3DSparkModel(draft_config, mapping=mapping, quant_config=None)
    finally:
        torch.set_default_dtype(old)
    kda = [
        i for i in range(config.text_config.num_hidden_layers) if config.text_config.is_kda_layer(i)
    ]
    return model, draft, kda


_LAYER = re.compile(r"(^|\.)(layers|blocks)\.(\d+)\.")


def kind_of(name: str, kda: set[int], draft: bool) -> str:
    """The k3layout weight kind of one tokenspeed parameter or buffer, by its name."""
    if draft:
        return "draft"
    if name.startswith("vision."):
        return "vision"
    if ".embed_tokens." in name:
        return "embedding"
    if name.startswith("language_model.lm_head."):
        return "lm_head"
    if "_res_" in name:
        return "attention_residual"
    if ".block_sparse_moe.gate." in name:
        return "moe_router"
    if ".block_sparse_moe.shared_experts." in name:
        return "shared_experts"
    if ".block_sparse_moe." in name:
        return "routed_experts"  # the experts and the latent projections and norm
    if ".mlp." in name:
        return "dense_mlp"
    layer = _LAYER.search(name)
    if ".self_attn." in name and layer is not None:
        return "kda" if int(layer.group(3)) in kda else "mla"
    return "norm"


def _ranges(indices: Sequence[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3,5"``."""
    out: list[str] = []
    start = prev = indices[0]
    for i in (*indices[1:], None):
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
        if i is not None:
            start = prev = i
    return ",".join(out)


def inventory(module: Any, kda: set[int], draft: bool) -> dict[str, Any]:
    """Every parameter and buffer: bytes in all and per kind, and the tensors with their
    layer (or vision block) index folded into ``*`` and listed as ranges."""
    by_kind: dict[str, int] = {}
    rows: dict[tuple[str, tuple[int, ...], str, bool], list[int]] = {}
    totals = {"parameters": 0, "buffers": 0}
    items = [(n, t, False) for n, t in module.named_parameters()]
    items += [(n, t, True) for n, t in module.named_buffers()]
    for name, tensor, buffer in items:
        nbytes = tensor.numel() * tensor.element_size()
        totals["buffers" if buffer else "parameters"] += nbytes
        kind = kind_of(name, kda, draft)
        by_kind[kind] = by_kind.get(kind, 0) + nbytes
        found = _LAYER.search(name)
        pattern = _LAYER.sub(r"\1\2.*.", name, count=1) if found else name
        key = (pattern, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), buffer)
        rows.setdefault(key, [])
        if found:
            rows[key].append(int(found.group(3)))
    tensors = [
        {
            "name": pattern,
            "shape": list(shape),
            "dtype": dtype,
            "buffer": buffer,
            "layers": _ranges(sorted(layers)) if layers else "",
        }
        for (pattern, shape, dtype, buffer), layers in rows.items()
    ]
    return {
        "parameter_bytes": totals["parameters"],
        "buffer_bytes": totals["buffers"],
        "total_bytes": totals["parameters"] + totals["buffers"],
        "by_kind": by_kind,
        "tensors": tensors,
    }


def run_case(ts: types.SimpleNamespace, c: dict[str, Any]) -> dict[str, Any]:
    if c["model"] == "kimi-linear-48b":
        architectures = json.loads((FIXTURES / "kimi-linear-48b-a3b.config.json").read_text())[
            "architectures"
        ]
        try:
            ts.registry.ModelRegistry.resolve_model_cls(architectures)
        except Exception as exc:
            return {
                **c,
                "status": "refused",
                "stage": "ModelRegistry.resolve_model_cls",
                "error": _error(exc),
            }
        raise RuntimeError("tokenspeed resolved Kimi-Linear: re-check the refusal")
    plans: list[str] = []
    kernel: Any = importlib.import_module("tokenspeed_kernel")
    real_plan = kernel.moe_plan

    def recording_plan(*args: Any, **kwargs: Any) -> Any:
        plan = real_plan(*args, **kwargs)
        plans.append(plan["apply_kernel_name"])
        return plan

    kernel.moe_plan = recording_plan
    try:
        model, draft, kda = build(ts, c)
    except Exception as exc:
        return {**c, "status": "refused", "stage": "model construction", "error": _error(exc)}
    finally:
        kernel.moe_plan = real_plan
    kda_set = set(kda)
    target = inventory(model, kda_set, draft=False)
    drafted = inventory(draft, kda_set, draft=True) if draft is not None else None
    total = target["total_bytes"] + (drafted["total_bytes"] if drafted else 0)
    return {
        **c,
        "status": "built",
        "moe_kernels": sorted(set(plans)),
        "total_bytes": total,
        "target": target,
        "draft": drafted,
    }


# --------------------------------------------------------------------------------------
# record
# --------------------------------------------------------------------------------------


def record(source: Path, out: Path, allow_other: bool) -> None:
    import logging  # noqa: PLC0415

    revision = read_revision(source, allow_other)
    ts = load_tokenspeed(source)
    logging.disable(logging.WARNING)
    cases = []
    for c in CASES:
        result = run_case(ts, c)
        cases.append(result)
        said = result.get("total_bytes", result.get("error", {}).get("message", ""))
        print(f"{c['id']:28s} {result['status']:8s} {str(said)[:110]}")
    files = imported_files(source, revision)
    import transformers  # noqa: PLC0415 - recorded beside the revision

    payload = {
        "source": {
            "repo": REPO,
            "ref": REF if revision["commit"] == COMMIT else None,
            "commit": revision["commit"],
            "imported_files": files,
        },
        "recorder": "tests/tools/record_tokenspeed_weights.py",
        "command": "record --source <extracted tree>",
        "python": platform.python_version(),
        "torch": ts.torch.__version__,
        "transformers": transformers.__version__,
        "emulated_gpu": EMULATED_GPU,
        "real_kernel_modules": list(REAL_KERNEL_MODULES),
        "stubbed_roots": sorted({name.split(".")[0] for name in STUBBED}),
        "fixtures": {
            "kimi-k3": "tests/fixtures/kimi-k3.config.json (+ each case's text_config)",
            "draft": "tests/fixtures/kimi-k3-dspark-draft/config.json (+ mask_token_id "
            f"{DRAFT_MASK_TOKEN_ID})",
            "kimi-linear-48b": "tests/fixtures/kimi-linear-48b-a3b.config.json",
        },
        "quantizations": QUANTIZATIONS,
        "counted": "every parameter and buffer of the built modules (named_parameters, "
        "named_buffers); tensors: the layer or vision-block index folded into '*', the "
        "indices listed as ranges",
        "cases": cases,
    }
    text = json.dumps(payload, indent=1) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"{out}: {len(text):,} bytes, {len(cases)} cases")


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ext = commands.add_parser("extract", help="extract tokenspeed's python trees")
    ext.add_argument("--git-dir", type=Path, required=True)
    ext.add_argument("--rev", default=COMMIT)
    ext.add_argument("--dest", type=Path, required=True)
    rec = commands.add_parser("record", help="build the cases and write the JSON")
    rec.add_argument("--source", type=Path, required=True)
    rec.add_argument("--out", type=Path, default=DEFAULT_OUT)
    rec.add_argument("--allow-other-revision", action="store_true")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.command == "extract":
        print(extract(args.git_dir, args.rev, args.dest))
    else:
        record(args.source, args.out, args.allow_other_revision)


if __name__ == "__main__":
    main()
