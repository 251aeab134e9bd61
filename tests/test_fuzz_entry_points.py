"""Arbitrary JSON values fed to every public entry point: only :class:`~k3layout.Refusal`
escapes (issue 9). The command line, fed arbitrary argument lists, exits 0 or 2 and never
prints a traceback."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3layout import (
    Deployment,
    HybridModel,
    Refusal,
    RideOptions,
    check_pairing,
    load_plan,
    model_from_config,
    pairing_refusal,
    plan,
    plan_ride,
    plan_transfer,
    pp_stage_bounds,
    preset,
    rank_sizes,
)
from k3layout.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
K3_CONFIG: dict[str, Any] = json.loads((FIXTURES / "kimi-k3.config.json").read_text())
K3 = preset("kimi-k3")
K3_PLAN_JSON = plan(K3, Deployment(attn_tp=8)).model_dump_json()

EXAMPLES = int(os.environ.get("K3LAYOUT_FUZZ_EXAMPLES", "120"))
"""Examples per entry point; raise it (``K3LAYOUT_FUZZ_EXAMPLES=5000``) for a longer hunt."""

FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
)

T = TypeVar("T")

# ---- values -------------------------------------------------------------------------------

HUGE = [10**18, 2**63, -(2**63), 10**400, 2**31, (1 << 31) - 1, 1 << 16, (1 << 16) + 1]
"""Integers at and beyond the bounds (a 4,301-digit integer is added where JSON text is not
needed: ``json.dumps`` itself refuses it)."""

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=200)
    | st.integers()
    | st.sampled_from(HUGE)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, 1e308, -1.0, 128.0, math.nan, math.inf])
    | st.text(max_size=12)
    | st.sampled_from(["vllm", "tokenspeed", "fp8", "bf16", "mla", "kda", "kimi_k3", "align"])
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=10,
)
python_values = json_values | st.just(10**5000) | st.just(K3) | st.just(Deployment())


def record_dicts(fields: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts keyed mostly by a record's own fields, so validation goes past the keys."""
    keys = st.sampled_from(fields) | st.text(max_size=6)
    return st.dictionaries(keys, json_values, max_size=len(fields))


DEPLOYMENT_FIELDS = list(Deployment.model_fields)
small_ints = st.integers(min_value=-1, max_value=9) | st.sampled_from(HUGE)
deployment_dicts = st.fixed_dictionaries(
    {},
    optional={
        "engine": st.sampled_from(["vllm", "tokenspeed"]) | json_values,
        "attn_tp": st.sampled_from([1, 2, 4, 8, 16, 32, 5, 0]) | small_ints,
        "attn_dp": small_ints,
        "pp": st.integers(min_value=0, max_value=100) | small_ints,
        "dcp": st.sampled_from([1, 2, 4, 8, 7]) | small_ints,
        "dcp_interleave": st.sampled_from([1, 2, 64, 3]) | small_ints,
        "kv_dtype": st.sampled_from(["fp8", "bf16", "fp8_ds_mla", "fp4"]),
        "spec_tokens": st.integers(min_value=-1, max_value=70),
        "block_tokens": st.none() | st.sampled_from([1, 16, 128, 1000, 1 << 32, (1 << 32) + 1]),
        "max_padding": st.none() | st.floats(allow_nan=True, allow_infinity=True),
        "replayssm": st.booleans(),
        "replayssm_cache_len": st.integers(min_value=0, max_value=100) | small_ints,
        "pp_partition": st.none() | st.lists(small_ints, max_size=4),
    },
)


def only_refusals(action: Callable[[], T]) -> T | None:
    """Run ``action``; a :class:`Refusal` is an answer, any other exception fails the test."""
    try:
        return action()
    except Refusal as refusal:
        assert refusal.code, refusal
        str(refusal)
        refusal.to_dict()
        return None


def deployment_or_none(fields: dict[str, Any]) -> Deployment | None:
    return only_refusals(lambda: Deployment.model_validate(fields))


# ---- config and plan loaders --------------------------------------------------------------


def _paths(value: object, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found: list[tuple[str | int, ...]] = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list) and len(value) <= 4:
        for i, item in enumerate(value):
            found += _paths(item, (*prefix, i))
    return found


CONFIG_PATHS = _paths(K3_CONFIG)


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    """The K3 fixture with a few fields replaced by fuzzed values or deleted."""
    data = copy.deepcopy(K3_CONFIG)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(CONFIG_PATHS))
        parent: Any = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(python_values)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation replaced a parent
    return data


@FUZZ
@given(st.one_of(python_values, mutated_configs()), st.one_of(st.none(), python_values))
def test_model_from_config(config: Any, drafts: Any) -> None:
    only_refusals(lambda: model_from_config(config, num_draft_layers=drafts))


@st.composite
def plan_texts(draw: st.DrawFn) -> str | bytes:
    choice = draw(st.integers(min_value=0, max_value=3))
    if choice == 0:
        return draw(st.text(max_size=40))
    if choice == 1:
        return json.dumps(draw(json_values))
    data = json.loads(K3_PLAN_JSON)
    paths = _paths(data)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(paths))
        parent: Any = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue
    text = json.dumps(data)
    return text.encode() if choice == 3 else text


@FUZZ
@given(st.one_of(plan_texts(), python_values))
def test_load_plan(text: Any) -> None:
    only_refusals(lambda: load_plan(text))


# ---- records ------------------------------------------------------------------------------


@FUZZ
@given(st.one_of(deployment_dicts, record_dicts(DEPLOYMENT_FIELDS), python_values))
def test_deployment_model_validate(fields: Any) -> None:
    only_refusals(lambda: Deployment.model_validate(fields))
    if isinstance(fields, dict) and all(isinstance(k, str) for k in fields):
        only_refusals(lambda: Deployment(**fields))
    with contextlib.suppress(ValueError, TypeError, RecursionError):  # json cannot write it
        text = json.dumps(fields)
        only_refusals(lambda: Deployment.model_validate_json(text))


layer_dicts = st.fixed_dictionaries(
    {"kind": st.sampled_from(["mla", "kda", "gqa"]) | json_values},
    optional={
        "num_heads": small_ints | json_values,
        "head_dim": small_ints,
        "conv_kernel": small_ints,
        "kv_lora_rank": small_ints,
        "qk_rope_head_dim": small_ints,
        "index_bytes_per_token": small_ints,
    },
)
model_dicts = st.fixed_dictionaries(
    {},
    optional={
        "name": json_values,
        "model_type": json_values,
        "layers": st.lists(layer_dicts, max_size=6) | json_values,
        "draft_layers": st.lists(layer_dicts, max_size=2) | json_values,
    },
)


@FUZZ
@given(st.one_of(model_dicts, record_dicts(list(HybridModel.model_fields)), python_values))
def test_hybrid_model_model_validate(fields: Any) -> None:
    model = only_refusals(lambda: HybridModel.model_validate(fields))
    if model is not None:
        only_refusals(lambda: plan(model, Deployment(attn_tp=1)))


@FUZZ
@given(st.one_of(record_dicts(list(RideOptions.model_fields)), python_values))
def test_ride_options_model_validate(fields: Any) -> None:
    only_refusals(lambda: RideOptions.model_validate(fields))


@FUZZ
@given(python_values)
def test_preset(name: Any) -> None:
    only_refusals(lambda: preset(name))


# ---- planning -----------------------------------------------------------------------------

MODELS = [preset(name) for name in ("kimi-k3", "kimi-k3-dspark", "kimi-linear-48b")]


@FUZZ
@given(st.sampled_from(MODELS), deployment_dicts, record_dicts(list(RideOptions.model_fields)))
def test_plan_and_ride(model: HybridModel, fields: dict[str, Any], options: Any) -> None:
    deployment = deployment_or_none(fields)
    if deployment is None:
        return
    result = only_refusals(lambda: plan(model, deployment))
    only_refusals(lambda: rank_sizes(model, deployment))
    if result is not None:
        ride = only_refusals(lambda: RideOptions.model_validate(options))
        only_refusals(lambda: plan_ride(result, ride))


@FUZZ
@given(python_values, python_values)
def test_plan_and_rank_sizes_with_arbitrary_arguments(model: Any, deployment: Any) -> None:
    only_refusals(lambda: plan(model, deployment))
    only_refusals(lambda: rank_sizes(model, deployment))
    only_refusals(lambda: plan(K3, deployment))
    only_refusals(lambda: rank_sizes(model, Deployment()))


@FUZZ
@given(
    st.one_of(small_ints, python_values),
    st.one_of(small_ints, python_values),
    st.one_of(st.none(), st.lists(small_ints, max_size=5), python_values),
)
def test_pp_stage_bounds(num_layers: Any, pp: Any, partition: Any) -> None:
    only_refusals(lambda: pp_stage_bounds(num_layers, pp, partition))


pairing_args = st.one_of(small_ints, st.sampled_from([0, 1, 2, 8, 16]), python_values)


@FUZZ
@given(pairing_args, pairing_args, pairing_args, pairing_args)
def test_pairing(producer: Any, consumer: Any, prefill_tp: Any, decode_tp: Any) -> None:
    only_refusals(lambda: pairing_refusal(producer, consumer, prefill_tp, decode_tp))
    only_refusals(lambda: check_pairing(producer, consumer, prefill_tp, decode_tp))


@FUZZ
@given(
    deployment_dicts,
    deployment_dicts,
    st.one_of(st.integers(min_value=-2, max_value=100_000), python_values),
    st.one_of(st.none(), st.sampled_from(MODELS), python_values),
)
def test_plan_transfer(
    prefill: dict[str, Any], decode: dict[str, Any], tokens: Any, decode_model: Any
) -> None:
    p, d = deployment_or_none(prefill), deployment_or_none(decode)
    if p is None or d is None:
        return
    if p.attn_tp * d.attn_tp * p.pp * d.pp > 4096:
        return  # correct but large answers: outside this test's time budget
    only_refusals(lambda: plan_transfer(K3, p, d, prompt_tokens=tokens, decode_model=decode_model))


@FUZZ
@given(python_values, python_values, python_values)
def test_plan_transfer_with_arbitrary_arguments(model: Any, prefill: Any, tokens: Any) -> None:
    only_refusals(lambda: plan_transfer(model, prefill, Deployment(), prompt_tokens=tokens))


# ---- the command line ---------------------------------------------------------------------

CLI_VALUES = st.one_of(
    st.sampled_from(["0", "1", "2", "8", "-1", "7", "96", "1000000000", str(10**20), str(10**40)]),
    st.sampled_from(["nan", "inf", "-inf", "1e308", "1e400", "0.5", "", "x", "1,2", "pp8xtp1"]),
    st.sampled_from(["tp8xdcp8", "pp2xtp4", "tp3", "kimi-k3", "kimi-k3-dspark", "fp8", "bf16"]),
    st.sampled_from(["vllm", "tokenspeed", "none", "align", "a" * 300, str(FIXTURES)]),
    st.integers(min_value=-5, max_value=10**6).map(str),
    st.text(max_size=8),
)
CLI_OPTIONS = [
    "--model", "--draft-layers", "--engine", "--attn-tp", "--attn-dp", "--kv-dtype",
    "--spec-tokens", "--pp", "--dcp", "--dcp-interleave", "--block-tokens", "--max-padding",
    "--kv-memory-gib", "--max-live", "--stage", "--chunk", "--hit", "--mamba-cache-mode",
    "--kv-load-failure-policy", "--publish-order", "--prefill", "--decode", "--tokens",
    "--conv-layout", "--tps", "--dtypes",
]  # fmt: skip
CLI_FLAGS = ["--json", "--replayssm", "--no-prefix-caching", "--chunked"]


@st.composite
def argvs(draw: st.DrawFn) -> list[str]:
    argv = [draw(st.sampled_from(["plan", "sweep", "transfer", "ride"]))]
    for _ in range(draw(st.integers(min_value=0, max_value=5))):
        if draw(st.integers(min_value=0, max_value=4)) == 0:
            argv.append(draw(st.sampled_from(CLI_FLAGS)))
        else:
            argv += [draw(st.sampled_from(CLI_OPTIONS)), draw(CLI_VALUES)]
    return argv


@settings(FUZZ, max_examples=EXAMPLES)
@given(argvs())
def test_the_command_line(argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse: a bad option or value, or --help
            code = exit_.code if isinstance(exit_.code, int) else 2
    assert code in (0, 2), (argv, err.getvalue())
    assert "Traceback" not in err.getvalue()
    if code == 2 and "--json" in argv and "refused [" in err.getvalue():
        assert json.loads(out.getvalue())["refused"]["code"]
