"""Every vLLM recommendation's launch line starts vLLM 0.33 as the deployment it describes and
holds what it promises.

Over deployments that fit the GPU (Kimi-Linear on H100 / H200 / B200 at TP 1-8, with and
without expert parallelism and DP attention; Kimi-K3 at attention TP 8 x DP 16 with expert
parallelism on B200 and H200, alone and with its DSpark draft) and workloads of N requests of
L tokens, each case:

1. asks ``plan(...).recommend(N, L)`` (the least ``--kv-cache-memory-bytes`` that holds the
   workload; or an explicit KV budget; or the deployment's own ``--gpu-memory-utilization``);
2. parses ``launch_line``, with the fixture's directories for ``MODEL`` and ``DRAFT``, through
   vLLM's own parser and ``create_engine_config`` (``vllm_launch.parse_launch``), and checks
   the config vLLM built: parallel sizes (TP, DP, PP and the MoE layers' EP, from vLLM's own
   ``FusedMoEParallelConfig``), cache dtype, block size, MLA backend, prefix caching, the KDA
   prefill backend, speculative decoding, the memory flag's value, ``max_num_seqs`` and
   ``max_model_len``;
3. runs vLLM's worker budget on that config (``vllm_budget.budget``: the device reports the
   GPU's total, the model runner takes k3layout's weights and reserve terms; with
   ``--kv-cache-memory-bytes`` the worker returns that figure) and vLLM's KV-cache start-up on
   the same config with that budget (``vllm_launch.start_parsed``), and asserts the budget is
   the one k3layout promised, ``--max-num-seqs`` is within vLLM's blocks (vLLM refuses a Mamba
   model's full CUDA graphs otherwise, vllm #49064), vLLM's max concurrency holds N requests of
   L tokens, and k3layout's promised capacity is vLLM's.

The Kimi-Linear fixture gives no ``max_position_embeddings``; vLLM's ``KimiLinearConfig``
then derives 4,096 tokens and refuses a longer ``--max-model-len`` (k3layout reads no context
and does not). The checkpoint's directory here carries a 1M context, and the planner loads the
same ``config.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from vllm_required import require_vllm, running

require_vllm()
RELEASE = running()
"""The vLLM release installed, which k3layout plans for."""

from vllm.config import VllmConfig  # noqa: E402
from vllm_budget import Facts, budget, kept_after_warmup, moe_parallel  # noqa: E402
from vllm_engine import DSPARK_DRAFT, FIXTURES, MODEL_FILES, max_concurrency  # noqa: E402
from vllm_launch import case_of, parse_launch, split_launch, start_parsed  # noqa: E402

from k3layout import (  # noqa: E402
    GPUS,
    Deployment,
    GpuName,
    HybridModel,
    KvCacheDtype,
    MemoryBudget,
    Recommendation,
    Refusal,
    VllmPlan,
    load_config,
    plan,
    preset,
)
from k3layout.engines.vllm.launch import KV_CACHE_DTYPE  # noqa: E402

GiB = 1 << 30
LONG_CONTEXT = 1 << 20
"""The context the Kimi-Linear checkpoint directory gives (module docstring)."""
BACKEND: dict[str, str] = {"h100": "FLASHMLA", "h200": "FLASHMLA", "b200": "FLASHINFER_MLA"}
"""The MLA backend a case names where it names none (the harness builds a named one)."""


@dataclass(frozen=True)
class Workload:
    """A deployment that fits its GPU and a workload of ``requests`` x ``length`` tokens.
    ``model``: kimi-linear, kimi-k3 or kimi-k3-dspark (``spec`` speculative tokens);
    ``utilization``: the deployment's own ``--gpu-memory-utilization``; ``kv_budget``: the
    KV budget recommend is given."""

    model: str
    gpu: GpuName
    tp: int
    requests: int
    length: int
    dp: int = 1
    ep: bool = False
    pp: int = 1
    kv_dtype: KvCacheDtype = "fp8"
    backend: str | None = None
    block: int | None = None
    prefix_caching: bool = True
    kda: str = "triton"
    spec: int = 0
    utilization: float | None = None
    kv_budget: int | None = None

    def __str__(self) -> str:
        parts = [self.model, self.gpu, f"tp{self.tp}"]
        parts += (
            [f"dp{self.dp}"] * (self.dp > 1) + ["ep"] * self.ep + [f"pp{self.pp}"] * (self.pp > 1)
        )
        parts += [self.kv_dtype] * (self.kv_dtype != "fp8")
        if self.backend is not None:
            parts.append(self.backend)
        parts += [f"block{self.block}"] * (self.block is not None)
        parts += ["no-prefix-caching"] * (not self.prefix_caching)
        parts += [self.kda] * (self.model != "kimi-linear")
        parts += [f"s{self.spec}"] * (self.spec > 0)
        parts += [f"util{self.utilization}"] * (self.utilization is not None)
        if self.kv_budget is not None:
            parts.append(f"kv{self.kv_budget >> 20}MiB")
        return "-".join([*parts, f"{self.requests}x{self.length}"])

    @property
    def checkpoint(self) -> str:
        """The target's checkpoint (and the harness's model key)."""
        return self.model.removesuffix("-dspark")

    def deployment(self) -> Deployment:
        return Deployment(
            engine_version=RELEASE,
            engine="vllm",
            gpu=self.gpu,
            attn_tp=self.tp,
            attn_dp=self.dp,
            pp=self.pp,
            expert_parallel=self.ep,
            kv_dtype=self.kv_dtype,
            attention_backend=self.backend or BACKEND[self.gpu],
            block_tokens=self.block,
            prefix_caching=self.prefix_caching,
            kda_prefill_backend=self.kda,
            spec_tokens=self.spec,
            gpu_memory_utilization=self.utilization,
        )


def _linear(gpu: GpuName, tp: int, requests: int, length: int, **kw: object) -> Workload:
    return Workload("kimi-linear", gpu, tp, requests, length, **kw)  # type: ignore[arg-type]


def _k3(gpu: GpuName, requests: int, length: int, **kw: object) -> Workload:
    model = "kimi-k3-dspark" if kw.get("spec") else "kimi-k3"
    return Workload(model, gpu, 8, requests, length, dp=16, ep=True, **kw)  # type: ignore[arg-type]


GRID: list[Workload] = [
    # Kimi-Linear: every GPU and TP, EP and DP attention, long and short many-request loads
    _linear("h100", 2, 64, 65_536, ep=True),
    _linear("h100", 4, 300, 8192),
    _linear("h100", 4, 1024, 4096, dp=2, ep=True),
    _linear("h100", 8, 1, LONG_CONTEXT),
    _linear("h200", 1, 64, 65_536),
    _linear("h200", 2, 16, 131_072, dp=2, ep=True),
    _linear("h200", 4, 2048, 2048, ep=True),
    _linear("h200", 8, 300, 8192, kv_dtype="bf16"),
    _linear("h200", 2, 48, 32_768, pp=2),
    _linear("h200", 4, 64, 16_384, block=512),
    _linear("h200", 2, 128, 8192, prefix_caching=False),
    _linear("b200", 1, 1, LONG_CONTEXT),
    _linear("b200", 2, 512, 4096, ep=True, backend="CUTLASS_MLA"),
    _linear("b200", 4, 64, 65_536, dp=2),
    _linear("b200", 8, 1024, 4096, ep=True),
    # an explicit KV budget, and the deployment's own memory flag
    _linear("h200", 2, 64, 32_768, kv_budget=40 * GiB),
    _linear("h200", 4, 64, 65_536, utilization=0.85),
    _linear("b200", 8, 256, 8192, dp=2, ep=True, utilization=0.9),
    # Kimi-K3 at attention TP 8 x DP 16 with expert parallelism
    _k3("b200", 16, 131_072),
    _k3("b200", 128, 4096, kda="flashkda", backend="CUTLASS_MLA"),
    _k3("b200", 1, LONG_CONTEXT),
    _k3("h200", 4, 131_072),
    _k3("h200", 64, 2048),
    _k3("b200", 64, 32_768, utilization=0.95),
    _k3("b200", 16, 65_536, kv_budget=30 * GiB),
    # and with its DSpark draft
    _k3("b200", 16, 65_536, spec=2),
    _k3("b200", 8, 131_072, spec=4, backend="CUTLASS_MLA"),
    _k3("h200", 4, 65_536, spec=2),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The directories the launch line's ``MODEL`` names (a ``config.json`` each)."""
    root = tmp_path_factory.mktemp("checkpoints")
    linear = json.loads((FIXTURES / MODEL_FILES["kimi-linear"]).read_text())
    linear["max_position_embeddings"] = LONG_CONTEXT  # module docstring
    configs = {
        "kimi-linear": linear,
        "kimi-k3": json.loads((FIXTURES / MODEL_FILES["kimi-k3"]).read_text()),
    }
    directories = {}
    for name, config in configs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
        directories[name] = root / name
    return directories


def planner_model(case: Workload, checkpoints: dict[str, Path]) -> HybridModel:
    """The model k3layout plans: the checkpoint's ``config.json`` (K3 with DSpark: the preset,
    which is the K3 fixture with vLLM's DSpark draft fixture, checked below)."""
    if case.model == "kimi-k3-dspark":
        return preset("kimi-k3-dspark")
    return load_config(checkpoints[case.model] / "config.json")


def test_the_dspark_preset_is_the_fixtures_with_the_draft(checkpoints: dict[str, Path]) -> None:
    loaded = load_config(checkpoints["kimi-k3"] / "config.json", draft=DSPARK_DRAFT)
    ours = preset("kimi-k3-dspark")
    assert (loaded.layers, loaded.draft_layers, loaded.drafter, loaded.architecture) == (
        ours.layers,
        ours.draft_layers,
        ours.drafter,
        ours.architecture,
    )


def test_the_grid_covers_the_issue() -> None:
    assert {(c.model, c.gpu) for c in GRID} >= {
        ("kimi-linear", "h100"),
        ("kimi-linear", "h200"),
        ("kimi-linear", "b200"),
        ("kimi-k3", "b200"),
        ("kimi-k3", "h200"),
        ("kimi-k3-dspark", "b200"),
    }
    assert {c.tp for c in GRID if c.model == "kimi-linear"} == {1, 2, 4, 8}
    assert any(c.requests >= 1024 and c.length <= 4096 for c in GRID)
    assert any(c.kv_budget is not None for c in GRID)
    assert any(c.utilization is not None for c in GRID)


def facts(gpu: GpuName, memory: MemoryBudget) -> Facts:
    """What the device measures at start-up: the GPU's total, k3layout's weights and its
    reserve terms (``test_conformance_budget`` proves vLLM's worker turns them into k3layout's
    budget)."""
    reserve = {term.name: term.bytes for term in memory.reserve}
    return Facts(
        total=GPUS[gpu].memory_bytes,
        in_use_at_start=GiB // 2,
        weights=memory.weights_bytes,
        activation_peak=reserve["activation_peak"],
        non_torch_increase=reserve["non_torch"],
        cudagraph=reserve["cuda_graphs"],
    )


def check_parsed(config: VllmConfig, case: Workload, got: Recommendation, draft: Path) -> None:
    """The config vLLM built from the line is the deployment, workload and memory flag."""
    d = case.deployment()
    parallel, cache = config.parallel_config, config.cache_config
    assert (
        parallel.tensor_parallel_size,
        parallel.data_parallel_size,
        parallel.pipeline_parallel_size,
        parallel.decode_context_parallel_size,
        parallel.enable_expert_parallel,
    ) == (d.attn_tp, d.attn_dp, d.pp, d.dcp, d.expert_parallel)
    moe = moe_parallel(config)  # what vLLM's MoE layers make of it
    assert (moe.use_ep, moe.ep_size) == (
        d.expert_parallel,
        d.attn_tp * d.attn_dp if d.expert_parallel else 1,
    )
    assert cache.cache_dtype == KV_CACHE_DTYPE[d.kv_dtype]
    if d.block_tokens is not None:
        assert cache.block_size == d.block_tokens
    backend = config.attention_config.backend
    assert backend is not None and backend.name == d.attention_backend
    assert cache.enable_prefix_caching == d.prefix_caching
    if case.model != "kimi-linear":
        assert (config.additional_config or {}).get("kda_prefill_backend") == d.kda_prefill_backend
    speculative = config.speculative_config
    if d.spec_tokens:
        assert speculative is not None
        assert (speculative.method, speculative.num_speculative_tokens) == ("dspark", d.spec_tokens)
        assert speculative.draft_model_config.model == str(draft)
    else:
        assert speculative is None
    assert got.memory is not None
    flag, value = got.memory.memory_flag
    if flag == "--kv-cache-memory-bytes":
        assert cache.kv_cache_memory_bytes == int(value) == got.kv_memory_bytes
    else:
        assert flag == "--gpu-memory-utilization"
        assert cache.kv_cache_memory_bytes is None
        assert cache.gpu_memory_utilization == float(value) == case.utilization
    assert config.scheduler_config.max_num_seqs == case.requests
    assert config.model_config.max_model_len == case.length


@pytest.mark.parametrize("case", GRID, ids=str)
def test_the_launch_line_starts_vllm_holding_the_workload(
    case: Workload, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    result = plan(planner_model(case, checkpoints), case.deployment())
    assert isinstance(result, VllmPlan)
    got = result.recommend(case.requests, case.length, case.kv_budget)
    assert got.memory is not None
    if case.kv_budget is not None:
        assert got.kv_memory_bytes == case.kv_budget
    launch = split_launch(got.launch_line, checkpoints[case.checkpoint], DSPARK_DRAFT)
    config = parse_launch(launch, GPUS[case.gpu].capability)
    check_parsed(config, case, got, DSPARK_DRAFT)
    # vLLM's worker turns the flags and the device into the budget k3layout promised
    memory = budget(config, facts(case.gpu, got.memory))
    if got.memory.kv_reserved_bytes is not None:  # 0.34's extensible cache, shrunk after warm-up
        assert memory == got.memory.kv_reserved_bytes
        memory = kept_after_warmup(result.deployment, memory, facts(case.gpu, got.memory))
    assert memory == got.kv_memory_bytes == got.memory.kv_memory_bytes
    engine = start_parsed(config, case_of(config, launch, case.checkpoint, memory), tmp_path)
    assert engine.config.scheduler_config.max_num_seqs <= engine.kv_cache_configs[0].num_blocks
    held = math.floor(max_concurrency(engine))
    assert held >= case.requests
    assert got.capacity.max_requests == held
    if case.kv_budget is None and case.utilization is None:  # the least budget: 1 B less fails
        with pytest.raises(Refusal) as caught:
            result.recommend(case.requests, case.length, memory - 1)
        assert caught.value.code == "budget_too_small"
