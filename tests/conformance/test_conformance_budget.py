"""vLLM's own worker turns the GPU into the KV budget k3layout gives, term for term, in the
release installed (0.33 or 0.34).

For each GPU, utilization and figure set, vLLM's ``Worker.determine_available_memory`` runs on
CPU (``vllm_budget.budget``) with the device reporting the GPU's total and the model runner
taking k3layout's own weights and reserve terms (the activation peak of the profile run, memory
outside torch, CUDA graphs); the budget it returns is k3layout's ``kv_memory_bytes``, or, with
0.34's extensible KV cache, its ``kv_reserved_bytes`` (the size before warm-up), and vLLM's own
``measure_kv_cache_bytes``, fed the memory those terms leave, gives ``kv_memory_bytes``. The
parsed ``--gpu-memory-utilization`` default and ``--kv-cache-memory-bytes`` are vLLM's too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_required import require_vllm, running

require_vllm()
RELEASE = running()
"""The vLLM release installed, which k3layout plans for."""

from vllm_budget import Facts, budget, engine_args, engine_config, kept_after_warmup  # noqa: E402
from vllm_engine import FIXTURES  # noqa: E402

from k3layout import GPUS, Deployment, GpuName, Refusal, preset  # noqa: E402
from k3layout.engines.vllm.budget import vllm_budget  # noqa: E402
from k3layout.engines.vllm.releases import RELEASES  # noqa: E402

GiB = 1 << 30


@pytest.fixture(scope="module")
def linear(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("kimi-linear")
    (directory / "config.json").write_text(
        (FIXTURES / "kimi-linear-48b-a3b.config.json").read_text()
    )
    return directory


def serve(model: Path, *flags: str) -> list[str]:
    return ["--model", str(model), "--skip-tokenizer-init", *flags]


def test_vllms_default_utilization_is_the_planners(linear: Path) -> None:
    parsed = engine_args(serve(linear)).gpu_memory_utilization
    assert parsed == RELEASES[RELEASE].utilization_flag_default
    planned = vllm_budget(preset("kimi-linear-48b"), Deployment(engine_version=RELEASE), 0)
    resolved = engine_config(serve(linear)).cache_config
    assert float(planned.memory_flag[1]) == getattr(
        resolved, "resolved_gpu_memory_utilization", resolved.gpu_memory_utilization
    )


GPUS_RUN: tuple[GpuName, ...] = ("h100", "h200", "b200", "mi300x")
CASES: list[tuple[GpuName, float | None, int, int]] = [
    (gpu, util, tp, weights)
    for gpu in GPUS_RUN
    for util in (None, 0.85, 0.95)
    for tp, weights in ((1, 90 * GiB), (8, 12 * GiB))
]


@pytest.mark.parametrize(("gpu", "util", "tp", "weights"), CASES, ids=str)
def test_vllms_worker_gives_the_planners_kv_budget(
    linear: Path, gpu: GpuName, util: float | None, tp: int, weights: int
) -> None:
    model = preset("kimi-linear-48b")
    deployment = Deployment(
        engine_version=RELEASE, attn_tp=tp, gpu=gpu, gpu_memory_utilization=util
    )
    try:
        planned = vllm_budget(model, deployment, weights)
    except Refusal as refusal:  # too little left: vLLM's own budget is then not positive
        assert refusal.code in ("memory_exceeded", "weights_do_not_fit")
        planned = None
    flags = ["-tp", str(tp)] + ([] if util is None else ["--gpu-memory-utilization", str(util)])
    config = engine_config(serve(linear, *flags), GPUS[gpu].capability)
    reserve = vllm_budget(model, deployment, 0).reserve  # the terms do not depend on weights
    facts = Facts(
        total=GPUS[gpu].memory_bytes,
        in_use_at_start=GiB // 2,
        weights=weights,
        activation_peak=next(t.bytes for t in reserve if t.name == "activation_peak"),
        non_torch_increase=next(t.bytes for t in reserve if t.name == "non_torch"),
        cudagraph=next(t.bytes for t in reserve if t.name == "cuda_graphs"),
    )
    engines = budget(config, facts)
    if planned is None:
        assert engines <= 0
        return
    if planned.kv_reserved_bytes is None:
        assert planned.kv_memory_bytes == engines
    else:  # sized before warm-up, then measured (0.34's extensible KV cache)
        assert getattr(config.cache_config, "enable_extensible_kv_cache", False)
        assert planned.kv_reserved_bytes == engines
        assert planned.kv_memory_bytes == kept_after_warmup(deployment, engines, facts)
    assert planned.used_bytes <= planned.gpu_memory_bytes


def test_a_given_kv_budget_is_vllms_kv_cache_memory_bytes(linear: Path) -> None:
    deployment = Deployment(engine_version=RELEASE, attn_tp=8, kv_memory_bytes=40 * GiB)
    planned = vllm_budget(preset("kimi-linear-48b"), deployment, 12 * GiB)
    flag, value = planned.memory_flag
    config = engine_config(serve(linear, "-tp", "8", flag, value))
    facts = Facts(total=GPUS["h200"].memory_bytes, weights=12 * GiB)
    assert budget(config, facts) == planned.kv_memory_bytes == 40 * GiB
