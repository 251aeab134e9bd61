"""Every public function of every public module, fed arbitrary values: only
:class:`~k3layout.Refusal` escapes. The root's entry points are fuzzed with structured
values in ``test_fuzz_entry_points``; here each function exported by a subpackage
(``__all__``), the torch adapter and the vLLM bridge gets junk and real objects of the
wrong kind in every parameter, keyword-only ones included."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import tempfile
import types
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3layout import Deployment, Refusal, plan, plan_transfer, plan_vllm, preset

EXAMPLES = int(os.environ.get("K3LAYOUT_FUZZ_EXAMPLES", "120")) // 4
"""Examples per function (a quarter of the entry points' budget: there are many more)."""

MODULES = [
    "k3layout.cache",
    "k3layout.draw",
    "k3layout.engines.sglang",
    "k3layout.engines.sglang.pools",
    "k3layout.engines.tokenspeed",
    "k3layout.engines.vllm",
    "k3layout.registry",
    "k3layout.layouts",
    "k3layout.model",
    "k3layout.offload",
    "k3layout.testing",
    "k3layout.transfer",
]
TORCH_MODULES = ["k3layout.torch"]

SKIPPED = {"register"}  # the vLLM plugin's entry point: it patches vLLM, tested on its own

MODEL = preset("kimi-linear-48b")
DEPLOYMENT = Deployment(attn_tp=4)
PLAN = plan_vllm(MODEL, DEPLOYMENT)
SGLANG_PLAN = plan(MODEL, Deployment(engine="sglang", attn_tp=4))
TRANSFER = plan_transfer(MODEL, Deployment(attn_tp=2), DEPLOYMENT, prompt_tokens=2048)

junk = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, -1, 1, 2**63, 10**400])
    | st.floats()
    | st.text(max_size=6)
    | st.binary(max_size=4)
    | st.lists(st.integers(-3, 9) | st.text(max_size=2), max_size=4)
    | st.tuples(st.integers(-3, 9), st.integers(-3, 9))
    | st.dictionaries(st.text(max_size=4), st.integers(-3, 9), max_size=3)
    | st.just(types.SimpleNamespace())
    | st.just(object())
    | st.just(MODEL)
    | st.just(DEPLOYMENT)
    | st.just(PLAN)
    | st.just(SGLANG_PLAN)
    | st.just(TRANSFER)
    | st.just(TRANSFER.pairs)
)


def public_functions(modules: list[str]) -> list[tuple[str, Callable[..., Any]]]:
    found: dict[str, tuple[str, Callable[..., Any]]] = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value) and name not in SKIPPED:
                found.setdefault(f"{module_name}.{name}", (f"{module_name}.{name}", value))
    return sorted(found.values())


def required(function: Callable[..., Any]) -> tuple[int, list[str]]:
    """How many positional parameters ``function`` needs, and its required keyword-only ones."""
    parameters = inspect.signature(function).parameters.values()
    positional = [
        p
        for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    keywords = [p.name for p in parameters if p.default is p.empty and p.kind is p.KEYWORD_ONLY]
    return len(positional), keywords


def fuzz(function: Callable[..., Any], values: st.SearchStrategy[Any]) -> None:
    count, keywords = required(function)
    optional = [
        p.name
        for p in inspect.signature(function).parameters.values()
        if p.default is not p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(
        st.lists(values, min_size=count, max_size=count),
        st.fixed_dictionaries({k: values for k in keywords}),
        st.dictionaries(st.sampled_from(optional), values, max_size=2) if optional else st.just({}),
    )
    def call(args: list[Any], required_keywords: dict[str, Any], extra: dict[str, Any]) -> None:
        with contextlib.suppress(Refusal):
            function(*args, **required_keywords, **extra)

    # a function that writes files writes them in a scratch folder
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        call()


@pytest.mark.parametrize(
    ("name", "function"), public_functions(MODULES), ids=lambda v: v if isinstance(v, str) else ""
)
def test_only_refusals_escape(name: str, function: Callable[..., Any]) -> None:
    fuzz(function, junk)


@pytest.mark.parametrize(
    ("name", "function"),
    public_functions(TORCH_MODULES) if importlib.util.find_spec("torch") else [],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_only_refusals_escape_the_torch_adapter(name: str, function: Callable[..., Any]) -> None:
    torch = pytest.importorskip("torch")
    adapter = importlib.import_module("k3layout.torch")
    allocate, block_tables, validate = adapter.allocate, adapter.block_tables, adapter.validate

    cache = allocate(PLAN, 8)
    live = validate(PLAN, cache.registered)
    tables = block_tables(PLAN, PLAN.block_tokens, range(8))
    tensors = st.sampled_from(
        [
            torch.zeros(3),
            torch.zeros(0),
            torch.zeros(2, 3, dtype=torch.float64),
            torch.zeros(2, 2, device="meta"),
            torch.tensor(1.0),
            torch.empty(2, 6, dtype=torch.uint8)[:, ::2],
            cache.planes[0],
        ]
    )
    values = (
        junk
        | tensors
        | st.just(cache)
        | st.just(cache.registered)
        | st.just(live)
        | st.just(tables)
        | st.lists(tensors, max_size=2)
        | st.dictionaries(st.sampled_from(sorted(cache.registered)), tensors, max_size=3)
    )
    fuzz(function, values)
