"""The vLLM startup check (``k3layout.engines.vllm.plugin``) run the way vLLM 0.33 runs it:
vLLM's own ``WorkerWrapperBase.initialize_from_config``, wrapped by ``register()``, hands the
rank's ``KVCacheConfig`` to a worker that allocates and binds the cache with vLLM's code
(``vllm_engine.bind`` then ``bind_kv_cache_to_layers``, on ``meta``). The check logs one line
when the bound cache is the plan's, stops startup with the planner's message when it is not,
and leaves vLLM untouched without ``K3LAYOUT_CHECK=1``."""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from vllm_required import require_vllm

require_vllm()

import torch  # noqa: E402
import vllm.plugins  # noqa: E402
from vllm.distributed import parallel_state  # noqa: E402
from vllm.v1.worker.utils import bind_kv_cache_to_layers  # noqa: E402
from vllm.v1.worker.worker_base import WorkerWrapperBase  # noqa: E402
from vllm_engine import Case, Engine, bind, start  # noqa: E402

from k3layout import Refusal  # noqa: E402
from k3layout.engines.vllm import check_kv_caches  # noqa: E402
from k3layout.engines.vllm.plugin import SWITCH, register  # noqa: E402

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
Caches = dict[str, torch.Tensor]
SWAPPED = ("language_model.model.layers.0.self_attn", "language_model.model.layers.4.self_attn")
"""Two KDA layers of K3's first group: positions 0 and 1, so planes 0 and 1."""


@dataclass
class Worker:
    """What vLLM's worker does in ``initialize_from_config``, reduced to the KV cache: allocate
    one backing, view it per layer, and bind each view to its layer through the layer API, as
    both model runners do; ``corrupt`` changes the views before they are bound."""

    engine: Engine
    stage: int
    corrupt: Callable[[Caches], Caches] = lambda caches: caches
    bound: Caches | None = None

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        assert kv_cache_config is self.engine.kv_cache_configs[self.stage]
        self.bound = self.corrupt(bind(self.engine, self.stage))
        layers = self.engine.workers[self.stage].compilation_config.static_forward_context
        bind_kv_cache_to_layers(self.bound, layers)


class Lines(logging.Handler):
    """The messages logged to the plugin's logger (vLLM stops propagation at ``vllm``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


@pytest.fixture
def lines() -> Iterator[list[tuple[int, str]]]:
    log = logging.getLogger("vllm.k3layout")
    handler, level = Lines(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


@pytest.fixture(autouse=True)
def restore_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever ``register()`` wraps is put back after each test."""
    original = WorkerWrapperBase.initialize_from_config
    monkeypatch.setattr(WorkerWrapperBase, "initialize_from_config", original)


def start_up(engine: Engine, stage: int, worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's ``collective_rpc("initialize_from_config", ...)`` on the worker of the first
    attention-TP rank of ``stage``, its pipeline group set up as the worker sets it up."""
    if engine.case.pp > 1:
        group = SimpleNamespace(rank_in_group=stage, world_size=engine.case.pp)
        monkeypatch.setattr(parallel_state, "_PP", group)
        monkeypatch.setattr(parallel_state, "_TP", SimpleNamespace(rank_in_group=0))
    tp = engine.case.attn_tp
    per_rank = [config for config in engine.kv_cache_configs for _ in range(tp)]
    wrapper = WorkerWrapperBase(rpc_rank=0, global_rank=stage * tp)
    wrapper.vllm_config = engine.workers[stage]
    wrapper.worker = worker
    wrapper.initialize_from_config(per_rank)


def swapped(caches: Caches) -> Caches:
    corrupted = dict(caches)
    first, second = SWAPPED
    corrupted[first], corrupted[second] = caches[second], caches[first]
    return corrupted


CASES = [
    Case(attn_tp=8),
    Case(attn_tp=8, pp=2),
    Case(attn_tp=8, drafter="dspark", spec_tokens=2),
    Case(attn_tp=8, backend="TRITON_MLA", kv_cache_layout="BLHNC"),
    Case("kimi-linear", attn_tp=4, max_model_len=4096),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_cache_that_matches_the_plan_logs_one_line_per_worker(
    case: Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lines: list[tuple[int, str]],
) -> None:
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", case.kv_cache_layout)
    monkeypatch.setenv(SWITCH, "1")
    register()
    engine = start(case, tmp_path)
    for stage in range(case.pp):
        lines.clear()
        worker = Worker(engine, stage)
        start_up(engine, stage, worker, monkeypatch)
        assert worker.bound is not None
        result = check_kv_caches(
            engine.workers[stage], engine.kv_cache_configs[stage], worker.bound, stage
        )
        blocks = engine.kv_cache_configs[stage].num_blocks
        planes = result.stage(stage).num_planes
        assert lines == [
            (
                logging.INFO,
                f"k3layout: KV cache of {result.model.name} stage {stage} matches the plan "
                f"({blocks} blocks, page {result.page_bytes} B, {planes} planes)",
            )
        ]
        # The layers were bound by vLLM's code, and the recorders are gone from them.
        for name, layer in engine.workers[stage].compilation_config.static_forward_context.items():
            assert "bind_kv_cache" not in vars(layer), name
            assert layer.kv_cache is not None and len(layer.kv_cache) > 0, name


def test_a_corrupted_cache_stops_startup_with_the_planners_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[tuple[int, str]]
) -> None:
    monkeypatch.setenv(SWITCH, "1")
    register()
    engine = start(Case(attn_tp=8), tmp_path)
    worker = Worker(engine, 0, corrupt=swapped)
    with pytest.raises(Refusal) as stopped:
        start_up(engine, 0, worker, monkeypatch)
    assert worker.bound is not None
    with pytest.raises(Refusal) as planner:
        check_kv_caches(engine.workers[0], engine.kv_cache_configs[0], worker.bound)
    assert str(stopped.value) == str(planner.value)
    assert stopped.value.code == planner.value.code
    assert stopped.value.facts == planner.value.facts
    assert lines == [
        (
            logging.ERROR,
            f"k3layout: refused the KV cache of stage 0; stopping startup "
            f"({SWITCH}=1): {planner.value}",
        )
    ]
    layers = engine.workers[0].compilation_config.static_forward_context
    assert not any("bind_kv_cache" in vars(layer) for layer in layers.values())


def test_a_corrupted_kv_cache_config_stops_startup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SWITCH, "1")
    register()
    engine = start(Case(attn_tp=8), tmp_path)
    names = engine.kv_cache_configs[0].kv_cache_groups[3].layer_names
    names[0], names[1] = names[1], names[0]
    with pytest.raises(Refusal) as stopped:
        start_up(engine, 0, Worker(engine, 0), monkeypatch)
    assert stopped.value.code == "plan_mismatch" and "group 3" in str(stopped.value)


@pytest.mark.parametrize("value", [None, "0", "true", ""])
def test_without_the_switch_vllm_is_left_alone(
    value: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lines: list[tuple[int, str]],
) -> None:
    if value is None:
        monkeypatch.delenv(SWITCH, raising=False)
    else:
        monkeypatch.setenv(SWITCH, value)
    original = WorkerWrapperBase.initialize_from_config
    register()
    assert WorkerWrapperBase.initialize_from_config is original
    engine = start(Case(attn_tp=8), tmp_path)
    start_up(engine, 0, Worker(engine, 0, corrupt=swapped), monkeypatch)  # not checked
    assert lines == []


def test_registering_twice_wraps_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[tuple[int, str]]
) -> None:
    monkeypatch.setenv(SWITCH, "1")
    original = WorkerWrapperBase.initialize_from_config
    register()
    wrapped = WorkerWrapperBase.initialize_from_config
    register()
    assert WorkerWrapperBase.initialize_from_config is wrapped is not original
    assert wrapped.__wrapped__ is original
    engine = start(Case(attn_tp=8), tmp_path)
    start_up(engine, 0, Worker(engine, 0), monkeypatch)
    assert len(lines) == 1 and "matches the plan" in lines[0][1]


def test_vllm_loads_the_plugin_from_the_declared_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[tuple[int, str]]
) -> None:
    """vLLM's ``load_general_plugins`` finds the entry point pyproject.toml declares (read
    from the file: an editable install's metadata lags it), loads and runs it; run again (a
    later load in the same process), the check still runs once."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    group = "vllm.general_plugins"
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"][group]
    assert declared == {"k3layout": "k3layout.engines.vllm:register"}
    points = importlib.metadata.EntryPoints(
        importlib.metadata.EntryPoint(name, value, group) for name, value in declared.items()
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **_: points)
    monkeypatch.setenv(SWITCH, "1")
    original = WorkerWrapperBase.initialize_from_config
    for _ in range(2):
        monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
        vllm.plugins.load_general_plugins()
    wrapped = WorkerWrapperBase.initialize_from_config
    assert wrapped is not original and wrapped.__wrapped__ is original
    engine = start(Case(attn_tp=8), tmp_path)
    start_up(engine, 0, Worker(engine, 0), monkeypatch)
    assert len(lines) == 1 and "matches the plan" in lines[0][1]
