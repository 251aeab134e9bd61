"""vLLM 0.33's NIXL connector (its pull connector, ``NixlConnector``) run on CPU: each side's
worker start-up and the decode's handshake with every prefill rank it reads from.

For one prefill deployment and one decode deployment of a model, :func:`nixl_outcome` starts
vLLM's KV cache on both sides (``vllm_engine.start``: vLLM's own config, layers, specs and
``KVCacheConfig``), builds vLLM's ``NixlPullConnectorWorker`` for each side's rank
(``__init__``), registers the caches vLLM binds (``register_kv_caches``), and on every decode
rank runs what ``_nixl_handshake`` runs for each prefill rank it targets
(``TransferTopology.handshake_target_ranks``, ``_validate_remote_parallel_config``,
``add_remote_agent``, which validates the handshake and computes the TP mapping). The first
exception vLLM raises is the outcome; otherwise every decode rank's source ranks per KV-cache
group.

Stand-ins, and nothing else: the ``nixl`` package is not installed, so ``NixlWrapper`` (the
NIXL agent: memory registration, descriptor lists, remote agents) is a recorder that returns
handles; the platform is a CUDA one (``device_type`` and NIXL memory type; the CPU platform
would pin this process's cores); the TP process group's rank and size are the worker's; the
ZMQ socket of the handshake is skipped, the prefill's ``NixlHandshakePayload`` is decoded from
its bytes as the handshake decodes it. Every decision is vLLM's code.

A conformance harness: it imports vLLM, torch, msgspec and its sibling ``vllm_engine``; never
``k3layout``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import vllm_engine
from vllm.config import KVTransferConfig
from vllm.config.vllm import set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlAgentMetadata,
    NixlHandshakePayload,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)
from vllm.model_executor.layers.mamba import mamba_utils
from vllm.v1.kv_cache_interface import MambaSpec

MAX_MODEL_LEN = 2048
"""Each side's ``--max-model-len``: small, so a small KV budget starts the engine."""
FIRST_BUDGET = 64 << 20
"""The first KV budget per rank tried (doubled until vLLM starts): the caches are real CPU
tensors, whose addresses NIXL registers."""


class FakeNixlWrapper:
    """The NIXL agent: records what vLLM registers and returns handles."""

    def __init__(self, name: str, config: Any = None) -> None:
        self.name = name
        self.handles = itertools.count(1)

    def get_reg_descs(self, ranges: Any, mem_type: str) -> Any:
        return (mem_type, list(ranges))

    def register_memory(self, descs: Any, backends: Any = None) -> None:
        return None

    def get_agent_metadata(self) -> bytes:
        return self.name.encode()

    def add_remote_agent(self, metadata: bytes) -> str:
        return f"remote:{metadata.decode()}"

    def prep_xfer_dlist(self, agent: str, data: Any, mem_type: str | None = None) -> int:
        return next(self.handles)

    def create_backend(self, *args: Any, **kwargs: Any) -> None:
        return None

    # the worker's shutdown (its finaliser) hands everything back
    def release_dlist_handle(self, handle: Any) -> None:
        return None

    def release_xfer_handle(self, handle: Any) -> None:
        return None

    def deregister_memory(self, descs: Any) -> None:
        return None

    def remove_remote_agent(self, agent: str) -> None:
        return None


@contextlib.contextmanager
def _environment(conv_layout: str) -> Iterator[None]:
    """``VLLM_SSM_CONV_STATE_LAYOUT`` for the block (vLLM caches its reading: cleared)."""
    saved = os.environ.get("VLLM_SSM_CONV_STATE_LAYOUT")
    os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = conv_layout
    mamba_utils.get_conv_state_layout.cache_clear()
    try:
        yield
    finally:
        if saved is None:
            del os.environ["VLLM_SSM_CONV_STATE_LAYOUT"]
        else:
            os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = saved
        mamba_utils.get_conv_state_layout.cache_clear()


@contextlib.contextmanager
def _rank(tp_rank: int, tp_size: int) -> Iterator[None]:
    """The worker's TP rank and size, the NIXL agent and a CUDA platform, as the worker
    module sees them."""
    saved = {
        name: getattr(base_worker, name)
        for name in (
            "NixlWrapper",
            "nixl_agent_config",
            "current_platform",
            "get_tensor_model_parallel_rank",
            "get_tensor_model_parallel_world_size",
        )
    }
    base_worker.NixlWrapper = FakeNixlWrapper
    base_worker.nixl_agent_config = None
    base_worker.current_platform = SimpleNamespace(
        device_type="cuda",
        get_nixl_memory_type=lambda: None,
        set_device=lambda device: None,
    )
    base_worker.get_tensor_model_parallel_rank = lambda: tp_rank
    base_worker.get_tensor_model_parallel_world_size = lambda: tp_size
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(base_worker, name, value)


@dataclass(frozen=True)
class Side:
    """One side of the transfer: the flags of its ``vllm serve``."""

    model: str
    attn_tp: int
    pp: int = 1
    dcp: int = 1
    prefix_caching: bool = True


def _start(side: Side, conv_layout: str, tmp: Path) -> vllm_engine.Engine:
    """vLLM's KV-cache start-up for ``side`` with the smallest budget (doubled from
    ``FIRST_BUDGET``) that holds one request of ``MAX_MODEL_LEN`` tokens."""
    case = vllm_engine.Case(
        model=side.model,
        attn_tp=side.attn_tp,
        pp=side.pp,
        dcp=side.dcp,
        prefix_caching=side.prefix_caching,
        max_model_len=MAX_MODEL_LEN,
        memory_bytes=FIRST_BUDGET,
    )
    with _environment(conv_layout):
        while True:
            try:
                return vllm_engine.start(case, tmp)
            except ValueError as error:
                short = "is needed" in str(error) or "No available memory" in str(error)
                if not short or case.memory_bytes > 16 << 30:
                    raise
                case = replace(case, memory_bytes=case.memory_bytes * 2)


class _Bound:
    """Each started engine's stage-0 caches, bound once on CPU (every rank of a side has
    the same shapes; a rank's worker registers its own copy's addresses)."""

    def __init__(self) -> None:
        self.engines: dict[tuple[Side, str], vllm_engine.Engine] = {}
        self.caches: dict[tuple[Side, str], dict[str, Any]] = {}

    def engine(self, side: Side, conv_layout: str, tmp: Path) -> vllm_engine.Engine:
        key = (side, conv_layout)
        if key not in self.engines:
            self.engines[key] = _start(side, conv_layout, tmp)
        return self.engines[key]

    def bound(self, side: Side, conv_layout: str, tmp: Path) -> dict[str, Any]:
        key = (side, conv_layout)
        if key not in self.caches:
            with _environment(conv_layout):
                self.caches[key] = vllm_engine.bind(
                    self.engine(side, conv_layout, tmp), 0, device="cpu"
                )
        return self.caches[key]


BOUND = _Bound()


def _worker(
    engine: vllm_engine.Engine, tp_rank: int, role: str, engine_id: str
) -> NixlPullConnectorWorker:
    """vLLM's NIXL pull worker of stage 0, TP rank ``tp_rank``."""
    config = engine.workers[0]
    config.kv_transfer_config = KVTransferConfig(
        kv_connector="NixlConnector", kv_role=role, kv_buffer_device="cuda", engine_id=engine_id
    )
    with set_current_vllm_config(config):
        return NixlPullConnectorWorker(config, engine_id, engine.kv_cache_configs[0])


def _failure(error: BaseException, step: str) -> dict[str, Any]:
    """Where vLLM refused: the step, the vLLM function that raised, its exception and text."""
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if f"{os.sep}vllm{os.sep}" in frame.filename
    ]
    return {
        "step": step,
        "check": frames[-1].name if frames else "",
        "error": type(error).__name__,
        "message": str(error),
    }


def nixl_outcome(
    model: str,
    prefill: Side,
    decode: Side,
    *,
    conv_layout: str = "DS",
    tmp: Path,
) -> dict[str, Any]:
    """What vLLM's NIXL connector does with a ``prefill`` -> ``decode`` transfer of ``model``.

    ``{"refused": None | {"step", "check", "error", "message"}, "sources": {decode tp rank:
    {"attention": [...], "state": [...]}}}``: the first refusal (``step`` is
    ``prefill_init``, ``decode_init`` or ``handshake``) or, for every decode rank, the
    prefill TP ranks it reads its attention groups and its state groups from."""
    del model  # named by the sides
    outcome: dict[str, Any] = {"refused": None, "sources": {}}
    sides = (("prefill", prefill, "kv_producer"), ("decode", decode, "kv_consumer"))
    engines = {}
    for name, side, _ in sides:
        engines[name] = BOUND.engine(side, conv_layout, tmp)
    metadata: dict[int, bytes] = {}
    # Each side's start-up: one worker's __init__ refuses what every rank's would.
    for name, side, role in sides:
        with _environment(conv_layout), _rank(0, side.attn_tp):
            try:
                _worker(engines[name], 0, role, name)
            except Exception as error:  # vLLM's refusal is the answer
                outcome["refused"] = _failure(error, f"{name}_init")
                return outcome
    if prefill.pp > 1 or decode.pp > 1:  # a PP start-up that passed: not compared here
        raise NotImplementedError("pipeline start-ups are compared only where vLLM refuses")
    caches = {name: BOUND.bound(side, conv_layout, tmp) for name, side, _ in sides}
    with _environment(conv_layout):
        for tp_rank in range(prefill.attn_tp):
            with _rank(tp_rank, prefill.attn_tp):
                worker = _worker(engines["prefill"], tp_rank, "kv_producer", "prefill")
                worker.register_kv_caches(caches["prefill"])
                metadata[tp_rank] = msgspec.msgpack.encode(worker.xfer_handshake_metadata)
        for tp_rank in range(decode.attn_tp):
            with _rank(tp_rank, decode.attn_tp):
                worker = _worker(engines["decode"], tp_rank, "kv_consumer", "decode")
                worker.register_kv_caches(caches["decode"])
                try:
                    sources = _handshake(worker, prefill.attn_tp, metadata)
                except Exception as error:  # vLLM's refusal is the answer
                    outcome["refused"] = _failure(error, "handshake")
                    return outcome
            outcome["sources"][tp_rank] = sources
    return outcome


def _handshake(
    worker: NixlPullConnectorWorker, remote_tp: int, metadata: dict[int, bytes]
) -> dict[str, list[int]]:
    """``_nixl_handshake`` without its socket: for each prefill rank the decode rank
    targets, decode the payload, validate the parallel config and add the remote agent."""
    assert worker.transfer_topo is not None
    targets = worker.transfer_topo.handshake_target_ranks(remote_tp, 1)
    for remote_rank in targets:
        payload = msgspec.msgpack.decode(metadata[remote_rank], type=NixlHandshakePayload)
        meta = msgspec.msgpack.decode(payload.agent_metadata_bytes, type=NixlAgentMetadata)
        worker._validate_remote_parallel_config(meta)
        worker.add_remote_agent(meta, remote_rank, remote_tp, meta.dcp_size)
    mapping = worker.tp_mappings["prefill"]
    found: dict[str, set[int]] = {"attention": set(), "state": set()}
    for spec_type, ranks in zip(
        worker._group_spec_types, mapping.source_ranks_per_group, strict=True
    ):
        found["state" if issubclass(spec_type, MambaSpec) else "attention"].update(ranks)
    return {kind: sorted(ranks) for kind, ranks in found.items()}
