"""vLLM 0.33's NIXL prefill-to-decode transfer of GLM-5.3-Flash's packed KV cache, run on CPU.

:func:`glm_nixl_transfer` takes a prefill deployment and a decode deployment of the fixture
(``tests/fixtures/glm-5.3-flash/config.json``) and runs, with vLLM's own code, what the two
engines do for one request of ``prompt_tokens`` tokens sent from prefill to decode through
vLLM's pull connector ``NixlConnector`` (``vllm/distributed/kv_transfer/kv_connector/v1/nixl/``;
0.33 has no ``nixl_connector.py``, the connector is that package):

1. each side's engine config and KV-cache plan (``vllm_glm.plan_glm``) built with
   ``--kv-transfer-config`` set (``VllmConfig.__post_init__`` runs with the connector
   configured: its DCP check, the hybrid allocator kept on because NIXL ``SupportsHMA``);
2. each stage's worker views, as the V2 runner hands them to the connector
   (``init_kv_cache``'s return, ``v1/worker/gpu/model_runner.py:796-819``), on ``meta``;
3. on every TP rank of both sides the connector's worker, ``NixlPullConnectorWorker``
   (``__init__``, ``register_kv_caches``: NIXL regions and the local descriptor list);
4. the engine core's scheduler (``Scheduler``, built as ``v1/engine/core.py:150-190`` and
   ``:320-372`` build it, with the connector's scheduler side): the prefill request
   (``kv_transfer_params={"do_remote_decode": True}``) is scheduled until its prefill is done,
   one token is sampled, and ``request_finished`` gives the ``kv_transfer_params`` the proxy
   forwards; the decode engine's scheduler takes that request and builds the connector
   metadata (``reqs_to_recv``: local and remote block ids per KV-cache group);
5. on every decode rank the handshake with every prefill rank it targets
   (``_nixl_handshake``: compatibility hash, ``add_remote_agent``, TP mapping, remote
   descriptors, ``_validate_remote_agent_handshake``), then ``start_load_kv`` with that
   metadata: ``_read_blocks_for_req`` and ``_read_blocks`` compute the descriptor ids of
   every READ.

Each READ's descriptor ids are resolved in the descriptor lists vLLM prepared (NIXL >= 1.5
strided ``Nx5`` rows: address, length, device, stride, count) to byte ranges, which are then
named by the cache layers (and parts) of the KV-cache group that owns the block on each side.

Stand-ins, and nothing else (every decision is vLLM's code):

* the ``nixl`` package is not installed: ``NixlWrapper`` is :class:`_RecordingAgent`, which
  records memory registrations, descriptor lists and transfers and returns handles;
* the backing is allocated on ``meta``: storage address 0, so every address NIXL sees is a
  byte offset inside the rank's one KV-cache backing (a GPU adds the allocation's address);
* the NIXL worker module sees a CUDA platform (``device_type`` "cuda", VRAM) and its TP rank
  and size (the technique of ``vllm_nixl``); vLLM's layers answer for the GPU
  ``vllm_glm.cuda_device`` sets;
* the handshake's ZMQ socket is :class:`_SideChannel`, which answers each
  ``(GET_META_MSG, pp_rank, tp_rank)`` query with the prefill rank's encoded
  ``NixlHandshakePayload`` as the prefill scheduler's listener does
  (``nixl/base_scheduler.py:343-383``); the handshake itself runs synchronously (vLLM runs it
  on a one-thread executor and records the result in ``_ensure_handshake``'s callback, which
  is done here in the same way);
* both engines serve one model name (:data:`MODEL_NAME`; the fixture is planned in a fresh
  temporary directory per side, and the model path is hashed into the handshake's
  compatibility hash, ``nixl/metadata.py:146-205``);
* the scheduler is built as a ``--language-model-only`` engine: its multimodal encoder budget
  needs the checkpoint's tokenizer, which the fixture lacks (``Glm5NextMultiModalProcessor
  requires a tokenizer``); the encoder cache never touches KV blocks;
* no model runs: the prefill step's sampled token is a constant.

Only the pull connector is run past start-up: ``connector="NixlPushConnector"`` runs each
side's ``NixlPushConnectorWorker.__init__`` (where it refuses pipeline parallelism) and stops.

What it found (``tests/fixtures/glm-5.3-flash/vllm-0.33-notes.md`` section 7 has the rules with
file:line, the golden figures and every refusal):

* regions are one per distinct byte offset of the packed block row (KDA slots, k_cache, latent
  and tail pages; offset 0 shared, with the k_cache page's length); the MLA group's blocks are
  read region by region (every region), the tail group's one block likewise, each KDA group's
  one state block as conv q|k|v and recurrent slices per KDA slot;
* prefill and decode must run the same block size (the KDA page sets each TP's default, so
  heterogeneous TP needs ``--block-size`` on both), the same DCP (1 or TP), the ``DS`` conv
  layout, no pipeline parallelism, and pass the compatibility hash;
* with MTP (ring 32) at small blocks the first MLA layer's tail ring is cut to the k_cache page.

A conformance harness: it imports vLLM, torch, numpy, msgspec and its sibling ``vllm_glm``;
never ``k3layout``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import torch
import vllm_glm
from vllm.config import KVTransferConfig, VllmConfig
from vllm.config.vllm import set_current_vllm_config
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)
from vllm.model_executor.layers.mamba import mamba_utils
from vllm_nixl import FakeNixlWrapper
from vllm_required import AT_LEAST_034

MODEL_NAME = "zai-org/GLM-5.3-Flash"
"""The model both engines serve (``ModelConfig.model``, hashed into the handshake)."""
PREFILL, DECODE = "prefill", "decode"
"""Each side's ``kv_transfer_config.engine_id``."""
SIDE_CHANNEL = ("localhost", 5600)
"""``VLLM_NIXL_SIDE_CHANNEL_HOST`` / ``_PORT`` defaults, as the prefill advertises them."""
CONNECTORS = {
    "NixlConnector": NixlPullConnectorWorker,
    "NixlPushConnector": NixlPushConnectorWorker,
}
VLLM_ROOT = Path(base_worker.__file__).resolve().parents[5]
"""The directory holding the ``vllm`` package (refusals name files relative to it)."""
MAX_STEPS = 10_000
"""Scheduler steps allowed for one prefill (a chunk per step)."""


@dataclass(frozen=True)
class GlmSide:
    """One engine of the pair: its ``vllm serve`` flags (``vllm_glm.plan_glm``'s arguments)."""

    tp: int = 8
    gpu: str = "H200"
    kv_dtype: str = "fp8"
    spec_tokens: int = 0
    mtp_layers: int | None = None
    dcp: int = 1
    pp: int = 1
    prefix_caching: bool = True
    max_model_len: int = 8192
    budget_bytes: int = 40 << 30
    backend: str | None = None
    kda_prefill_backend: str = "auto"
    block_size: int | None = None

    def plan_arguments(self) -> dict[str, Any]:
        """``plan_glm``'s keyword arguments."""
        return {
            "gpu": self.gpu,
            "tp": self.tp,
            "kv_dtype": self.kv_dtype,
            "spec_tokens": self.spec_tokens,
            "mtp_layers": self.mtp_layers,
            "dcp": self.dcp,
            "pp": self.pp,
            "prefix_caching": self.prefix_caching,
            "max_model_len": self.max_model_len,
            "budget_bytes": self.budget_bytes,
            "backend": self.backend,
            "kda_prefill_backend": self.kda_prefill_backend,
            "block_size": self.block_size,
        }


class _Refused(Exception):
    """vLLM refused the transfer at ``step``."""

    def __init__(self, step: str, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.step = step
        self.error = error


def _failure(step: str, error: BaseException) -> dict[str, Any]:
    """Where vLLM refused: the step, the vLLM function and ``file:line`` that raised, the
    exception type and its message."""
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and cause not in chain:  # e.g. pydantic wraps an assertion
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    frames: list[traceback.FrameSummary] = []
    for each in reversed(chain):  # the innermost exception raised in vLLM names the check
        frames = [
            frame
            for frame in traceback.extract_tb(each.__traceback__)
            if f"{os.sep}vllm{os.sep}" in frame.filename
        ]
        if frames:
            break
    where = ""
    if frames:
        path = Path(frames[-1].filename).resolve()
        with contextlib.suppress(ValueError):
            path = path.relative_to(VLLM_ROOT)
        where = f"{path}:{frames[-1].lineno}"
    return {
        "step": step,
        "check": frames[-1].name if frames else "",
        "where": where,
        "error": type(error).__name__,
        "message": str(error),
    }


@contextlib.contextmanager
def _step(step: str) -> Iterator[None]:
    """Run one step of the transfer; what vLLM raises becomes :class:`_Refused`."""
    try:
        yield
    except _Refused:
        raise
    except Exception as error:  # vLLM's refusal is the answer
        raise _Refused(step, error) from error


@contextlib.contextmanager
def _conv_layout(layout: str | None) -> Iterator[None]:
    """``VLLM_SSM_CONV_STATE_LAYOUT`` for the block (``None``: unset, vLLM's default);
    vLLM caches its reading, so the cache is cleared on entry and exit."""
    name = "VLLM_SSM_CONV_STATE_LAYOUT"
    saved = os.environ.get(name)
    if layout is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = layout
    mamba_utils.get_conv_state_layout.cache_clear()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
        mamba_utils.get_conv_state_layout.cache_clear()


# The NIXL agent and the handshake's socket.


class _RecordingAgent(FakeNixlWrapper):
    """The NIXL agent (``nixl._api.nixl_agent``): the K3 harness's fake, also recording
    what vLLM registers, the descriptor lists it prepares and the transfers it makes."""

    label = "agent"

    def __init__(self, name: str, config: Any = None) -> None:
        super().__init__(name, config)
        self.registered: list[Any] = []
        self.dlists: dict[int, tuple[str, np.ndarray]] = {}
        self.transfers: list[dict[str, Any]] = []
        self.notifications: list[tuple[str, bytes]] = []

    def register_memory(self, descs: Any, backends: Any = None) -> None:
        self.registered.append(descs)

    def get_agent_metadata(self) -> bytes:
        return self.label.encode()

    def add_remote_agent(self, metadata: bytes) -> str:
        return metadata.decode()

    def prep_xfer_dlist(self, agent: str, data: Any, mem_type: str | None = None) -> int:
        handle = next(self.handles)
        self.dlists[handle] = (agent, np.array(data, dtype=np.uint64).reshape(-1, 5))
        return handle

    def make_prepped_xfer(  # noqa: PLR0917 - vLLM passes these positionally
        self,
        operation: str,
        local_handle: int,
        local_ids: Any,
        remote_handle: int,
        remote_ids: Any,
        notif_msg: bytes | None = None,
    ) -> int:
        handle = next(self.handles)
        self.transfers.append(
            {
                "operation": operation,
                "local_handle": local_handle,
                "local_ids": np.asarray(local_ids, dtype=np.int64),
                "remote_handle": remote_handle,
                "remote_ids": np.asarray(remote_ids, dtype=np.int64),
                "notification": notif_msg,
            }
        )
        return handle

    def transfer(self, handle: int) -> str:
        return "PROC"

    def send_notif(self, agent: str, notif_msg: bytes) -> None:
        self.notifications.append((agent, notif_msg))

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        return {}


class _SideChannel:
    """The prefill engine's handshake listener as the decode's ZMQ REQ socket sees it:
    each query ``(GET_META_MSG, pp_rank, tp_rank)`` is answered with that rank's encoded
    ``NixlHandshakePayload`` and the listener's clock (``nixl/base_scheduler.py:366-383``)."""

    def __init__(self, payloads: dict[tuple[int, int], bytes]) -> None:
        self.payloads = payloads
        self.query: tuple[int, int] = (0, 0)
        self.queries: list[tuple[int, int]] = []

    def setsockopt(self, *args: Any) -> None:
        return None

    def send(self, message: bytes) -> None:
        _, pp_rank, tp_rank = msgspec.msgpack.decode(message)
        self.query = (pp_rank, tp_rank)
        self.queries.append(self.query)

    def recv_multipart(self) -> list[bytes]:
        return [self.payloads[self.query], msgspec.msgpack.encode(time.perf_counter())]


@contextlib.contextmanager
def _rank(
    tp_rank: int, tp_size: int, label: str, channel: _SideChannel | None = None
) -> Iterator[None]:
    """The NIXL worker module's view of rank ``tp_rank`` of ``tp_size``: a recording agent
    named ``label``, a CUDA platform, and (for a handshake) the prefill's side channel."""
    agent = type(f"Agent[{label}]", (_RecordingAgent,), {"label": label})

    @contextlib.contextmanager
    def side_channel(socket_type: Any, address: str) -> Iterator[_SideChannel]:
        del socket_type, address
        assert channel is not None, "no side channel in this step"
        yield channel

    patches: dict[str, Any] = {
        "NixlWrapper": agent,
        "nixl_agent_config": None,
        "current_platform": SimpleNamespace(
            device_type="cuda",
            get_nixl_memory_type=lambda: None,
            set_device=lambda device: None,
        ),
        "get_tensor_model_parallel_rank": lambda: tp_rank,
        "get_tensor_model_parallel_world_size": lambda: tp_size,
        "zmq_ctx": side_channel,
    }
    saved = {name: getattr(base_worker, name) for name in patches}
    for name, value in patches.items():
        setattr(base_worker, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(base_worker, name, value)


# Each side: plan, views, scheduler.


@dataclass
class _Engine:
    """One side's vLLM objects: the plan (``plan_glm``'s dict, ``objects`` popped), the
    engine config, each stage's worker config, ``KVCacheConfig`` and connector views."""

    side: GlmSide
    engine_id: str
    plan: dict[str, Any]
    config: VllmConfig
    workers: list[VllmConfig]
    kv_cache_configs: list[Any]
    views: list[dict[str, torch.Tensor]]

    @property
    def capability(self) -> tuple[int, int]:
        return vllm_glm.GPUS[self.side.gpu]


def _plan(side: GlmSide, transfer: KVTransferConfig) -> tuple[dict[str, Any], list[Exception]]:
    """``plan_glm`` for ``side`` with ``--kv-transfer-config transfer``: its ``VllmConfig``
    is built with the connector configured (``_engine_config`` is ``plan_glm``'s only
    construction of one). Also returns what that construction raised (``plan_glm`` keeps
    only the message)."""
    raised: list[Exception] = []

    def with_connector(**kwargs: Any) -> VllmConfig:
        try:
            return VllmConfig(**kwargs, kv_transfer_config=copy.deepcopy(transfer))
        except Exception as error:
            raised.append(error)
            raise

    setattr(vllm_glm, "VllmConfig", with_connector)  # noqa: B010 - a module global
    try:
        return vllm_glm.plan_glm(**side.plan_arguments(), objects=True), raised
    finally:
        setattr(vllm_glm, "VllmConfig", VllmConfig)  # noqa: B010


def _views(plan: dict[str, Any], engine: dict[str, Any], stage: int) -> dict[str, torch.Tensor]:
    """What the V2 runner of ``stage`` hands the connector: ``init_kv_cache``'s views
    (``allocate_kv_cache`` on ``meta``, then the layers bound), through
    ``vllm_glm._bind_stage_v2`` under the settings ``vllm_glm.bound_views`` gives it."""
    worker: VllmConfig = engine["workers"][stage]
    context = worker.compilation_config.static_forward_context
    text = worker.model_config.hf_text_config
    heads = text.num_attention_heads // worker.parallel_config.tensor_parallel_size
    for layer in context.values():
        if hasattr(layer, "topk_buffer_width"):  # MLAAttention: what its __init__ also sets
            layer._vllm_config = worker  # mla_attention.py:731
            layer.num_heads = heads
    backends = {layer.get_attn_backend() for layer in context.values()}
    with (
        set_current_vllm_config(worker),
        vllm_glm.cuda_device(tuple(plan["capability"]), True),
        vllm_glm._unbuilt_metadata_builders(backends),
    ):
        *_, record = vllm_glm._bind_stage_v2(
            worker, engine["kv_cache_configs"][stage], stage == len(engine["workers"]) - 1
        )
    views: dict[str, torch.Tensor] = record["manager"]
    return views


@dataclass(frozen=True)
class _Options:
    """:func:`glm_nixl_transfer`'s keyword arguments."""

    prompt_tokens: int
    conv_layout: str | None
    connector: str
    extra_config: dict[str, Any]
    kv_buffer_device: str


def _engine(side: GlmSide, engine_id: str, role: str, options: _Options) -> _Engine:
    """Plan ``side`` and bind its stages' views; refusals are ``{engine_id}_config``."""
    transfer = KVTransferConfig(
        kv_connector=options.connector,
        kv_role=role,
        kv_buffer_device=options.kv_buffer_device,
        engine_id=engine_id,
        kv_connector_extra_config=dict(options.extra_config),
    )
    plan, raised = _plan(side, transfer)
    if "refused" in plan:
        error: Exception
        if raised and plan["refused_at"] == "config":
            error = raised[-1]
        else:  # plan_glm's message; its step names the planning stage that raised
            kind, _, text = plan["refused"].partition(": ")
            error = type(kind, (Exception,), {})(f"{text} (at plan_glm's {plan['refused_at']})")
        raise _Refused(f"{engine_id}_config", error)
    if "unsupported" in plan:
        raise NotImplementedError(plan["unsupported"])
    engine = plan.pop("objects")
    for config in (engine["config"], *engine["workers"]):
        config.model_config.model = MODEL_NAME  # both engines serve one checkpoint
        if config.speculative_config is not None:  # the MTP draft is that checkpoint too
            config.speculative_config.draft_model_config.model = MODEL_NAME
    with _step(f"{engine_id}_bind"):
        views = [_views(plan, engine, stage) for stage in range(side.pp)]
    return _Engine(
        side=side,
        engine_id=engine_id,
        plan=plan,
        config=engine["config"],
        workers=engine["workers"],
        kv_cache_configs=engine["kv_cache_configs"],
        views=views,
    )


def _scheduler(engine: _Engine) -> tuple[Any, int]:
    """The engine core's scheduler with the connector's scheduler side, built as
    ``EngineCore`` builds it (``v1/engine/core.py:320-372``, ``:150-190``)."""
    from vllm.v1.core.kv_cache_utils import (  # noqa: PLC0415
        generate_scheduler_kv_cache_config,
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
        update_kv_cache_capacity,
    )
    from vllm.v1.structured_output import StructuredOutputManager  # noqa: PLC0415

    config = engine.config
    configs = engine.kv_cache_configs
    for kv_cache_config in configs:
        kv_cache_config.kv_cache_layout = config.cache_config.kv_cache_layout
    scheduler_config = generate_scheduler_kv_cache_config(configs)
    config.cache_config.num_gpu_blocks = scheduler_config.num_blocks
    groups = scheduler_config.kv_cache_groups
    participating = [g.kv_cache_spec.block_size for g in groups if g.kv_cache_spec.prefix_cacheable]
    config.cache_config.block_size = min(
        participating or [g.kv_cache_spec.block_size for g in groups]
    )
    update_kv_cache_capacity(config, scheduler_config)
    config.validate_block_size()
    block_size, hash_block_size = resolve_kv_cache_block_sizes(scheduler_config, config)
    alignment = resolve_cache_hit_alignment_tokens(
        scheduler_config, config, block_size, hash_block_size
    )
    for kv_cache_config in (*configs, scheduler_config):
        kv_cache_config.hash_block_size = hash_block_size
        kv_cache_config.cache_hit_alignment_tokens = alignment
    multimodal = config.model_config.multimodal_config
    if multimodal is not None:  # --language-model-only (module docstring)
        multimodal.language_model_only = True
        multimodal.enable_mm_embeds = False  # not opted in; rederived by vLLM below
        config._resolve_mm_embedding_inputs()
    scheduler_class = config.scheduler_config.get_scheduler_cls()
    block_size, hash_block_size = resolve_kv_cache_block_sizes(scheduler_config, config)
    scheduler = scheduler_class(
        vllm_config=config,
        kv_cache_config=scheduler_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block_size,
        hash_block_size=hash_block_size,
    )
    return scheduler, hash_block_size


def _request(
    config: VllmConfig,
    hash_block_size: int,
    *,
    request_id: str,
    prompt_tokens: int,
    max_tokens: int,
    params: dict[str, Any],
) -> Any:
    """A request as the engine core makes it, with the engine's block hasher
    (``v1/engine/core.py:219-230``)."""
    from vllm.sampling_params import SamplingParams  # noqa: PLC0415
    from vllm.utils.hashing import get_hash_fn_by_name  # noqa: PLC0415
    from vllm.v1.core.kv_cache_utils import (  # noqa: PLC0415
        get_request_block_hasher,
        init_none_hash,
    )
    from vllm.v1.request import Request  # noqa: PLC0415

    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(hash_block_size, hash_fn, config.num_hash_lookahead_tokens)
    sampling = SamplingParams(max_tokens=max_tokens, extra_args={"kv_transfer_params": params})
    # distinct token ids (prefix caching hashes them; no model reads them)
    tokens = list(range(1000, 1000 + prompt_tokens))
    return Request(request_id, tokens, sampling, None, block_hasher=hasher)


def _prefill(engine: _Engine, prompt_tokens: int) -> dict[str, Any]:
    """The prefill engine's scheduler runs the request to its end (one sampled token);
    returns the ``kv_transfer_params`` of its finished output (the connector's
    ``request_finished``) and what the scheduler did."""
    from vllm.v1.outputs import ModelRunnerOutput  # noqa: PLC0415

    scheduler, hash_block_size = _scheduler(engine)
    request = _request(
        engine.config,
        hash_block_size,
        request_id="req-prefill",
        prompt_tokens=prompt_tokens,
        max_tokens=16,
        params={"do_remote_decode": True},
    )
    scheduler.add_request(request)
    chunks: list[int] = []
    allocated: list[list[int]] = []
    for _ in range(MAX_STEPS):
        output = scheduler.schedule()
        scheduled = output.num_scheduled_tokens.get(request.request_id, 0)
        chunks.append(scheduled)
        if output.scheduled_new_reqs:
            allocated = [list(ids) for ids in output.scheduled_new_reqs[0].block_ids]
        done = scheduled > 0 and not request.is_prefill_chunk
        # 0.34 finds a request's row by req_ids alone
        index = {} if AT_LEAST_034 else {"req_id_to_index": {request.request_id: 0}}
        runner_output = ModelRunnerOutput(
            req_ids=[request.request_id], sampled_token_ids=[[7] if done else []], **index
        )
        for outputs in scheduler.update_from_output(output, runner_output).values():
            for each in outputs.outputs:
                if each.kv_transfer_params is not None:
                    return {
                        "kv_transfer_params": each.kv_transfer_params,
                        "prompt_tokens_computed": request.num_computed_tokens,
                        "chunks": [c for c in chunks if c],
                        "first_step_block_ids": allocated,
                        "finish_reason": str(each.finish_reason),
                    }
    raise RuntimeError("the prefill request did not finish")


def _decode(engine: _Engine, prompt_tokens: int, params: dict[str, Any]) -> dict[str, Any]:
    """The decode engine's scheduler takes the request with the prefill's
    ``kv_transfer_params`` (what the proxy forwards) and builds the connector metadata."""
    scheduler, hash_block_size = _scheduler(engine)
    request = _request(
        engine.config,
        hash_block_size,
        request_id="req-decode",
        prompt_tokens=prompt_tokens,
        max_tokens=16,
        params=copy.deepcopy(params),
    )
    scheduler.add_request(request)
    output = scheduler.schedule()
    metadata = output.kv_connector_metadata
    assert isinstance(metadata, NixlConnectorMetadata), metadata
    (request_meta,) = metadata.reqs_to_recv.values()
    return {
        "metadata": metadata,
        "status": str(request.status),
        "num_external_tokens": request.num_computed_tokens,
        "allocated_block_ids": [
            list(ids) for ids in scheduler.kv_cache_manager.get_block_ids(request.request_id)
        ],
        "local_block_ids": [list(ids) for ids in request_meta.local_block_ids],
        "remote_block_ids": [list(ids) for ids in request_meta.remote.block_ids],
        "local_num_computed_blocks": list(request_meta.local_num_computed_blocks),
        "handshake": {
            "tp_size": request_meta.tp_size,
            "dcp_size": request_meta.dcp_size,
            "pp_size": request_meta.pp_size,
        },
    }


# The workers.


def _worker(
    engine: _Engine, stage: int, tp_rank: int, connector: str, channel: _SideChannel | None
) -> Any:
    """vLLM's NIXL worker of ``stage``, TP rank ``tp_rank`` (``__init__`` only)."""
    config = engine.workers[stage]
    label = f"{engine.engine_id}/pp{stage}/tp{tp_rank}"
    with (
        _rank(tp_rank, engine.side.tp, label, channel),
        set_current_vllm_config(config),
        vllm_glm.cuda_device(engine.capability, True),
    ):
        return CONNECTORS[connector](config, engine.engine_id, engine.kv_cache_configs[stage])


def _register(engine: _Engine, stage: int, tp_rank: int, worker: Any) -> None:
    """The worker's ``register_kv_caches`` with its stage's views."""
    label = f"{engine.engine_id}/pp{stage}/tp{tp_rank}"
    with (
        _rank(tp_rank, engine.side.tp, label),
        set_current_vllm_config(engine.workers[stage]),
        vllm_glm.cuda_device(engine.capability, True),
    ):
        worker.register_kv_caches(engine.views[stage])


def _scratch_regions(worker: Any) -> set[int]:
    """The regions of the circular-buffer (tail ring) groups: 0.33 keeps them apart
    (``_scratch_region_indices``); 0.34 keeps every group's regions
    (``_group_region_indices``, ``None`` for all of them)."""
    if not AT_LEAST_034:
        return set(worker._scratch_region_indices)
    from vllm.v1.kv_cache_interface import CircularBufferSpec  # noqa: PLC0415

    found: set[int] = set()
    for group, kind in enumerate(worker._group_spec_types):
        if kind is CircularBufferSpec:
            regions = worker._group_region_indices[group]
            found.update(range(worker.num_regions) if regions is None else regions)
    return found


def _regions(worker: Any) -> list[dict[str, Any]]:
    """The NIXL regions a worker registered (rank 0 stands for its side: every rank has the
    same offsets), in vLLM's region order."""
    bases = worker.kv_caches_base_addr[worker.engine_id][worker.tp_rank]
    return [
        {
            "index": index,
            "name": worker.region_names[index],
            "offset": int(bases[index]),
            "block_len": int(worker.block_len_per_layer[index]),
            "block_stride": int(worker.block_stride_per_layer[index]),
            "group": int(worker.region_group_ids[index]),
            "num_blocks": int(worker.region_num_blocks[index]),
            "replicated": bool(worker._region_is_mla[index]),
            "ssm": index in worker._ssm_region_indices,
            "scratch": index in _scratch_regions(worker),
        }
        for index in range(worker.num_regions)
    ]


def _worker_facts(worker: Any) -> dict[str, Any]:
    """What a registered worker derived: block size, kernel ratio, flags, conv split."""
    decomposition = worker._conv_decomp
    return {
        "block_size": worker.block_size,
        "physical_blocks_per_logical": worker._physical_blocks_per_logical_kv_block,
        "num_blocks": worker.num_blocks,
        "use_mla": worker.use_mla,
        "has_mamba": worker._has_mamba,
        "is_csa_linear": worker._is_csa_linear,
        "packed": worker._has_packed_cache,
        "kv_cache_layout": worker.kv_cache_layout,
        "backend": worker.backend_name,
        "group_spec_types": [t.__name__ for t in worker._group_spec_types],
        "num_regions": worker.num_regions,
        "num_fa_descs": int(worker.num_descs),
        "conv_split": None
        if decomposition is None
        else {
            "local_conv_offsets": [list(o) for o in decomposition.local_conv_offsets],
            "ssm_sizes": list(decomposition.ssm_sizes),
        },
    }


# Naming bytes: which cache layer (and part) of which group a byte range of a block holds.


def _parts(layer: dict[str, Any]) -> list[tuple[str, int, int]]:
    """A cache layer's parts as ``(part, start, end)`` inside its page: KDA's conv
    projections q|k|v (``DS`` layout: channel-major, so each is contiguous) and recurrent
    state, then its page padding; the tail ring's raw-K head and gate head; a whole latent or
    indexer key page."""
    role, page = layer["role"], layer["page_size_bytes"]
    if role == "kda":
        (conv_shape, state_shape), (conv_dtype, state_dtype) = layer["shapes"], layer["dtypes"]
        conv = (
            int(np.prod(conv_shape))
            * torch.tensor([], dtype=getattr(torch, conv_dtype)).element_size()
        )
        state = (
            int(np.prod(state_shape))
            * torch.tensor([], dtype=getattr(torch, state_dtype)).element_size()
        )
        third = conv // 3
        parts = [("conv_q", 0, third), ("conv_k", third, 2 * third), ("conv_v", 2 * third, conv)]
        parts.append(("recurrent", conv, conv + state))
        if conv + state < page:
            parts.append(("padding", conv + state, page))
        return parts
    if role == "tail":
        return [("tail_k", 0, page // 2), ("tail_gate", page // 2, page)]
    return [(role, 0, page)]


def _layouts(plan: dict[str, Any], stage: int) -> dict[int, list[tuple[str, str, int, int]]]:
    """Per KV-cache group of ``stage``: ``(layer, part, start, end)`` in block bytes."""
    layouts: dict[int, list[tuple[str, str, int, int]]] = {}
    for layer in plan["stages"][stage]["layers"]:
        base = layer["offset_in_block"]
        layouts.setdefault(layer["group"], []).extend(
            (layer["name"], part, base + start, base + end) for part, start, end in _parts(layer)
        )
    return layouts


def _covers(
    layout: list[tuple[str, str, int, int]], start: int, end: int
) -> list[tuple[str, str, int, int]]:
    """The parts of ``layout`` that ``[start, end)`` overlaps, with the overlap inside each
    part (``from``, ``to`` relative to the part's start)."""
    return [
        (name, part, max(start, lo) - lo, min(end, hi) - lo)
        for name, part, lo, hi in layout
        if start < hi and lo < end
    ]


def _expand(dlist: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Addresses and lengths of descriptor ``ids`` of a strided ``Nx5`` list."""
    counts = dlist[:, 4].astype(np.int64)
    starts = np.cumsum(counts) - counts
    rows = np.searchsorted(starts, ids, side="right") - 1
    assert np.all(ids - starts[rows] < counts[rows]), "descriptor id out of range"
    addresses = dlist[rows, 0].astype(np.int64) + (ids - starts[rows]) * dlist[rows, 3].astype(
        np.int64
    )
    return addresses, dlist[rows, 1].astype(np.int64)


def _owner(block_ids: list[list[int]], block: int) -> int | None:
    """The KV-cache group whose list holds ``block`` (a block id belongs to one group)."""
    return next((g for g, ids in enumerate(block_ids) if block in ids), None)


def _short(name: str) -> str:
    """``layers.3.self_attn.indexer.k_cache`` -> ``3.k_cache``."""
    index = vllm_glm._module_layer(name)
    return f"{index}.{name.rsplit('.', 1)[-1]}"


def _read_summary(
    transfer: dict[str, Any],
    decode_agent: _RecordingAgent,
    *,
    prefill: _Engine,
    decode: _Engine,
    remote_block_ids: list[list[int]],
    local_block_ids: list[list[int]],
) -> dict[str, Any]:
    """One READ as byte ranges: per KV-cache group of the decode request, the block pairs and,
    per pair, the copies (prefill offset in block, decode offset in block, length) with the
    layer parts they read and write; the group's parts each side covers."""
    local_agent, local_list = decode_agent.dlists[transfer["local_handle"]]
    remote_agent, remote_list = decode_agent.dlists[transfer["remote_handle"]]
    src, length = _expand(remote_list, transfer["remote_ids"])
    dst, local_length = _expand(local_list, transfer["local_ids"])
    assert np.array_equal(length, local_length), "a copy's lengths differ"
    src_stride = prefill.plan["stages"][0]["block_stride"]
    dst_stride = decode.plan["stages"][0]["block_stride"]
    src_layout, dst_layout = _layouts(prefill.plan, 0), _layouts(decode.plan, 0)
    groups: dict[int, dict[str, Any]] = {}
    for s, d, n in zip(src.tolist(), dst.tolist(), length.tolist(), strict=True):
        src_block, src_offset = divmod(s, src_stride)
        dst_block, dst_offset = divmod(d, dst_stride)
        group = _owner(local_block_ids, dst_block)
        src_group = _owner(remote_block_ids, src_block)
        key = -1 if group is None else group
        entry = groups.setdefault(
            key, {"group": group, "src_group": src_group, "pairs": {}, "written": {}, "read": {}}
        )
        assert entry["src_group"] == src_group, "a group's blocks come from two groups"
        entry["pairs"].setdefault((src_block, dst_block), []).append((src_offset, dst_offset, n))
        for name, part, lo, hi in _covers(dst_layout.get(key, []), dst_offset, dst_offset + n):
            entry["written"].setdefault((name, part), []).append((lo, hi))
        for name, part, lo, hi in _covers(
            src_layout.get(-1 if src_group is None else src_group, []),
            src_offset,
            src_offset + n,
        ):
            entry["read"].setdefault((name, part), []).append((lo, hi))
    summary = []
    for key, entry in groups.items():
        pairs = entry["pairs"]
        patterns = {tuple(sorted(copies)) for copies in pairs.values()}
        copies = sorted(next(iter(pairs.values())))
        written = _merged(entry["written"])
        summary.append(
            {
                "group": entry["group"],
                "src_group": entry["src_group"],
                "block_pairs": sorted(pairs),
                "same_copies_every_block": len(patterns) == 1,
                "copies_per_block": copies if len(patterns) == 1 else None,
                "copies_by_block": None
                if len(patterns) == 1
                else {f"{a}->{b}": sorted(c) for (a, b), c in sorted(pairs.items())},
                "bytes_per_block": sum(n for *_, n in copies) if len(patterns) == 1 else None,
                "bytes": int(sum(n for c in pairs.values() for *_, n in c)),
                "written": written,
                "read": _merged(entry["read"]),
                **_copy_bytes(dst_layout.get(key, []), copies),
            }
        )
    return {
        "prefill_agent": remote_agent,
        "local_agent": local_agent,
        "num_descriptors": len(src),
        "notification": transfer["notification"].decode() if transfer["notification"] else None,
        "groups": sorted(summary, key=lambda e: -1 if e["group"] is None else e["group"]),
    }


def _spans(spans: list[tuple[int, int]] | list[list[int]]) -> list[list[int]]:
    """``spans`` merged and sorted."""
    out: list[list[int]] = []
    for lo, hi in sorted((int(a), int(b)) for a, b in spans):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _unwritten(
    layout: list[tuple[str, str, int, int]], written: dict[str, list[list[int]]]
) -> dict[str, list[list[int]]]:
    """Per ``layer:part`` of a decode group's layout (page padding aside), the byte ranges
    inside the part that ``written`` leaves out."""
    unwritten: dict[str, list[list[int]]] = {}
    for name, part, lo, hi in layout:
        if part == "padding":
            continue
        gaps, cursor = [], 0
        for start, end in _spans(written.get(f"{_short(name)}:{part}", [])):
            if start > cursor:
                gaps.append([cursor, start])
            cursor = max(cursor, end)
        if cursor < hi - lo:
            gaps.append([cursor, hi - lo])
        if gaps:
            unwritten[f"{_short(name)}:{part}"] = gaps
    return unwritten


def _copy_bytes(
    layout: list[tuple[str, str, int, int]], copies: list[tuple[int, int, int]]
) -> dict[str, int]:
    """One block's copies against the decode group's layout: bytes written outside every
    part (page padding, slots no layer of the group uses) and bytes written twice."""
    union = _spans([(d, d + n) for _, d, n in copies])
    inside = sum(
        max(0, min(hi, b) - max(lo, a))
        for a, b in union
        for _, part, lo, hi in layout
        if part != "padding"
    )
    total = sum(b - a for a, b in union)
    return {
        "bytes_outside_parts": total - inside,
        "bytes_written_twice": sum(n for *_, n in copies) - total,
    }


def _merged(ranges: dict[tuple[str, str], list[tuple[int, int]]]) -> dict[str, list[list[int]]]:
    """Per ``layer:part``, the byte ranges inside the part touched (merged, sorted)."""
    return {
        f"{_short(name)}:{part}": _spans(spans) for (name, part), spans in sorted(ranges.items())
    }


# The transfer.


def _side_summary(engine: _Engine) -> dict[str, Any]:
    """A side's plan in one dict: ``plan_glm``'s key figures and its groups."""
    plan = engine.plan
    return {
        "plan": vllm_glm.summary(plan),
        "backend": plan["backend"],
        "cache_dtype": plan["cache_dtype"],
        "block_size": plan["block_size"],
        "block_stride": plan["block_stride"],
        "num_blocks": plan["num_blocks"],
        "groups": [
            {
                "index": g["index"],
                "roles": sorted(set(g["roles"])),
                "layers": len(g["layers"]),
                "block_size": g["block_size"],
                "page_size_bytes": g["page_size_bytes"],
            }
            for g in plan["groups"]
        ],
    }


def glm_nixl_transfer(
    prefill: GlmSide,
    decode: GlmSide,
    *,
    prompt_tokens: int = 5000,
    conv_layout: str | None = "DS",
    connector: str = "NixlConnector",
    extra_config: dict[str, Any] | None = None,
    kv_buffer_device: str = "cuda",
) -> dict[str, Any]:
    """What vLLM 0.33's NIXL connector does with one GLM-5.3-Flash request of
    ``prompt_tokens`` tokens sent from ``prefill`` to ``decode``.

    ``conv_layout`` is ``VLLM_SSM_CONV_STATE_LAYOUT`` on both sides (``None``: unset, vLLM's
    default ``SD``, which the connector refuses); ``connector`` the ``kv_connector`` (pull
    ``NixlConnector``; ``NixlPushConnector`` is run to its workers' start-up only);
    ``extra_config`` ``kv_connector_extra_config``; ``kv_buffer_device`` the transfer
    buffer (``cpu``: host staging).

    Returns ``{"refused": None | {"step", "check", "where", "error", "message"}, ...}``:
    ``step`` is where vLLM raised (``prefill_config`` / ``decode_config``: ``plan_glm`` with
    the connector configured; ``*_bind``; ``*_init``: a worker's ``__init__``;
    ``*_register``; ``prefill_scheduler``; ``decode_scheduler``; ``handshake``; ``read``:
    ``start_load_kv``), ``check`` the vLLM function and ``where`` its ``file:line`` (relative
    to site-packages; empty when pydantic wrapped the assertion). What was reached is also
    returned:

    * ``prefill`` / ``decode``: the side's plan (``plan``, ``backend``, ``block_size``,
      ``block_stride``, ``num_blocks``, ``groups``), its rank-0 worker's facts (``worker``)
      and NIXL ``regions`` (offset in the block row, ``block_len``, ``block_stride``, group,
      replicated / ssm / scratch flags; every rank has the same offsets);
    * ``request``: the prefill's scheduling (``prefill``: tokens computed, chunks),
      ``remote_block_ids`` per group (the ``kv_transfer_params``), and ``decode``: its
      allocated and transferred (``local_block_ids``) block ids per group;
    * ``ranks``: per decode TP rank, ``handshake_targets``, ``source_ranks_per_group``,
      ``tp_ratio``, ``coverage`` (per decode group: every layer part written? the gaps), the
      notify-only ``notifications`` and ``reads``: each READ from one prefill rank, per group
      the ``block_pairs`` (prefill block, decode block) and ``copies_per_block``
      ``(prefill offset in block, decode offset in block, length)``, the layer parts each
      side covers (``read`` / ``written``: byte ranges inside the part), and the bytes
      written outside any part or twice."""
    outcome: dict[str, Any] = {"refused": None, "connector": connector}
    options = _Options(
        prompt_tokens=prompt_tokens,
        conv_layout=conv_layout,
        connector=connector,
        extra_config=dict(extra_config or {}),
        kv_buffer_device=kv_buffer_device,
    )
    try:
        _transfer(outcome, prefill, decode, options)
    except _Refused as refused:
        outcome["refused"] = _failure(refused.step, refused.error)
    return outcome


@dataclass
class _Pair:
    """Both engines and what the decode ranks share: the prefill ranks' handshake payloads,
    the decode scheduler's connector metadata and request facts, the outcome being built."""

    prefill: _Engine
    decode: _Engine
    payloads: dict[tuple[int, int], bytes]
    metadata: NixlConnectorMetadata
    received: dict[str, Any]
    outcome: dict[str, Any]


def _transfer(
    outcome: dict[str, Any], prefill_side: GlmSide, decode_side: GlmSide, options: _Options
) -> None:
    """:func:`glm_nixl_transfer`'s steps, filling ``outcome``; raises :class:`_Refused`."""
    connector = options.connector
    with _conv_layout(options.conv_layout):
        prefill = _engine(prefill_side, PREFILL, "kv_producer", options)
        outcome["prefill"] = _side_summary(prefill)
        decode = _engine(decode_side, DECODE, "kv_consumer", options)
        outcome["decode"] = _side_summary(decode)
        # Start-up: one worker per stage refuses what every rank's would.
        for engine in (prefill, decode):
            for stage in range(engine.side.pp):
                with _step(f"{engine.engine_id}_init"):
                    _worker(engine, stage, 0, connector, None)
        if connector != "NixlConnector":
            outcome["unsupported"] = f"{connector}: transfers are not run past start-up"
            return
        if prefill_side.pp > 1 or decode_side.pp > 1:
            outcome["unsupported"] = "pipeline stages passed start-up: not run further"
            return
        payloads: dict[tuple[int, int], bytes] = {}
        encoder = msgspec.msgpack.Encoder()
        for tp_rank in range(prefill_side.tp):
            worker = _worker(prefill, 0, tp_rank, connector, None)
            with _step("prefill_register"):
                _register(prefill, 0, tp_rank, worker)
            payloads[(0, tp_rank)] = encoder.encode(worker.xfer_handshake_metadata)
            if tp_rank == 0:
                outcome["prefill"]["worker"] = _worker_facts(worker)
                outcome["prefill"]["regions"] = _regions(worker)
        with _step("prefill_scheduler"):
            sent = _prefill(prefill, options.prompt_tokens)
        params = sent["kv_transfer_params"]
        outcome["request"] = {
            "prompt_tokens": options.prompt_tokens,
            "prefill": {k: v for k, v in sent.items() if k != "kv_transfer_params"},
            "remote_block_ids": [list(ids) for ids in params["remote_block_ids"]],
            "remote_num_tokens": params["remote_num_tokens"],
        }
        with _step("decode_scheduler"):
            received = _decode(decode, options.prompt_tokens, params)
        metadata = received.pop("metadata")
        outcome["request"]["decode"] = received
        pair = _Pair(prefill, decode, payloads, metadata, received, outcome)
        outcome["ranks"] = {
            tp_rank: _decode_rank(pair, tp_rank) for tp_rank in range(decode_side.tp)
        }


def _decode_rank(pair: _Pair, tp_rank: int) -> dict[str, Any]:
    """Decode TP rank ``tp_rank``: start-up, handshake with its prefill ranks, the READs."""
    decode, received = pair.decode, pair.received
    channel = _SideChannel(pair.payloads)
    label = f"{DECODE}/pp0/tp{tp_rank}"
    worker = _worker(decode, 0, tp_rank, "NixlConnector", channel)
    with _step("decode_register"):
        _register(decode, 0, tp_rank, worker)
    if tp_rank == 0:
        pair.outcome["decode"]["worker"] = _worker_facts(worker)
        pair.outcome["decode"]["regions"] = _regions(worker)
    handshake = received["handshake"]
    host, port = SIDE_CHANNEL
    with (
        _rank(tp_rank, decode.side.tp, label, channel),
        set_current_vllm_config(decode.workers[0]),
        vllm_glm.cuda_device(decode.capability, True),
    ):
        with _step("handshake"):
            # _ensure_handshake's job (base_worker.py:1385-1445), run here synchronously
            agents, clock_offset = worker._nixl_handshake(
                host,
                port,
                handshake["tp_size"],
                PREFILL,
                handshake["dcp_size"],
                handshake["pp_size"],
            )
        worker._remote_agents[PREFILL] = agents
        worker._engine_clock_offset[PREFILL] = clock_offset
        worker._engine_last_active[PREFILL] = time.perf_counter()
        worker._track_remote_engine_replacement(PREFILL, host, port)
        with _step("read"):
            worker.start_load_kv(copy.deepcopy(pair.metadata))
    agent: _RecordingAgent = worker.nixl_wrapper
    mapping = worker.tp_mappings[PREFILL]
    if worker._recv_failures or not worker._failed_recv_reqs.empty():
        raise _Refused("read", RuntimeError("the READ was routed to failure reporting"))
    reads = [
        _read_summary(
            transfer,
            agent,
            prefill=pair.prefill,
            decode=decode,
            remote_block_ids=pair.outcome["request"]["remote_block_ids"],
            local_block_ids=received["allocated_block_ids"],
        )
        for transfer in agent.transfers
    ]
    written: dict[int, dict[str, list[list[int]]]] = {}
    for read in reads:
        for group in read["groups"]:
            into = written.setdefault(group["group"], {})
            for key, spans in group["written"].items():
                into.setdefault(key, []).extend(spans)
    layouts = _layouts(decode.plan, 0)
    coverage = {}
    for group in range(len(received["local_block_ids"])):
        gaps = _unwritten(layouts.get(group, []), written.get(group, {}))
        coverage[group] = {"complete": not gaps, "unwritten": gaps}
    return {
        "coverage": coverage,
        "handshake_targets": [rank for _, rank in channel.queries],
        "source_ranks_per_group": [list(r) for r in mapping.source_ranks_per_group],
        "local_consumers": mapping.local_consumers,
        "tp_ratio": worker.transfer_topo.tp_ratio(handshake["tp_size"]),
        "reads": reads,
        "notifications": [(name, message.decode()) for name, message in agent.notifications],
    }


def per_kind(outcome: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """A served transfer per decode TP rank and decode KV-cache group: the group's kind
    (``kda``, ``k_cache+latent``, ``tail``), the prefill ranks read, the block pairs
    (prefill block, decode block), copies per block from each prefill rank, the bytes per
    block from all of them and whether every layer part of the group got written."""
    kinds = {g["index"]: "+".join(g["roles"]) for g in outcome["decode"]["groups"]}
    table: dict[int, list[dict[str, Any]]] = {}
    for rank, entry in outcome["ranks"].items():
        groups: dict[int, dict[str, Any]] = {}
        for read in entry["reads"]:
            source = int(read["prefill_agent"].rsplit("tp", 1)[1])
            for group in read["groups"]:
                row = groups.setdefault(
                    group["group"],
                    {
                        "group": group["group"],
                        "kind": kinds[group["group"]],
                        "prefill_ranks": [],
                        "block_pairs": [tuple(p) for p in group["block_pairs"]],
                        "copies_per_block": len(group["copies_per_block"] or []),
                        "bytes_per_block": 0,
                    },
                )
                row["prefill_ranks"].append(source)
                row["bytes_per_block"] += group["bytes_per_block"] or 0
        for index, row in groups.items():
            row["complete"] = entry["coverage"][index]["complete"]
        table[rank] = [groups[g] for g in sorted(groups)]
    return table


def describe(outcome: dict[str, Any]) -> str:
    """The outcome in a few lines (refusal, or per decode rank and READ the groups)."""
    lines = []
    if outcome["refused"] is not None:
        r = outcome["refused"]
        return f"REFUSED at {r['step']} ({r['check']}, {r['where']}): {r['error']}: {r['message']}"
    if "unsupported" in outcome:
        return f"UNSUPPORTED: {outcome['unsupported']}"
    request = outcome["request"]
    lines.append(
        f"prefill computed {request['prefill']['prompt_tokens_computed']} "
        f"remote_block_ids {request['remote_block_ids']}; decode local "
        f"{request['decode']['local_block_ids']}"
    )
    for rank, entry in outcome["ranks"].items():
        for read in entry["reads"]:
            for group in read["groups"]:
                lines.append(
                    f"D{rank} <- {read['prefill_agent']} g{group['group']} "
                    f"pairs {group['block_pairs']} bytes/block {group['bytes_per_block']}"
                )
    return "\n".join(lines)
