"""One rule for scalar inputs, everywhere: an int is an int. ``True``, ``"8"`` and ``8.0`` are
refused naming the field, in a record (``Deployment``), in a plan's methods (``memory_for``,
``capacity``, ``recommend``) and in the functions; text is converted only where text enters
(the command line, ``model_validate_strings``)."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k3layout import Deployment, KDALayer, MLALayer, Refusal, plan, preset

NOT_INTS = (True, False, "8", 8.0, b"8")
NOT_BOOLS = (1, 0, "true", "1", 1.0)


def _int_fields() -> list[str]:
    return [
        name
        for name, info in Deployment.model_fields.items()
        if "int" in str(info.annotation) and "float" not in str(info.annotation)
        and "tuple" not in str(info.annotation)
    ]


def test_every_int_field_of_a_deployment_is_found() -> None:
    assert {"attn_tp", "attn_dp", "pp", "dcp", "spec_tokens", "block_tokens"} <= set(
        _int_fields()
    )


@pytest.mark.parametrize("field", _int_fields())
@pytest.mark.parametrize("value", NOT_INTS, ids=repr)
def test_a_deployment_refuses_a_non_int_for_an_int_field(field: str, value: object) -> None:
    with pytest.raises(Refusal) as refused:
        Deployment.model_validate({field: value})
    assert refused.value.code == "invalid_argument"
    assert refused.value.facts["field"] == field


@pytest.mark.parametrize("field", ["replayssm", "prefix_caching"])
@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
def test_a_deployment_refuses_a_non_bool_for_a_bool_field(field: str, value: object) -> None:
    with pytest.raises(Refusal) as refused:
        Deployment.model_validate({field: value})
    assert refused.value.facts["field"] == field


@pytest.mark.parametrize("value", [True, "0.5"], ids=repr)
def test_a_float_field_refuses_bools_and_text_but_takes_an_int(value: object) -> None:
    with pytest.raises(Refusal):
        Deployment(engine="sglang", mamba_full_memory_ratio=value)
    assert Deployment(engine="sglang", mamba_full_memory_ratio=1).mamba_full_memory_ratio == 1.0


def test_containers_take_any_sequence_but_hold_their_items_to_the_rule() -> None:
    assert Deployment(pp=2, pp_partition=[46, 47]).pp_partition == (46, 47)
    with pytest.raises(Refusal) as refused:
        Deployment(pp=2, pp_partition=["46", 47])
    assert refused.value.facts["field"] == "pp_partition.0"


def test_model_layers_hold_to_the_same_rule() -> None:
    with pytest.raises(Refusal):
        KDALayer(num_heads="96", head_dim=128)
    with pytest.raises(Refusal):
        MLALayer(num_heads=True)


def test_text_converts_only_where_text_enters() -> None:
    assert Deployment.model_validate_strings({"attn_tp": "8"}).attn_tp == 8
    assert Deployment.model_validate_json('{"attn_tp": 8}').attn_tp == 8
    with pytest.raises(Refusal):
        Deployment.model_validate_json('{"attn_tp": "8"}')


PLAN = plan(preset("kimi-k3"), Deployment(attn_tp=8))

CALLS: dict[str, typing.Callable[[object], object]] = {
    # each value of the wrong type on purpose: the plan refuses what its signature rules out
    "memory_for": lambda v: PLAN.memory_for(v, max_model_len=8192),  # type: ignore[arg-type]
    "memory_for.max_model_len": lambda v: PLAN.memory_for(4, max_model_len=v),  # type: ignore[arg-type]
    "capacity": lambda v: PLAN.capacity(v, max_model_len=8192),  # type: ignore[arg-type]
    "capacity.max_model_len": lambda v: PLAN.capacity(40 << 30, max_model_len=v),  # type: ignore[arg-type]
    "recommend": lambda v: PLAN.recommend(v, 8192),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("call", CALLS, ids=str)
@pytest.mark.parametrize("value", NOT_INTS, ids=repr)
def test_the_plan_methods_refuse_what_the_deployment_refuses(call: str, value: object) -> None:
    with pytest.raises(Refusal) as refused:
        CALLS[call](value)
    assert refused.value.code == "invalid_argument"
    assert "field" in refused.value.facts


@given(st.sampled_from(_int_fields()), st.text(alphabet="0123456789", min_size=1, max_size=3))
def test_the_command_line_parses_text_by_the_option_type(field: str, digits: str) -> None:
    # argparse's type=int converts text; Deployment then checks the int it got
    value = int(digits)
    try:
        Deployment.model_validate({field: value})
    except Refusal:
        return
    assert Deployment.model_validate_strings({field: digits}) == Deployment.model_validate(
        {field: value}
    )


@pytest.mark.parametrize("text", ["True", "8.0", "eight"])
def test_the_command_line_refuses_a_non_integer_option_with_a_message(text: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "k3layout", "plan", "--attn-tp", text],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "--attn-tp" in done.stderr
    assert "Traceback" not in done.stderr
