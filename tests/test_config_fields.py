"""Every field of a fixture config replaced by a value of the wrong kind (NaN, an infinity, a
float, a bool, a string, ``null``): the loader gives the fixture's own model, and so its plan,
only for a field the cache ignores; any other field is refused naming it (issue 29, item 11).
``null`` reads as the field left out or is refused naming it, never anything else; the
top-level ``model_type``, which names the checkpoint, is refused."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k3layout import HybridModel, Refusal, load_config, model_from_config
from k3layout.model.hf_config import _LinearAttnConfig, _TextConfig
from k3layout.model.hf_weights import _Weights

FIXTURES = Path(__file__).parent / "fixtures"
CONFIGS = ("kimi-k3.config.json", "kimi-linear-48b-a3b.config.json")

# the cache's fields and the weights' (model.hf_weights: dimensions, dtype, the vision tower)
TEXT_FIELDS = frozenset(_TextConfig.model_fields) | frozenset(_Weights.model_fields) | {
    "architectures",
    "dtype",
    "quantization_config",
    "vision_config",
}
LINEAR_FIELDS = frozenset(_LinearAttnConfig.model_fields)
CODES = ("invalid_config", "size_limit")  # size_limit: a number past a bound the field sets


Path_ = tuple[str | int, ...]


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def leaves(value: object, path: Path_ = ()) -> Iterator[Path_]:
    """Every scalar's path; of a list, its first and last items."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index in sorted({0, len(value) - 1}) if value else ():
            yield from leaves(value[index], (*path, index))
    else:
        yield path


def replaced(data: dict[str, Any], path: Path_, value: object) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    holder: Any = changed
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return changed


def dropped(data: dict[str, Any], path: Path_) -> dict[str, Any]:
    changed = copy.deepcopy(data)
    holder: Any = changed
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    return changed


def dotted(path: Path_) -> str:
    return ".".join(str(part) for part in path)


def is_read(path: Path_) -> bool:
    """Whether the loader reads the field at ``path`` (a list item: whether it reads the list):
    the text config's fields, at the top level or under ``text_config``, and
    ``linear_attn_config``'s."""
    keys = [part for part in path if isinstance(part, str)]
    if keys[:1] == ["text_config"]:
        keys = keys[1:]
    if not keys:
        return True
    if keys[0] not in TEXT_FIELDS:
        return False
    return keys[0] != "linear_attn_config" or len(keys) == 1 or keys[1] in LINEAR_FIELDS


def outcome(data: dict[str, Any]) -> HybridModel | Refusal:
    try:
        return model_from_config(data)
    except Refusal as refusal:
        return refusal


def wrong_values(original: object) -> list[object]:
    """Values of the wrong kind for a field holding ``original`` (never ``original``'s own
    kind: a string field is not given strings, a bool field not bools)."""
    values: list[object] = [math.nan, math.inf, -math.inf, 0.5]
    if isinstance(original, int) and not isinstance(original, bool):
        values += [float(original), True, False, str(original)]
    elif isinstance(original, float):
        values += [True, False, str(original)]
    elif isinstance(original, bool):
        values += [int(original), str(original).lower()]
    return values


CASES = [(name, path) for name in CONFIGS for path in leaves(config(name))]


@pytest.mark.parametrize(
    ("name", "path"), CASES, ids=[f"{n.split('.')[0]}:{dotted(p)}" for n, p in CASES]
)
def test_a_wrong_kind_of_value_is_refused_naming_the_field_or_ignored(
    name: str, path: Path_
) -> None:
    data = config(name)
    fixture = model_from_config(data)
    original: Any = data
    for key in path:
        original = original[key]
    for value in wrong_values(original):
        result = outcome(replaced(data, path, value))
        if not is_read(path):
            assert result == fixture, (dotted(path), value, result)
            continue
        assert isinstance(result, Refusal), (dotted(path), value, result)
        assert result.code in CODES and result.facts["field"] == dotted(path), value


@pytest.mark.parametrize(
    ("name", "path"), CASES, ids=[f"{n.split('.')[0]}:{dotted(p)}" for n, p in CASES]
)
def test_null_reads_as_the_field_left_out(name: str, path: Path_) -> None:
    data = config(name)
    nulled = outcome(replaced(data, path, None))
    if path == ("model_type",):  # the checkpoint's own type: refused, never left to the backbone
        assert isinstance(nulled, Refusal)
        assert (nulled.code, nulled.facts["field"]) == ("invalid_config", "model_type")
        return
    if not is_read(path):
        assert nulled == model_from_config(data), dotted(path)
        return
    if isinstance(path[-1], int):  # a null inside a list of layer ids
        assert isinstance(nulled, Refusal) and nulled.facts["field"] == dotted(path)
        return
    left_out = outcome(dropped(data, path))
    if isinstance(nulled, Refusal):  # a null where the field has no "none" is refused by name
        assert nulled.code in CODES and nulled.facts["field"] == dotted(path), nulled
    else:
        assert nulled == left_out, dotted(path)


def _at(data: dict[str, Any], path: Path_) -> object:
    value: Any = data
    for key in path:
        value = value[key]
    return value


INTEGER_FIELDS = [
    (name, path) for name, path in CASES if is_read(path) and type(_at(config(name), path)) is int
]


@given(
    case=st.sampled_from(INTEGER_FIELDS),
    value=st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.text(max_size=8)
    | st.lists(st.integers(), max_size=2),
)
def test_an_integer_field_takes_only_an_integer(case: tuple[str, Path_], value: object) -> None:
    name, path = case
    result = outcome(replaced(config(name), path, value))
    assert isinstance(result, Refusal)
    assert result.code in CODES and result.facts["field"] == dotted(path)


# The two silent plans of issue 29, item 11, as the fuzzers found them ---------------------------


def test_a_kimi_k3_checkpoint_whose_model_type_is_null_is_refused_not_planned_as_kimi_linear(
    tmp_path: Path,
) -> None:
    data = config("kimi-k3.config.json")
    assert data["text_config"]["model_type"] == "kimi_linear"  # what it used to be planned as
    for shaped in (replaced(data, ("model_type",), None), dropped(data, ("model_type",))):
        file = tmp_path / "config.json"
        file.write_text(json.dumps(shaped))
        with pytest.raises(Refusal) as refused:
            load_config(file)
        assert (refused.value.code, refused.value.facts["field"]) == (
            "invalid_config",
            "model_type",
        )
        assert "text_config.model_type='kimi_linear' names only the backbone" in str(refused.value)


def test_a_flat_config_whose_model_type_is_null_is_refused() -> None:
    # a flattened Kimi-K3 would otherwise plan as model_type "unknown", outside K3's rules
    flat = {**config("kimi-k3.config.json")["text_config"], "model_type": None}
    refusal = outcome(flat)
    assert isinstance(refusal, Refusal) and refusal.facts["field"] == "model_type"


def test_a_nan_in_linear_attn_config_num_heads_is_refused_naming_it(tmp_path: Path) -> None:
    file = tmp_path / "config.json"
    text = (FIXTURES / "kimi-linear-48b-a3b.config.json").read_text()
    file.write_text(
        text.replace('"num_heads": 32', '"num_heads": NaN', 1)
    )  # JSON as Python reads it
    assert math.isnan(json.loads(file.read_text())["linear_attn_config"]["num_heads"])
    with pytest.raises(Refusal) as refused:
        load_config(file)
    assert (refused.value.code, refused.value.facts["field"]) == (
        "invalid_config",
        "linear_attn_config.num_heads",
    )


@pytest.mark.parametrize("value", ["-5.0", True, math.nan, -math.inf])
def test_gate_lower_bound_takes_a_finite_json_number_only(value: object) -> None:
    path = ("text_config", "linear_attn_config", "gate_lower_bound")
    refusal = outcome(replaced(config("kimi-k3.config.json"), path, value))
    assert isinstance(refusal, Refusal) and refusal.facts["field"] == dotted(path)
