"""Record tokenspeed's own Kimi-K3 KV-cache answers: the truth for ``engine="tokenspeed"``.

tokenspeed (github.com/lightseekorg/tokenspeed) plans Kimi-K3's cache in its "kimi_k3" cache
recipe. This tool runs that recipe -- tokenspeed's own ``KimiK3Recipe``, ``pack``,
``CacheLayout.bind``, ``CacheMemoryPlan.field_page_byte_offset``, ``CacheRecipe.setup`` and
``MLAConfig.generate`` -- over Kimi-K3, Kimi-K3 + its DSpark draft and Kimi-Linear-48B, and
writes what they answer as JSON under ``tests/fixtures/tokenspeed-1152/`` (``--revision
pr1152``, the default) or ``tests/fixtures/tokenspeed-main/`` (``--revision main``). No
tokenspeed code is copied into this project: the tool imports the files from an extracted
tokenspeed tree.

Revisions
    ``pr1152`` (default): PR #1152 of lightseekorg/tokenspeed ("derive the Kimi-K3 MLA packing
    from the KDA state size"), ref ``refs/pull/1152/head``, commit
    ``a6ee91b3e612d111b0ad6361607f221419d139f7``.

    ``main``: tokenspeed's ``main`` at commit ``f4d8ec6e039c028c7ee71317ccfb84e56ae2b45c``
    (ref ``refs/heads/main`` when it was fetched). #1152 is not merged there: ``main`` keeps a
    fixed 12:1 MLA packing, sizes the speculative-verify workspace for the KDA replay commit
    (PR #1156) when tokenspeed-kernel can run it, and derives each pool's state groups from the
    memory plan instead of a per-layer ``layer_group_ids`` tuple (PR #1178).

Fetching
    tokenspeed is not installable here. Get a git directory of the repository (in this
    workplace: the ``fetch`` tool with ``github:lightseekorg/tokenspeed``, which leaves a bare
    git directory at ``/work/.mirror/lightseekorg+tokenspeed/repo``; anywhere else:
    ``git clone --bare https://github.com/lightseekorg/tokenspeed`` and
    ``git fetch origin refs/pull/1152/head``), then extract the few files this tool reads::

        .venv/bin/python tests/tools/record_tokenspeed.py extract \\
            --git-dir /work/.mirror/lightseekorg+tokenspeed/repo --dest /tmp/ts
        .venv/bin/python tests/tools/record_tokenspeed.py record --source /tmp/ts

        .venv/bin/python tests/tools/record_tokenspeed.py extract --revision main \\
            --git-dir /work/.mirror/lightseekorg+tokenspeed/repo --dest /tmp/ts-main
        .venv/bin/python tests/tools/record_tokenspeed.py record --revision main \\
            --source /tmp/ts-main

    ``extract`` writes ``REVISION`` in the destination; ``record`` refuses a tree whose files
    do not hash to the blobs of that revision (``--allow-other-revision`` records another
    commit, naming it), and a tree extracted for the other ``--revision``.

What is imported, what is stubbed, and why (both revisions)
    Imported and run unchanged (``python/tokenspeed/runtime/...``):
    ``layers/attention/kv_cache/recipes/{__init__,base,plan,spec,cache_runtime,kimi_k3,setup}.py``,
    ``layers/attention/configs/{base,mla}.py`` (cache-dtype resolution, ``max_bs``),
    ``configs/kimi_k3_config.py``, ``configs/kimi_k3_dspark_config.py`` (transformers'
    ``PretrainedConfig`` from this venv). Read as text only (``ast``, never imported):
    ``utils/server_args.py`` (the ``--kv-cache-dtype`` choices) and
    ``layers/attention/registry.py`` (which architectures take the kimi_k3 recipe).

    Stubbed (placeholders registered in ``sys.modules`` before the import):

    - the package ``__init__`` files above the recipe (``tokenspeed``, ``tokenspeed.runtime``,
      ``...attention``, ``...kv_cache``, ``tokenspeed.runtime.configs``): their real bodies
      import logging set-up, CUDA kernels and every model; the shells only point ``__path__``
      at the extracted directories;
    - ``tokenspeed.runtime.utils.env``: only ``envs.TOKENSPEED_CI_SMALL_KV_SIZE`` is read (the
      CI-only token cap); the stub answers "unset", as outside tokenspeed's CI;
    - ``tokenspeed.runtime.distributed.utils``: ``divide``, used by ``KimiLinearConfig``'s
      ``mamba2_cache_params`` (not by the recipe); the stub divides exactly or raises;
    - ``tokenspeed.runtime.configs.model_config`` / ``tokenspeed.runtime.utils.server_args``:
      ``ModelConfig`` / ``ServerArgs`` are annotations only in the attention configs (both
      modules load checkpoints, CUDA platform probes and the launcher);
    - ``recipes.{deepseek_v4,inkling,ordinary,qwen35}``: other families' recipes, imported by
      ``setup.py``'s dispatch table only.

What ``main`` adds
    ``main``'s recipe decides its verify workspace with tokenspeed-kernel's
    ``kda_replay_commit_supported`` (imported inside ``KimiK3Recipe.replay_kda``), and its
    pools map state layers to groups with ``derive_state_groups_by_layer``
    (``layers/attention/kv_cache/base.py``). Also imported and run unchanged for ``main``:
    ``layers/attention/kv_cache/base.py`` and, from ``tokenspeed-kernel/python/
    tokenspeed_kernel/``, ``platform.py``, ``registry.py``, ``selection.py``,
    ``signature.py``, ``ops/attention/__init__.py`` (where ``kda_replay_commit_supported``
    lives), ``ops/attention/{kda_utils,gdn_utils}.py`` and ``ops/attention/triton/
    kda_dispatch.py`` (the registrations of the two kernels the probe asks for:
    ``kda_replay_commit`` and the no-store ``kda_fused_paged_verify``; the kernel bodies
    import Triton only when called). ``extract`` lists every tokenspeed-kernel file that
    names either operation (``git grep``) in ``REVISION``, and ``record`` refuses if one of
    them is not imported, so no stub hides a registration. More stubs for ``main``:

    - ``tokenspeed.runtime.utils`` (a package shell already) gains ``get_colorful_logger``
      (``logging.getLogger``), read by ``kv_cache/base.py`` at import;
    - ``tokenspeed.runtime.layers.paged_attention`` (``PagedAttention``, the model's attention
      layer) and ``tokenspeed.runtime.layers.attention.kv_cache.arena`` (``CacheArena``, which
      allocates the device buffer and imports Triton kernels): names ``kv_cache/base.py``
      imports for its pool classes; ``derive_state_groups_by_layer`` reads only the arena's
      ``plan`` and ``cache_group_specs``, given here as the ``CachePoolSpec`` that
      ``CacheRecipe.setup()`` returns (the arena takes both from that spec);
    - ``tokenspeed_kernel`` and ``tokenspeed_kernel.ops``: package shells (the real
      ``__init__`` imports every op and kernel);
    - ``tokenspeed_kernel.ops.attention.{cuda,deep_gemm,flash_attn,flash_mla,flashinfer,gluon,
      msa}``: backend registration modules ``ops/attention/__init__.py`` imports for their
      side effects (CUDA/HIP extensions); none names the two replay operations;
    - ``tokenspeed_kernel.ops.attention.triton``: a package shell (the real ``__init__``
      imports every Triton attention kernel); only ``kda_dispatch`` is imported;
    - ``tokenspeed_kernel.profiling``: ``ShapeCapture``/``kernel_scope`` placeholders (the
      real module imports Triton's proton profiler; used only when a kernel runs).

    The platform ``kda_replay_commit_supported`` sees is tokenspeed-kernel's
    ``Platform.override``: an NVIDIA H200 (SM 9.0), the platform every ``main`` answer is
    recorded on; the ``without_replay`` / ``budgets_without_replay`` entries are recorded on an
    AMD Instinct MI350X (CDNA4, gfx950), where tokenspeed-kernel registers neither operation.
    ``TOKENSPEED_KERNEL_OVERRIDE_*`` must be unset (``select_kernel`` reads them).

Emulated (both revisions)
    tokenspeed's ``ServerArgs``/``ModelConfig`` cannot be built without a GPU and a
    checkpoint, so these are emulated: the server arguments ``MLAConfig.generate`` reads,
    set to tokenspeed's defaults (``max_num_seqs`` 160, or 80 with speculative decoding;
    ``chunked_prefill_size`` 8192; ``--kv-cache-dtype fp8`` normalised to ``fp8_e4m3``;
    ``spec_context_pad`` = 3 x draft tokens), the attention mapping (``attn_tp_size`` =
    attention TP, ``data_parallel_size`` = attention DP, so ``max_bs = max_num_seqs // dp``),
    and the model config's
    ``context_len`` (``max_position_embeddings``), ``num_attention_layers``
    (``num_hidden_layers``; the DSpark draft has no ``dspark_num_stages``) and ``dtype``
    (``torch.bfloat16``, the checkpoints' dtype).
    ``decode_input_tokens`` is 1, or ``speculative_num_draft_tokens`` (8 for DSpark: a block of
    7 proposals plus the anchor) with speculative decoding, as tokenspeed's event loop passes it;
    ``overlap_schedule_depth`` is 1 (overlap scheduling, tokenspeed's default) or 0.

Recomputed, not returned by tokenspeed
    ``padding_fraction`` (``pack`` only checks it): ``(parent // p_g - raw_g) / raw_g`` with
    ``raw_g`` the group's summed field payloads, exactly as ``pack`` computes it.
    ``main``'s ``verify_workspace`` parts (``workspace_bytes`` itself is tokenspeed's): the
    conv checkpoint rows, the replay rows and the bytes of one replay row, read off the planned
    fields as ``KimiK3Recipe.workspace_bytes`` combines them; the tool checks that the parts
    add up to tokenspeed's total and stops if they do not.

This file is not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import io
import json
import math
import os
import platform
import subprocess
import sys
import tarfile
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = "lightseekorg/tokenspeed"
REF = "refs/pull/1152/head"
COMMIT = "a6ee91b3e612d111b0ad6361607f221419d139f7"

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
DEFAULT_OUT = FIXTURES / "tokenspeed-1152"

_PY = "python/tokenspeed"
_RECIPES = f"{_PY}/runtime/layers/attention/kv_cache/recipes"
IMPORTED_FILES = (
    f"{_RECIPES}/__init__.py",
    f"{_RECIPES}/base.py",
    f"{_RECIPES}/plan.py",
    f"{_RECIPES}/spec.py",
    f"{_RECIPES}/cache_runtime.py",
    f"{_RECIPES}/kimi_k3.py",
    f"{_RECIPES}/setup.py",
    f"{_PY}/runtime/layers/attention/configs/base.py",
    f"{_PY}/runtime/layers/attention/configs/mla.py",
    f"{_PY}/runtime/configs/kimi_k3_config.py",
    f"{_PY}/runtime/configs/kimi_k3_dspark_config.py",
)
READ_FILES = (
    f"{_PY}/runtime/utils/server_args.py",
    f"{_PY}/runtime/layers/attention/registry.py",
)
ALL_FILES = IMPORTED_FILES + READ_FILES

STUBBED_MODULES = {
    "tokenspeed": "package shell (real __init__ sets up logging)",
    "tokenspeed.runtime": "package shell",
    "tokenspeed.runtime.layers": "package shell",
    "tokenspeed.runtime.layers.attention": "package shell",
    "tokenspeed.runtime.layers.attention.configs": "package shell",
    "tokenspeed.runtime.layers.attention.kv_cache": "package shell",
    "tokenspeed.runtime.configs": "package shell (real __init__ imports every model config)",
    "tokenspeed.runtime.utils": "package shell",
    "tokenspeed.runtime.distributed": "package shell",
    "tokenspeed.runtime.utils.env": "envs.TOKENSPEED_CI_SMALL_KV_SIZE answers 'unset' (CI-only "
    "token cap)",
    "tokenspeed.runtime.distributed.utils": "divide(): used by KimiLinearConfig."
    "mamba2_cache_params only",
    "tokenspeed.runtime.configs.model_config": "ModelConfig: an annotation in the attention "
    "configs",
    "tokenspeed.runtime.utils.server_args": "ServerArgs: an annotation in the attention configs",
    "tokenspeed.runtime.layers.attention.kv_cache.recipes.deepseek_v4": "another family "
    "(setup.py dispatch table)",
    "tokenspeed.runtime.layers.attention.kv_cache.recipes.inkling": "another family",
    "tokenspeed.runtime.layers.attention.kv_cache.recipes.ordinary": "another family",
    "tokenspeed.runtime.layers.attention.kv_cache.recipes.qwen35": "another family",
}

# ``main``: the same recipe files, plus what its recipe and pools import for the replay-commit
# workspace (tokenspeed-kernel's probe) and the plan-derived state groups (kv_cache/base.py).
MAIN_REF = "refs/heads/main"
MAIN_COMMIT = "f4d8ec6e039c028c7ee71317ccfb84e56ae2b45c"
_KERNEL = "tokenspeed-kernel/python/tokenspeed_kernel"
MAIN_IMPORTED_FILES = (
    *IMPORTED_FILES,
    f"{_PY}/runtime/layers/attention/kv_cache/base.py",
    f"{_KERNEL}/platform.py",
    f"{_KERNEL}/registry.py",
    f"{_KERNEL}/selection.py",
    f"{_KERNEL}/signature.py",
    f"{_KERNEL}/ops/attention/__init__.py",
    f"{_KERNEL}/ops/attention/kda_utils.py",
    f"{_KERNEL}/ops/attention/gdn_utils.py",
    f"{_KERNEL}/ops/attention/triton/kda_dispatch.py",
)
# The operations KimiK3Recipe.replay_kda's probe selects; every tokenspeed-kernel file naming
# one of them must be imported, not stubbed.
REPLAY_OPS = ("kda_replay_commit", "kda_fused_paged_verify")
_ATTENTION_BACKENDS = ("cuda", "deep_gemm", "flash_attn", "flash_mla", "flashinfer", "gluon", "msa")
MAIN_STUBBED_MODULES = {
    **STUBBED_MODULES,
    "tokenspeed.runtime.utils": "package shell; get_colorful_logger = logging.getLogger "
    "(kv_cache/base.py reads it at import)",
    "tokenspeed.runtime.layers.paged_attention": "PagedAttention: the model's attention layer, "
    "imported by kv_cache/base.py's pool classes",
    "tokenspeed.runtime.layers.attention.kv_cache.arena": "CacheArena: allocates the device "
    "buffer (Triton kernels); derive_state_groups_by_layer reads only plan and "
    "cache_group_specs, given as CacheRecipe.setup()'s CachePoolSpec",
    "tokenspeed_kernel": "package shell (real __init__ imports every op and kernel)",
    "tokenspeed_kernel.ops": "package shell",
    **{
        f"tokenspeed_kernel.ops.attention.{name}": "backend registration imported for its "
        "side effects (CUDA/HIP); names neither replay operation"
        for name in _ATTENTION_BACKENDS
    },
    "tokenspeed_kernel.ops.attention.triton": "package shell (real __init__ imports every "
    "Triton attention kernel); only kda_dispatch is imported",
    "tokenspeed_kernel.profiling": "ShapeCapture/kernel_scope placeholders (the real module "
    "imports Triton's proton; used only when a kernel runs)",
}


@dataclass(frozen=True)
class Revision:
    """One tokenspeed revision this tool records: what it reads and where it writes."""

    key: str
    ref: str
    commit: str
    out: Path
    imported_files: tuple[str, ...]
    read_files: tuple[str, ...]
    stubbed_modules: dict[str, str]

    @property
    def all_files(self) -> tuple[str, ...]:
        return self.imported_files + self.read_files

    @property
    def is_main(self) -> bool:
        return self.key == "main"


REVISIONS = {
    "pr1152": Revision(
        "pr1152", REF, COMMIT, DEFAULT_OUT, IMPORTED_FILES, READ_FILES, STUBBED_MODULES
    ),
    "main": Revision(
        "main",
        MAIN_REF,
        MAIN_COMMIT,
        FIXTURES / "tokenspeed-main",
        MAIN_IMPORTED_FILES,
        READ_FILES,
        MAIN_STUBBED_MODULES,
    ),
}

# The platforms tokenspeed-kernel's selection is shown (Platform.override). Every ``main``
# answer is recorded on the first; ``without_replay`` entries on the second.
PLATFORMS: dict[str, dict[str, Any]] = {
    "nvidia-h200": {
        "vendor": "nvidia",
        "arch": (9, 0),
        "device_name": "NVIDIA H200",
        "sm_count": 132,
        "max_shared_memory_per_sm": 233_472,
        "total_memory": 150_000_000_000,
        "memory_bandwidth": 4800.0,
    },
    "amd-mi350x": {
        "vendor": "amd",
        "arch": (9, 5),
        "device_name": "AMD Instinct MI350X",
        "sm_count": 256,
        "max_shared_memory_per_sm": 160 * 1024,
        "total_memory": 288_000_000_000,
        "memory_bandwidth": 8000.0,
    },
}
REPLAY_PLATFORM = "nvidia-h200"
NO_REPLAY_PLATFORM = "amd-mi350x"

# What the sweep asks: every --kv-cache-dtype spelling tokenspeed's CLI takes, the one its
# resolve_dtype() also takes, and k3layout's own spellings.
DTYPE_SPELLINGS = ("auto", "fp8", "fp8_e4m3", "mxfp8", "bfloat16", "bf16", "fp8_ds_mla")
ATTN_TPS = (*range(1, 65), 96)
ATTN_DPS = (1, 8)
DSPARK_DRAFT_TOKENS = 8  # 7 proposals + the anchor: DSpark's verify window
DEFAULT_CHUNKED_PREFILL = 8192
SPEC_OVERSHOOT_SPANS = 3


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# --------------------------------------------------------------------------------------
# extract
# --------------------------------------------------------------------------------------


def _git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True
    ).stdout


def extract(git_dir: Path, rev: str | None, dest: Path, revision: Revision) -> str:
    """Write the files ``revision`` reads, at ``rev`` (default: its commit), under ``dest``;
    return the full commit."""
    rev = rev or revision.commit
    commit = _git(git_dir, "rev-parse", "--verify", f"{rev}^{{commit}}").decode().strip()
    files = revision.all_files
    archive = _git(git_dir, "archive", "--format=tar", commit, "--", *files)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    blobs = {}
    for path in files:
        line = _git(git_dir, "ls-tree", commit, "--", path).decode().split()
        blobs[path] = line[2]
    meta: dict[str, Any] = {"repo": REPO, "commit": commit, "blobs": blobs}
    if revision.is_main:
        meta["revision"] = revision.key
        meta["replay_op_files"] = replay_op_files(git_dir, commit)
    (dest / "REVISION").write_text(json.dumps(meta, indent=1) + "\n")
    return commit


def replay_op_files(git_dir: Path, commit: str) -> list[str]:
    """Every tokenspeed-kernel file at ``commit`` that names one of REPLAY_OPS (quoted)."""
    patterns = [arg for op in REPLAY_OPS for arg in ("-e", f'"{op}"')]
    found = subprocess.run(
        [
            "git",
            f"--git-dir={git_dir}",
            "grep",
            "-l",
            "-F",
            *patterns,
            commit,
            "--",
            "tokenspeed-kernel/python",
        ],
        check=False,
        capture_output=True,
    )
    if found.returncode not in (0, 1):
        raise RuntimeError(found.stderr.decode())
    return sorted(line.split(":", 1)[1] for line in found.stdout.decode().splitlines())


# --------------------------------------------------------------------------------------
# loading tokenspeed with stubs
# --------------------------------------------------------------------------------------


class _Unset:
    """``envs.X`` of the stub env module: never set."""

    @staticmethod
    def get_set_value_or(value: object) -> object:
        return value


def _divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator


def _module(name: str, **attrs: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    sys.modules[name] = module
    return module


def _placeholder(name: str) -> type:
    return type(name, (), {"__doc__": "stub: not part of the Kimi-K3 cache recipe"})


def load_tokenspeed(source: Path, revision: Revision = REVISIONS["pr1152"]) -> SimpleNamespace:
    """Import the recipe from the extracted tree ``source`` behind the stubs."""
    py = source / "python"
    if not (py / "tokenspeed").is_dir():
        raise SystemExit(f"{source} holds no python/tokenspeed (run `extract` first)")
    if any(name.split(".", 1)[0] in ("tokenspeed", "tokenspeed_kernel") for name in sys.modules):
        raise RuntimeError("tokenspeed is already imported in this process")
    shells = {
        "tokenspeed": "tokenspeed",
        "tokenspeed.runtime": "tokenspeed/runtime",
        "tokenspeed.runtime.layers": "tokenspeed/runtime/layers",
        "tokenspeed.runtime.layers.attention": "tokenspeed/runtime/layers/attention",
        "tokenspeed.runtime.layers.attention.configs": (
            "tokenspeed/runtime/layers/attention/configs"
        ),
        "tokenspeed.runtime.layers.attention.kv_cache": (
            "tokenspeed/runtime/layers/attention/kv_cache"
        ),
        "tokenspeed.runtime.configs": "tokenspeed/runtime/configs",
        "tokenspeed.runtime.utils": "tokenspeed/runtime/utils",
        "tokenspeed.runtime.distributed": "tokenspeed/runtime/distributed",
    }
    for name, rel in shells.items():
        _module(name, __path__=[str(py / rel)])
    _module(
        "tokenspeed.runtime.utils.env",
        envs=SimpleNamespace(TOKENSPEED_CI_SMALL_KV_SIZE=_Unset()),
    )
    _module("tokenspeed.runtime.distributed.utils", divide=_divide)
    _module("tokenspeed.runtime.configs.model_config", ModelConfig=_placeholder("ModelConfig"))
    _module("tokenspeed.runtime.utils.server_args", ServerArgs=_placeholder("ServerArgs"))
    kernel = _load_kernel(source) if revision.is_main else None
    recipes = "tokenspeed.runtime.layers.attention.kv_cache.recipes"
    recipes_pkg = importlib.import_module(recipes)
    for family, cls in (
        ("deepseek_v4", "DeepseekV4Recipe"),
        ("inkling", "InklingRecipe"),
        ("ordinary", "OrdinaryRecipe"),
        ("qwen35", "QwenGDNRecipe"),
    ):
        stub = _module(f"{recipes}.{family}", **{cls: _placeholder(cls)})
        setattr(recipes_pkg, family, stub)
    kimi_k3 = importlib.import_module(f"{recipes}.kimi_k3")
    plan = importlib.import_module(f"{recipes}.plan")
    setup = importlib.import_module(f"{recipes}.setup")
    mla = importlib.import_module("tokenspeed.runtime.layers.attention.configs.mla")
    k3_config = importlib.import_module("tokenspeed.runtime.configs.kimi_k3_config")
    dspark_config = importlib.import_module("tokenspeed.runtime.configs.kimi_k3_dspark_config")
    ts = SimpleNamespace(
        revision=revision,
        KimiK3Recipe=kimi_k3.KimiK3Recipe,
        pack=plan.pack,
        setup=setup,
        MLAConfig=mla.MLAConfig,
        KimiK3Config=k3_config.KimiK3Config,
        KimiLinearConfig=k3_config.KimiLinearConfig,
        KimiK3DSparkConfig=dspark_config.KimiK3DSparkConfig,
    )
    if kernel is not None:
        kv_base = importlib.import_module("tokenspeed.runtime.layers.attention.kv_cache.base")
        spec = importlib.import_module(f"{recipes}.spec")
        ts.kernel_platform = kernel
        ts.derive_state_groups_by_layer = kv_base.derive_state_groups_by_layer
        ts.STATE_LAYER_TYPES = spec.STATE_LAYER_TYPES
        use_platform(ts, REPLAY_PLATFORM)
    return ts


def _load_kernel(source: Path) -> Any:
    """``main``: tokenspeed-kernel's platform, selection and the two replay registrations, and
    the stubs kv_cache/base.py needs; returns tokenspeed_kernel.platform."""
    import logging  # noqa: PLC0415 - the stub logger

    overrides = sorted(k for k in os.environ if k.startswith("TOKENSPEED_KERNEL_OVERRIDE_"))
    if overrides:
        raise SystemExit(f"unset {overrides}: select_kernel obeys them")
    sys.modules["tokenspeed.runtime.utils"].get_colorful_logger = logging.getLogger  # type: ignore[attr-defined]
    _module(
        "tokenspeed.runtime.layers.paged_attention", PagedAttention=_placeholder("PagedAttention")
    )
    _module(
        "tokenspeed.runtime.layers.attention.kv_cache.arena",
        CacheArena=_placeholder("CacheArena"),
    )
    root = source / _KERNEL
    _module("tokenspeed_kernel", __path__=[str(root)])
    _module("tokenspeed_kernel.ops", __path__=[str(root / "ops")])
    for name in _ATTENTION_BACKENDS:
        _module(f"tokenspeed_kernel.ops.attention.{name}")
    _module(
        "tokenspeed_kernel.ops.attention.triton",
        __path__=[str(root / "ops" / "attention" / "triton")],
    )
    _module(
        "tokenspeed_kernel.profiling",
        ShapeCapture=_placeholder("ShapeCapture"),
        kernel_scope=_placeholder("kernel_scope"),
    )
    importlib.import_module("tokenspeed_kernel.ops.attention")
    importlib.import_module("tokenspeed_kernel.ops.attention.triton.kda_dispatch")
    return importlib.import_module("tokenspeed_kernel.platform")


def use_platform(ts: SimpleNamespace, key: str) -> None:
    """Show tokenspeed-kernel the platform ``key`` (its own ``Platform.override``)."""
    plat = ts.kernel_platform
    spec = PLATFORMS[key]
    arch = plat.ArchVersion(*spec["arch"])
    features = (
        plat._get_cuda_sm_features(arch)
        if spec["vendor"] == "nvidia"
        else plat._get_rocm_sm_features("gfx950")
    )
    plat.Platform.override(
        plat.PlatformInfo(
            vendor=spec["vendor"],
            arch_version=arch,
            device_name=spec["device_name"],
            device_count=8,
            total_memory=spec["total_memory"],
            memory_bandwidth=spec["memory_bandwidth"],
            sm_count=spec["sm_count"],
            max_threads_per_sm=2048,
            max_shared_memory_per_sm=spec["max_shared_memory_per_sm"],
            sm_features=features,
        )
    )


@contextmanager
def on_platform(ts: SimpleNamespace, key: str) -> Iterator[None]:
    use_platform(ts, key)
    try:
        yield
    finally:
        use_platform(ts, REPLAY_PLATFORM)


def _platform_summary(key: str) -> dict[str, Any]:
    spec = PLATFORMS[key]
    return {
        "vendor": spec["vendor"],
        "arch": "{}.{}".format(*spec["arch"]),
        "device_name": spec["device_name"],
    }


def check_revision(
    source: Path, allow_other: bool, revision: Revision = REVISIONS["pr1152"]
) -> dict[str, Any]:
    """The revision of the extracted tree, its files' blob ids checked against REVISION."""
    revision_file = source / "REVISION"
    recorded: dict[str, Any] = (
        json.loads(revision_file.read_text()) if revision_file.exists() else {}
    )
    extracted_for = recorded.get("revision", "pr1152")
    if extracted_for != revision.key:
        raise SystemExit(
            f"{source} was extracted for --revision {extracted_for}, not {revision.key}"
        )
    files = revision.all_files
    blobs = {path: git_blob_id((source / path).read_bytes()) for path in files}
    expected = recorded.get("blobs", {})
    drift = sorted(path for path in files if expected.get(path) != blobs[path])
    commit = recorded.get("commit")
    if (commit != revision.commit or drift) and not allow_other:
        raise SystemExit(
            f"{source}: commit {commit!r}, files differing from its REVISION blobs: {drift}; "
            f"extract {revision.commit} or pass --allow-other-revision"
        )
    out: dict[str, Any] = {
        "repo": REPO,
        "ref": revision.ref if commit == revision.commit else None,
        "commit": commit,
        "files": blobs,
        "files_match_commit": not drift,
    }
    if revision.is_main:
        named = recorded.get("replay_op_files")
        if not named:
            raise SystemExit(f"{revision_file} lists no replay_op_files (re-run `extract`)")
        hidden = sorted(set(named) - set(revision.imported_files))
        if hidden:
            raise SystemExit(f"stubbed files name {REPLAY_OPS}: {hidden}")
        out["replay_op_files"] = named
    return out


# --------------------------------------------------------------------------------------
# facts read from source text (never imported)
# --------------------------------------------------------------------------------------


def _string_list(node: ast.AST) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
    return None


def cli_kv_cache_dtype_choices(source: Path) -> list[str]:
    """``choices`` of ``--kv-cache-dtype`` in tokenspeed's server_args.py."""
    tree = ast.parse((source / READ_FILES[0]).read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "--kv-cache-dtype"
        ):
            for keyword in node.keywords:
                if keyword.arg == "choices":
                    found = _string_list(keyword.value)
                    if found is not None:
                        return found
    raise RuntimeError("no --kv-cache-dtype choices in server_args.py")


def kimi_k3_architectures(source: Path) -> list[str]:
    """``_HYBRID_MLA_KDA_ARCHITECTURES``: the architectures registry.py routes to kimi_k3."""
    tree = ast.parse((source / READ_FILES[1]).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_HYBRID_MLA_KDA_ARCHITECTURES"
            for t in node.targets
        ):
            found = _string_list(node.value)
            if found is not None:
                return sorted(found)
    raise RuntimeError("no _HYBRID_MLA_KDA_ARCHITECTURES in registry.py")


# --------------------------------------------------------------------------------------
# models and launches
# --------------------------------------------------------------------------------------


class Models:
    """The three configs, built by tokenspeed's own config classes."""

    def __init__(self, ts: SimpleNamespace) -> None:
        k3 = json.loads((FIXTURES / "kimi-k3.config.json").read_text())
        linear = json.loads((FIXTURES / "kimi-linear-48b-a3b.config.json").read_text())
        draft = json.loads((FIXTURES / "kimi-k3-dspark-draft" / "config.json").read_text())
        self.k3 = ts.KimiK3Config(**k3)
        self.linear = ts.KimiLinearConfig(**linear)
        self.draft = ts.KimiK3DSparkConfig(**draft)
        self.draft_defaults = ts.KimiK3DSparkConfig()


def model_namespace(hf_config: Any) -> SimpleNamespace:
    """The attributes of tokenspeed's ModelConfig that MLAConfig.generate and the recipe read."""
    import torch  # noqa: PLC0415 - ModelConfig.dtype is a torch dtype

    text = getattr(hf_config, "text_config", hf_config)
    layers = int(text.num_hidden_layers)
    for attr in ("dspark_num_stages", "mtp_num_hidden_layers"):
        if getattr(text, attr, None) is not None:
            layers = int(getattr(text, attr))
    return SimpleNamespace(
        hf_config=hf_config,
        context_len=int(text.max_position_embeddings),
        num_attention_heads=int(text.num_attention_heads),
        num_key_value_heads=int(text.num_key_value_heads),
        head_dim=int(text.kv_lora_rank) + int(text.qk_rope_head_dim),
        dtype=torch.bfloat16,
        kv_lora_rank=int(text.kv_lora_rank),
        qk_nope_head_dim=int(text.qk_nope_head_dim),
        qk_rope_head_dim=int(text.qk_rope_head_dim),
        v_head_dim=int(text.v_head_dim),
        scaling=1.0,
        num_attention_layers=layers,
    )


def server_args(
    *,
    tp: int,
    dp: int,
    kv_cache_dtype: str,
    speculative: bool,
    max_num_seqs: int | None = None,
    max_total_tokens: int | None = None,
    quant_method: str = "none",
) -> SimpleNamespace:
    """tokenspeed's server arguments at their defaults, as MLAConfig.generate reads them."""
    draft_tokens = DSPARK_DRAFT_TOKENS if speculative else 1
    if max_num_seqs is None:
        max_num_seqs = 80 if speculative else 160
    return SimpleNamespace(
        kv_cache_dtype="fp8_e4m3" if kv_cache_dtype == "fp8" else kv_cache_dtype,
        kv_cache_quant_method=quant_method,
        speculative_algorithm="DSPARK" if speculative else None,
        speculative_num_steps=draft_tokens - 1 if speculative else 0,
        speculative_num_draft_tokens=draft_tokens,
        spec_context_pad=SPEC_OVERSHOOT_SPANS * draft_tokens if speculative else 0,
        device="cpu",
        attention_backend=None,
        drafter_attention_backend=None,
        attn_tp_size=tp,
        data_parallel_size=dp,
        mapping=SimpleNamespace(attn=SimpleNamespace(tp_size=tp, dp_size=dp)),
        prefix_granularity=64,
        max_cudagraph_capture_size=80 if speculative else 160,
        max_num_seqs=max_num_seqs,
        max_total_tokens=max_total_tokens,
        chunked_prefill_size=DEFAULT_CHUNKED_PREFILL,
        disaggregation_mode="null",
    )


class Launch:
    """One launch: the attention configs and the K3 recipe tokenspeed builds for it."""

    def __init__(
        self,
        ts: SimpleNamespace,
        hf_config: Any,
        draft_config: Any | None,
        args: SimpleNamespace,
        *,
        budget: int = 1 << 40,
        overlap: int = 1,
        decode_input_tokens: int | None = None,
        max_bs: int | None = None,
    ) -> None:
        self.ts = ts
        self.args = args
        self._params = (hf_config, draft_config, args)
        self._options: dict[str, Any] = {
            "budget": budget,
            "overlap": overlap,
            "decode_input_tokens": decode_input_tokens,
            "max_bs": max_bs,
        }
        self.model = model_namespace(hf_config)
        self.draft = None if draft_config is None else model_namespace(draft_config)
        self.attn = ts.MLAConfig.generate(args, self.model)
        self.draft_attn = (
            None if self.draft is None else ts.MLAConfig.generate(args, self.draft, True)
        )
        if max_bs is not None:  # a probe's concurrency, in place of max_num_seqs // dp
            self.attn.max_bs = max_bs
        if decode_input_tokens is None:
            decode_input_tokens = (
                int(args.speculative_num_draft_tokens) if args.speculative_algorithm else 1
            )
        self.recipe = ts.KimiK3Recipe(
            server_args=args,
            model_config=self.model,
            attn_config=self.attn,
            draft_model_config=self.draft,
            draft_attn_config=self.draft_attn,
            cache_budget_bytes=budget,
            decode_input_tokens=decode_input_tokens,
            overlap_schedule_depth=overlap,
        )

    def again(self) -> Launch:
        """The same launch, built afresh (its recipe's cached answers recomputed)."""
        return Launch(self.ts, *self._params, **self._options)

    def layout(self) -> tuple[Any, Any, Any]:
        """group -> packing -> pack -> check, as CacheRecipe.setup runs them."""
        recipe = self.recipe
        groups = recipe.groups()
        packing = recipe.packing(groups)
        layout = self.ts.pack(
            groups,
            prefix_granularity=recipe.prefix_granularity,
            cache_blocks_per_lcm_block=packing,
            alignment=recipe.alignment,
            max_padding_fraction=recipe.max_padding_fraction,
        )
        recipe.check_layout(layout)
        return groups, packing, layout


# --------------------------------------------------------------------------------------
# what one layout says
# --------------------------------------------------------------------------------------


def _float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def group_raw_bytes(layout: Any) -> dict[str, int]:
    raw: dict[str, int] = {}
    for field in layout.fields:
        raw[field.group_id] = raw.get(field.group_id, 0) + field.payload_bytes
    return raw


def padding(layout: Any) -> dict[str, dict[str, Any]]:
    """Each group's padding as ``pack`` computes it: (parent // p_g - raw_g) / raw_g."""
    raw = group_raw_bytes(layout)
    out = {}
    for group_id, count in layout.group_packing:
        stride = layout.lcm_block_bytes // count
        out[group_id] = {
            "stride_bytes": stride,
            "raw_bytes": raw[group_id],
            "padding_fraction": (stride - raw[group_id]) / raw[group_id],
        }
    return out


def field_kind(field_id: str) -> str:
    return field_id.split(".", 2)[2]


def field_layer(field_id: str) -> int:
    return int(field_id.split(".", 2)[1])


def field_strides(layout: Any) -> dict[str, dict[str, Any]]:
    """Per group and field kind: shape, dtype, offset in the plane and page stride, with the
    layers that share them (all of the group's layers, where uniform)."""
    out: dict[str, dict[str, Any]] = {}
    for field in layout.fields:
        key = (field.shape, field.dtype, field.field_offset_bytes, field.page_stride_bytes)
        kinds = out.setdefault(field.group_id, {})
        variants = kinds.setdefault(field_kind(field.field_id), [])
        for variant in variants:
            if variant["key"] == key:
                variant["layers"].append(field_layer(field.field_id))
                break
        else:
            variants.append({"key": key, "layers": [field_layer(field.field_id)]})
    result: dict[str, dict[str, Any]] = {}
    for group_id, kinds in out.items():
        result[group_id] = {}
        for kind, variants in kinds.items():
            result[group_id][kind] = [
                {
                    "shape": list(v["key"][0]),
                    "dtype": v["key"][1],
                    "field_offset_bytes": v["key"][2],
                    "page_stride_bytes": v["key"][3],
                    "payload_bytes": math.prod(v["key"][0]) * _dtype_bytes(v["key"][1]),
                    "layers": sorted(v["layers"]),
                }
                for v in variants
            ]
    return result


def _dtype_bytes(name: str) -> int:
    return {"uint8": 1, "float8_e4m3fn": 1, "bfloat16": 2, "float32": 4}[name]


def sizes(launch: Launch, layout: Any) -> dict[str, Any]:
    """Per-rank sizes of one layer of each kind, read off the planned fields."""
    fields = {field_kind(f.field_id): f for f in layout.fields}
    target_latent = next(
        f
        for f in layout.fields
        if f.field_id.endswith(".latent_kv")
        and field_layer(f.field_id) < launch.recipe.num_target_layers
    )
    conv, recurrent = fields["conv_state"], fields["recurrent_state"]
    out: dict[str, Any] = {
        "mla_page_bytes": target_latent.payload_bytes,
        "mla_page_dtype": target_latent.dtype,
        "latent_shape": list(target_latent.shape),
        "conv_state_shape": list(conv.shape),
        "conv_state_dtype": conv.dtype,
        "conv_state_bytes": conv.payload_bytes,
        "recurrent_state_shape": list(recurrent.shape),
        "recurrent_state_dtype": recurrent.dtype,
        "recurrent_state_bytes": recurrent.payload_bytes,
        "kda_state_bytes_per_layer": conv.payload_bytes + recurrent.payload_bytes,
        "kda_state_span_bytes_per_layer": recurrent.field_offset_bytes + recurrent.payload_bytes,
        "conv_rows": conv.shape[1],
    }
    drafts = [
        f
        for f in layout.fields
        if f.field_id.endswith(".latent_kv")
        and field_layer(f.field_id) >= launch.recipe.num_target_layers
    ]
    if drafts:
        out["draft_page_bytes"] = drafts[0].payload_bytes
        out["draft_page_dtype"] = drafts[0].dtype
    return out


def conv_rows_with_spec(ts: SimpleNamespace, models: Models, tp: int) -> dict[str, Any]:
    """The KDA conv state's rows without and with speculative tokens (DSpark, 8 per step)."""
    rows = {}
    for speculative in (False, True):
        args = server_args(tp=tp, dp=1, kv_cache_dtype="fp8", speculative=speculative)
        draft = models.draft if speculative else None
        _, _, layout = Launch(ts, models.k3, draft, args).layout()
        conv = next(f for f in layout.fields if f.field_id.endswith(".conv_state"))
        key = "speculative_tokens_8" if speculative else "speculative_tokens_0"
        rows[key] = {"conv_state_shape": list(conv.shape), "rows": conv.shape[1]}
    return rows


def utilization(layout: Any) -> dict[str, float]:
    report = layout.bind(1).capacity_report()
    return {group_id: entry["binding_utilization"] for group_id, entry in report.items()}


def plane_summary(layout: Any) -> dict[str, Any]:
    distinct: dict[int, int] = {}
    for _, plane_bytes in layout.plane_bytes:
        distinct[plane_bytes] = distinct.get(plane_bytes, 0) + 1
    return {
        "num_planes": len(layout.plane_bytes),
        "plane_bytes_counts": {str(k): v for k, v in sorted(distinct.items())},
        "plane_order": [plane_id for plane_id, _ in layout.plane_bytes],
    }


def _packing_inputs(groups: Any, packing: dict[str, int]) -> dict[str, Any]:
    """The recipe's packing and the two payloads a packing rule reads."""
    fields = {spec.group_id: f for spec, f in groups}
    return {
        "mla_page_bytes": next(f.payload_bytes for f in fields["full_attention"]),
        "linear_plane_bytes": sum(
            f.payload_bytes for f in fields["linear_attention_0"] if f.plane_id == "slot.0"
        ),
        "mla_packing": packing["full_attention"],
        "linear_packing": packing["linear_attention_0"],
    }


def rule_1152(groups: Any, packing: dict[str, int]) -> dict[str, Any]:
    """The recipe's packing and the two payloads its formula reads."""
    return {
        **_packing_inputs(groups, packing),
        "formula": "mla = max(1, ceil(linear_plane / mla_page)); "
        "linear = max(1, mla * mla_page // linear_plane)",
    }


def rule_main(groups: Any, packing: dict[str, int]) -> dict[str, Any]:
    """``main``'s packing and the two payloads it reads: a fixed MLA packing, the state groups
    as many pages as fit in that many MLA pages."""
    inputs = _packing_inputs(groups, packing)
    return {
        **inputs,
        "mla_plane_bytes": inputs["mla_packing"] * inputs["mla_page_bytes"],
        "formula": "mla = 12 (fixed); linear = max(1, 12 * mla_page // linear_plane)",
    }


def _workspace_parts(launch: Launch) -> dict[str, Any]:
    """tokenspeed's verify workspace for one launch, with the parts it adds up (recomputed
    from the planned fields; checked against tokenspeed's total)."""
    recipe = launch.recipe
    args = launch.args
    total = recipe.workspace_bytes()
    out: dict[str, Any] = {"replay_kda": bool(recipe.replay_kda), "workspace_bytes": total}
    if args.speculative_algorithm is None:
        return out
    state = [
        f for spec, fields in recipe.groups() if spec.group_id != "full_attention" for f in fields
    ]
    conv = [f for f in state if field_kind(f.field_id) == "conv_state"]
    recurrent = [f for f in state if field_kind(f.field_id) == "recurrent_state"]
    max_bs = launch.attn.max_bs
    draft_tokens = int(args.speculative_num_draft_tokens)
    if out["replay_kda"]:
        heads, head_dim, _ = recurrent[0].shape
        parts = {
            "qkv_bf16": conv[0].shape[0] * 2,
            "f_a_bf16": head_dim * 2,
            "beta_bf16": heads * 2,
            "gate_fp32": heads * head_dim * 4,
        }
        row = sum(parts.values())
        rows = max_bs * draft_tokens
        conv_bytes = max_bs * sum(f.payload_bytes for f in conv)
        out.update(
            conv_checkpoint_rows=max_bs,
            conv_checkpoint_bytes=conv_bytes,
            replay_layers=len(conv),
            replay_rows=rows,
            replay_row_bytes=row,
            replay_row_parts=parts,
            replay_payload_bytes=len(conv) * rows * row,
        )
        derived = conv_bytes + len(conv) * rows * row
    else:
        rows = max_bs * (draft_tokens + 1)
        row = sum(f.payload_bytes for f in state)
        out.update(verify_rows=rows, state_row_bytes=row, state_layers=len(conv))
        derived = rows * row
    if derived != total:
        raise RuntimeError(f"workspace parts add to {derived}, tokenspeed says {total}")
    return out


def verify_workspace(ts: SimpleNamespace, launch: Launch) -> dict[str, Any]:
    """``main``: the verify workspace on the replay platform, and for a speculative launch the
    same launch's on a platform without the replay kernels."""
    out = _workspace_parts(launch)
    if launch.args.speculative_algorithm is not None:
        with on_platform(ts, NO_REPLAY_PLATFORM):
            out["without_replay"] = {
                "platform": NO_REPLAY_PLATFORM,
                **_workspace_parts(launch.again()),
            }
    return out


def _by_group(mapping: dict[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for layer, group_id in sorted(mapping.items()):
        out.setdefault(group_id, []).append(layer)
    return out


def pool_state_groups(ts: SimpleNamespace, launch: Launch) -> dict[str, Any]:
    """``main``: what each pool view derives from the plan (``derive_state_groups_by_layer``),
    for the views tokenspeed's registry builds: the target view over the whole merged spec,
    and the draft view ``CachePoolSpec.layer_view`` cuts at the draft's layers."""
    setup = launch.recipe.setup()
    spec = setup.spec
    arena = SimpleNamespace(plan=spec.memory_plan, cache_group_specs=spec.cache_group_specs)
    views = [("target", 0, spec)]
    if setup.num_draft_layers:
        views.append(
            (
                "draft",
                setup.num_target_layers,
                spec.layer_view(
                    first_layer=setup.num_target_layers, num_layers=setup.num_draft_layers
                ),
            )
        )
    types_count: dict[str, int] = {}
    for label in spec.layer_types:
        types_count[label] = types_count.get(label, 0) + 1
    out: dict[str, Any] = {
        "pool_spec_fields": [f for f in vars(spec) if not f.startswith("_")],
        "layer_types": types_count,
        "state_family_groups": [g.group_id for g in spec.cache_group_specs if g.family == "state"],
        "views": {},
    }
    recipe_ids = launch.recipe.group_ids
    for name, first, view in views:
        try:
            mapping = ts.derive_state_groups_by_layer(
                arena,
                first_layer=first,
                num_layers=len(view.layer_types),
                state_layer_ids=(
                    i for i, label in enumerate(view.layer_types) if label in ts.STATE_LAYER_TYPES
                ),
            )
        except Exception as exc:
            out["views"][name] = {"refused": _error(exc)}
            continue
        out["views"][name] = {
            "first_layer": first,
            "num_layers": len(view.layer_types),
            "state_group_by_layer": _by_group(mapping),
            "matches_recipe_group_ids": all(
                recipe_ids[first + layer] == group_id for layer, group_id in mapping.items()
            ),
        }
    return out


def group_specs(groups: Any) -> list[dict[str, Any]]:
    out = []
    for spec, fields in groups:
        out.append(
            {
                "group_id": spec.group_id,
                "retention": spec.retention,
                "family": spec.family,
                "rows_per_page": spec.rows_per_page,
                "checkpoint_granularity": spec.checkpoint_granularity,
                "block_granularity": spec.block_granularity,
                "num_fields": len(fields),
            }
        )
    return out


def layers_by_group(recipe: Any) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for layer, group_id in enumerate(recipe.group_ids):
        out.setdefault(group_id, []).append(layer)
    return out


# --------------------------------------------------------------------------------------
# the sweep
# --------------------------------------------------------------------------------------


def sweep_cell(
    ts: SimpleNamespace,
    hf_config: Any,
    draft_config: Any | None,
    *,
    tp: int,
    dp: int,
    dtype: str,
    cli_choices: Sequence[str],
) -> dict[str, Any]:
    speculative = draft_config is not None
    cell: dict[str, Any] = {
        "attn_tp": tp,
        "attn_dp": dp,
        "kv_cache_dtype": dtype,
        "cli_accepts": (dtype in cli_choices),
    }
    args = server_args(tp=tp, dp=dp, kv_cache_dtype=dtype, speculative=speculative)
    try:
        launch = Launch(ts, hf_config, draft_config, args)
    except Exception as exc:
        cell.update(status="refused", stage="attn_config", error=_error(exc))
        return cell
    cell["resolved_kv_cache_dtype"] = str(launch.attn.kv_cache_dtype).removeprefix("torch.")
    if launch.draft_attn is not None:
        cell["resolved_draft_kv_cache_dtype"] = str(launch.draft_attn.kv_cache_dtype).removeprefix(
            "torch."
        )
    cell["max_bs"] = launch.attn.max_bs
    stage = "groups"
    try:
        groups = launch.recipe.groups()
        stage = "packing"
        packing = dict(launch.recipe.packing(groups))
        stage = "pack"
        _, _, layout = launch.layout()
    except Exception as exc:
        cell.update(status="refused", stage=stage, error=_error(exc))
        return cell
    cell["status"] = "ok"
    cell["packing"] = dict(layout.group_packing)
    if ts.revision.is_main:
        cell["packing_rule"] = rule_main(groups, packing)
    else:
        cell["rule_1152"] = rule_1152(groups, packing)
    cell["sizes"] = sizes(launch, layout)
    cell["parent_bytes"] = layout.lcm_block_bytes
    cell.update(plane_summary(layout))
    del cell["plane_order"]
    cell["max_padding_fraction"] = _float(launch.recipe.max_padding_fraction)
    cell["padding"] = padding(layout)
    cell["utilization"] = utilization(layout)
    cell["strides"] = {
        group_id: {
            kind: [{k: v for k, v in variant.items() if k != "layers"} for variant in variants]
            if len(variants) > 1
            else {k: v for k, v in variants[0].items() if k != "layers"}
            for kind, variants in kinds.items()
        }
        for group_id, kinds in field_strides(layout).items()
    }
    cell["workspace_bytes"] = launch.recipe.workspace_bytes()
    if ts.revision.is_main:
        cell["verify_workspace"] = verify_workspace(ts, launch)
    return cell


MODELS = (
    ("kimi-k3", "kimi-k3.config.json", False),
    ("kimi-k3-dspark", "kimi-k3.config.json + kimi-k3-dspark-draft/config.json", True),
    ("kimi-linear-48b", "kimi-linear-48b-a3b.config.json", False),
)


def _configs(models: Models, name: str) -> tuple[Any, Any | None]:
    if name == "kimi-k3":
        return models.k3, None
    if name == "kimi-k3-dspark":
        return models.k3, models.draft
    return models.linear, None


def sweep(ts: SimpleNamespace, models: Models, name: str, choices: Sequence[str]) -> dict[str, Any]:
    hf_config, draft_config = _configs(models, name)
    cells = [
        sweep_cell(ts, hf_config, draft_config, tp=tp, dp=dp, dtype=dtype, cli_choices=choices)
        for tp in ATTN_TPS
        for dp in ATTN_DPS
        for dtype in DTYPE_SPELLINGS
    ]
    groups: dict[str, Any] | None = None
    try:
        launch = Launch(
            ts,
            hf_config,
            draft_config,
            server_args(tp=8, dp=1, kv_cache_dtype="fp8", speculative=draft_config is not None),
        )
        groups = {
            "layers": layers_by_group(launch.recipe),
            "specs": group_specs(launch.recipe.groups()),
            "num_target_layers": launch.recipe.num_target_layers,
            "num_draft_layers": launch.recipe.num_draft_layers,
        }
        if ts.revision.is_main:
            groups["pool_state_groups"] = pool_state_groups(ts, launch)
    except Exception as exc:
        groups = {"refused": _error(exc)}
    accepted = sorted({c["attn_tp"] for c in cells if c["status"] == "ok"})
    return {"model": name, "groups": groups, "accepted_attn_tp": accepted, "cells": cells}


# --------------------------------------------------------------------------------------
# details, capacity, bind
# --------------------------------------------------------------------------------------

DETAIL_CELLS = (
    ("kimi-k3", 1, 1, "fp8"),
    ("kimi-k3", 1, 8, "fp8"),
    ("kimi-k3", 8, 1, "fp8"),
    ("kimi-k3", 8, 8, "fp8"),
    ("kimi-k3", 1, 1, "bfloat16"),
    ("kimi-k3", 8, 1, "bfloat16"),
    ("kimi-k3", 96, 1, "fp8"),
    ("kimi-k3-dspark", 8, 1, "fp8"),
    ("kimi-k3-dspark", 1, 8, "fp8"),
)
# ``main`` refuses the TP 1 and TP 96 cells above; these add cells it lays out with a state
# packing above 1 (appended, so the cells #1152 has keep their places).
MAIN_DETAIL_CELLS = (
    ("kimi-k3", 4, 1, "bfloat16"),
    ("kimi-k3", 16, 1, "fp8"),
    ("kimi-k3", 12, 1, "bfloat16"),
    ("kimi-k3-dspark", 12, 1, "fp8"),
    ("kimi-k3-dspark", 6, 1, "bfloat16"),
)


def _refused_cell(
    name: str, tp: int, dtype: str, exc: BaseException, **extra: int
) -> dict[str, Any]:
    return {
        "model": name,
        "attn_tp": tp,
        **extra,
        "kv_cache_dtype": dtype,
        "status": "refused",
        "error": _error(exc),
    }


def detail(ts: SimpleNamespace, models: Models, cell: tuple[str, int, int, str]) -> Any:
    name, tp, dp, dtype = cell
    hf_config, draft_config = _configs(models, name)
    args = server_args(tp=tp, dp=dp, kv_cache_dtype=dtype, speculative=draft_config is not None)
    launch = Launch(ts, hf_config, draft_config, args)
    try:
        groups, packing, layout = launch.layout()
    except Exception as exc:  # main refuses some cells #1152 lays out
        return _refused_cell(name, tp, dtype, exc, attn_dp=dp)
    planes: dict[str, list[dict[str, Any]]] = {}
    for field in layout.fields:
        planes.setdefault(field.plane_id, []).append(
            {
                "group": field.group_id,
                "layer": field_layer(field.field_id),
                "field": field_kind(field.field_id),
                "offset": field.field_offset_bytes,
                "payload": field.payload_bytes,
                "stride": field.page_stride_bytes,
            }
        )
    return {
        "model": name,
        "attn_tp": tp,
        "attn_dp": dp,
        "kv_cache_dtype": dtype,
        "max_bs": launch.attn.max_bs,
        "packing": dict(layout.group_packing),
        **(
            {"packing_rule": rule_main(groups, dict(packing))}
            if ts.revision.is_main
            else {"rule_1152": rule_1152(groups, dict(packing))}
        ),
        "parent_bytes": layout.lcm_block_bytes,
        "plane_bytes": [list(p) for p in layout.plane_bytes],
        "groups": group_specs(groups),
        "layers": layers_by_group(launch.recipe),
        "sizes": sizes(launch, layout),
        "padding": padding(layout),
        "utilization": utilization(layout),
        "fields_by_kind": field_strides(layout),
        "slots": {plane_id: planes[plane_id] for plane_id, _ in layout.plane_bytes},
        "workspace_bytes": launch.recipe.workspace_bytes(),
        **(
            {
                "verify_workspace": verify_workspace(ts, launch),
                "pool_state_groups": pool_state_groups(ts, launch),
            }
            if ts.revision.is_main
            else {}
        ),
    }


PROBE_TOKENS = (1, 128, 131_072, 1_048_576, 4_194_304)
PROBE_LOADS = ((1, 0), (1, 1), (16, 0), (16, 1), (160, 0), (160, 1))
CAPACITY_CELLS = (
    ("kimi-k3", 1, "fp8"),
    ("kimi-k3", 8, "fp8"),
    ("kimi-k3", 1, "bfloat16"),
    ("kimi-k3", 8, "bfloat16"),
    ("kimi-k3-dspark", 8, "fp8"),
)
MAIN_CAPACITY_CELLS = (
    ("kimi-k3", 16, "fp8"),
    ("kimi-k3-dspark", 12, "fp8"),
)
PROBE_PARENTS = (1, 2, 10, 100, 1000)
BUDGETS = (1 << 30, 8 << 30, 40 << 30, 100 << 30)


def capacity_probes(ts: SimpleNamespace, models: Models, name: str, tp: int, dtype: str) -> Any:
    hf_config, draft_config = _configs(models, name)
    speculative = draft_config is not None
    args = server_args(tp=tp, dp=1, kv_cache_dtype=dtype, speculative=speculative)
    try:
        Launch(ts, hf_config, draft_config, args).layout()
    except Exception as exc:  # main refuses some cells #1152 lays out
        return _refused_cell(name, tp, dtype, exc)
    probes = []
    for max_live, depth in PROBE_LOADS:
        for decode_tokens in (1, DSPARK_DRAFT_TOKENS) if speculative else (1,):
            launch = Launch(
                ts,
                hf_config,
                draft_config,
                args,
                overlap=depth,
                decode_input_tokens=decode_tokens,
                max_bs=max_live,
            )
            _, _, layout = launch.layout()
            recipe = launch.recipe
            entry: dict[str, Any] = {
                "max_live": max_live,
                "overlap_schedule_depth": depth,
                "decode_input_tokens": decode_tokens,
                "scheduler_limits": dict(recipe.scheduler_limits),
                # the recipe's own term: max_live * ceil(depth * decode_input_tokens / 128),
                # added to the full_attention pages only
                "protected_pages": max_live * math.ceil(depth * decode_tokens / 128),
                "parents_needed": {str(t): recipe.parents_needed(layout, t) for t in PROBE_TOKENS},
                "token_capacity": {},
            }
            for parents in (*PROBE_PARENTS, *entry["parents_needed"].values()):
                try:
                    entry["token_capacity"][str(parents)] = recipe.token_capacity(layout, parents)
                except Exception as exc:
                    entry["token_capacity"][str(parents)] = {"refused": _error(exc)}
            probes.append(entry)
    return {
        "model": name,
        "attn_tp": tp,
        "kv_cache_dtype": dtype,
        "packing": dict(Launch(ts, hf_config, draft_config, args).layout()[2].group_packing),
        "probes": probes,
        "budgets": budgets(ts, hf_config, draft_config, args),
        **(
            {"budgets_without_replay": _budgets_without_replay(ts, hf_config, draft_config, args)}
            if ts.revision.is_main and speculative
            else {}
        ),
    }


def _budgets_without_replay(
    ts: SimpleNamespace, hf_config: Any, draft_config: Any, args: Any
) -> dict[str, Any]:
    with on_platform(ts, NO_REPLAY_PLATFORM):
        return {
            "platform": NO_REPLAY_PLATFORM,
            "budgets": budgets(ts, hf_config, draft_config, args),
        }


def _setup(launch: Launch) -> dict[str, Any]:
    try:
        result = launch.recipe.setup()
    except Exception as exc:
        return {"refused": _error(exc)}
    plan = result.spec.memory_plan
    return {
        "num_lcm_blocks": plan.num_lcm_blocks,
        "parent_bytes": plan.lcm_block_bytes,
        "arena_bytes": plan.arena_bytes,
        "token_capacity": result.spec.token_capacity,
        "fixed_workspace_bytes": result.fixed_workspace_bytes,
        "page_counts": {g.group_id: g.page_count for g in plan.groups},
    }


BUDGET_MAX_BS = (1, 16, None)  # None: tokenspeed's default, max_num_seqs // dp


def budgets(ts: SimpleNamespace, hf_config: Any, draft_config: Any, args: Any) -> list[Any]:
    """CacheRecipe.setup() at a few budgets, concurrencies and token caps (overlap on)."""
    parent = Launch(ts, hf_config, draft_config, args).layout()[2].lcm_block_bytes
    out = []
    for max_bs in BUDGET_MAX_BS:
        for budget in (2 * parent - 1, 2 * parent, *BUDGETS):
            for limit in (None, 1_048_576):
                limited = SimpleNamespace(**{**vars(args), "max_total_tokens": limit})
                launch = Launch(ts, hf_config, draft_config, limited, budget=budget, max_bs=max_bs)
                out.append(
                    {
                        "budget_bytes": budget,
                        "max_total_tokens": limit,
                        "max_bs": launch.attn.max_bs,
                        **_setup(launch),
                    }
                )
    return out


BIND_CELLS = (
    ("kimi-k3", 8, "fp8", 7),
    ("kimi-k3", 1, "fp8", 3),
    ("kimi-k3", 8, "bfloat16", 5),
    ("kimi-k3", 96, "bfloat16", 3),
    ("kimi-k3-dspark", 8, "fp8", 7),
)
MAIN_BIND_CELLS = (
    ("kimi-k3", 16, "fp8", 7),
    ("kimi-k3", 24, "bfloat16", 5),
    ("kimi-k3-dspark", 12, "fp8", 7),
)


def _sample_layers(recipe: Any) -> list[int]:
    by_group = layers_by_group(recipe)
    picks: list[int] = []
    for layers in by_group.values():
        for index in (0, 1, len(layers) // 2, len(layers) - 1):
            if layers[index] not in picks:
                picks.append(layers[index])
    target = [layer for layer in by_group["full_attention"] if layer < recipe.num_target_layers]
    if target[-1] not in picks:
        picks.append(target[-1])
    return sorted(picks)


def _sample_pages(per_parent: int, num_parents: int) -> list[int]:
    last = num_parents * per_parent
    candidates = (0, 1, 2, per_parent - 1, per_parent, per_parent + 1, 2 * per_parent, last)
    return sorted({p for p in candidates if 0 <= p <= last})


def bind_samples(ts: SimpleNamespace, models: Models, cell: tuple[str, int, str, int]) -> Any:
    name, tp, dtype, num_parents = cell
    hf_config, draft_config = _configs(models, name)
    args = server_args(tp=tp, dp=1, kv_cache_dtype=dtype, speculative=draft_config is not None)
    launch = Launch(ts, hf_config, draft_config, args)
    try:
        _, _, layout = launch.layout()
    except Exception as exc:  # main refuses some cells #1152 lays out
        return {**_refused_cell(name, tp, dtype, exc), "num_lcm_blocks": num_parents}
    plan = layout.bind(num_parents)
    addresses = []
    for layer in _sample_layers(launch.recipe):
        for field in (f for f in plan.fields if field_layer(f.field_id) == layer):
            group = plan.group(field.group_id)
            plane = plan.plane(field.plane_id)
            pages = _sample_pages(group.cache_blocks_per_lcm_block, num_parents)
            addresses.append(
                {
                    "field_id": field.field_id,
                    "group": field.group_id,
                    "plane": field.plane_id,
                    "plane_arena_offset": plane.arena_offset_bytes,
                    "field_offset_bytes": field.field_offset_bytes,
                    "page_stride_bytes": field.page_stride_bytes,
                    "payload_bytes": field.payload_bytes,
                    "offsets": {
                        str(page): plan.field_page_byte_offset(field.field_id, page)
                        for page in pages
                    },
                }
            )
    out_of_range = []
    for group in plan.groups:
        field = next(f for f in plan.fields if f.group_id == group.group_id)
        try:
            plan.field_page_byte_offset(field.field_id, group.page_count)
            out_of_range.append({"group": group.group_id, "page": group.page_count})
        except IndexError as exc:
            out_of_range.append(
                {"group": group.group_id, "page": group.page_count, "refused": _error(exc)}
            )
    return {
        "model": name,
        "attn_tp": tp,
        "kv_cache_dtype": dtype,
        "num_lcm_blocks": num_parents,
        "parent_bytes": plan.lcm_block_bytes,
        "arena_bytes": plan.arena_bytes,
        "groups": [
            {
                "group": g.group_id,
                "pages_per_parent": g.cache_blocks_per_lcm_block,
                "page_count": g.page_count,
            }
            for g in plan.groups
        ],
        "planes": [
            {
                "plane": p.plane_id,
                "arena_offset_bytes": p.arena_offset_bytes,
                "bytes_per_lcm_block": p.bytes_per_lcm_block,
            }
            for p in plan.planes
        ],
        "addresses": addresses,
        "page_out_of_range": out_of_range,
    }


def extra_refusals(ts: SimpleNamespace, models: Models) -> list[dict[str, Any]]:
    """Refusals no --kv-cache-dtype spelling reaches: the quant method, a dtype handed to the
    recipe directly."""
    import torch  # noqa: PLC0415 - the recipe's own dtypes

    out = []
    cases: list[tuple[str, Callable[[Launch], None]]] = [
        ("kv_cache_quant_method=per_token_head", lambda launch: None),
        (
            "attn_config.kv_cache_dtype=torch.float16",
            lambda launch: _set_dtype(launch, torch.float16),
        ),
        (
            "attn_config.kv_cache_dtype=torch.float8_e5m2",
            lambda launch: _set_dtype(launch, torch.float8_e5m2),
        ),
    ]
    for label, change in cases:
        quant = "per_token_head" if "per_token_head" in label else "none"
        args = server_args(tp=8, dp=1, kv_cache_dtype="fp8", speculative=False, quant_method=quant)
        launch = Launch(ts, models.k3, None, args)
        change(launch)
        try:
            launch.layout()
            out.append({"case": label, "attn_tp": 8, "status": "ok"})
        except Exception as exc:
            out.append({"case": label, "attn_tp": 8, "status": "refused", "error": _error(exc)})
    return out


def _set_dtype(launch: Launch, dtype: Any) -> None:
    launch.attn.kv_cache_dtype = dtype


# --------------------------------------------------------------------------------------
# record
# --------------------------------------------------------------------------------------


def _write(path: Path, payload: dict[str, Any]) -> int:
    text = json.dumps(payload, indent=1, sort_keys=False) + "\n"
    path.write_text(text)
    return len(text)


def record(source: Path, out: Path, allow_other: bool, rev: Revision = REVISIONS["pr1152"]) -> None:
    revision = check_revision(source, allow_other, rev)
    ts = load_tokenspeed(source, rev)
    models = Models(ts)
    choices = cli_kv_cache_dtype_choices(source)
    import torch  # noqa: PLC0415 - recorded beside the revision
    import transformers  # noqa: PLC0415

    header: dict[str, Any] = {
        "source": revision,
        "recorder": "tests/tools/record_tokenspeed.py",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "stubbed_modules": rev.stubbed_modules,
        "launch_defaults": {
            "max_num_seqs": "160, or 80 with speculative decoding (max_bs = max_num_seqs // dp)",
            "chunked_prefill_size": DEFAULT_CHUNKED_PREFILL,
            "speculative": f"DSPARK, speculative_num_draft_tokens={DSPARK_DRAFT_TOKENS}",
            "overlap_schedule_depth": 1,
            "kv_cache_quant_method": "none",
            "max_total_tokens": None,
            "cache_budget_bytes": 1 << 40,
        },
    }
    if rev.is_main:
        header["platforms"] = {
            "recorded_on": {REPLAY_PLATFORM: _platform_summary(REPLAY_PLATFORM)},
            "without_replay_on": {NO_REPLAY_PLATFORM: _platform_summary(NO_REPLAY_PLATFORM)},
            "how": "tokenspeed_kernel.platform.Platform.override; the platform decides "
            "KimiK3Recipe.replay_kda (kda_replay_commit_supported) and nothing else recorded",
        }
    facts = {
        "cli_kv_cache_dtype_choices": choices,
        "kimi_k3_recipe_architectures": kimi_k3_architectures(source),
        "model_architectures": {
            "kimi-k3": list(models.k3.architectures or []),
            "kimi-linear-48b": list(getattr(models.linear, "architectures", None) or []),
            "kimi-k3-dspark-draft": list(models.draft.architectures or []),
        },
        "dspark_draft": {
            "fixture_num_attention_heads": models.draft.num_attention_heads,
            "fixture_num_key_value_heads": models.draft.num_key_value_heads,
            "KimiK3DSparkConfig_default_num_attention_heads": (
                models.draft_defaults.num_attention_heads
            ),
            "num_hidden_layers": models.draft.num_hidden_layers,
            "kv_latent_dim": models.draft.kv_latent_dim,
            "mla_use_nope": models.draft.mla_use_nope,
        },
        "conv_rows_tp8": conv_rows_with_spec(ts, models, 8),
        "extra_refusals": extra_refusals(ts, models),
    }
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, _, _ in MODELS:
        payload = {**header, "facts": facts, **sweep(ts, models, name, choices)}
        written[f"sweep-{name}.json"] = _write(out / f"sweep-{name}.json", payload)
    extra = rev.is_main
    details = [detail(ts, models, c) for c in DETAIL_CELLS + (MAIN_DETAIL_CELLS if extra else ())]
    written["detail.json"] = _write(out / "detail.json", {**header, "cells": details})
    capacity = [
        capacity_probes(ts, models, *c)
        for c in CAPACITY_CELLS + (MAIN_CAPACITY_CELLS if extra else ())
    ]
    written["capacity.json"] = _write(out / "capacity.json", {**header, "cells": capacity})
    binds = [bind_samples(ts, models, c) for c in BIND_CELLS + (MAIN_BIND_CELLS if extra else ())]
    written["bind.json"] = _write(out / "bind.json", {**header, "cells": binds})
    for name, size in written.items():
        print(f"{out / name}: {size:,} bytes")


# --------------------------------------------------------------------------------------
# compare two recordings
# --------------------------------------------------------------------------------------

_CELL_KEYS = ("attn_tp", "attn_dp", "kv_cache_dtype")
_RULE_KEYS = ("mla_page_bytes", "linear_plane_bytes", "mla_packing", "linear_packing")


def _rule(cell: dict[str, Any]) -> dict[str, Any] | None:
    rule = cell.get("rule_1152") or cell.get("packing_rule")
    return None if rule is None else {k: rule[k] for k in _RULE_KEYS}


def _field_counts(old: dict[Any, Any], new: dict[Any, Any]) -> dict[str, Any]:
    """Per field, how many cells' values differ: over every cell (a field one cell lacks, as a
    refused cell lacks the layout's, differs), and over the cells both recordings lay out.
    A field only one recording has is counted, not compared. ``rule`` compares #1152's
    ``rule_1152`` with main's ``packing_rule`` on the keys they share (the two payloads and the
    two packings)."""
    fields = sorted(
        ({k for c in old.values() for k in c} | {k for c in new.values() for k in c})
        - {*_CELL_KEYS, "cli_accepts", "rule_1152", "packing_rule"}
    )
    counts: dict[str, Any] = {}
    for name in (*fields, "rule"):
        in_old = name == "rule" or any(name in c for c in old.values())
        in_new = name == "rule" or any(name in c for c in new.values())
        if not (in_old and in_new):
            side, cells = ("new", new) if in_new else ("old", old)
            counts[name] = {f"only_in_{side}": sum(name in c for c in cells.values())}
            continue
        every = both = 0
        for key, a in old.items():
            b = new[key]
            differs = (_rule(a) != _rule(b)) if name == "rule" else a.get(name) != b.get(name)
            every += differs
            both += differs and a["status"] == b["status"] == "ok"
        counts[name] = {"all_cells": every, "cells_ok_in_both": both}
    return counts


def compare(old_dir: Path, new_dir: Path) -> dict[str, Any]:
    """How two recordings differ, cell by cell (the counts in tokenspeed-main/DIFFERENCES.md)."""
    out: dict[str, Any] = {}
    for name, _, _ in MODELS:
        old_file = json.loads((old_dir / f"sweep-{name}.json").read_text())
        new_file = json.loads((new_dir / f"sweep-{name}.json").read_text())
        old = {tuple(c[k] for k in _CELL_KEYS): c for c in old_file["cells"]}
        new = {tuple(c[k] for k in _CELL_KEYS): c for c in new_file["cells"]}
        if old.keys() != new.keys():
            raise SystemExit(f"sweep-{name}.json: the two recordings ask different cells")
        status: dict[str, int] = {}
        for key, a in old.items():
            change = f"{a['status']} -> {new[key]['status']}"
            status[change] = status.get(change, 0) + 1
        out[f"sweep-{name}.json"] = {
            "cells": len(old),
            "status": dict(sorted(status.items())),
            "accepted_attn_tp": {
                "old": old_file["accepted_attn_tp"],
                "new": new_file["accepted_attn_tp"],
            },
            "fields": _field_counts(old, new),
        }
    for name in ("detail.json", "capacity.json", "bind.json"):
        old_cells = json.loads((old_dir / name).read_text())["cells"]
        new_cells = json.loads((new_dir / name).read_text())["cells"]
        rows = []
        for a, b in zip(old_cells, new_cells, strict=False):
            keys = sorted(set(a) | set(b))
            rows.append(
                {
                    **{k: a[k] for k in ("model", *_CELL_KEYS) if k in a},
                    "status": [a.get("status", "ok"), b.get("status", "ok")],
                    "differ": [k for k in keys if a.get(k) != b.get(k)],
                }
            )
        out[name] = {"cells_compared": rows, "new_only_cells": len(new_cells) - len(old_cells)}
    return out


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ext = commands.add_parser("extract", help="extract the files this tool reads")
    ext.add_argument("--revision", choices=sorted(REVISIONS), default="pr1152")
    ext.add_argument("--git-dir", type=Path, required=True)
    ext.add_argument("--rev", default=None, help="commit to extract (default: the revision's)")
    ext.add_argument("--dest", type=Path, required=True)
    rec = commands.add_parser("record", help="run the recipe and write the JSON")
    rec.add_argument("--revision", choices=sorted(REVISIONS), default="pr1152")
    rec.add_argument("--source", type=Path, required=True)
    rec.add_argument("--out", type=Path, default=None, help="default: the revision's fixtures")
    rec.add_argument("--allow-other-revision", action="store_true")
    cmp = commands.add_parser("compare", help="count the cells two recordings differ in")
    cmp.add_argument("--old", type=Path, default=REVISIONS["pr1152"].out)
    cmp.add_argument("--new", type=Path, default=REVISIONS["main"].out)
    args = parser.parse_args(None if argv is None else list(argv))
    if args.command == "compare":
        print(json.dumps(compare(args.old, args.new), indent=1))
        return
    revision = REVISIONS[args.revision]
    if args.command == "extract":
        print(extract(args.git_dir, args.rev, args.dest, revision))
    else:
        record(args.source, args.out or revision.out, args.allow_other_revision, revision)


if __name__ == "__main__":
    main()
