"""LMCache 0.5.6's own vLLM connector planning, run on vLLM's live worker objects, as plain dicts.

Issue 33's reference harness (research; nothing here is collected by pytest). It takes the
objects the vLLM conformance harnesses build on CPU (``vllm_engine.start`` for Kimi-K3 and
Kimi-Linear, ``vllm_glm.plan_glm(objects=True)`` for GLM-5.3-Flash) and runs LMCache's own code
on them, as ``LMCacheMPConnector`` (``lmcache/integration/vllm/lmcache_mp_connector.py``) and
the MP server (``lmcache/v1/multiprocess/``) run it:

* the tensors a worker's connector gets in ``register_kv_caches`` (vLLM's
  ``allocate_kv_cache``: both model runners hand the connector its output, before
  ``map_kv_caches_to_kernel_blocks``), then LMCache's ``apply_kv_cache_group_edits`` and
  ``create_engine_group_infos_from_vllm`` (what ``register_kv_caches`` does), its format
  detection (``normalize_and_discover_per_layer_formats``) and the server's
  ``KVLayerGroupsManager`` (kernel and object groups, the per-chunk shapes);
* the connector's start-up checks, by constructing ``LMCacheMPConnector`` in the scheduler role
  (``validate_mamba_step_alignment``, ``validate_kv_cache_groups``, ``validate_dcp_support``,
  the server and PP/DP checks, the adapter's chunk-size check). The only thing the scheduler
  asks the server at start-up is its chunk size (``get_lmcache_chunk_size``); without
  ``server_url`` that one answer is given here, with it a running ``lmcache server`` gives it;
* each rank's share (``ParallelStrategy``: MLA-only dedup, writers, readers) and the bytes of
  one chunk's memory object (``get_layout_desc``, the server's ``reserve_write`` layout) per
  rank and per server.

Every number comes out of LMCache's or vLLM's functions; nothing of either is copied. LMCache
is imported lazily (``importlib``) so that this module imports, and type-checks, in
environments without it; ``lmcache_available()`` says whether it is there.

Environment: ``.venv-vllm-lmcache`` (tests/fixtures/lmcache-0.5.6-notes.md has the recipe:
``lmcache==0.5.6 --no-deps`` plus tests/conformance/lmcache-no-deps.txt and
lmcache-deps.txt beside vLLM 0.33.0).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

LMCACHE_VERSION = "0.5.6"
QUIET = {"LMCACHE_DISABLE_BANNER": "1", "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"}
"""LMCache's banner off, and its usage telemetry (``usage_telemetry/identity.py``) off."""


def lmcache_available() -> bool:
    """Whether LMCache (and its connector's imports) can be imported here."""
    return importlib.util.find_spec("lmcache") is not None


def _lm(module: str) -> Any:
    """``lmcache.<module>``, imported with LMCache's telemetry off."""
    for name, value in QUIET.items():
        os.environ.setdefault(name, value)
    return importlib.import_module(f"lmcache.{module}")


@dataclass
class Deployment:
    """What LMCache's connector sees of one vLLM deployment: the engine core's config, each
    pipeline stage's worker config and ``KVCacheConfig``, and ``caches(stage)``: the tensors a
    worker of that stage hands ``register_kv_caches`` (on ``meta`` unless said otherwise)."""

    name: str
    config: Any
    workers: list[Any]
    kv_cache_configs: list[Any]
    caches: Callable[[int], dict[str, torch.Tensor]]

    @property
    def pp(self) -> int:
        return len(self.kv_cache_configs)


def connector_caches(engine: Any, stage: int = 0, device: str = "meta") -> dict[str, Any]:
    """What a worker of ``stage`` of a ``vllm_engine.Engine`` hands its KV connector:
    ``allocate_kv_cache``'s views (``gpu_model_runner.initialize_kv_cache_tensors`` and the V2
    runner's ``init_kv_cache`` both pass these, not the kernel-block views the layers bind)."""
    import vllm_engine  # noqa: PLC0415 - a sibling harness, imported as the tests import it

    caches, _, _ = vllm_engine.allocated(engine, stage, device)
    return caches


def from_engine(engine: Any, device: str = "meta") -> Deployment:
    """A :class:`Deployment` of a ``vllm_engine.Engine`` (Kimi-K3, Kimi-Linear)."""
    return Deployment(
        name=str(engine.case),
        config=engine.config,
        workers=engine.workers,
        kv_cache_configs=engine.kv_cache_configs,
        caches=lambda stage: connector_caches(engine, stage, device),
    )


def from_glm(**plan_glm_kwargs: Any) -> Deployment | dict[str, Any]:
    """A :class:`Deployment` of GLM-5.3-Flash from ``vllm_glm.plan_glm`` (its arguments), the
    connector's tensors from the V2 runner's ``init_kv_cache`` as ``vllm_glm_nixl`` takes
    them; or plan_glm's refusal dict."""
    import vllm_glm  # noqa: PLC0415 - a sibling harness, imported as the tests import it
    import vllm_glm_nixl  # noqa: PLC0415

    plan = vllm_glm.plan_glm(**{**plan_glm_kwargs, "objects": True})
    if "refused" in plan or "unsupported" in plan:
        return dict(plan)
    objects = plan.pop("objects")
    return Deployment(
        name="glm-5.3-flash " + " ".join(f"{k}={v}" for k, v in sorted(plan_glm_kwargs.items())),
        config=objects["config"],
        workers=objects["workers"],
        kv_cache_configs=objects["kv_cache_configs"],
        caches=lambda stage: vllm_glm_nixl._views(plan, objects, stage),
    )


def _dcp(config: Any) -> int:
    return int(getattr(config.parallel_config, "decode_context_parallel_size", 1))


def scheduler_kv_cache_config(deployment: Deployment) -> Any:
    """The ``KVCacheConfig`` the engine core's scheduler (and its connector) gets."""
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config  # noqa: PLC0415

    return generate_scheduler_kv_cache_config(deployment.kv_cache_configs)


def _registration(deployment: Deployment, stage: int) -> tuple[Any, dict[str, Any], Any]:
    """``register_kv_caches``' first steps on a worker of ``stage``: layout hints, the group
    edits, the engine group infos."""
    kv_cache_groups = _lm("integration.vllm.kv_cache_groups")
    edits = _lm("integration.vllm.kv_cache_group_edits")
    utils = _lm("integration.vllm.utils")
    config = deployment.kv_cache_configs[stage]
    hints = utils.vllm_layout_hints(deployment.workers[stage])
    caches = edits.apply_kv_cache_group_edits(config, deployment.caches(stage), layout_hints=hints)
    infos = kv_cache_groups.create_engine_group_infos_from_vllm(
        config, caches, layout_hints=hints, dcp_size=_dcp(deployment.config)
    )
    return hints, caches, infos


def _manager(
    caches: dict[str, Any], hints: Any, infos: Any, chunk_size: int, separate: bool
) -> Any:
    """The server's ``KVLayerGroupsManager`` for a registration (as ``CPUCacheContext`` and
    ``GPUCacheContext`` build it); raises the server's chunk-size refusal."""
    gpu_utils = _lm("v1.gpu_connector.utils")
    group_view = _lm("v1.multiprocess.group_view")
    groups = _lm("v1.kv_layer_groups")
    engine_type = _lm("utils").EngineType.VLLM
    normalized, formats = gpu_utils.normalize_and_discover_per_layer_formats(
        list(caches.values()), group_view.engine_group_layer_indices(infos), engine_type, hints
    )
    return groups.KVLayerGroupsManager(
        list(normalized),
        engine_kv_formats=formats,
        engine_group_infos=infos,
        lmcache_tokens_per_chunk=chunk_size,
        separate_object_groups=separate,
    )


def _shapes(manager: Any, chunk_size: int) -> Any:
    """An object with what LMCache's layout functions read of a cache context (its kernel
    groups, chunk size), whose shape methods are ``CPUCacheContext``'s own: the per-chunk
    layout without the KV cache in shared memory."""
    base = _lm("v1.platform.base.cache_context").BaseCacheContext
    cpu = _lm("v1.platform.devices.cpu.cache_context").CPUCacheContext
    shim = type(
        "LayoutOnly",
        (),
        {
            "get_kernel_group_shape_dtype": cpu.get_kernel_group_shape_dtype,
            "cache_size_per_token": cpu.cache_size_per_token,
            "get_kv_buffer_shape": base.get_kv_buffer_shape,
        },
    )()
    shim.kv_layer_groups_manager_ = manager
    shim.kv_layer_groups_manager = manager
    shim.lmcache_tokens_per_chunk = chunk_size
    return shim


def groups(deployment: Deployment, stage: int = 0) -> dict[str, Any]:
    """LMCache's object groups for a worker of ``stage``: one entry per ``EngineGroupInfo``
    (protocol order) with vLLM's layer names, whether it holds recurrent state, its window
    (``sw_size_tokens``; -1 none), ``tokens_per_block`` (DCP-scaled for attention) and what
    LMCache's format detection made of its tensors."""
    hints, caches, infos = _registration(deployment, stage)
    gpu_utils = _lm("v1.gpu_connector.utils")
    group_view = _lm("v1.multiprocess.group_view")
    native = _lm("lmcache_native")
    engine_type = _lm("utils").EngineType.VLLM
    names = list(caches)
    normalized, formats = gpu_utils.normalize_and_discover_per_layer_formats(
        list(caches.values()), group_view.engine_group_layer_indices(infos), engine_type, hints
    )
    entries = []
    for info in infos:
        first = info.layer_indices[0]
        fmt = formats[first]
        entries.append(
            {
                "engine_group_id": info.engine_group_id,
                "layers": [names[i] for i in info.layer_indices],
                "num_layers": len(info.layer_indices),
                "recurrent": bool(info.recurrent_state),
                "window": int(info.sw_size_tokens),
                "tokens_per_block": int(info.tokens_per_block),
                "kv_format": fmt.name,
                "mla": bool(native.is_mla(fmt)),
                "tensor_shape": list(normalized[first].shape),
                "tensor_dtype": str(normalized[first].dtype),
                "vllm_spec": type(
                    deployment.kv_cache_configs[stage]
                    .kv_cache_groups[info.engine_group_id]
                    .kv_cache_spec
                ).__name__,
            }
        )
    return {"layout_hints": dict(hints), "num_registered": len(names), "groups": entries}


def geometry(deployment: Deployment) -> dict[str, Any]:
    """The connector's scheduler-side geometry: each vLLM group's ``tokens_per_block``
    (``get_group_tokens_per_block``, 0 for scratch groups), the scheduler block
    (``get_vllm_scheduler_block_size``: their LCM, the smallest chunk the adapter accepts), the
    cache model name (DCP interleave decoration) and whether LMCache treats it as MLA-only."""
    connector = _lm("integration.vllm.lmcache_mp_connector")
    utils = _lm("integration.vllm.utils")
    config = copy.deepcopy(deployment.config)
    kv_cache_config = scheduler_kv_cache_config(deployment)
    spans = [int(s) for s in connector.get_group_tokens_per_block(config, kv_cache_config)]
    block = int(connector.get_vllm_scheduler_block_size(config, kv_cache_config))
    return {
        "group_tokens_per_block": spans,
        "scheduler_block_size": block,
        "hit_alignment_tokens": math.lcm(*[s for s in spans if s > 0]),
        "smallest_chunk_size": block,
        "cache_model_name": connector.get_dcp_decorated_model_name(config, kv_cache_config),
        "mla_only": bool(utils.mla_only(config.model_config)),
        "is_hybrid": bool(getattr(config.model_config, "is_hybrid", False)),
        "max_num_batched_tokens": int(config.scheduler_config.max_num_batched_tokens),
        "mamba_cache_mode": str(getattr(config.cache_config, "mamba_cache_mode", "none")),
    }


@contextmanager
def _chunk_size_answer(chunk_size: int) -> Iterator[None]:
    """The server's one start-up answer to the scheduler (``GET_CHUNK_SIZE``) given here."""
    adapter = _lm("integration.vllm.vllm_multi_process_adapter")
    original = adapter.get_lmcache_chunk_size
    adapter.get_lmcache_chunk_size = lambda *_args, **_kwargs: chunk_size
    try:
        yield
    finally:
        adapter.get_lmcache_chunk_size = original


def startup(
    deployment: Deployment,
    chunk_size: int = 256,
    *,
    n_servers: int = 1,
    server_url: str | None = None,
    max_num_batched_tokens: int | None = None,
    parallel: dict[str, int] | None = None,
    extra_config: dict[str, Any] | None = None,
    mq_timeout: float = 20.0,
) -> dict[str, Any]:
    """``LMCacheMPConnector.__init__`` in the scheduler role, as vLLM's engine core builds it
    (``--kv-transfer-config '{"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
    ...}'``), with ``--max-num-batched-tokens`` and ``ParallelConfig`` fields (``parallel``:
    e.g. ``prefill_context_parallel_size``, ``cp_kv_cache_interleave_size``) overridden.

    ``n_servers`` servers are named in ``lmcache.mp.server_urls`` (``server_url`` the real
    one, repeated; without it the chunk size is answered here). Returns ``{"accepted": True}``
    or ``{"accepted": False, "error": type, "refusal": LMCache's text}``."""
    from vllm.config import KVTransferConfig  # noqa: PLC0415
    from vllm.config.vllm import set_current_vllm_config  # noqa: PLC0415
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: PLC0415
        KVConnectorRole,
    )

    connector_module = _lm("integration.vllm.lmcache_mp_connector")
    config = copy.deepcopy(deployment.config)
    if max_num_batched_tokens is not None:
        config.scheduler_config.max_num_batched_tokens = max_num_batched_tokens
    for name, value in (parallel or {}).items():
        setattr(config.parallel_config, name, value)
    url = server_url or "tcp://127.0.0.1:1"  # never dialled without a server: answered here
    extra = {
        "lmcache.mp.server_urls": ",".join([url] * n_servers) if n_servers > 1 else url,
        "lmcache.mp.mq_timeout": mq_timeout,
        **(extra_config or {}),
    }
    config.kv_transfer_config = KVTransferConfig(
        kv_connector="LMCacheMPConnector", kv_role="kv_both", kv_connector_extra_config=extra
    )
    from vllm_engine import _environment  # noqa: PLC0415 - a sibling harness

    kv_cache_config = scheduler_kv_cache_config(deployment)
    answer = _chunk_size_answer(chunk_size) if server_url is None else _nothing()
    connector = None
    try:
        with _environment(**QUIET), answer, set_current_vllm_config(config):
            connector = connector_module.LMCacheMPConnector(
                config, KVConnectorRole.SCHEDULER, kv_cache_config
            )
        chunk_size_used = int(connector.scheduler_adapter.lmcache_tokens_per_chunk)
        return {"accepted": True, "chunk_size": chunk_size_used}
    except (ValueError, AssertionError, ConnectionError) as error:
        return {"accepted": False, "error": type(error).__name__, "refusal": str(error)}
    finally:
        if connector is not None:
            connector.shutdown()


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def chunk(
    deployment: Deployment,
    chunk_size: int,
    stage: int = 0,
    *,
    separate_object_groups: bool = False,
) -> dict[str, Any]:
    """What the server makes of a worker of ``stage`` registering at ``chunk_size``:
    ``KVLayerGroupsManager``'s check (``{"accepted": False, "refusal"}``), else each kernel
    group's bytes in one chunk's memory object (``CPUCacheContext.get_kernel_group_shape_dtype``)
    and each object group's memory object (``get_layout_desc``: what ``reserve_write``
    reserves per chunk and rank), and ``cache_size_per_token``."""
    transfer = _lm("v1.multiprocess.modules.lmcache_driven_transfer")
    hints, caches, infos = _registration(deployment, stage)
    try:
        manager = _manager(caches, hints, infos, chunk_size, separate_object_groups)
    except ValueError as error:
        return {"chunk_size": chunk_size, "accepted": False, "refusal": str(error)}
    shim = _shapes(manager, chunk_size)
    kernel_groups = []
    for index, group in enumerate(manager.kernel_groups):
        shape, dtype = shim.get_kernel_group_shape_dtype(chunk_size, index)
        sd = group.shape_desc
        kernel_groups.append(
            {
                "engine_group_id": int(group.engine_group_idx),
                "num_layers": group.num_layers,
                "recurrent": bool(group.recurrent_state),
                "window": int(group.sw_size_tokens),
                "tokens_per_block": int(group.tokens_per_block),
                "slots_per_block": int(group.slots_per_block),
                "kv_format": group.engine_kv_format.name,
                "shape_desc": {
                    "kv_size": sd.kv_size,
                    "num_blocks": sd.nb,
                    "block_size": sd.bs,
                    "num_heads": sd.nh,
                    "head_size": sd.hs,
                    "element_size": sd.element_size,
                },
                "chunk_shape": list(shape),
                "dtype": str(dtype),
                "bytes_per_chunk": int(shape.numel() * dtype.itemsize),
                "subchunk_window_tokens": int(manager.get_subchunk_sw_size_tokens(index)),
            }
        )
    object_groups = []
    for index, og in enumerate(manager.object_groups):
        layout = transfer.get_layout_desc(shim, chunk_size, index)
        object_groups.append(
            {
                "kernel_groups": list(og.kernel_group_indices),
                "recurrent": bool(og.recurrent),
                "window_chunks": int(og.sw_size_chunks),
                "bytes_per_chunk": int(
                    sum(
                        math.prod(shape) * dtype.itemsize
                        for shape, dtype in zip(layout.shapes, layout.dtypes, strict=True)
                    )
                ),
            }
        )
    return {
        "chunk_size": chunk_size,
        "accepted": True,
        "separate_object_groups": separate_object_groups,
        "kernel_groups": kernel_groups,
        "object_groups": object_groups,
        "bytes_per_chunk": sum(og["bytes_per_chunk"] for og in object_groups),
        "cache_size_per_token": int(shim.cache_size_per_token()),
    }


def ranks(
    deployment: Deployment, n_servers: int = 1, *, mla_only: bool | None = None
) -> list[dict[str, Any]]:
    """Each global rank's ``ParallelStrategy`` (``build_parallel_strategy_from_vllm_config``
    with the rank set): its piece of a chunk, whether it writes, how many read one object.
    ``mla_only`` overrides LMCache's verdict (``mla_only(model_config)``), to show the pure-MLA
    dedup rule on a deployment that is not pure MLA; ``None`` keeps LMCache's."""
    connector = _lm("integration.vllm.lmcache_mp_connector")
    base = connector.build_parallel_strategy_from_vllm_config(deployment.config, n_servers)
    if mla_only is not None:
        base = replace(base, mla_only=mla_only)
    entries = []
    for rank in range(base.vllm_world_size):
        strategy = replace(base, vllm_worker_id=rank)
        entries.append(
            {
                "rank": rank,
                "stage": rank // base.tp_size,
                "server": rank // strategy.ranks_per_server,
                "kv_world_size": strategy.kv_world_size,
                "kv_worker_id": strategy.kv_worker_id,
                "is_kv_writer": bool(strategy.is_kv_writer),
                "num_kv_readers": strategy.num_kv_readers,
                "mla_only": bool(strategy.mla_only),
            }
        )
    return entries


def server_bytes(
    deployment: Deployment,
    chunk_size: int,
    n_servers: int = 1,
    *,
    separate_object_groups: bool = False,
) -> dict[str, Any]:
    """Bytes one cached chunk costs on each server: the memory objects its writer ranks store
    (one per object group per chunk; a rank's object from :func:`chunk` of its stage), and per
    cached token. Chunks whose blocks are all null in an object group are not stored
    (``all_null_chunk_masks``), which only matters with ``separate_object_groups``."""
    world = deployment.config.parallel_config.world_size
    if world % n_servers:  # the connector's own start-up assertion, run
        return startup(deployment, chunk_size, n_servers=n_servers)
    per_stage = [
        chunk(deployment, chunk_size, stage, separate_object_groups=separate_object_groups)
        for stage in range(deployment.pp)
    ]
    if not all(entry["accepted"] for entry in per_stage):
        refused = next(entry for entry in per_stage if not entry["accepted"])
        return {"accepted": False, "refusal": refused["refusal"]}
    servers = [0] * n_servers
    writers = [0] * n_servers
    for entry in ranks(deployment, n_servers):
        if entry["is_kv_writer"]:
            servers[entry["server"]] += per_stage[entry["stage"]]["bytes_per_chunk"]
            writers[entry["server"]] += 1
    return {
        "accepted": True,
        "chunk_size": chunk_size,
        "per_stage_rank_bytes_per_chunk": [entry["bytes_per_chunk"] for entry in per_stage],
        "writers_per_server": writers,
        "bytes_per_chunk_per_server": servers,
        "bytes_per_token_per_server": [value / chunk_size for value in servers],
    }


def plan(
    deployment: Deployment,
    chunk_sizes: tuple[int, ...] = (256,),
    n_servers: int = 1,
) -> dict[str, Any]:
    """Everything above for one deployment: groups of every stage, the geometry, and for
    each chunk size (plus the smallest accepted) the start-up verdict, the server's
    registration check, the bytes per rank and per server."""
    shape = geometry(deployment)
    sizes = sorted({*chunk_sizes, shape["smallest_chunk_size"]})
    return {
        "deployment": deployment.name,
        "lmcache": LMCACHE_VERSION,
        **shape,
        "stages": [groups(deployment, stage) for stage in range(deployment.pp)],
        "ranks": ranks(deployment, n_servers),
        "chunks": {
            size: {
                "startup": startup(deployment, size, n_servers=n_servers),
                "server": server_bytes(deployment, size, n_servers),
            }
            for size in sizes
        },
    }


def summary(result: dict[str, Any]) -> str:
    """One line per group of stage 0 and one per chunk size, for notes."""
    lines = [
        f"{result['deployment']}: tokens_per_block {result['group_tokens_per_block']}, "
        f"smallest chunk {result['smallest_chunk_size']}, mla_only {result['mla_only']}"
    ]
    for stage, entry in enumerate(result["stages"]):
        for group in entry["groups"]:
            lines.append(
                f"  stage {stage} group {group['engine_group_id']}: {group['num_layers']} layers"
                f" {'recurrent' if group['recurrent'] else 'attention'} window"
                f" {group['window']} tpb {group['tokens_per_block']} {group['kv_format']}"
            )
    for size, entry in result["chunks"].items():
        start = entry["startup"]
        verdict = "accepted" if start["accepted"] else f"REFUSED: {start['refusal']}"
        server = entry["server"]
        per_token = (
            f", {server['bytes_per_token_per_server']} B/token/server"
            if server.get("accepted")
            else ""
        )
        lines.append(f"  chunk {size}: {verdict}{per_token}")
    return "\n".join(lines)


GRID: dict[str, dict[str, Any]] = {
    "kimi-k3 tp8 fp8": {"attn_tp": 8},
    "kimi-k3 tp8 bf16": {"attn_tp": 8, "kv_dtype": "bf16"},
    "kimi-k3 tp8 dcp8 fp8": {"attn_tp": 8, "dcp": 8},
    "kimi-k3 tp8 pp2 fp8": {"attn_tp": 8, "pp": 2},
    "kimi-k3 tp8 dspark s2 fp8": {"attn_tp": 8, "drafter": "dspark", "spec_tokens": 2},
    "kimi-k3 tp1 fp8": {"attn_tp": 1},
    "kimi-linear tp1 bf16": {
        "model": "kimi-linear",
        "attn_tp": 1,
        "kv_dtype": "bf16",
        "max_model_len": 4096,
    },
    "kimi-linear tp8 bf16": {
        "model": "kimi-linear",
        "attn_tp": 8,
        "kv_dtype": "bf16",
        "max_model_len": 4096,
    },
    "kimi-linear tp8 fp8": {"model": "kimi-linear", "attn_tp": 8, "max_model_len": 4096},
}
"""The deployments the notes record (``vllm_engine.Case`` fields); GLM-5.3-Flash is
:func:`from_glm` ``(tp=8)`` and ``(tp=1)``."""


def record(tmp: Path, chunk_sizes: tuple[int, ...] = (256,)) -> dict[str, Any]:
    """:func:`plan` of every :data:`GRID` deployment (``vllm_engine.start`` in ``tmp``)."""
    import vllm_engine  # noqa: PLC0415 - a sibling harness, imported as the tests import it

    return {
        name: plan(from_engine(vllm_engine.start(vllm_engine.Case(**fields), tmp)), chunk_sizes)
        for name, fields in GRID.items()
    }
