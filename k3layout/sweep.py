"""Sweeps: plan a grid of attention TP x cache dtype for both engines, refusals included."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import reduce
from typing import cast

from pydantic import Field

from ._args import expect, expect_args, expect_positive, expect_sequence
from ._divisors import divisors
from ._frozen import Frozen
from .constants import MAX_RANKS
from .deployment import Deployment, EngineFlavour
from .dtypes import KvCacheDtype
from .errors import Refusal, RefusalCode
from .layouts import plan
from .layouts.recommend import gpu_budget, most_served
from .limits import check_bound
from .model import HybridModel
from .registry import engine_names, facts_of


class SweepCell(Frozen):
    """One (engine, attn_tp, kv_dtype) point: its headline numbers or its refusal code."""

    engine: EngineFlavour
    engine_version: str = Field(description="the engine release planned for")
    attn_tp: int
    kv_dtype: KvCacheDtype
    refusal: RefusalCode | None = None
    message: str | None = None
    packing: str | None = None
    padding: float | None = None
    bytes_per_token: float | None = None
    block_bytes: int | None = None

    @property
    def plannable(self) -> bool:
        """Whether the point planned."""
        return self.refusal is None


def default_attn_tps(model: HybridModel, limit: int = 64) -> tuple[int, ...]:
    """Every attention TP up to ``limit`` that divides the heads, plus the powers of two
    (some of which do not divide, and show their refusal). Refuses a ``limit`` that is not
    an int from 1 to ``MAX_RANKS`` (a rank id is an int32)."""
    expect("model", model, HybridModel)
    hint = "pass limit >= 1 (64 by default)"
    check_bound("limit", expect_positive("limit", limit, hint), MAX_RANKS, why="a rank id")
    heads = reduce(math.gcd, (layer.num_heads for layer in model.module_layers))
    dividing = {tp for tp in divisors(heads) if tp <= limit}
    powers = {1 << k for k in range(limit.bit_length()) if 1 << k <= limit}
    return tuple(sorted(dividing | powers))


def sweep_cell(model: HybridModel, deployment: Deployment) -> SweepCell:
    """Plan one point; a refusal becomes a cell carrying its code."""
    base: dict[str, object] = {
        "engine": deployment.engine,
        "engine_version": deployment.version_run,
        "attn_tp": deployment.attn_tp,
        "kv_dtype": deployment.kv_dtype,
    }
    try:
        result = plan(model, deployment)
    except Refusal as refusal:
        return SweepCell.model_validate({**base, "refusal": refusal.code, "message": str(refusal)})
    return SweepCell.model_validate(
        {
            **base,
            "packing": result.packing_label,
            "padding": result.worst_padding,
            "bytes_per_token": result.bytes_per_token,
            "block_bytes": result.block_bytes,
        }
    )


def _listed(values: object) -> object:
    """An iterable argument as a tuple (a generator, a set), else as given (and refused)."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        return values
    return tuple(values)


def sweep(
    model: HybridModel,
    attn_tps: Iterable[int],
    kv_dtypes: Iterable[KvCacheDtype] = ("fp8", "bf16"),
    engines: Iterable[EngineFlavour] | None = None,
    base: Deployment | None = None,
) -> tuple[SweepCell, ...]:
    """Plan every (engine, kv_dtype, attn_tp) point; ``base`` supplies the other fields.

    The padding of a ``vllm`` cell is the KDA page padding over ``S``; of a ``tokenspeed`` cell the
    largest group padding.
    """
    expect_args(("model", model, HybridModel), ("base", base, (Deployment, type(None))))
    tps = tuple(expect_sequence("attn_tps", _listed(attn_tps), int))
    dtypes = tuple(expect_sequence("kv_dtypes", _listed(kv_dtypes), str))
    listed = engine_names() if engines is None else _listed(engines)
    names = tuple(expect_sequence("engines", listed, str))
    fields = {} if base is None else {n: getattr(base, n) for n in Deployment.model_fields}
    cells: list[SweepCell] = []
    for engine in names:
        for kv_dtype in dtypes:
            for attn_tp in cast(tuple[int, ...], tps):
                if attn_tp < 1:
                    raise Refusal(
                        "invalid_argument",
                        f"attn_tp={attn_tp} must be >= 1",
                        facts={"attn_tp": attn_tp},
                    )
                deployment = Deployment.model_validate(
                    {
                        **fields,
                        "engine": engine,
                        "engine_version": release_for(fields, engine),
                        "kv_dtype": kv_dtype,
                        "attn_tp": attn_tp,
                        # an engine without DCP is swept at dcp 1 whatever the base says
                        "dcp": fields.get("dcp", 1)
                        if facts_of(engine).decode_context_parallel
                        else 1,
                    }
                )
                cells.append(sweep_cell(model, deployment))
    return tuple(cells)


def release_for(fields: Mapping[str, object], engine: object) -> object:
    """The release a swept ``engine`` plans for: the base deployment's where it names that
    engine (a release is one engine's), else ``None``, the engine's newest."""
    return fields.get("engine_version") if fields.get("engine") == engine else None


class RequestsCell(Frozen):
    """One (engine, context length) point of a budget: the requests it holds at once, or
    the refusal."""

    engine: EngineFlavour
    engine_version: str = Field(description="the engine release planned for")
    max_model_len: int
    kv_memory_bytes: int = Field(description="the KV budget per rank (0 where refused unasked)")
    max_requests: int | None = None
    refusal: RefusalCode | None = None


def requests_sweep(
    model: HybridModel,
    kv_memory_bytes: int | None,
    contexts: Iterable[int],
    base: Deployment | None = None,
    engines: Iterable[EngineFlavour] | None = None,
    *,
    recommended: bool = False,
) -> tuple[RequestsCell, ...]:
    """How requests trade against context length in one KV budget per rank, for every engine
    (``base`` supplies the deployment; each engine plans it as its own): the requests the
    engine holds with its settings as given, or (``recommended``) the most it serves with its
    recommended flags (:func:`~k3layout.layouts.recommend.most_served`). ``kv_memory_bytes``
    ``None``: each engine's own budget on the GPU, from the deployment's memory flag or KV
    budget (else the engine's default), checked against the GPU with the weights
    (:func:`~k3layout.layouts.recommend.gpu_budget`). A budget an engine refuses, or a
    deployment it does not run, becomes a cell carrying the refusal code."""
    expect_args(
        ("model", model, HybridModel),
        ("kv_memory_bytes", kv_memory_bytes, (int, type(None))),
        ("base", base, (Deployment, type(None))),
    )
    lengths = tuple(expect_sequence("contexts", _listed(contexts), int))
    listed = engine_names() if engines is None else _listed(engines)
    names = tuple(expect_sequence("engines", listed, str))
    fields = {} if base is None else {n: getattr(base, n) for n in Deployment.model_fields}
    cells: list[RequestsCell] = []
    for engine in names:
        release = release_for(fields, engine)
        version = release if isinstance(release, str) else facts_of(engine).versions[-1]
        try:
            deployment = Deployment.model_validate(
                {**fields, "engine": engine, "engine_version": release}
            )
            planned = plan(model, deployment)
            memory = kv_memory_bytes
            if memory is None:
                budget = gpu_budget(planned, None)
                memory = budget.kv_memory_bytes if budget else deployment.kv_memory_bytes
                assert memory is not None  # gpu_budget gives None only with a KV budget
        except Refusal as refusal:
            cells.extend(
                RequestsCell(
                    engine=engine,
                    engine_version=version,
                    max_model_len=n,
                    kv_memory_bytes=kv_memory_bytes or 0,
                    refusal=refusal.code,
                )
                for n in cast(tuple[int, ...], lengths)
            )
            continue
        for length in cast(tuple[int, ...], lengths):
            try:
                if recommended:
                    best = most_served(planned, length, memory)
                    held = 0 if best is None else best.requests
                else:
                    held = planned.capacity(memory, length).max_requests
            except Refusal as refusal:
                cells.append(
                    RequestsCell(
                        engine=engine,
                        engine_version=version,
                        max_model_len=length,
                        kv_memory_bytes=memory,
                        refusal=refusal.code,
                    )
                )
                continue
            cells.append(
                RequestsCell(
                    engine=engine,
                    engine_version=version,
                    max_model_len=length,
                    kv_memory_bytes=memory,
                    max_requests=held,
                )
            )
    return tuple(cells)
