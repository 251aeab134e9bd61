"""The engine-layout protocol and the cache specs refuse bad arguments: a wrong type, an index
that is not there, a channel group that does not exist. Only ``Refusal`` leaves them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import pytest

from k3layout import (
    Deployment,
    ParentPlan,
    Refusal,
    ReplicaShard,
    VllmPlan,
    conv_channel_offset,
    plan,
    plan_parent,
    plan_vllm,
    preset,
)
from k3layout.constants import MAX_KV_MEMORY_BYTES

VLLM: VllmPlan = plan_vllm(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2))
PARENT: ParentPlan = plan_parent(preset("kimi-k3"), Deployment(attn_tp=8))
KDA = VLLM.sizes.spec_of(0)

BAD_CALLS: dict[str, Callable[[], object]] = {
    "an unknown conv channel group": lambda: conv_channel_offset(KDA, "x", 8),
    "a conv offset of no spec": lambda: conv_channel_offset(None, "k", 8),  # type: ignore[arg-type]
    "an MLA spec's conv offset": lambda: conv_channel_offset(VLLM.sizes.attention, "k", 8),
    "a local offset of an int": lambda: KDA.part("conv").local_offset(5, 8),  # type: ignore[arg-type]
    "a local offset of strings": lambda: KDA.part("conv").local_offset(("a", 0, 0, 0), 8),  # type: ignore[arg-type]
    "a local offset outside the shape": lambda: KDA.part("conv").local_offset((9, 0, 0, 0), 8),
    "a spec of a string layer": lambda: VLLM.sizes.spec_of("x"),  # type: ignore[arg-type]
    "a spec of a layer past the model": lambda: VLLM.sizes.spec_of(98),
    "a string stage": lambda: VLLM.stage("x"),  # type: ignore[arg-type]
    "groups of a string stage": lambda: VLLM.groups_of("kda", "y"),  # type: ignore[arg-type]
    "the payload of no group": lambda: VLLM.payload_bytes(None),  # type: ignore[arg-type]
    "a parent payload of no group": lambda: PARENT.payload_bytes(None),  # type: ignore[arg-type]
    "parent pages of no group": lambda: PARENT.pages_needed(None, 5),  # type: ignore[arg-type]
    "page axes of no group": lambda: PARENT.page_axes(None, 3),  # type: ignore[arg-type]
    "blocks in a string budget": lambda: VLLM.blocks_in("x"),  # type: ignore[arg-type]
    "parents in a string budget": lambda: PARENT.blocks_in("x"),  # type: ignore[arg-type]
    "bytes of a string block count": lambda: VLLM.blocks_bytes("x"),  # type: ignore[arg-type]
    "a plane of a string block count": lambda: PARENT.plane_span_bytes("x"),  # type: ignore[arg-type]
    "a string block's byte range": lambda: PARENT.byte_range(40, "conv", "x", 3),  # type: ignore[arg-type]
    "a block past the allocation": lambda: VLLM.byte_range(40, "conv", 3, 3),
    "a part the layer does not have": lambda: VLLM.byte_range(40, "latent", 0, 3),
    "a layer the stage does not hold": lambda: VLLM.byte_range(98, "conv", 0, 3),
    "a string layer's ranges": lambda: VLLM.part_range_list("x"),  # type: ignore[arg-type]
    "a caption of a string plane count": lambda: VLLM.block_caption("x"),  # type: ignore[arg-type]
    "a replica shard of a string extent": lambda: ReplicaShard().local_size_and_offset("a", 2, 0),  # type: ignore[arg-type]
    "KV heads neither dividing nor divided": lambda: ReplicaShard().local_size_and_offset(3, 2, 0),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_a_bad_argument_is_a_named_refusal(name: str) -> None:
    with pytest.raises(Refusal) as refused:
        BAD_CALLS[name]()
    assert refused.value.code in {"invalid_argument", "uneven_split"}


# ---- integers too large to print ------------------------------------------------------------

HUGE_INTS = (-(10**5000), 10**5000, -(1 << 70), 1 << 70)
"""Beyond int64 either way, and beyond the 4,300 digits ``str()`` prints: a refusal that
printed the value itself would raise ``ValueError`` instead."""

PLANS = {
    "vllm": plan_vllm(preset("kimi-k3"), Deployment(attn_tp=8, pp=2)),
    "sglang": plan(preset("kimi-k3"), Deployment(engine="sglang", attn_tp=8)),
    "tokenspeed": PARENT,
}


def _int_calls() -> list[tuple[str, Callable[[], object]]]:
    """Each public method of each engine's plan with one int parameter given each huge int,
    the others at their defaults (or 1 for an int, ``None`` otherwise; a KV budget of 40 GiB,
    so that no call asks the GPU, which K3 at TP 8 does not fit)."""
    calls: list[tuple[str, Callable[[], object]]] = []
    for engine, result in PLANS.items():
        for name in dir(type(result)):
            method = getattr(result, name, None)
            if name.startswith("_") or not inspect.ismethod(method):
                continue
            params = list(inspect.signature(method).parameters.values())
            ints = [p.name for p in params if "int" in str(p.annotation)]
            base: dict[str, object] = {
                p.name: p.default
                if p.default is not inspect.Parameter.empty
                else (1 if p.name in ints else None)
                for p in params
            }
            if "kv_memory_bytes" in base:  # a budget given: the GPU's is tested elsewhere
                base["kv_memory_bytes"] = 40 << 30
            for param in ints:
                for value in HUGE_INTS:
                    given = {**base, param: value}
                    label = f"{engine}.{name}({param}={value.bit_length()} bits, sign {value > 0})"
                    calls.append((label, functools.partial(method, **given)))
    return calls


INT_CALLS = _int_calls()


def test_every_int_parameter_is_swept() -> None:
    # the capacity answers and the layout's addressing are among the calls (not skipped)
    labels = " ".join(label for label, _ in INT_CALLS)
    for method in ("capacity", "memory_for", "recommend", "byte_range", "bind", "num_blocks"):
        assert f".{method}(" in labels, method
    assert len(INT_CALLS) > 200


@pytest.mark.parametrize("label", [label for label, _ in INT_CALLS])
def test_a_huge_int_is_refused_not_raised(label: str) -> None:
    call = dict(INT_CALLS)[label]
    try:
        call()
    except Refusal as refusal:
        assert refusal.code in {"invalid_argument", "size_limit", "budget_too_small"}
        str(refusal)  # the message prints


@pytest.mark.parametrize("engine", list(PLANS))
def test_a_budget_beyond_the_bound_is_a_size_limit(engine: str) -> None:
    with pytest.raises(Refusal) as refused:
        PLANS[engine].capacity(MAX_KV_MEMORY_BYTES + 1, 8192)
    assert refused.value.code == "size_limit"
    assert refused.value.facts["field"] == "budget_bytes"
    assert PLANS[engine].capacity(MAX_KV_MEMORY_BYTES, 8192).max_requests > 0


def test_a_huge_int_argument_names_its_field_and_size() -> None:
    with pytest.raises(Refusal) as refused:
        PLANS["vllm"].byte_range(40, "conv", -(10**5000), 3)
    assert refused.value.code == "size_limit"
    assert refused.value.facts == {"field": "block", "bits": (10**5000).bit_length()}
    assert "<an integer of 16,610 bits>" in str(refused.value)
