"""A refusal says its hint once: in ``str(refusal)`` (what the command line prints and engines
log) and in ``to_dict()`` (what ``--json`` prints), over refusals the public entry points give
for generated bad input (issue 29, item 10)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k3layout import (
    Deployment,
    Refusal,
    engine_names,
    model_from_config,
    plan,
    plan_ride,
    plan_transfer,
    preset,
)
from k3layout.cli.common import option_refusal

FIXTURES = Path(__file__).parent / "fixtures"
K3: dict[str, Any] = json.loads((FIXTURES / "kimi-k3.config.json").read_text())


def sentences(hint: str) -> list[str]:
    """The hint's sentences and clauses (``; `` or ``. `` apart), each long enough to be one."""
    return [part.strip(" .") for part in re.split(r"; |\. ", hint) if len(part.strip(" .")) > 12]


def says_its_hint_once(refusal: Refusal) -> None:
    text = str(refusal)
    record = refusal.to_dict()
    if not refusal.hint:
        return
    assert text.count(refusal.hint) == 1, text
    for sentence in sentences(refusal.hint):
        assert text.count(sentence) == 1, (sentence, text)
        assert f"{record['message']} {record['hint']}".count(sentence) == 1, (sentence, record)


def refusal_of(action: Callable[[], object]) -> Refusal | None:
    try:
        action()
    except Refusal as refusal:
        return refusal
    return None


def test_a_message_that_already_ends_with_its_hint_is_not_given_it_again() -> None:
    inner = Refusal("invalid_argument", "x must be >= 1", hint="pass x >= 1")
    again = Refusal(inner.code, str(inner), hint=inner.hint)  # a refusal re-raised in its words
    assert str(again) == "x must be >= 1; pass x >= 1"
    assert again.to_dict()["message"] == "x must be >= 1"
    says_its_hint_once(again)


def test_to_dict_keeps_the_message_and_the_hint_apart() -> None:
    refusal = Refusal("pp_too_deep", "pp=200 exceeds 93 layers", hint="use pp <= 93")
    assert refusal.to_dict()["message"] == "pp=200 exceeds 93 layers"
    assert refusal.to_dict()["hint"] == "use pp <= 93"
    assert str(refusal) == "pp=200 exceeds 93 layers; use pp <= 93"


sizes = st.integers(min_value=-2, max_value=200) | st.sampled_from([0, 3, 5, 7, 96, 2**40])
deployments = st.fixed_dictionaries(
    {
        "engine": st.sampled_from(engine_names()),
        "attn_tp": sizes,
        "pp": st.integers(min_value=0, max_value=100),
        "dcp": st.sampled_from([1, 2, 3, 8, 16]),
        "spec_tokens": st.integers(min_value=-1, max_value=9),
        "kv_dtype": st.sampled_from(["fp8", "bf16", "fp8_ds_mla", "fp16"]),
        "max_padding": st.none() | st.floats(min_value=-1, max_value=2),
        "block_tokens": st.none() | sizes,
    }
)


@given(
    model=st.sampled_from(["kimi-k3", "kimi-k3-dspark", "kimi-linear-48b"]),
    fields=deployments,
    budget=st.integers(min_value=0, max_value=2**40),
    length=st.integers(min_value=-1, max_value=2**22),
)
def test_planning_refusals_say_their_hint_once(
    model: str, fields: dict[str, Any], budget: int, length: int
) -> None:
    def action() -> object:
        planned = plan(preset(model), Deployment(**fields))
        planned.capacity(budget, max_model_len=length)
        return plan_ride(planned)

    refusal = refusal_of(action)
    if refusal is not None:
        says_its_hint_once(refusal)
        says_its_hint_once(option_refusal(refusal))  # as the command line words it


@given(prefill=deployments, decode=deployments, tokens=st.integers(min_value=-1, max_value=10**6))
def test_transfer_refusals_say_their_hint_once(
    prefill: dict[str, Any], decode: dict[str, Any], tokens: int
) -> None:
    refusal = refusal_of(
        lambda: plan_transfer(
            preset("kimi-k3"), Deployment(**prefill), Deployment(**decode), prompt_tokens=tokens
        )
    )
    if refusal is not None:
        says_its_hint_once(refusal)


def _leaves(value: object, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, list) and value:
        return _leaves(value[0], (*path, 0))
    return [path]


@given(
    path=st.sampled_from(_leaves(K3)),
    value=st.none() | st.floats() | st.booleans() | st.text(max_size=4) | st.integers(),
)
def test_config_refusals_say_their_hint_once(path: tuple[str | int, ...], value: object) -> None:
    data = copy.deepcopy(K3)
    holder: Any = data
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    refusal = refusal_of(lambda: model_from_config(data))
    if refusal is not None:
        says_its_hint_once(refusal)


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--attn-tp", "0"],
        ["plan", "--attn-tp", "5", "--json"],
        ["plan", "--model", "kimi-k3", "--draft-layers", "5"],
        ["plan", "--engine", "tokenspeed", "--attn-tp", "6", "--kv-dtype", "bf16"],
        ["plan", "--engine", "tokenspeed", "--attn-tp", "4"],
        ["plan", "--engine", "tokenspeed", "--attn-tp", "48", "--kv-dtype", "bf16"],
        ["ride", "--chunk", "7"],
        ["transfer", "--prefill", "pp8xtp2", "--decode", "tp3"],
    ],
)
def test_the_command_lines_refusals_say_their_hint_once(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from k3layout.cli import main  # noqa: PLC0415

    assert main([*argv, "--json"] if "--json" not in argv else argv) == 2
    out, err = capsys.readouterr()
    record = json.loads(out)["refused"]
    hint = record["hint"]
    assert hint and err.count(hint) == 1, err
    assert json.dumps(record).count(hint) == 1, record
