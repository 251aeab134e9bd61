"""Every SGLang recommendation's launch line starts SGLang 0.5.23 as the deployment it describes
and holds what it promises.

Over deployments that fit the GPU (Kimi-Linear on H100 / H200 / B200 at TP 1-8, with and
without expert parallelism and DP attention; Kimi-K3 at attention TP 8 x DP 16 with expert
parallelism, alone and with its DSpark draft as SGLang's GQA draft) and workloads of N
requests of L tokens, each case:

1. asks ``plan(...).recommend(N, L)`` (the least ``--mem-fraction-static`` that holds the
   workload; or an explicit KV budget; or the deployment's own fraction);
2. parses ``launch_line``, with the fixture's directories for ``MODEL`` and ``DRAFT``, through
   SGLang's launcher parser (``sglang_launch.parse_launch``: ``prepare_server_args``) and
   checks the raw ``ServerArgs`` - ``--tp-size`` over every DP replica, ``--dp-size`` with DP
   attention, PP, ``--ep-size``, the cache dtype, the radix cache, speculative decoding, the
   fraction, ``--max-running-requests``, the state pool's ``--max-mamba-cache-size`` (and
   ``--mamba-full-memory-ratio``), ``--max-total-tokens`` and ``--context-length`` - then what
   SGLang's resolution made of them (attention TP and DP sizes, the running requests and
   state slots asked for, the context);
3. runs SGLang's ``KVCacheConfigurator`` on those ``ServerArgs`` (``sglang_launch.sized``) in
   the KV budget the fraction gives - k3layout's ``MemoryBudget.kv_memory_bytes``, which
   ``test_conformance_sglang_budget`` proves is SGLang's profiler's figure to the byte - and
   asserts SGLang holds N requests of L tokens (``max_running_requests >= N``, not the silent
   cap of sglang #38846, and a token pool of N x L), the pools k3layout promised are SGLang's
   and the capacity is SGLang's; in one byte less than the least budget, SGLang holds fewer.

The Kimi-Linear fixture gives no ``max_position_embeddings`` (SGLang then derives 4,096 tokens
and refuses a longer ``--context-length``); the checkpoint directory here carries a 1M
context, and the planner loads the same ``config.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sglang_engine import require_sglang

require_sglang()

from sglang_engine import FIXTURES, MODEL_FILES  # noqa: E402
from sglang_launch import launch_argv, parse_launch, sized  # noqa: E402
from test_conformance_sglang import k3_with_gqa_draft  # noqa: E402

from k3layout import (  # noqa: E402
    Architecture,
    Deployment,
    GpuName,
    HybridModel,
    KvCacheDtype,
    Recommendation,
    Refusal,
    load_config,
    plan,
)
from k3layout.engines.sglang import SglangCapacity, SglangPlan  # noqa: E402
from k3layout.engines.sglang.launch import KV_CACHE_DTYPE  # noqa: E402
from k3layout.model.hf_weights import dspark_draft_of  # noqa: E402

GIB = 1 << 30
LONG_CONTEXT = 1 << 20
"""The context the Kimi-Linear checkpoint directory gives (module docstring)."""
DSPARK_DRAFT = FIXTURES / "sglang-dspark-draft"
DRAFT_CONFIG: dict[str, Any] = json.loads((DSPARK_DRAFT / "config.json").read_text())
GAMMA = int(DRAFT_CONFIG["block_size"])
"""The draft's own block size: the speculative tokens SGLang's DSpark runs by default."""


@dataclass(frozen=True)
class Workload:
    """A deployment that fits its GPU and a workload of ``requests`` x ``length`` tokens
    (``requests`` per attention-DP replica). ``model``: kimi-linear, kimi-k3 or
    kimi-k3-dspark (``spec`` speculative tokens); ``fraction``: the deployment's own
    ``--mem-fraction-static``; ``kv_budget``: the KV budget recommend is given."""

    model: str
    gpu: GpuName
    tp: int
    requests: int
    length: int
    dp: int = 1
    ep: bool = False
    pp: int = 1
    kv_dtype: KvCacheDtype = "fp8"
    prefix_caching: bool = True
    ratio: float | None = None
    spec: int = 0
    fraction: float | None = None
    kv_budget: int | None = None

    def __str__(self) -> str:
        parts = [self.model, self.gpu, f"tp{self.tp}"]
        parts += [f"dp{self.dp}"] * (self.dp > 1) + ["ep"] * self.ep
        parts += [f"pp{self.pp}"] * (self.pp > 1) + [self.kv_dtype] * (self.kv_dtype != "fp8")
        parts += ["radix-off"] * (not self.prefix_caching)
        parts += [f"ratio{self.ratio}"] * (self.ratio is not None)
        parts += [f"s{self.spec}"] * (self.spec > 0)
        parts += [f"mfs{self.fraction}"] * (self.fraction is not None)
        if self.kv_budget is not None:
            parts.append(f"kv{self.kv_budget >> 20}MiB")
        return "-".join([*parts, f"{self.requests}x{self.length}"])

    @property
    def checkpoint(self) -> str:
        """The target's checkpoint."""
        return self.model.removesuffix("-dspark")

    def deployment(self) -> Deployment:
        return Deployment(
            engine="sglang",
            gpu=self.gpu,
            attn_tp=self.tp,
            attn_dp=self.dp,
            pp=self.pp,
            expert_parallel=self.ep,
            kv_dtype=self.kv_dtype,
            prefix_caching=self.prefix_caching,
            mamba_full_memory_ratio=self.ratio,
            spec_tokens=self.spec,
            mem_fraction_static=self.fraction,
        )


def _linear(gpu: GpuName, tp: int, requests: int, length: int, **kw: Any) -> Workload:
    return Workload("kimi-linear", gpu, tp, requests, length, **kw)


def _k3(gpu: GpuName, requests: int, length: int, **kw: Any) -> Workload:
    return Workload("kimi-k3", gpu, 8, requests, length, dp=16, ep=True, **kw)


GRID: list[Workload] = [
    # Kimi-Linear: every GPU and TP, EP and DP attention, long and short many-request loads
    _linear("h100", 4, 64, 65_536),
    _linear("h100", 8, 300, 8192, dp=2, ep=True),
    _linear("h200", 1, 64, 65_536),
    _linear("h200", 2, 16, 131_072, dp=2, ep=True),
    _linear("h200", 4, 1024, 4096, ep=True),
    _linear("h200", 8, 300, 8192, kv_dtype="bf16"),
    _linear("h200", 4, 48, 32_768, pp=2),
    _linear("h200", 2, 128, 8192, prefix_caching=False, ratio=0.5),
    _linear("b200", 1, 1, LONG_CONTEXT),
    _linear("b200", 2, 512, 4096, ep=True),
    _linear("b200", 4, 2048, 2048, dp=2, ep=True),
    # an explicit KV budget, and the deployment's own memory flag
    _linear("h200", 2, 64, 32_768, kv_budget=40 * GIB),
    _linear("h200", 4, 64, 65_536, fraction=0.85),
    # Kimi-K3 at attention TP 8 x DP 16 with expert parallelism: SGLang's default fraction
    # leaves it little KV on a B200, and none on an H200
    _k3("b200", 2, 65_536),
    _k3("b200", 16, 131_072, fraction=0.85),
    _k3("h200", 8, 65_536, fraction=0.9),
    _k3("b200", 2, 65_536, kv_budget=3 * GIB),
    # speculative decoding without a draft model: SGLang's EAGLE-family MTP (NEXTN)
    _linear("h200", 4, 64, 32_768, spec=3),
    _k3("b200", 8, 65_536, fraction=0.85, spec=2),
    # and with its DSpark draft (module docstring): its own block size, and another
    Workload("kimi-k3-dspark", "b200", 16, 16, 65_536, spec=GAMMA, kv_budget=40 * GIB),
    Workload("kimi-k3-dspark", "h200", 16, 8, 131_072, spec=3, kv_budget=30 * GIB),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The directories the launch line's ``MODEL`` names (a ``config.json`` each)."""
    root = tmp_path_factory.mktemp("checkpoints")
    linear = json.loads(MODEL_FILES["kimi-linear"].read_text())
    linear["max_position_embeddings"] = LONG_CONTEXT  # module docstring
    configs = {"kimi-linear": linear, "kimi-k3": json.loads(MODEL_FILES["kimi-k3"].read_text())}
    directories = {}
    for name, config in configs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
        directories[name] = root / name
    return directories


def planner_model(case: Workload, checkpoints: dict[str, Path]) -> HybridModel:
    """The model k3layout plans: the checkpoint's ``config.json``; with DSpark, K3 with the
    draft as SGLang's GQA layers, as ``test_conformance_sglang.k3_with_gqa_draft`` builds it
    (its weights not modelled: module docstring)."""
    if case.model == "kimi-k3-dspark":
        return k3_with_gqa_draft()
    return load_config(checkpoints[case.checkpoint] / "config.json")


def test_no_dspark_deployment_of_k3_holds_its_weights_in_sglang() -> None:
    """Why the DSpark cases take the path where the weights are not modelled: with the
    draft's dimensions known, DP attention (the only way K3's weights fit) is refused, as
    SGLang runs a DSpark draft under DP attention only with ``--enable-dp-lm-head``, and
    without it a stage's weights are over the GPU."""
    k3 = load_config(MODEL_FILES["kimi-k3"])
    assert k3.architecture is not None
    gqa = k3_with_gqa_draft()
    draft = dspark_draft_of(DRAFT_CONFIG, "sglang-dspark-draft/config.json")
    model = HybridModel(
        name=gqa.name,
        model_type=k3.model_type,
        layers=k3.layers,
        draft_layers=gqa.draft_layers,
        drafter="dspark",
        context_tokens=k3.context_tokens,
        architecture=Architecture.model_validate({**dict(k3.architecture), "draft": draft}),
    )
    for attn_tp, attn_dp, code in ((8, 16, "draft_unsupported"), (16, 1, "weights_do_not_fit")):
        deployment = Deployment(
            engine="sglang",
            gpu="b200",
            attn_tp=attn_tp,
            attn_dp=attn_dp,
            expert_parallel=True,
            spec_tokens=GAMMA,
        )
        with pytest.raises(Refusal) as caught:
            plan(model, deployment).recommend(1, 65_536)
        assert caught.value.code == code


def test_the_grid_covers_the_issue() -> None:
    assert {(c.model, c.gpu) for c in GRID} >= {
        ("kimi-linear", "h100"),
        ("kimi-linear", "h200"),
        ("kimi-linear", "b200"),
        ("kimi-k3", "b200"),
        ("kimi-k3-dspark", "b200"),
    }
    assert {c.tp for c in GRID if c.model == "kimi-linear"} == {1, 2, 4, 8}
    assert any(c.requests >= 1024 and c.length <= 4096 for c in GRID)
    assert any(c.kv_budget is not None for c in GRID)
    assert any(c.fraction is not None and c.kv_budget is None for c in GRID)
    assert {c.spec for c in GRID if c.model == "kimi-k3-dspark"} == {GAMMA, 3}
    assert any(c.spec for c in GRID if c.model != "kimi-k3-dspark")


def check_parsed(server_args: Any, case: Workload, got: Recommendation) -> None:
    """The raw ``ServerArgs`` of the line are the deployment, workload and memory flag."""
    d = case.deployment()
    flags = dict(got.flags)
    world = d.attn_tp * d.attn_dp
    assert (
        server_args.tp_size,
        server_args.dp_size,
        server_args.enable_dp_attention,
        server_args.pp_size,
        server_args.ep_size,
        server_args.dcp_size,
    ) == (world, d.attn_dp, d.attn_dp > 1, d.pp, world if d.expert_parallel else 1, d.dcp)
    assert server_args.kv_cache_dtype == KV_CACHE_DTYPE[d.kv_dtype]
    assert server_args.disable_radix_cache == (not d.prefix_caching)
    if d.mamba_full_memory_ratio is not None:
        assert server_args.mamba_full_memory_ratio == d.mamba_full_memory_ratio
    if case.model == "kimi-k3-dspark":
        assert server_args.speculative_algorithm == "DSPARK"
        assert server_args.speculative_draft_model_path == str(DSPARK_DRAFT)
        assert server_args.speculative_dspark_block_size == d.spec_tokens
    elif d.spec_tokens:
        assert server_args.speculative_algorithm == "NEXTN"
        assert (server_args.speculative_num_steps, server_args.speculative_eagle_topk) == (
            d.spec_tokens,
            1,
        )
    else:
        assert server_args.speculative_algorithm is None
    if d.spec_tokens:
        assert server_args.speculative_num_draft_tokens == d.spec_tokens + 1
    if got.memory is None:  # the weights are not modelled: the KV budget as given
        assert "--mem-fraction-static" not in flags
        assert server_args.mem_fraction_static is None
    else:
        flag, value = got.memory.memory_flag
        assert flag == "--mem-fraction-static"
        assert server_args.mem_fraction_static == float(value)
        if case.fraction is not None and case.kv_budget is None:
            assert server_args.mem_fraction_static == case.fraction
    assert server_args.max_running_requests == case.requests * d.attn_dp
    assert server_args.max_mamba_cache_size == int(flags["--max-mamba-cache-size"])
    assert server_args.max_total_tokens == int(flags["--max-total-tokens"])
    assert server_args.context_length == case.length


def check_resolved(answer: dict[str, Any], server_args: Any, case: Workload) -> None:
    """What SGLang's resolution made of the line: the deployment's attention TP and DP, the
    fraction, requests, state slots and context as given, the speculative window."""
    d = case.deployment()
    assert "refused" not in answer, answer.get("refused")
    assert (answer["attn_tp_size"], answer["attn_dp_size"], answer["pp_size"]) == (
        d.attn_tp,
        d.attn_dp,
        d.pp,
    )
    if server_args.mem_fraction_static is not None:
        assert answer["mem_fraction_static"] == server_args.mem_fraction_static
    assert answer["requested_max_running_requests"] == server_args.max_running_requests
    assert answer["requested_max_mamba_cache_size"] == server_args.max_mamba_cache_size
    assert answer["context_len"] == case.length
    assert answer["disable_radix_cache"] == (not d.prefix_caching)
    if d.spec_tokens:
        dspark = case.model == "kimi-k3-dspark"
        assert answer["speculative_algorithm"] == ("DSPARK" if dspark else "EAGLE")
        assert answer["speculative_num_draft_tokens"] == d.spec_tokens + 1
    if d.mamba_full_memory_ratio is not None:
        assert answer["mamba_full_memory_ratio"] == d.mamba_full_memory_ratio


@pytest.mark.parametrize("case", GRID, ids=str)
def test_the_launch_line_starts_sglang_holding_the_workload(
    case: Workload, checkpoints: dict[str, Path]
) -> None:
    result = plan(planner_model(case, checkpoints), case.deployment())
    assert isinstance(result, SglangPlan)
    got = result.recommend(case.requests, case.length, case.kv_budget)
    # what the fraction gives, as SGLang profiles it (or the KV budget given, where the
    # weights are not modelled)
    budget = got.kv_memory_bytes
    if got.memory is not None:
        assert budget == got.memory.kv_memory_bytes
    assert budget >= got.needed_bytes
    if case.kv_budget is not None:
        assert budget >= case.kv_budget
    server_args = parse_launch(
        launch_argv(got.launch_line, checkpoints[case.checkpoint], DSPARK_DRAFT)
    )
    check_parsed(server_args, case, got)
    answer = sized(server_args, case.gpu, budget)
    check_resolved(answer, server_args, case)
    length, requests = case.length, case.requests
    assert answer["max_running_requests"] >= requests
    assert answer["logical_max_total_num_tokens"] >= requests * length
    assert got.capacity.max_requests == min(
        answer["max_running_requests"], answer["logical_max_total_num_tokens"] // length
    )
    pools = got.capacity
    assert isinstance(pools, SglangCapacity)
    assert (
        pools.max_total_num_tokens,
        pools.max_mamba_cache_size,
        pools.max_running_requests,
    ) == (
        answer["max_total_num_tokens"],
        answer["max_mamba_cache_size"],
        answer["max_running_requests"],
    )
    assert answer["max_total_num_tokens"] == server_args.max_total_tokens  # the cap holds
    # the least budget is the least: with these flags, SGLang holds fewer in a byte less
    short = sized(server_args, case.gpu, got.needed_bytes - 1)
    assert "refused" in short or (
        min(short["max_running_requests"], short["logical_max_total_num_tokens"] // length)
        < requests
    )
