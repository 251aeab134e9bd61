"""The GPU decides what vLLM 0.33 decides from it, and the bridge never stops what vLLM serves.

- vLLM's own KDA prefill resolver (``models/kimi_k3/nvidia/kda.py``), run with the platform
  reporting each NVIDIA GPU's compute capability, picks the kernel the planner picks for
  ``Deployment(gpu=...)``, or refuses where the planner refuses; and the blocks per request
  follow (FlashKDA holds a prefill checkpoint block).
- Every value vLLM takes for an option the bridge reads (its cache dtypes, its MLA backends)
  gives a deployment, or a refusal marked ``unmodelled`` that the startup check logs and lets
  pass; never another refusal.
- On a worker of pipeline stage 1 the bridge checks stage 1 by default (``parallel_config.rank``
  says the stage).
"""

from __future__ import annotations

import copy
import logging
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_required import require_vllm, running

require_vllm()
RELEASE = running()
"""The vLLM release installed, which k3layout plans for."""

from vllm_engine import Case, bind, start  # noqa: E402

from k3layout import GPUS, Deployment, Refusal, plan, plan_vllm, preset  # noqa: E402
from k3layout.engines.vllm import check_kv_cache_config, check_kv_caches  # noqa: E402
from k3layout.engines.vllm.bridge import deployment_from_vllm  # noqa: E402
from k3layout.engines.vllm.plugin import check_after_kv_cache_init  # noqa: E402
from k3layout.engines.vllm.rules import resolved_kda_prefill_backend  # noqa: E402

NVIDIA = [name for name, gpu in GPUS.items() if gpu.vendor == "nvidia"]
CUDA_BACKENDS = ("auto", "triton", "flashkda", "flashinfer")


def vllms_kernel(gpu: str, requested: str) -> str | Exception:
    """What vLLM's resolver picks for K3's KDA layer (bf16 activations, fp32 recurrent state,
    head_dim 128, gate bounded at -5) on a CUDA platform of ``gpu``'s capability."""
    import vllm.platforms  # noqa: PLC0415
    from vllm.models.kimi_k3.nvidia import kda  # noqa: PLC0415
    from vllm.platforms.interface import DeviceCapability  # noqa: PLC0415

    major, minor = GPUS[gpu].capability  # type: ignore[index]
    platform = vllm.platforms.current_platform

    def capability(device_id: int = 0) -> Any:
        return DeviceCapability(major, minor)

    patched: dict[str, Any] = {"is_cuda": lambda: True, "get_device_capability": capability}
    saved = {name: platform.__dict__.get(name) for name in patched}
    for name, value in patched.items():
        setattr(platform, name, value)
    try:
        return str(
            kda.resolve_kda_prefill_backend(requested, 128, torch.bfloat16, torch.float32, -5.0)
        )
    except (RuntimeError, ValueError) as error:
        return error
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(platform, name)
            else:
                setattr(platform, name, value)


@pytest.mark.parametrize("gpu", NVIDIA)
@pytest.mark.parametrize("requested", CUDA_BACKENDS)
def test_the_kda_prefill_kernel_is_the_one_vllm_resolves_on_the_gpu(
    gpu: str, requested: str
) -> None:
    theirs = vllms_kernel(gpu, requested)
    try:
        ours: str | Refusal = resolved_kda_prefill_backend(
            requested,  # type: ignore[arg-type]
            full_rank_gate=True,
            gate_lower_bound=-5.0,
            head_dim=128,
            gpu=gpu,  # type: ignore[arg-type]
        )
    except Refusal as refusal:
        ours = refusal
    if isinstance(theirs, Exception):
        assert isinstance(ours, Refusal), (gpu, requested, theirs, ours)
        assert ours.code == "kernel_unsupported"
        return
    assert ours == theirs, (gpu, requested)


@pytest.mark.parametrize("gpu", NVIDIA)
def test_the_blocks_per_request_follow_the_gpus_kernel(gpu: str) -> None:
    kernel = vllms_kernel(gpu, "auto")
    result = plan_vllm(
        preset("kimi-k3-dspark"),
        Deployment(engine_version=RELEASE, gpu=gpu, attn_tp=8, spec_tokens=2),
    )
    blocks = [g.blocks for g in result.capacity(60 << 30, 131_072).blocks_per_request]
    # the numbers: [4, 4, 4, 86] with Triton, [5, 5, 5, 86] with FlashKDA
    assert blocks == ([5, 5, 5, 86] if kernel == "flashkda" else [4, 4, 4, 86])


def test_every_cache_dtype_and_mla_backend_vllm_takes_plans_or_is_marked_unmodelled(
    tmp_path: Path,
) -> None:
    from vllm.config.cache import CacheDType  # noqa: PLC0415
    from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: PLC0415

    engine = start(Case(attn_tp=8), tmp_path)
    seen = 0
    for dtype in typing.get_args(CacheDType):
        config = copy.copy(engine.workers[0])
        config.cache_config = copy.copy(config.cache_config)
        config.cache_config.cache_dtype = dtype
        seen += _plans_or_unmodelled(config, "kv_cache_dtype", dtype)
    mla = [b for b in AttentionBackendEnum if b.name.endswith("MLA") or "_MLA" in b.name]
    for backend in mla:
        config = copy.copy(engine.workers[0])
        config.attention_config = copy.copy(config.attention_config)
        config.attention_config.backend = backend
        seen += _plans_or_unmodelled(config, "attention_backend", backend.name)
    assert seen >= 8  # vLLM's own choices were walked, not an empty list


def _plans_or_unmodelled(config: Any, option: str, value: object) -> int:
    try:
        deployment_from_vllm(config, gpu="h200")
    except Refusal as refusal:
        assert refusal.facts.get("unmodelled") == str(value), (option, value, refusal)
    return 1


def test_an_unmodelled_setting_is_logged_and_the_engine_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: PLC0415

    engine = start(Case(attn_tp=8), tmp_path)
    config = copy.copy(engine.workers[0])
    config.attention_config = copy.copy(config.attention_config)
    config.attention_config.backend = AttentionBackendEnum.TOKENSPEED_MLA
    with caplog.at_level(logging.WARNING):
        assert check_after_kv_cache_init(config, engine.kv_cache_configs[0], bind(engine)) is None
    assert "cannot check the KV cache" in caplog.text


def test_a_pipeline_worker_is_checked_as_its_own_stage_by_default(tmp_path: Path) -> None:
    engine = start(Case(attn_tp=8, pp=2), tmp_path)
    worker = copy.copy(engine.workers[1])
    worker.parallel_config = copy.copy(worker.parallel_config)
    worker.parallel_config.rank = 8 + 3  # TP rank 3 of stage 1
    checked = check_kv_cache_config(worker, engine.kv_cache_configs[1])
    assert checked.deployment.pp == 2
    check_kv_caches(worker, engine.kv_cache_configs[1], bind(engine, 1))
    first = copy.copy(engine.workers[0])
    first.parallel_config = copy.copy(first.parallel_config)
    first.parallel_config.rank = 5  # stage 0
    with pytest.raises(Refusal):  # stage 1's config on a stage-0 worker still differs
        check_kv_cache_config(first, engine.kv_cache_configs[1])


def vllms_default_backend(gpu: str, kv_dtype: str, attn_tp: int, tmp: Path) -> str:
    """The MLA backend vLLM's CUDA selector picks for K3 on ``gpu``: the first of its
    priorities whose validation passes. Kernels this CPU build lacks (FlashMLA's, FlashAttention
    MLA's symbols) are taken as present, as on a GPU build: their "not available" reasons and
    import gaps are the only ones set aside."""
    import json  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import types  # noqa: PLC0415

    # the CUDA platform module loads vLLM's stable-ABI ops library at import; the selection
    # logic needs none of it
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    import vllm.v1.attention.backends.fa_utils as fa  # noqa: PLC0415
    from vllm.config import set_current_vllm_config  # noqa: PLC0415
    from vllm.platforms import cuda  # noqa: PLC0415
    from vllm.platforms.interface import DeviceCapability  # noqa: PLC0415
    from vllm.v1.attention.selector import AttentionSelectorConfig  # noqa: PLC0415
    from vllm_engine import target_config, vllm_config  # noqa: PLC0415

    for name in ("flash_attn_varlen_func", "get_scheduler_metadata"):
        if not hasattr(fa, name):
            setattr(fa, name, lambda *args, **kwargs: None)
    case = Case(attn_tp=attn_tp, kv_dtype=kv_dtype)
    directory = tmp / str(case)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(target_config(case)))
    config = vllm_config(case, directory)
    capability = DeviceCapability(*GPUS[gpu].capability)  # type: ignore[index]
    dtype = config.cache_config.cache_dtype
    with set_current_vllm_config(config):
        selector = AttentionSelectorConfig(
            head_size=576, dtype=torch.bfloat16, kv_cache_dtype=dtype, block_size=None, use_mla=True
        )
        for backend in cuda._get_backend_priorities(
            True, capability, num_heads=96 // attn_tp, kv_cache_dtype=dtype, head_size=576
        ):
            reasons = backend.get_class().validate_configuration(
                device_capability=capability, **selector._asdict()
            )
            real = [
                r
                for r in reasons
                if "not available" not in r and "not supported on this device" not in r
            ]
            if not real:
                return str(backend.name)
    raise AssertionError(f"vLLM selects no MLA backend on {gpu}")


@pytest.mark.parametrize("gpu", NVIDIA)
@pytest.mark.parametrize("kv_dtype", ["fp8", "bf16"])
def test_the_default_mla_backend_is_the_one_vllms_selector_picks(
    gpu: str, kv_dtype: str, tmp_path: Path
) -> None:
    theirs = vllms_default_backend(gpu, kv_dtype, 8, tmp_path)
    result = plan(
        preset("kimi-k3"),
        Deployment(engine_version=RELEASE, engine="vllm", gpu=gpu, attn_tp=8, kv_dtype=kv_dtype),
    )
    assert result.report_fields()[0]["attention_backend"] == theirs
