"""SGLang 0.5.23's GPU budget against ``k3layout.engines.sglang.budget``, run on CPU.

(a) The default ``--mem-fraction-static``: SGLang resolves its ``ServerArgs`` on the case's GPU
(``sglang_engine.sglang_server_args``, ``nvidia-smi``'s total the GPU's
``smi_memory_mib``); k3layout's :func:`default_mem_fraction_static` for the same model and
flags must be the very float SGLang resolved, over models, GPUs, TP, PP, DP attention, DCP,
expert parallelism, ``--max-running-requests``, DSpark and ViT sizes.

(b) The KV budget: SGLang's ``KVCacheConfigurator._profile_available_bytes`` runs with its own
``get_available_gpu_memory`` (``torch.cuda.mem_get_info`` answering the free memory k3layout
assumes: the GPU's total less start-up before the weights, less the weights after; the
multi-rank MIN all-reduce through its float32 tensor), its multimodal reservation and the
state-pool carve-out held at zero: the rest must be k3layout's ``kv_memory_bytes`` to the
byte. With both left in, SGLang's pool sizes (``_resolve_memory_pool_config``) must be what
``SglangPlan.capacity`` gives for that budget; and the least fraction k3layout recommends must
be the least thousandth at which SGLang's own budget holds the KV asked for.
"""

from __future__ import annotations

import contextlib
import functools
import json
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from sglang_engine import require_sglang

require_sglang()

import sglang_engine as se  # noqa: E402

from k3layout import (  # noqa: E402
    Deployment,
    GQALayer,
    HybridModel,
    Refusal,
    load_config,
    plan,
)
from k3layout.engines.sglang import SglangPlan  # noqa: E402
from k3layout.engines.sglang.budget import (  # noqa: E402
    default_mem_fraction_static,
    sglang_budget,
    sglang_least,
)
from k3layout.gpus import GPUS, GpuName  # noqa: E402
from k3layout.memory.estimates import startup  # noqa: E402

GIB = 1 << 30
SGLANG_DSPARK_DRAFT = se.FIXTURES / "sglang-dspark-draft"
SERVED: tuple[GpuName, ...] = ("h100", "h200", "b200", "gb200")
HARNESS_MIB = {name: float(gpu["mem_mib"]) for name, gpu in se.GPUS.items()}
"""The harness's own ``nvidia-smi`` totals (H100, H200, B200), before the fixture below."""
VIT_SIZES = {"vit48x1152": (48, 1152), "vit12x768": (12, 768), "vit64x2048": (64, 2048)}
"""K3 with other vision towers (``vision_config``): a factor inside the clamp, above it, under
it."""


@pytest.fixture(scope="module", autouse=True)
def _gpus() -> Iterator[None]:
    """The harness's GPUs with ``nvidia-smi``'s total as k3layout's table gives it, and the
    GB200 (a B200 die: SM100's facts)."""
    table = {
        name: {
            "mem_mib": float(GPUS[name].smi_memory_mib),
            "facts": se.GPUS["b200" if name == "gb200" else name]["facts"],
        }
        for name in SERVED
    }
    with mock.patch.dict(se.GPUS, table):
        yield


def test_the_tables_nvidia_smi_totals_are_the_harness_own() -> None:
    ours = {name: float(GPUS[name].smi_memory_mib) for name in SERVED if name in HARNESS_MIB}
    assert ours == HARNESS_MIB


@functools.cache
def _config_path(model: str, tmp: Path) -> Path:
    if model in se.MODEL_FILES:
        return se.MODEL_FILES[model]
    layers, hidden = VIT_SIZES[model]
    config = json.loads(se.MODEL_FILES["kimi-k3"].read_text())
    config["vision_config"] = {"vt_num_hidden_layers": layers, "vt_hidden_size": hidden}
    path = tmp / f"kimi-k3-{model}.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sglang-budget")


@functools.cache
def _model(path: Path, dspark: bool) -> HybridModel:
    model = load_config(path)
    if not dspark:
        return model
    draft = json.loads((SGLANG_DSPARK_DRAFT / "config.json").read_text())
    layer = GQALayer(
        num_heads=draft["num_attention_heads"],
        num_kv_heads=draft["num_key_value_heads"],
        head_dim=draft["head_dim"],
    )
    return HybridModel(
        name=f"{model.name}-dspark",
        model_type=model.model_type,
        layers=model.layers,
        draft_layers=(layer,) * draft["num_hidden_layers"],
        drafter="dspark",
        architecture=model.architecture,
    )


@dataclass(frozen=True)
class Case:
    """One launch: ``tp`` is SGLang's ``--tp-size``; ``dp`` attention DP (``--dp-size D
    --enable-dp-attention``); ``ep`` ``--ep-size`` = ``--tp-size``."""

    model: str = "kimi-k3"
    gpu: str = "h200"
    tp: int = 8
    dp: int = 1
    pp: int = 1
    dcp: int = 1
    mrr: int | None = None
    dspark: bool = False
    ep: bool = False

    def __str__(self) -> str:
        parts = [self.model, self.gpu, f"tp{self.tp}"]
        for name, value, default in (
            ("dp", self.dp, 1),
            ("pp", self.pp, 1),
            ("dcp", self.dcp, 1),
            ("mrr", self.mrr, None),
        ):
            if value != default:
                parts.append(f"{name}{value}")
        parts += ["dspark"] * self.dspark + ["ep"] * self.ep
        return "-".join(parts)

    def harness_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(
            tp=self.tp, pp=self.pp, dcp=self.dcp, gpu=self.gpu, max_running_requests=self.mrr
        )
        if self.dp > 1:
            kwargs.update(dp=self.dp, enable_dp_attention=True)
        if self.dspark:
            kwargs["spec"] = {"algorithm": "DSPARK", "draft_model_path": SGLANG_DSPARK_DRAFT}
        if self.ep:
            kwargs["server_args"] = {"ep_size": self.tp}
        return kwargs

    def spec_tokens(self) -> int:
        if not self.dspark:
            return 0
        return int(json.loads((SGLANG_DSPARK_DRAFT / "config.json").read_text())["block_size"])

    def deployment(self, **fields: Any) -> Deployment:
        return Deployment(
            engine="sglang",
            gpu=self.gpu,
            attn_tp=self.tp // self.dp,
            attn_dp=self.dp,
            pp=self.pp,
            dcp=self.dcp,
            spec_tokens=self.spec_tokens(),
            max_running_requests=self.mrr,
            expert_parallel=self.ep,
            **fields,
        )


def grid() -> list[Case]:
    """Models x GPUs x TP; PP 2; DP attention; DCP; EP; --max-running-requests over the
    decode-graph tiers and the DP 300 threshold; DSpark; other ViTs."""
    cases: list[Case] = []
    for model in ("kimi-k3", "kimi-linear"):
        for gpu in SERVED:
            cases += [Case(model, gpu, tp) for tp in (1, 2, 4, 8, 16)]
            cases += [Case(model, gpu, tp, pp=2) for tp in (2, 4, 8)]
            cases += [Case(model, gpu, tp, dp=dp) for tp, dp in ((2, 2), (4, 2), (8, 2), (8, 4))]
            cases += [Case(model, gpu, 8, dp=8), Case(model, gpu, 16, dp=16)]
            cases += [Case(model, gpu, 8, ep=True), Case(model, gpu, 16, ep=True)]
            cases += [Case(model, gpu, 8, dcp=dcp) for dcp in (2, 8)]
            for mrr in (1, 8, 100, 255, 256, 300, 301, 320, 600):
                cases += [Case(model, gpu, 2, mrr=mrr), Case(model, gpu, 8, dp=4, mrr=mrr)]
            cases.append(Case(model, gpu, 8, pp=2, dp=2, mrr=400))
    for gpu in SERVED:
        cases += [Case(gpu=gpu, dspark=True), Case(gpu=gpu, tp=4, dspark=True)]
        cases += [Case(gpu=gpu, dspark=True, mrr=mrr) for mrr in (16, 300)]
        cases += [Case(vit, gpu, 8) for vit in VIT_SIZES]
    return cases


GRID = grid()


@functools.cache
def sglang_fraction(case: Case, path: Path) -> float | str:
    """SGLang's resolved ``mem_fraction_static``, or why SGLang refused the flags."""
    try:
        server_args, _ = se.sglang_server_args(path, **case.harness_kwargs())
    except Exception as error:  # SGLang refused the launch
        return f"{type(error).__name__}: {error}"
    value = server_args.resolved_dict()["mem_fraction_static"]
    assert isinstance(value, float)
    return value


def test_the_grid_covers_every_rule_branch() -> None:
    # each tier of decode graphs, the DP 300 threshold both ways, a cap by requests
    assert {c.gpu for c in GRID} == set(SERVED)
    assert any(c.dp > 1 and c.mrr == 301 for c in GRID)
    assert any(c.dp > 1 and c.mrr == 300 for c in GRID)


@pytest.mark.parametrize("case", GRID, ids=str)
def test_the_default_fraction_is_sglangs(case: Case, config_dir: Path) -> None:
    path = _config_path(case.model, config_dir)
    resolved = sglang_fraction(case, path)
    if isinstance(resolved, str):  # SGLang refuses the launch: so does the planner
        with pytest.raises(Refusal) as caught:
            plan(_model(path, case.dspark), case.deployment())
        assert caught.value.code == "dcp_unsupported", (caught.value, resolved)
        assert "CuteDSL MLA" in resolved and "CuteDSL MLA" in str(caught.value)
        return
    ours = default_mem_fraction_static(_model(path, case.dspark), case.deployment())
    assert ours == resolved, (ours, resolved)


def test_sglang_resolves_most_of_the_grid(config_dir: Path) -> None:
    refused = [
        c for c in GRID if isinstance(sglang_fraction(c, _config_path(c.model, config_dir)), str)
    ]
    # SGLang 0.5.23 refuses K3's DCP on Hopper (CuteDSL MLA is SM100 only); nothing else
    assert all(
        c.model != "kimi-linear" and c.dcp > 1 and c.gpu in ("h100", "h200") for c in refused
    )
    assert len(refused) == 4


@pytest.mark.parametrize("gpu", ["a100", "mi300x", "mi355x"])
def test_a_gpu_sglangs_resolution_was_not_read_on_is_refused_naming_the_flag(gpu: str) -> None:
    with pytest.raises(Refusal) as caught:
        default_mem_fraction_static(
            load_config(se.MODEL_FILES["kimi-k3"]), Case(gpu=gpu).deployment()
        )
    assert caught.value.code == "engine_setting"
    assert caught.value.facts["field"] == "mem_fraction_static"


# ---------------------------------------------------------------------------------------------
# (b) The KV budget, by SGLang's profiler with the free memory k3layout assumes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """A case of the KV rule: ``weights`` per rank (any figure: the rule is under test, not the
    weights), and optionally the fraction and the start-up memory given."""

    case: Case
    weights: int
    fraction: float | None = None
    reserve: int | None = None

    def __str__(self) -> str:
        extra = [f"w{self.weights}"]
        if self.fraction is not None:
            extra.append(f"mfs{self.fraction}")
        if self.reserve is not None:
            extra.append(f"r{self.reserve}")
        return "-".join([str(self.case), *extra])

    def deployment(self) -> Deployment:
        return self.case.deployment(mem_fraction_static=self.fraction, reserve_bytes=self.reserve)


BUDGETS = [
    Budget(Case(tp=8), 72 * GIB + 123_456_789),
    Budget(Case(tp=1), 60 * GIB + 987_654_321),  # one rank: no float32 all-reduce
    Budget(Case(tp=16), 40 * GIB + 7),
    Budget(Case(tp=8, gpu="h100"), 50 * GIB + 1),
    Budget(Case(tp=8, gpu="b200"), 96 * GIB + 555_555_555),
    Budget(Case(tp=8, gpu="gb200", dp=8), 30 * GIB + 3),
    Budget(Case(tp=4, mrr=64), 90 * GIB + 31_337),
    Budget(Case(tp=8), 72 * GIB + 123_456_789, fraction=0.9),
    Budget(Case(tp=8), 72 * GIB + 123_456_789, reserve=3 * GIB + 12_345),
    Budget(Case(tp=8, dspark=True), 74 * GIB + 4_242_424),
    Budget(Case("kimi-linear", tp=1), 90 * GIB + 17),
    Budget(Case("kimi-linear", tp=2, gpu="h100"), 45 * GIB + 999),
    Budget(Case("kimi-linear", tp=8, dp=2), 12 * GIB + 5, fraction=0.77),
    Budget(Case("kimi-linear", tp=8, pp=2), 6 * GIB + 6),
]


@contextlib.contextmanager
def _free_memory(s: types.SimpleNamespace, free: list[int], total: int) -> Iterator[None]:
    """``torch.cuda`` of one idle GPU answering ``free[0]`` bytes free of ``total`` (SGLang's
    ``get_available_gpu_memory`` runs as on CUDA); the world all-reduce is the MIN of ranks
    that all answer alike, so it leaves the float32 tensor as it is."""
    torch = s.torch
    props = types.SimpleNamespace(is_integrated=False)
    with (
        mock.patch.object(torch.cuda, "device_count", lambda: 1),
        mock.patch.object(torch.cuda, "current_device", lambda: 0),
        mock.patch.object(torch.cuda, "empty_cache", lambda: None),
        mock.patch.object(torch.cuda, "get_device_properties", lambda *a: props),
        mock.patch.object(torch.cuda, "mem_get_info", lambda *a: (free[0], total)),
        mock.patch.object(torch.distributed, "all_reduce", lambda *a, **k: None),
        # the profiler's gc.collect() before its probe: no garbage changes the stand-in
        mock.patch.object(s.kvc, "gc", types.SimpleNamespace(collect=lambda *a: 0)),
    ):
        yield


def sglang_profile(
    budget: Budget, path: Path, fraction: float | None = None, pools: bool = False
) -> dict[str, int]:
    """SGLang's own budget for ``budget``'s figures: ``rest`` is ``_profile_available_bytes``
    with the multimodal reservation and the state-pool carve-out at zero; with ``pools``, the
    pool sizes ``_resolve_memory_pool_config`` gives with both in. ``fraction``: launch with
    that ``--mem-fraction-static`` (else the budget's own flag, or SGLang's default)."""
    deployment = budget.deployment()
    total = GPUS[deployment.gpu].memory_bytes
    start = startup(deployment).bytes if budget.reserve is None else budget.reserve
    free_before = total - start
    free_after = free_before - budget.weights
    given = fraction if fraction is not None else budget.fraction
    extra = {} if given is None else {"mem_fraction_static": given}
    kwargs = budget.case.harness_kwargs()
    kwargs["server_args"] = {**kwargs.get("server_args", {}), **extra}
    world = budget.case.tp * budget.case.pp
    free = [free_before]
    out: dict[str, int] = {}
    with se._session(budget.case.gpu) as s, _free_memory(s, free, total):
        server_args = se._server_args(
            s,
            path,
            tp=budget.case.tp,
            dp=budget.case.dp,
            enable_dp_attention=budget.case.dp > 1,
            pp=budget.case.pp,
            dcp=budget.case.dcp,
            kv_dtype="fp8",
            spec=kwargs.get("spec"),
            max_running_requests=budget.case.mrr,
            mamba_full_memory_ratio=None,
            max_mamba_cache_size=None,
            extra=kwargs["server_args"],
        )
        s.rc.publish(server_args, role="scheduler", ranks=s.rc.SpawnRanks(world_rank=0, gpu_id=0))
        # measure_pre_model_load_memory's probe (distributed/bootstrap.py:207-212): the MIN
        # over the world group of the free memory before the weights load
        pre = s.common.get_available_gpu_memory("cuda", 0, distributed=world > 1, cpu_group=None)
        free[0] = free_after  # the weights are resident
        run = se._StageRun(s, server_args, pp_rank=0, device="cuda")
        with (
            mock.patch.object(s.kvc, "mm_runtime_reservation_gb", lambda **k: 0.0),
            mock.patch.object(type(run.kvc), "_handle_max_mamba_cache", lambda self, rest: rest),
        ):
            out["rest"] = run.kvc._profile_available_bytes(pre)
        if pools:
            run = se._StageRun(s, server_args, pp_rank=0, device="cuda")
            config = run.kvc._resolve_memory_pool_config(pre_model_load_memory=pre)
            out["max_total_num_tokens"] = config.max_total_num_tokens
            out["max_running_requests"] = config.max_running_requests
            out["max_mamba_cache_size"] = s.rc.get_schedule().max_mamba_cache_size
            out["context_len"] = run.model_config.context_len
    return out


@pytest.mark.parametrize("budget", BUDGETS, ids=str)
def test_the_kv_budget_is_sglangs_to_the_byte(budget: Budget, config_dir: Path) -> None:
    path = _config_path(budget.case.model, config_dir)
    ours = sglang_budget(_model(path, budget.case.dspark), budget.deployment(), budget.weights)
    assert ours.kv_memory_bytes == sglang_profile(budget, path)["rest"]
    # weights + startup + headroom + KV is the GPU, to the float32 rounding of the probes
    assert 0 <= ours.free_bytes < 1 << 20


@pytest.mark.parametrize("budget", [b for b in BUDGETS if b.case.pp == 1], ids=str)
def test_sglangs_pools_of_that_budget_are_the_plans(budget: Budget, config_dir: Path) -> None:
    path = _config_path(budget.case.model, config_dir)
    model = _model(path, budget.case.dspark)
    deployment = budget.deployment()
    kv = sglang_budget(model, deployment, budget.weights).kv_memory_bytes
    result = plan(model, deployment)
    assert isinstance(result, SglangPlan)
    sglang = sglang_profile(budget, path, pools=True)
    capacity = result.capacity(kv, sglang["context_len"])
    assert (
        capacity.max_total_num_tokens,
        capacity.max_mamba_cache_size,
        capacity.max_running_requests,
    ) == (
        sglang["max_total_num_tokens"],
        sglang["max_mamba_cache_size"],
        sglang["max_running_requests"],
    )


@pytest.mark.parametrize("budget", BUDGETS[:6] + BUDGETS[10:12], ids=str)
def test_the_least_fraction_is_the_least_thousandth_at_which_sglang_holds_the_kv(
    budget: Budget, config_dir: Path
) -> None:
    path = _config_path(budget.case.model, config_dir)
    model = _model(path, budget.case.dspark)
    deployment = budget.deployment()
    wanted = sglang_budget(model, deployment, budget.weights).kv_memory_bytes * 2 // 3
    least = sglang_least(model, deployment, budget.weights, wanted)
    fraction = float(least.memory_flag[1])
    assert sglang_profile(budget, path, fraction)["rest"] == least.kv_memory_bytes >= wanted
    below = round(fraction - 0.001, 3)
    assert sglang_profile(budget, path, below)["rest"] < wanted
