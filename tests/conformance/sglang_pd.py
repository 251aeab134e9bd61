"""What SGLang 0.5.23's prefill-to-decode (PD) disaggregation transfers to one Kimi-K3 decode
rank, computed by SGLang's own code: which prefill ranks the decode rank pairs with, which of
them write the MLA KV, and the byte blocks of each KDA state tensor (conv, temporal) that each
of them writes into the decode rank's state slot, or SGLang's reason for failing.

A conformance harness: it imports only SGLang, torch, numpy (which SGLang needs), the standard
library and its sibling ``sglang_platform.py`` (the Triton and torchvision stand-ins SGLang needs
to import on a CPU-only box, shared with ``sglang_engine.py``), and pytest only inside
``require_sglang``; never ``k3layout``. Nothing of SGLang is copied or reimplemented: every
answer comes from calling SGLang's functions and methods on stand-in objects. What each
stand-in replaces (a ZMQ socket, an HTTP request, a Mooncake session, a GPU-sized pool) is said
where it is built. SGLang is imported with ``importlib`` so that type checking and collection
work where it is not installed.

Entry points::

    sglang_pd_case(prefill_tp=8, decode_tp=2, decode_rank=1) -> dict   # one decode rank
    deployment_outcome(prefill_tp=8, decode_tp=3) -> dict              # every rank + verdict
    grid() -> list[dict]                                                # TP_SIZES x TP_SIZES
    dcp_token_plan(dcp_size=4, dcp_rank=1, page_size=64, num_pages=8)   # DCP rows of a rank

Everything runs on CPU, a few milliseconds a case (the grid of 416 ranks in ~15 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import re
import threading
import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from sglang_platform import (
    SGLANG_VERSION,
    install_platform_stubs,
    sglang_importable,
    skip_without_sglang,
)

TP_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)

# Kimi-K3's KDA geometry: 96 heads of 128, short-conv kernel 4. SGLang keeps the conv state as
# [K-1, q|k|v channels / tp] in the conv dtype and the temporal (recurrent) state as
# [H/tp, K, V] in the SSM dtype (fp32 by default).
K3: dict[str, int] = {"kda_heads": 96, "head_dim": 128, "conv_kernel": 4}
_ROOM = 4242  # bootstrap room of the one request every case transfers
_ADDR = "prefill-bootstrap:8998"  # never resolved: the HTTP layer is stood in (below)
_SRC_SLOT = 3  # mamba slot of the request on the prefill rank
_DST_SLOT = 5  # mamba slot of the request on the decode rank

Json = dict[str, Any]


def sglang_available() -> bool:
    """True where SGLang ``SGLANG_VERSION`` and the PD modules this harness drives
    import."""
    return sglang_importable(_sgl)


def require_sglang() -> None:
    """Skip the calling test module unless SGLang ``SGLANG_VERSION`` is importable."""
    skip_without_sglang(_sgl, "PD modules")


_MODULES: dict[str, Any] = {}


def _sgl() -> Any:
    """SGLang's modules (and torch), imported once, after ``install_platform_stubs``."""
    if not _MODULES:
        install_platform_stubs()
        names = {
            "torch": "torch",
            "mamba_utils": "sglang.srt.configs.mamba_utils",
            "pd_utils": "sglang.srt.disaggregation.utils",
            "base_conn": "sglang.srt.disaggregation.base.conn",
            "common_conn": "sglang.srt.disaggregation.common.conn",
            "common_utils": "sglang.srt.disaggregation.common.utils",
            "mooncake_conn": "sglang.srt.disaggregation.mooncake.conn",
            "decode": "sglang.srt.disaggregation.decode",
            "dist_utils": "sglang.srt.distributed.utils",
            "memory_pool": "sglang.srt.mem_cache.memory_pool",
        }
        loaded = {k: importlib.import_module(v) for k, v in names.items()}
        _MODULES.update(loaded)
    return types.SimpleNamespace(**_MODULES)


def _kv_class(kind: str) -> Any:
    """The Mooncake backend's class of a kind, by SGLang's own ``get_kv_class``."""
    u = _sgl().pd_utils
    return u.get_kv_class(u.TransferBackend.MOONCAKE, getattr(u.KVClassType, kind))


# --------------------------------------------------------------------------------------------
# Pools: SGLang's own state shape and pool methods, over small CPU tensors
# --------------------------------------------------------------------------------------------


def _torch_dtype(name: str) -> Any:
    torch = _sgl().torch
    return {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "float32": torch.float32,
        "fp32": torch.float32,
        "fp8": torch.float8_e4m3fn,
        "fp8_e4m3": torch.float8_e4m3fn,
    }[name]


def _kv_dtype_str(name: str) -> str:
    """SGLang's ``--kv-cache-dtype`` spelling (both roles must register the same)."""
    return "auto" if name in ("bf16", "bfloat16", "auto") else "fp8_e4m3"


def _stage_layers(num_hidden_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    # SGLang's own layer split of a PP stage (SGLANG_PP_LAYER_PARTITION unset).
    lo, hi = _sgl().dist_utils.get_pp_indices(num_hidden_layers, pp_rank, pp_size)
    return int(lo), int(hi)


_POOLS: dict[tuple[Any, ...], types.SimpleNamespace] = {}


def _hybrid_pool(
    *,
    attn_tp: int,
    kda_layers: tuple[int, ...],
    mla_layers: tuple[int, ...],
    geometry: Json,
) -> types.SimpleNamespace:
    """One attention-TP rank's ``HybridLinearKVPool`` (made without ``__init__``), holding a
    ``MambaPool`` and an ``MLATokenToKVPool`` (both made without ``__init__``, which want a
    GPU-sized budget, kernels and the global parallel state).

    * The KDA state shape is SGLang's ``KimiLinearStateShape.create`` with the attention TP
      size (what ``KimiLinearConfig.mamba2_cache_params`` calls), so ``conv = [(K-1,
      (q+k+v)/tp)]``, ``temporal = (H/tp, K, V)``, ``conv_slice_axis = 1`` and
      ``conv_shard_groups = [H*D, H*D, H*D]``. A TP size that does not divide the heads is
      refused there, by SGLang's ``divide``.
    * The ``MambaPool``'s ``mamba_cache`` is SGLang's own ``MambaPool.State`` over CPU tensors
      of the shapes ``__init__`` allocates (``[layers, slots] + shape``, the non-envelope
      layout), with the ``mamba_layer_ids`` / ``conv_shard_groups`` / ``conv_slice_axis``
      attributes ``__init__`` sets, so the pool's own ``get_contiguous_buf_infos``,
      ``get_state_dim_per_tensor``, ``get_state_slice_outer_counts``,
      ``get_state_conv_shard_groups`` and ``get_state_layer_ids`` give the metadata.
    * Only the MLA pool's class matters (to ``is_mla_backend`` and ``setup_state_kv_args``);
      its KV buffers are given as one small CPU tensor per MLA layer, ``[tokens, 1,
      kv_lora_rank + qk_rope_head_dim]`` as ``MLATokenToKVPool`` shapes them (uint8 for fp8).
    """
    key = (attn_tp, kda_layers, mla_layers, tuple(sorted(geometry.items())))
    if key in _POOLS:
        return _POOLS[key]
    s = _sgl()
    torch = s.torch
    g = geometry
    shape = s.mamba_utils.KimiLinearStateShape.create(
        tp_world_size=attn_tp,
        num_heads=g["kda_heads"],
        head_dim=g["head_dim"],
        conv_kernel_size=g["conv_kernel"],
    )
    dtype = s.mamba_utils.Mamba2StateDType(
        conv=_torch_dtype(g["conv_dtype"]), temporal=_torch_dtype(g["ssm_dtype"])
    )
    params = s.mamba_utils.KimiLinearCacheParams(shape=shape, layers=list(kda_layers), dtype=dtype)
    slots = max(_SRC_SLOT, _DST_SLOT) + 1
    n = len(kda_layers)
    mamba = object.__new__(s.memory_pool.MambaPool)
    mamba.mamba_layer_ids = list(kda_layers)
    mamba.mamba_cache = s.memory_pool.MambaPool.State(
        conv=[torch.empty((n, slots, *c), dtype=dtype.conv) for c in shape.conv],
        temporal=torch.empty((n, slots, *shape.temporal), dtype=dtype.temporal),
    )
    mamba.conv_shard_groups = getattr(params.shape, "conv_shard_groups", None)
    mamba.conv_slice_axis = getattr(params.shape, "conv_slice_axis", 0)

    store = torch.uint8 if "fp8" in g["kv_dtype"] else _torch_dtype(g["kv_dtype"])
    width = g["kv_lora_rank"] + g["qk_rope_head_dim"]
    mla_buffers = [torch.empty((2 * g["page_size"], 1, width), dtype=store) for _ in mla_layers]

    hybrid = object.__new__(s.memory_pool.HybridLinearKVPool)
    hybrid.full_kv_pool = object.__new__(s.memory_pool.MLATokenToKVPool)
    hybrid.mamba_pool = mamba
    hybrid.use_dsa = False
    pool = types.SimpleNamespace(
        hybrid=hybrid,
        mamba=mamba,
        shape=shape,
        mla_buffers=mla_buffers,
        page_size=g["page_size"],
        kv_dtype=g["kv_dtype"],
        mla_layers=mla_layers,
    )
    _POOLS[key] = pool
    return pool


def _kv_args(
    pool: types.SimpleNamespace, *, engine_rank: int, pp_rank: int, start_layer: int, end_layer: int
) -> Any:
    """The backend's ``KVArgs`` as ``_init_kv_manager`` fills it (prefill: ``engine_rank =
    tp_rank``; decode: ``tp_rank % attn_tp_size``), its state part written by SGLang's own
    ``setup_state_kv_args`` from the pool. The MLA part is what
    ``MLATokenToKVPool.get_contiguous_buf_infos`` reports: one buffer per MLA layer, one page
    of it per item."""
    s = _sgl()
    args = _kv_class("KVARGS")()
    args.engine_rank = engine_rank
    args.pp_rank = pp_rank
    args.system_dp_rank = 0
    args.kv_cache_dtype_str = _kv_dtype_str(pool.kv_dtype)
    args.kv_layout = None
    args.page_size = pool.page_size
    args.prefill_start_layer = start_layer
    args.prefill_end_layer = end_layer
    args.kv_data_ptrs = [b.data_ptr() for b in pool.mla_buffers]
    args.kv_data_lens = [b.nbytes for b in pool.mla_buffers]
    args.kv_item_lens = [b[0].nbytes * pool.page_size for b in pool.mla_buffers]
    args.kv_layer_ids = list(pool.mla_layers)
    args.aux_data_ptrs, args.aux_data_lens, args.aux_item_lens = [], [], []
    args.num_draft_entries = 0
    args.gpu_id = 0
    args.ib_device = None
    args.rust_http_port = None
    s.pd_utils.setup_state_kv_args(args, pool.hybrid)
    return args


def _entry_labels(pool: types.SimpleNamespace) -> list[tuple[str, int]]:
    """(tensor name, layer id) of each state transfer entry, in SGLang's own entry order."""
    return [(f, layer) for f, _, _, layer in pool.mamba._iter_transfer_state_entries()]


# --------------------------------------------------------------------------------------------
# Managers: MooncakeKVManager shells with the attributes __init__ would set
# --------------------------------------------------------------------------------------------


def _manager(
    kv_args: Any,
    pool: types.SimpleNamespace,
    *,
    attn_tp: int,
    pp_size: int,
    pp_rank: int,
    cp_size: int,
    cp_rank: int,
    dcp_size: int,
    dcp_rank: int,
    decode: bool,
) -> Any:
    """A ``MooncakeKVManager`` made without ``__init__`` (which binds ZMQ sockets, starts a
    Mooncake transfer engine and threads, and reads the global parallel state), with the
    fields ``CommonKVManager.__init__`` derives for a Kimi-K3 rank: ``is_mla_backend`` is
    SGLang's ``is_mla_backend(token_to_kv_pool)`` of the *hybrid* pool (False), and
    ``is_hybrid_mla_backend`` what ``setup_state_kv_args`` wrote (True: its full pool is MLA);
    ``state_tp_size`` is the attention TP size (no CP-TP group sharing); a hybrid decode, and a
    hybrid prefill under CP, transfer with every CP rank (``enable_all_cp_ranks_for_transfer``).
    """
    s = _sgl()
    m = object.__new__(_kv_class("MANAGER"))
    m.kv_args = kv_args
    m.kv_cache_dtype_str = kv_args.kv_cache_dtype_str
    m.kv_layout = None
    m.dsv41_spec_layout = None
    m.is_mla_backend = s.pd_utils.is_mla_backend(pool.hybrid)
    m.is_hybrid_mla_backend = kv_args.is_hybrid_mla_backend
    m.attn_tp_size = attn_tp
    m.attn_tp_rank = kv_args.engine_rank % attn_tp
    m.state_tp_size = attn_tp
    m.attn_cp_size, m.attn_cp_rank = cp_size, cp_rank
    m.dcp_size, m.dcp_rank = dcp_size, dcp_rank
    m.attn_dp_size, m.attn_dp_rank = 1, 0
    m.pp_size, m.pp_rank = pp_size, pp_rank
    m.kv_shard_rank, m.kv_shard_size = 0, 1
    m.enable_all_cp_ranks_for_transfer = bool(m.is_hybrid_mla_backend and (decode or cp_size > 1))
    m.enable_staging = False
    m.local_ip = "127.0.0.1"
    m.rank_port = 17000 + kv_args.engine_rank
    m.failure_lock = threading.Lock()
    m.failure_records = {}
    m.request_status = {}
    m.connection_lock = threading.Lock()
    m.connection_pool = {}
    m.prefill_info_table = {}
    m._deferred_ack_targets = {}
    m._deferred_ack_poisoned_rooms = set()
    m._staging_outstanding = {}
    m.deferred_bootstrap = None
    m.defer_decode_allocation = False
    session = f"decode-rank-{kv_args.engine_rank}"
    m.get_session_id = lambda: session  # the Mooncake session name
    return m


# --------------------------------------------------------------------------------------------
# Bootstrap server: SGLang's own route handlers, called without aiohttp's server
# --------------------------------------------------------------------------------------------


class _Request:
    """Stands in for ``aiohttp.web.Request``: the handlers read ``.query`` and ``await
    .json()``."""

    def __init__(self, query: dict[str, str] | None = None, payload: Json | None = None):
        self.query = query or {}
        self._payload = payload

    async def json(self) -> Json | None:
        return self._payload


def _port(cp: int, pp: int, tp: int) -> int:
    """The port a prefill rank registers: it encodes (cp, pp, tp), so that a bootstrap answer
    says which rank it names (a real rank registers its ZMQ port)."""
    return 20000 + 1000 * cp + 100 * pp + tp


def _peer(bootstrap_info: Json) -> tuple[int, int, int]:
    n = int(bootstrap_info["rank_port"]) - 20000
    return n // 1000, (n // 100) % 10, n % 100  # cp, pp, tp


def _bootstrap_server(
    *,
    prefill_tp: int,
    prefill_pp: int,
    prefill_cp: int,
    prefill_dp: int,
    page_size: int,
    kv_dtype: str,
) -> Any:
    """A ``CommonKVBootstrapServer`` made without ``__init__`` (which starts the aiohttp
    server thread), with the fields ``__init__`` sets, every prefill rank registered through
    SGLang's own ``_handle_route_put`` with the payload ``register_to_bootstrap`` sends."""
    s = _sgl()
    srv = object.__new__(s.common_conn.CommonKVBootstrapServer)
    srv.lock = asyncio.Lock()
    for f in (
        "pp_size",
        "attn_tp_size",
        "attn_cp_size",
        "dp_size",
        "page_size",
        "kv_cache_dtype",
        "kv_layout",
        "dsv41_spec_layout",
        "follow_bootstrap_room",
        "enable_dsa_cache_layer_split",
        "enable_kv_cache_sharding",
        "prefill_http_port",
    ):
        setattr(srv, f, None)
    srv.decode_allocation_policy = "early"
    srv.prefill_port_table = {}
    srv.room_to_dp_rank = {}
    srv._registered_count = 0
    ranks = [
        (dp, cp, tp, pp)
        for dp in range(prefill_dp)
        for cp in range(prefill_cp)
        for tp in range(prefill_tp)
        for pp in range(prefill_pp)
    ]
    for dp, cp, tp, pp in ranks:
        payload = {
            "attn_tp_size": prefill_tp,
            "attn_tp_rank": tp,
            "attn_cp_size": prefill_cp,
            "attn_cp_rank": cp,
            "attn_dp_size": prefill_dp,
            "attn_dp_rank": dp,
            "pp_size": prefill_pp,
            "pp_rank": pp,
            "system_dp_size": 1,
            "system_dp_rank": 0,
            "rank_ip": "10.0.0.1",
            "rank_port": _port(cp, pp, tp),
            "page_size": page_size,
            "kv_cache_dtype": _kv_dtype_str(kv_dtype),
            "load_balance_method": "follow_bootstrap_room",
            "enable_kv_cache_sharding": False,
        }
        r = asyncio.run(srv._handle_route_put(_Request(payload=payload)))
        assert r.status == 200, r.text
    return srv


class _Response:
    """Stands in for a ``requests`` response, made from the handler's ``web.Response``."""

    def __init__(self, web_response: Any):
        self.status_code = int(web_response.status)
        self.text = str(web_response.text) if web_response.text is not None else ""
        self._body = web_response.body

    def json(self) -> Any:
        return json.loads(self._body)


class _Session:
    """Stands in for the ``requests`` session the decode uses for ``GET /route``: the query
    string goes straight to the server's own ``_handle_route_get``."""

    def __init__(self, srv: Any):
        self.srv = srv

    def get(self, url: str, timeout: float | None = None) -> _Response:
        query = dict(parse_qsl(urlsplit(url).query))
        return _Response(asyncio.run(self.srv._handle_route_get(_Request(query=query))))


@contextlib.contextmanager
def _patched(module: Any, **attrs: Any) -> Iterator[None]:
    saved = {k: getattr(module, k) for k in attrs}
    for k, v in attrs.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


@contextlib.contextmanager
def _http_to(srv: Any) -> Iterator[None]:
    """Route the decode's HTTP calls (``requests.get`` in ``try_ensure_parallel_info``,
    ``_get_bootstrap_session(addr).get`` in ``_get_bootstrap_info_from_server``) to ``srv``."""
    c = _sgl().common_conn
    session = _Session(srv)
    with (
        _patched(c.requests, get=session.get),
        _patched(c, _get_bootstrap_session=lambda addr: session),
    ):
        yield


@contextlib.contextmanager
def _plain_parallel() -> Iterator[None]:
    """``_should_skip_cp_replicated_state_transfer`` reads the global parallel state (only
    for a CP rank other than 0): stand it in with a plain Kimi-K3 deployment's flags (no DSA
    layer split, no CP-TP group sharing, no KV-cache sharding)."""
    flags = types.SimpleNamespace(
        enable_dsa_cache_layer_split=False,
        enable_cp_tp_group_sharing=False,
        enable_kv_cache_sharding=False,
    )
    with _patched(_sgl().common_conn, get_parallel=lambda: flags):
        yield


def _reason(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else str(exc)
    # Several of SGLang's asserts give a one-element tuple as their message.
    if isinstance(arg, tuple) and len(arg) == 1:
        arg = arg[0]
    return str(arg)


def _prefill_dp_rank(dm: Any) -> int:
    """Which prefill DP group serves the request: SGLang's own
    ``DecodePreallocQueue._resolve_prefill_dp_rank`` (made without ``__init__``; it reads
    only ``kv_manager.prefill_info_table``) on a request stand-in with no pinned DP rank."""
    q = object.__new__(_sgl().decode.DecodePreallocQueue)
    q.kv_manager = dm
    host, port = _ADDR.rsplit(":", 1)
    req = types.SimpleNamespace(
        bootstrap_host=host,
        bootstrap_port=int(port),
        disagg_prefill_dp_rank=None,
        bootstrap_room=_ROOM,
    )
    return int(q._resolve_prefill_dp_rank(req))


def _decode_pairing(dm: Any, srv: Any) -> Json:
    """The decode rank's side of bootstrapping, by SGLang's own code:
    ``try_ensure_parallel_info`` (its sanity checks, then ``_resolve_rank_mapping``), and a
    ``MooncakeKVReceiver``'s ``_setup_bootstrap_infos`` (one ``GET /route`` per target prefill
    rank). The receiver is made without ``__init__``; its ``_register_kv_args`` (a ZMQ send)
    is stood in by a no-op that succeeds."""
    s = _sgl()
    out: Json = {}
    with _http_to(srv):
        try:
            ok = dm.try_ensure_parallel_info(_ADDR)
        except (RuntimeError, AssertionError, ValueError) as exc:
            return {"refused": _reason(exc), "refused_at": "decode try_ensure_parallel_info"}
        if not ok:
            return {"refused": "no prefill server info", "refused_at": "decode"}
        info = dm.prefill_info_table[_ADDR]
        dp_rank = _prefill_dp_rank(dm)
        out["mapping"] = {
            "target_tp_rank": info.target_tp_rank,
            "target_tp_ranks": list(info.target_tp_ranks),
            "target_cp_ranks": list(info.target_cp_ranks),
            "target_pp_ranks": list(info.target_pp_ranks),
            "required_dst_info_num": info.required_dst_info_num,
            "required_prefill_response_num": info.required_prefill_response_num,
            "prefill_dp_rank": dp_rank,
        }
        rc = object.__new__(_kv_class("RECEIVER"))
        rc.bootstrap_room, rc.bootstrap_addr, rc.kv_mgr = _ROOM, _ADDR, dm
        rc.conclude_state = None
        rc._connection_pool_entries = {}
        rc.prefill_dp_rank = dp_rank
        rc.target_tp_rank, rc.target_tp_ranks = info.target_tp_rank, info.target_tp_ranks
        rc.target_cp_ranks, rc.target_pp_ranks = info.target_cp_ranks, info.target_pp_ranks
        rc._register_kv_args = lambda: True
        dm.update_status(_ROOM, s.base_conn.KVPoll.Bootstrapping)
        rc._setup_bootstrap_infos()
    if rc.conclude_state == s.base_conn.KVPoll.Failed:
        out["refused"] = dm.failure_records.get(_ROOM, "failed")
        out["refused_at"] = "decode CommonKVReceiver._setup_bootstrap_infos"
        said = [
            _Session(srv).get(
                f"http://{_ADDR}/route?prefill_dp_rank={dp_rank}&prefill_cp_rank={cp}"
                f"&target_tp_rank={tp}&target_pp_rank={pp}"
            )
            for cp in info.target_cp_ranks
            for tp in info.target_tp_ranks
            for pp in info.target_pp_ranks
        ]
        out["bootstrap_server_said"] = [r.text for r in said if r.status_code != 200]
        return out
    out["peers"] = [
        {
            "prefill_tp_rank": _peer(b)[2],
            "prefill_pp_rank": _peer(b)[1],
            "prefill_cp_rank": _peer(b)[0],
            "is_dummy": bool(b["is_dummy"]),
        }
        for b in rc.bootstrap_infos
    ]
    return out


# --------------------------------------------------------------------------------------------
# The case
# --------------------------------------------------------------------------------------------


def sglang_pd_case(
    *,
    prefill_tp: int,
    decode_tp: int,
    decode_rank: int,
    prefill_pp: int = 1,
    decode_pp: int = 1,
    decode_pp_rank: int = 0,
    prefill_cp: int = 1,
    decode_cp: int = 1,
    decode_dcp: int = 1,
    prefill_dp: int = 1,
    kda_heads: int = K3["kda_heads"],
    head_dim: int = K3["head_dim"],
    conv_kernel: int = K3["conv_kernel"],
    conv_dtype: str = "bfloat16",
    ssm_dtype: str = "float32",
    kv_dtype: str = "fp8_e4m3",
    kv_lora_rank: int = 512,
    qk_rope_head_dim: int = 64,
    page_size: int = 64,
    num_hidden_layers: int = 4,
    kda_layers: tuple[int, ...] | None = None,
) -> Json:
    """What SGLang 0.5.23 (Mooncake backend) transfers, for one request, to attention-TP rank
    ``decode_rank`` of a Kimi-K3 decode instance of attention TP ``decode_tp`` from a prefill
    instance of attention TP ``prefill_tp``. Sizes are *attention* TP sizes (``tp / dp``
    under attention DP); ``prefill_dp`` is the prefill's number of attention-DP groups.

    The model is ``num_hidden_layers`` layers, KDA on ``kda_layers`` (default: all but every
    fourth, Kimi-Linear's 3:1 pattern) and MLA on the rest. The result::

        {"sglang": "0.5.23", "case": {...the inputs...},
         "pool": {"is_mla_backend": False, "is_hybrid_mla_backend": True},
         "mapping": {target_tp_rank, target_tp_ranks, target_cp_ranks, target_pp_ranks,
                     required_dst_info_num, required_prefill_response_num, prefill_dp_rank},
         "peers": [{prefill_tp_rank, prefill_pp_rank, prefill_cp_rank, is_dummy}, ...],
         "kv": {"writers": [prefill ranks that write the MLA KV], "page_bytes", "layers",
                "dcp_relayout", ("dcp_tokens")},
         "state": {"path": "whole" | "slice", "src_shapes", "dst_shapes", "dst_item_bytes",
                   "dst_bytes_written", ("out_of_item"),
                   "by_source": [{prefill_tp_rank, prefill_pp_rank, prefill_cp_rank,
                                  writes_kv, writes_state, kv_layers, src_item_bytes,
                                  "conv": {"layers": [...], "blocks": [[src, dst, len], ...]},
                                  "temporal": {...}}, ...]}}

    A block ``[src, dst, len]`` is a byte copy from offset ``src`` of the request's item (one
    layer's slot) of that tensor on the prefill rank to offset ``dst`` of the item on the
    decode rank, in the order SGLang issues them. Where SGLang fails this decode rank, the
    result has ``"refused"`` (SGLang's own message) and ``"refused_at"``; what one rank's
    failure does to the deployment is ``deployment_outcome``'s to say.
    """
    if kda_layers is None:
        kda_layers = tuple(i for i in range(num_hidden_layers) if (i + 1) % 4 != 0)
    kda = tuple(kda_layers)
    mla = tuple(i for i in range(num_hidden_layers) if i not in kda)
    geometry: Json = {
        "kda_heads": kda_heads,
        "head_dim": head_dim,
        "conv_kernel": conv_kernel,
        "conv_dtype": conv_dtype,
        "ssm_dtype": ssm_dtype,
        "kv_dtype": kv_dtype,
        "kv_lora_rank": kv_lora_rank,
        "qk_rope_head_dim": qk_rope_head_dim,
        "page_size": page_size,
    }
    case: Json = {
        "prefill_tp": prefill_tp,
        "decode_tp": decode_tp,
        "decode_rank": decode_rank,
        "prefill_pp": prefill_pp,
        "decode_pp": decode_pp,
        "decode_pp_rank": decode_pp_rank,
        "prefill_cp": prefill_cp,
        "decode_cp": decode_cp,
        "decode_dcp": decode_dcp,
        "prefill_dp": prefill_dp,
        **geometry,
        "kda_layers": list(kda),
        "mla_layers": list(mla),
    }
    result: Json = {"sglang": SGLANG_VERSION, "case": case}

    def stage(pp_rank: int, pp_size: int) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
        lo, hi = _stage_layers(num_hidden_layers, pp_rank, pp_size)
        return (
            lo,
            hi,
            tuple(i for i in kda if lo <= i < hi),
            tuple(i for i in mla if lo <= i < hi),
        )

    # ---- the decode rank ------------------------------------------------------------------
    d_lo, d_hi, d_kda, d_mla = stage(decode_pp_rank, decode_pp)
    try:
        d_pool = _hybrid_pool(
            attn_tp=decode_tp, kda_layers=d_kda, mla_layers=d_mla, geometry=geometry
        )
    except (ValueError, AssertionError) as exc:  # heads not divisible by the decode TP
        return {**result, "refused": _reason(exc), "refused_at": "decode KimiLinearStateShape"}
    d_args = _kv_args(
        d_pool,
        engine_rank=decode_rank % decode_tp,
        pp_rank=decode_pp_rank,
        start_layer=d_lo,
        end_layer=d_hi,
    )
    dm = _manager(
        d_args,
        d_pool,
        attn_tp=decode_tp,
        pp_size=decode_pp,
        pp_rank=decode_pp_rank,
        cp_size=decode_cp,
        cp_rank=0,
        dcp_size=decode_dcp,
        dcp_rank=(decode_rank % decode_tp) % decode_dcp,
        decode=True,
    )
    result["pool"] = {
        "is_mla_backend": bool(dm.is_mla_backend),
        "is_hybrid_mla_backend": bool(dm.is_hybrid_mla_backend),
    }
    try:
        _hybrid_pool(attn_tp=prefill_tp, kda_layers=kda, mla_layers=mla, geometry=geometry)
    except (ValueError, AssertionError) as exc:
        return {**result, "refused": _reason(exc), "refused_at": "prefill KimiLinearStateShape"}
    srv = _bootstrap_server(
        prefill_tp=prefill_tp,
        prefill_pp=prefill_pp,
        prefill_cp=prefill_cp,
        prefill_dp=prefill_dp,
        page_size=page_size,
        kv_dtype=kv_dtype,
    )
    pairing = _decode_pairing(dm, srv)
    result.update(pairing)
    if "refused" in pairing:
        return result

    # What the decode rank registers with its prefill peers: SGLang's own wire message
    # (build_receiver_registration_message) read back by KVArgsRegisterInfo.from_zmq, so the
    # prefill side sees exactly the decode's metadata, as over ZMQ.
    reg = _sgl().mooncake_conn.KVArgsRegisterInfo.from_zmq(dm.build_receiver_registration_message())
    kv: Json = {
        "writers": [],
        "page_bytes": d_args.kv_item_lens[0] if d_mla else 0,
        "layers": list(d_mla),
        "dcp_relayout": False,
    }
    state: Json = {
        "path": None,
        "src_shapes": None,
        "dst_shapes": {"conv": list(d_pool.shape.conv[0]), "temporal": list(d_pool.shape.temporal)},
        "dst_item_bytes": _per_tensor(_entry_labels(d_pool), d_args.state_item_lens[0]),
        "by_source": [],
    }
    result["kv"], result["state"] = kv, state
    for peer in result["peers"]:
        if peer["is_dummy"]:
            continue
        refusal = _from_peer(
            peer,
            reg,
            result,
            stage=stage,
            geometry=geometry,
            prefill_tp=prefill_tp,
            prefill_pp=prefill_pp,
            prefill_cp=prefill_cp,
            page_size=page_size,
        )
        if refusal:
            return {**result, **refusal}
    _coverage(state)
    return result


def _from_peer(
    peer: Json,
    reg: Any,
    result: Json,
    *,
    stage: Callable[[int, int], tuple[int, int, tuple[int, ...], tuple[int, ...]]],
    geometry: Json,
    prefill_tp: int,
    prefill_pp: int,
    prefill_cp: int,
    page_size: int,
) -> Json | None:
    """One real prefill peer, as its transfer worker treats this decode rank: the KV path
    (DCP relayout or the plain copy of whole pages of the replicated MLA latent), whether it
    writes the KV and the state (``_get_dsa_cache_transfer_skip_flags``: within an
    aggregation group one prefill rank writes the KV, every rank its state heads), and the
    state blocks. Adds to ``result``; returns a refusal, if SGLang raises one."""
    kv, state = result["kv"], result["state"]
    p_rank, p_pp, p_cp = peer["prefill_tp_rank"], peer["prefill_pp_rank"], peer["prefill_cp_rank"]
    p_lo, p_hi, p_kda, p_mla = stage(p_pp, prefill_pp)
    p_pool = _hybrid_pool(attn_tp=prefill_tp, kda_layers=p_kda, mla_layers=p_mla, geometry=geometry)
    p_args = _kv_args(p_pool, engine_rank=p_rank, pp_rank=p_pp, start_layer=p_lo, end_layer=p_hi)
    pm = _manager(
        p_args,
        p_pool,
        attn_tp=prefill_tp,
        pp_size=prefill_pp,
        pp_rank=p_pp,
        cp_size=prefill_cp,
        cp_rank=p_cp,
        dcp_size=1,
        dcp_rank=0,
        decode=False,
    )
    state["src_shapes"] = {
        "conv": list(p_pool.shape.conv[0]),
        "temporal": list(p_pool.shape.temporal),
    }
    try:
        dcp = bool(pm.requires_dcp_relayout(reg.dst_dcp_size, reg.dst_dcp_rank))
    except RuntimeError as exc:
        return {
            "refused": _reason(exc),
            "refused_at": "prefill CommonKVManager.requires_dcp_relayout",
        }
    kv["dcp_relayout"] = dcp
    if dcp and "dcp_tokens" not in kv:
        kv["dcp_tokens"] = _dcp_tokens(reg.dst_dcp_size, reg.dst_dcp_rank, page_size)
    with _plain_parallel():
        skip_kv, skip_state = pm._get_dsa_cache_transfer_skip_flags(reg)
    if not skip_kv and p_mla:
        simple = prefill_pp == 1 and prefill_cp == 1
        kv["writers"].append(p_rank if simple else {"tp": p_rank, "pp": p_pp, "cp": p_cp})
    entry: Json = {
        "prefill_tp_rank": p_rank,
        "prefill_pp_rank": p_pp,
        "prefill_cp_rank": p_cp,
        "writes_kv": not skip_kv,
        "writes_state": not skip_state,
        # the MLA layers whose KV pages this source sends (its stage's, when it writes the KV)
        "kv_layers": list(p_mla) if not skip_kv else [],
    }
    if not skip_state and p_kda:
        path, blocks = _state_blocks(pm, p_args, reg, p_pool)
        state["path"] = path
        entry.update(blocks)
    state["by_source"].append(entry)
    return None


def _per_tensor(labels: list[tuple[str, int]], item_lens: list[int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (field, _), n in zip(labels, item_lens, strict=True):
        out.setdefault(field, int(n))
    return out


def _state_blocks(
    pm: Any,
    p_args: Any,
    reg: Any,
    p_pool: types.SimpleNamespace,
) -> tuple[str, Json]:
    """Drive SGLang's own ``MooncakeKVManager.maybe_send_extra`` for the request's one mamba
    slot and record the ``(src_addr, dst_addr, length)`` blocks it gives ``_transfer_data``
    (stood in: it records them instead of posting to a Mooncake session). The addresses are
    turned back into (tensor, layer, offset in the slot) with the pools' own pointers and
    item lengths; ``path`` says whether ``_send_mamba_state_slice`` was taken."""
    sent: list[tuple[int, int, int]] = []

    def record(session: str, blocks: list[tuple[int, int, int]]) -> int:
        sent.extend(blocks)
        return 0

    calls = {"slice": 0}
    real_slice: Callable[..., int] = pm._send_mamba_state_slice

    def spy(*a: Any, **k: Any) -> int:
        calls["slice"] += 1
        return real_slice(*a, **k)

    pm._transfer_data = record
    pm._send_mamba_state_slice = spy
    req = types.SimpleNamespace(
        mooncake_session_id=reg.mooncake_session_id, dst_state_indices=[[_DST_SLOT]]
    )
    rc = pm.maybe_send_extra(req, [[_SRC_SLOT]], None, reg)
    assert rc == 0, rc
    labels = _entry_labels(p_pool)
    src_ptrs, src_lens = p_args.state_data_ptrs[0], p_args.state_item_lens[0]
    dst_ptrs, dst_lens = reg.dst_state_data_ptrs[0], reg.dst_state_item_lens[0]

    def locate(addr: int, ptrs: list[int], lens: list[int], slot: int) -> tuple[int, int]:
        for i, (p, n) in enumerate(zip(ptrs, lens, strict=True)):
            base = p + n * slot
            if base <= addr < base + n:
                return i, addr - base
        raise AssertionError(f"address {addr:#x} is in no state slot")

    per: dict[str, dict[int, list[list[int]]]] = defaultdict(lambda: defaultdict(list))
    for src, dst, length in sent:
        i, so = locate(src, src_ptrs, src_lens, _SRC_SLOT)
        _, do = locate(dst, dst_ptrs, dst_lens, _DST_SLOT)
        field, layer = labels[i]
        per[field][layer].append([so, do, length])
    out: Json = {}
    for field, layers in per.items():
        if len({json.dumps(b) for b in layers.values()}) == 1:  # same at every layer: once
            out[field] = {"layers": sorted(layers), "blocks": next(iter(layers.values()))}
        else:
            out[field] = {"per_layer": {str(k): v for k, v in sorted(layers.items())}}
    out["src_item_bytes"] = _per_tensor(labels, src_lens)
    if calls["slice"]:
        out["nixl_same_blocks"] = _nixl_state_blocks(pm, p_args, reg) == sent
    return ("slice" if calls["slice"] else "whole"), out


def _nixl_state_blocks(pm: Any, p_args: Any, reg: Any) -> list[tuple[int, int, int]]:
    """The same slice transfer by the NIXL backend: SGLang's own
    ``NixlKVManager._send_mamba_state_slice`` on a manager made without ``__init__`` (the
    fields it reads copied from the Mooncake shell), its NIXL agent stood in by one that
    records the (address, length) descriptor lists instead of posting a transfer."""
    nixl = importlib.import_module("sglang.srt.disaggregation.nixl.conn")
    nm = object.__new__(nixl.NixlKVManager)
    nm.kv_args, nm.state_tp_size, nm.pp_size = p_args, pm.state_tp_size, pm.pp_size
    seen: dict[str, list[Any]] = {}

    def descs(addrs: list[tuple[int, int, int]], mem: str) -> list[tuple[int, int, int]]:
        seen.setdefault("descs", []).append(addrs)
        return addrs

    nm.agent = types.SimpleNamespace(get_xfer_descs=descs, initialize_xfer=lambda *a: "handle")
    nm._post_xfer = lambda handle, msg: None
    nm._send_mamba_state_slice(
        "decode-peer",
        [_SRC_SLOT],
        p_args.state_data_ptrs[0],
        p_args.state_item_lens[0],
        p_args.state_dim_per_tensor[0],
        reg.dst_state_data_ptrs[0],
        [_DST_SLOT],
        reg.dst_state_item_lens[0],
        reg.dst_state_dim_per_tensor[0],
        0,
        reg.dst_attn_tp_size,
        reg.dst_tp_rank,
        p_args.state_conv_shard_groups[0],
        p_args.state_slice_outer_counts[0],
        src_layer_ids=p_args.state_layer_ids[0],
        dst_layer_ids=reg.dst_state_layer_ids[0],
    )
    src, dst = seen["descs"]
    return [(a[0], b[0], a[1]) for a, b in zip(src, dst, strict=True)]


def _coverage(state: Json) -> None:
    """Per tensor: the bytes of the decode item that some source writes
    (``dst_bytes_written``, overlaps once) -- the item is fully written when this equals
    ``dst_item_bytes`` -- and any block reaching past the end of its source or destination
    item (``out_of_item``; SGLang does not check this)."""
    written_by: dict[str, int] = {}
    for field, dst_len in state["dst_item_bytes"].items():
        spans: list[tuple[int, int]] = []
        out: list[Json] = []
        for e in state["by_source"]:
            t = e.get(field)
            if not t:
                continue
            blocks: list[list[int]] = t.get("blocks") or next(
                iter(t.get("per_layer", {}).values()), []
            )
            for so, do, n in blocks:
                spans.append((do, do + n))
                if so + n > e["src_item_bytes"][field] or do + n > dst_len:
                    out.append({"prefill_tp_rank": e["prefill_tp_rank"], "block": [so, do, n]})
        written, end = 0, 0
        for start, stop in sorted(spans):
            begin = max(start, end)
            if stop > begin:
                written += stop - begin
                end = stop
        written_by[field] = written
        if out:
            state.setdefault("out_of_item", {})[field] = out
    state["dst_bytes_written"] = written_by


def dcp_token_plan(
    *, dcp_size: int, dcp_rank: int, page_size: int, num_pages: int
) -> list[tuple[int, int]]:
    """Every (prompt position, row in the decode rank's pages) pair a decode DCP rank receives
    of a fresh request of ``num_pages * page_size`` tokens, from SGLang's own
    ``build_dcp_token_transfer_plan`` (prefill pages 0.. in order, decode pages 0.. in
    order)."""
    import numpy as np  # noqa: PLC0415

    plan = _sgl().common_utils.build_dcp_token_transfer_plan(
        np.arange(num_pages, dtype=np.int32),
        np.arange(num_pages, dtype=np.int32),
        physical_page_size=page_size,
        dcp_size=dcp_size,
        dcp_rank=dcp_rank,
        num_kv_tokens=num_pages * page_size,
    )
    src = [int(x) for x in plan.target_src_token_indices.tolist()]
    dst = [int(x) for x in plan.target_dst_token_indices.tolist()]
    return list(zip(src, dst, strict=True))


def _dcp_tokens(dcp_size: int, dcp_rank: int, page_size: int, pages_per_rank: int = 2) -> Json:
    """Which of a fresh request's tokens a decode DCP rank receives (``dcp_token_plan``, a
    prompt of ``pages_per_rank * dcp_size`` pages): the first (prompt position, row in the
    decode rank's pages) pairs."""
    n_pages = pages_per_rank * dcp_size
    pairs = dcp_token_plan(
        dcp_size=dcp_size, dcp_rank=dcp_rank, page_size=page_size, num_pages=n_pages
    )
    src = [a for a, _ in pairs]
    dst = [b for _, b in pairs]
    return {
        "prompt_tokens": n_pages * page_size,
        "received": len(src),
        "first": [[a, b] for a, b in zip(src[:6], dst[:6], strict=True)],
    }


# --------------------------------------------------------------------------------------------
# Deployments and the grid
# --------------------------------------------------------------------------------------------


def deployment_outcome(*, prefill_tp: int, decode_tp: int, **kw: Any) -> Json:
    """Every decode rank of the deployment, and what it means for a request.

    The decode ranks of a group poll a request together (``poll_and_all_reduce`` takes the
    MIN of their ``KVPoll``), and so do the prefill ranks. So one decode rank whose pairing
    fails fails every request on the decode side; and a prefill rank that no decode rank ever
    contacts keeps its ``CommonKVSender`` in ``Bootstrapping`` until
    ``_check_bootstrap_timeout`` fails it, which fails every request on the prefill side. That
    reason is SGLang's own ``_check_bootstrap_timeout`` text, from a stand-in sender."""
    ranks = [
        sglang_pd_case(prefill_tp=prefill_tp, decode_tp=decode_tp, decode_rank=r, **kw)
        for r in range(decode_tp)
    ]
    refused = [r for r in ranks if "refused" in r]
    out: Json = {"ranks": ranks}
    if refused:
        out["refused"] = refused[0]["refused"]
        out["refused_at"] = refused[0]["refused_at"]
        out["refused_by_decode_ranks"] = [r["case"]["decode_rank"] for r in refused]
        return out
    contacted = {p["prefill_tp_rank"] for r in ranks for p in r["peers"]}
    missing = sorted(set(range(prefill_tp)) - contacted)
    if missing:
        out["refused"] = _bootstrap_timeout_reason()
        out["refused_at"] = "prefill CommonKVSender._check_bootstrap_timeout"
        out["never_contacted_prefill_ranks"] = missing
    return out


def _bootstrap_timeout_reason() -> str:
    """SGLang's own failure text from ``CommonKVSender._check_bootstrap_timeout``, on a
    sender made without ``__init__`` whose bootstrap began one timeout ago."""
    s = _sgl()
    timeout = s.common_conn.envs.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.get()
    records: dict[int, str] = {}

    def record_failure(room: int, reason: str) -> None:
        records[room] = reason

    mgr = types.SimpleNamespace(
        defer_decode_allocation=False,
        bootstrap_timeout=timeout,
        record_failure=record_failure,
        update_status=lambda room, status: None,
    )
    snd = object.__new__(s.common_conn.CommonKVSender)
    snd.kv_mgr = mgr
    snd.bootstrap_room = _ROOM
    snd.init_time = time.time() - timeout
    snd._prefill_complete_time = None
    assert snd._check_bootstrap_timeout() == s.base_conn.KVPoll.Failed
    # The elapsed seconds differ by milliseconds run to run: say the configured timeout.
    return re.sub(r"after [0-9.]+s", f"after {float(timeout):.1f}s", records[_ROOM])


def grid(sizes: tuple[int, ...] = TP_SIZES, **kw: Any) -> list[Json]:
    """``sglang_pd_case`` over prefill TP x decode TP in ``sizes`` x every decode rank, each
    rank that is fine itself marked with its deployment's failure where there is one
    (``deployment_refused``, ``deployment_refused_at`` and the ranks to blame)."""
    rows: list[Json] = []
    for ptp in sizes:
        for dtp in sizes:
            dep = deployment_outcome(prefill_tp=ptp, decode_tp=dtp, **kw)
            for r in dep["ranks"]:
                if "refused" not in r and "refused" in dep:
                    r["deployment_refused"] = dep["refused"]
                    r["deployment_refused_at"] = dep["refused_at"]
                    for k in ("never_contacted_prefill_ranks", "refused_by_decode_ranks"):
                        if k in dep:
                            r[k] = dep[k]
                rows.append(r)
    return rows


if __name__ == "__main__":
    # python sglang_pd.py PREFILL_TP DECODE_TP DECODE_RANK   one case, as JSON
    # python sglang_pd.py --grid OUT.json                    the TP_SIZES grid, every rank
    import logging
    import sys

    logging.disable(logging.ERROR)  # SGLang logs each 404 and slice transfer: noise here
    if sys.argv[1] == "--grid":
        rows = grid()
        with open(sys.argv[2], "w") as f:
            json.dump(
                {"sglang": SGLANG_VERSION, "sizes": list(TP_SIZES), "model": K3, "rows": rows},
                f,
                separators=(",", ":"),
            )
        print(f"{len(rows)} decode ranks written to {sys.argv[2]}")
    else:
        p, d, r = (int(x) for x in sys.argv[1:4])
        print(json.dumps(sglang_pd_case(prefill_tp=p, decode_tp=d, decode_rank=r), indent=1))
