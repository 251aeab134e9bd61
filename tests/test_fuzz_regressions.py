"""Every input the fuzzer found (issue 9, item 4) as a regression: each becomes a named
refusal or a correct answer, in well under a second, and never a raw ``ValidationError``,
``TypeError``, ``RecursionError``, ``OverflowError`` or traceback."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from k3layout import (
    Deployment,
    HybridModel,
    KDALayer,
    MLALayer,
    Refusal,
    check_pairing,
    load_config,
    load_plan,
    model_from_config,
    pairing_refusal,
    plan,
    plan_transfer,
    pp_stage_bounds,
    preset,
    rank_sizes,
    transfer_violations,
    weights_per_rank,
)
from k3layout._divisors import divisors, divisors_near, nearest_divisors
from k3layout.cli import main
from k3layout.constants import (
    INT64_MAX,
    MAX_LISTED_ITEMS,
    MAX_MODEL_DIM,
    MAX_MODULE_LAYERS,
    MAX_PADDING_LIMIT,
    MAX_RANKS,
)
from k3layout.engines.vllm import VllmPlan
from k3layout.names import engine_layer_names
from k3layout.offload import RidePlan, plan_ride, ride_report
from k3layout.sweep import default_attn_tps, sweep

FIXTURES = Path(__file__).parent / "fixtures"
QUICK_S = 1.0


def config(name: str = "kimi-k3.config.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def refused(action: Callable[[], object]) -> Refusal:
    """The refusal ``action`` raises, checked to come quickly."""
    start = time.perf_counter()
    with pytest.raises(Refusal) as caught:
        action()
    assert time.perf_counter() - start < QUICK_S
    return caught.value


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit code and stderr of ``k3layout argv``, run in process; never a traceback."""
    start = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code if isinstance(exit_.code, int) else 2
    assert time.perf_counter() - start < 5 * QUICK_S
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


# JSON that cannot be parsed safely ------------------------------------------------------------


@pytest.fixture
def deep_json() -> str:
    return "[" * 100_000 + "]" * 100_000


def test_json_nested_100000_deep_is_refused_by_load_config(tmp_path: Path, deep_json: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(deep_json)
    refusal = refused(lambda: load_config(path))
    assert refusal.code == "invalid_config"
    assert refusal.facts["field"] == "<file>"
    assert "nested too deeply" in str(refusal)


def test_json_nested_100000_deep_is_refused_by_load_plan(deep_json: str) -> None:
    for text in (deep_json, '{"a":' * 100_000 + "1" + "}" * 100_000):
        refusal = refused(lambda text=text: load_plan(text))  # type: ignore[misc]
        assert refusal.code == "invalid_argument"
        assert "recursion limit" in str(refusal)


def test_a_4301_digit_integer_is_refused(tmp_path: Path) -> None:
    data = json.dumps(config())
    huge = "1" + "0" * 4300
    path = tmp_path / "config.json"
    path.write_text(data.replace('"num_hidden_layers": 93', f'"num_hidden_layers": {huge}'))
    refusal = refused(lambda: load_config(path))
    assert refusal.code == "invalid_config"
    assert refusal.facts["source"] == str(path)
    assert "4300" in str(refusal)
    text = plan(preset("kimi-k3"), Deployment()).model_dump_json()
    assert refused(lambda: load_plan(text.replace('"page_bytes":', f'"page_bytes":{huge}, "x":')))


def test_a_huge_python_integer_in_a_config_is_refused_naming_the_field() -> None:
    data = config()
    data["text_config"]["num_hidden_layers"] = 10**5000
    refusal = refused(lambda: model_from_config(data))
    assert refusal.code == "size_limit"
    assert refusal.facts["field"] == "text_config.num_hidden_layers"
    assert "16,610 bits" in str(refusal)


# Sizes too big to handle ----------------------------------------------------------------------


def test_draft_layers_of_10_to_the_20_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    refusal = refused(lambda: model_from_config(config(), num_draft_layers=10**20))
    assert refusal.code == "size_limit"
    assert refusal.facts == {"field": "num_draft_layers", "bound": MAX_MODULE_LAYERS - 93}
    fixture = str(FIXTURES / "kimi-k3.config.json")
    code, err = cli(["plan", "--model", fixture, "--draft-layers", str(10**20)], capsys)
    assert code == 2 and "size_limit" in err


def test_a_billion_hidden_layers_are_refused() -> None:
    data = config()
    data["text_config"]["num_hidden_layers"] = 10**9
    refusal = refused(lambda: model_from_config(data))
    assert refusal.code == "size_limit"
    assert refusal.facts["field"] == "text_config.num_hidden_layers"
    assert refusal.facts["bound"] == MAX_MODULE_LAYERS


@pytest.mark.parametrize("repeats", [100_000, MAX_MODULE_LAYERS])
def test_repeated_layer_ids_are_refused_in_linear_time(repeats: int) -> None:
    data = config()
    data["text_config"]["linear_attn_config"]["kda_layers"] = [1] * repeats
    refusal = refused(lambda: model_from_config(data))
    field = refusal.facts["field"]
    assert field == "text_config.linear_attn_config.kda_layers"
    if repeats > MAX_MODULE_LAYERS:
        assert refusal.code == "size_limit"
    else:
        assert refusal.code == "invalid_config" and "more than once" in str(refusal)


@pytest.mark.parametrize("where", ["num_attention_heads", "linear_attn_config.num_heads"])
def test_head_counts_of_10_to_the_18_are_refused(where: str) -> None:
    data = config()
    target = data["text_config"]
    *parents, leaf = where.split(".")
    for parent in parents:
        target = target[parent]
    target[leaf] = 10**18
    refusal = refused(lambda: model_from_config(data))
    assert refusal.code == "size_limit"
    assert refusal.facts["field"] == f"text_config.{where}"
    for record, build in (
        ("MLALayer", lambda: MLALayer(num_heads=10**18)),
        ("KDALayer", lambda: KDALayer(num_heads=10**18, head_dim=8)),
    ):
        refusal = refused(build)
        assert refusal.code == "size_limit"
        assert refusal.facts == {"record": record, "field": "num_heads", "bound": MAX_MODEL_DIM}


def test_a_model_beyond_the_layer_bound_is_refused() -> None:
    mla = MLALayer(num_heads=8)
    refusal = refused(
        lambda: HybridModel(
            name="x", model_type="x", layers=(mla,) * MAX_MODULE_LAYERS, draft_layers=(mla,)
        )
    )
    assert refusal.code == "size_limit"
    assert refusal.facts["bound"] == MAX_MODULE_LAYERS


def test_a_plan_whose_byte_counts_do_not_fit_int64_is_refused() -> None:
    mla = MLALayer(num_heads=8, kv_lora_rank=MAX_MODEL_DIM, qk_rope_head_dim=MAX_MODEL_DIM)
    kda = KDALayer(num_heads=MAX_MODEL_DIM, head_dim=MAX_MODEL_DIM)
    big = HybridModel(name="big", model_type="big", layers=(kda, kda, mla, mla))
    refusal = refused(lambda: plan(big, Deployment()))
    assert refusal.code == "size_limit"
    assert refusal.facts == {"field": "block_bytes", "bound": INT64_MAX}


def test_a_plan_json_with_byte_counts_beyond_int64_is_refused() -> None:
    data = json.loads(plan(preset("kimi-k3"), Deployment(attn_tp=8)).model_dump_json())
    data["page_bytes"] = 10**30
    refusal = refused(lambda: load_plan(json.dumps(data)))
    # The plan re-derives itself first: the stored page is not the planner's.
    assert refusal.code == "plan_mismatch"
    assert refusal.facts["field"] == "page_bytes"


def test_the_block_raise_is_exact_integer_arithmetic() -> None:
    # A state near 2**62 bytes over 256-byte steps: float division rounds the quotient down
    # to an integer, the ceiling loses its +1 and the page falls short of the state.
    mla = MLALayer(num_heads=8, kv_lora_rank=1, qk_rope_head_dim=1)
    kda = KDALayer(num_heads=MAX_MODEL_DIM - 1, head_dim=MAX_MODEL_DIM - 1, conv_kernel=2)
    result = plan(HybridModel(name="t", model_type="t", layers=(kda, mla)), Deployment())
    assert isinstance(result, VllmPlan) and result.sizes.state is not None
    state, per_token = result.sizes.state_bytes, result.sizes.attention_bytes_per_token
    assert state > 2**61
    align = 128
    assert result.block_tokens % align == 0
    assert result.page_bytes >= state > (result.block_tokens - align) * per_token


# Hints built by listing every divisor ---------------------------------------------------------


def test_divisor_hints_take_square_root_time() -> None:
    start = time.perf_counter()
    assert nearest_divisors(10**9 + 7, 8) == (1, 10**9 + 7)
    assert divisors_near(10**9, 7) == [1, 2, 4, 5, 8, 10, 16, 20]
    assert divisors(96) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    assert all(10**30 % d == 0 for d in divisors_near(10**30, 7))
    assert time.perf_counter() - start < QUICK_S


def test_a_prime_head_count_gets_a_quick_hint() -> None:
    prime = 1_048_573  # the largest prime below MAX_MODEL_DIM
    model = HybridModel(name="p", model_type="p", layers=(MLALayer(num_heads=prime),))
    refusal = refused(lambda: plan(model, Deployment(attn_tp=8)))
    assert refusal.code == "heads_not_divisible"
    assert refusal.hint == f"attn_tp=1 or attn_tp={prime} would divide the heads"
    data = config()
    data["text_config"]["linear_attn_config"]["num_heads"] = 10**9 + 7
    assert refused(lambda: model_from_config(data)).code == "size_limit"


def test_attn_tp_of_a_billion_with_dcp_7_gets_a_quick_bounded_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    refusal = refused(lambda: plan(preset("kimi-k3"), Deployment(attn_tp=10**9, dcp=7)))
    assert refusal.code == "dcp_not_dividing_tp"
    assert refusal.hint == "use dcp in [1, 2, 4, 5, 8, 10, 16, 20]"
    code, err = cli(["plan", "--attn-tp", "1000000000", "--dcp", "7"], capsys)
    assert code == 2 and "dcp_not_dividing_tp" in err


# Numbers out of range -------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1e308, math.inf, MAX_PADDING_LIMIT * 2])
def test_a_huge_max_padding_is_refused_when_the_deployment_is_built(value: float) -> None:
    refusal = refused(lambda: Deployment(max_padding=value))
    assert refusal.facts["field"] == "max_padding"
    assert refusal.code in ("size_limit", "invalid_argument")


def test_a_nan_max_padding_is_refused_when_the_deployment_is_built() -> None:
    refusal = refused(lambda: Deployment(max_padding=math.nan))
    assert refusal.code == "invalid_argument"
    assert refusal.facts == {"record": "Deployment", "field": "max_padding"}


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-padding", "1e308"),
        ("--max-padding", "nan"),
        ("--kv-memory-gib", "1e400"),
        ("--kv-memory-gib", "nan"),
        ("--kv-memory-gib", "-1"),
        ("--kv-memory-gib", "1e300"),
        ("--attn-tp", str(10**40)),
    ],
)
def test_cli_numbers_out_of_range_exit_2_naming_the_option(
    capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    code, err = cli(["plan", "--engine", "tokenspeed", option, value], capsys)
    assert code == 2
    assert option in err


@pytest.mark.parametrize(
    "args", [(93, 0), (93, -1), (93, "8"), (93.0, 8), (0, 1), (93, 2, "ab"), (93, 2, (1.5, 91.5))]
)
def test_pp_stage_bounds_refuses_bad_arguments(args: tuple[Any, ...]) -> None:
    assert refused(lambda: pp_stage_bounds(*args)).code == "invalid_argument"


def test_pp_stage_bounds_refuses_a_billion_layers() -> None:
    assert refused(lambda: pp_stage_bounds(10**9, 8)).code == "size_limit"


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ((0, 0, 0, 0), "invalid_argument"),
        ((0, 0, 0, 8), "invalid_argument"),
        ((0, 0, 2, 0), "invalid_argument"),
        ((0, 0, -2, 8), "invalid_argument"),
        ((0, 0, 10**40, 10**40), "size_limit"),
        ((0, 10**40, 2, 8), "invalid_argument"),
        ((-1, 0, 2, 8), "invalid_argument"),
        ((0, 0, "2", 8), "invalid_argument"),
        ((0.0, 0, 2, 8), "invalid_argument"),
    ],
)
def test_the_pairing_family_refuses_zero_negative_huge_and_mistyped_sizes(
    args: tuple[Any, ...], code: str
) -> None:
    assert refused(lambda: check_pairing(*args)).code == code
    try:
        refusal = pairing_refusal(*args)
    except Refusal as raised:  # a wrong type is raised, not returned
        refusal = raised
    assert refusal is not None and refusal.code == code


def test_a_huge_head_group_is_named_by_its_bounds() -> None:
    refusal = refused(lambda: check_pairing(1, 1, 2, MAX_RANKS - 1))
    assert refusal.code == "head_group_mismatch"
    assert refusal.facts["head_group_range"] == ((MAX_RANKS - 1) // 2, MAX_RANKS - 1)


# Wrong argument types -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k3_model() -> HybridModel:
    return preset("kimi-k3")


def test_wrong_argument_types_are_refused_naming_the_parameter(k3_model: HybridModel) -> None:
    d = Deployment()
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: plan("kimi-k3", d), "model"),  # type: ignore[call-overload]
        (lambda: plan(k3_model, {"attn_tp": 8}), "deployment"),  # type: ignore[call-overload]
        (lambda: rank_sizes(None, d), "model"),  # type: ignore[arg-type]
        (lambda: plan_transfer(k3_model, "pp8", d, prompt_tokens=8), "prefill"),  # type: ignore[arg-type]
        (lambda: plan_transfer(k3_model, d, d, prompt_tokens=True), "prompt_tokens"),
        (lambda: load_plan(None), "source"),  # type: ignore[arg-type]
        (lambda: load_config(None), "path"),  # type: ignore[arg-type]
        (lambda: model_from_config([1, 2]), "config"),  # type: ignore[arg-type]
        (lambda: preset(3), "name"),  # type: ignore[arg-type]
    ]
    for action, field in cases:
        refusal = refused(action)
        assert refusal.code == "invalid_argument"
        assert field in str(refusal)


def test_records_refuse_bad_values_naming_the_record_and_field() -> None:
    refusal = refused(lambda: Deployment(attn_tp=0))
    assert refusal.facts == {"record": "Deployment", "field": "attn_tp"}
    assert "greater than 0" in str(refusal)
    refusal = refused(lambda: Deployment.model_validate({"engine": "trtllm"}))
    assert refusal.facts["field"] == "engine" and "known: vllm, tokenspeed, sglang" in str(refusal)
    refusal = refused(lambda: Deployment.model_validate_json('{"pp": 2, "pp_partition": [1]}'))
    assert refusal.facts["field"] == "pp_partition"
    refusal = refused(
        lambda: HybridModel.model_validate(
            {
                "name": "x",
                "model_type": "x",
                "layers": [{"kind": "kda", "num_heads": 1, "head_dim": 1}],
            }
        )
    )
    assert refusal.facts["field"] == "layers" and "at least one attention layer" in str(refusal)
    refusal = refused(
        lambda: HybridModel.model_validate({"name": "x", "layers": [{"kind": "rnn"}]})
    )
    assert refusal.facts["record"] == "HybridModel"
    assert refused(lambda: Deployment(8)).code == "invalid_argument"  # type: ignore[call-arg]
    d = Deployment()
    assert refused(lambda: setattr(d, "attn_tp", 2)).code == "invalid_argument"


# CLI output paths -----------------------------------------------------------------------------


def test_a_model_path_too_long_for_the_os_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = cli(["plan", "--model", "a" * 5000], capsys)
    assert code == 2 and "--model" in err
    assert refused(lambda: load_config("a" * 5000)).code == "invalid_config"
    assert refused(lambda: load_config("a\0b")).code == "invalid_config"


@pytest.fixture
def drawable() -> Iterator[None]:
    pytest.importorskip("matplotlib")
    yield


@pytest.mark.usefixtures("drawable")
def test_draw_to_a_folder_or_an_unusable_path_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "planes.png"
    folder.mkdir()
    for output in (str(folder), str(tmp_path), str(tmp_path / ("a" * 300 + ".png"))):
        code, err = cli(["draw", "planes", "-o", output], capsys)
        assert code == 2, output
        assert "refused [invalid_argument]" in err


@pytest.mark.usefixtures("drawable")
def test_draw_to_an_unwritable_path_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from k3layout import draw  # noqa: PLC0415 - needs matplotlib

    def denied(figure: object, path: object) -> Path:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(draw, "save", denied)
    code, err = cli(["draw", "planes", "-o", str(tmp_path / "x.png")], capsys)
    assert code == 2 and "cannot be written (Permission denied)" in err


# Silent acceptance in the config loader -------------------------------------------------------


def _k3(mutate: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    data = copy.deepcopy(config())
    mutate(data)
    return data


def _drop_full(data: dict[str, Any]) -> dict[str, Any]:
    linear: dict[str, Any] = data["text_config"]["linear_attn_config"]
    linear.pop("full_attn_layers")
    return linear


def _shift(data: dict[str, Any]) -> None:
    linear = _drop_full(data)
    linear["kda_layers"] = [n + 1 for n in linear["kda_layers"]]


def _empty(data: dict[str, Any]) -> None:
    _drop_full(data)["kda_layers"] = []


def _grown(data: dict[str, Any]) -> None:
    _drop_full(data)
    data["text_config"]["num_hidden_layers"] = 100


def _grown_with_full(data: dict[str, Any]) -> None:
    data["text_config"]["num_hidden_layers"] = 100


def _flat_kimi_linear_without_linear(data: dict[str, Any]) -> None:
    text = data.pop("text_config")
    text.pop("linear_attn_config")
    data.update(text)


SILENT = [
    ("linear_attn_config deleted", lambda d: d["text_config"].pop("linear_attn_config"),
     "text_config.linear_attn_config"),
    ("flat kimi_linear without linear attention", _flat_kimi_linear_without_linear,
     "linear_attn_config"),
    ("kda_layers shifted by one", _shift, "text_config.linear_attn_config.full_attn_layers"),
    ("kda_layers empty", _empty, "text_config.linear_attn_config.full_attn_layers"),
    ("num_hidden_layers raised", _grown, "text_config.linear_attn_config.full_attn_layers"),
    ("num_hidden_layers raised with both lists", _grown_with_full,
     "text_config.linear_attn_config.full_attn_layers"),
    ("true for an integer", lambda d: d["text_config"].update(num_attention_heads=True),
     "text_config.num_attention_heads"),
    ("true in a layer list",
     lambda d: d["text_config"]["linear_attn_config"]["kda_layers"].__setitem__(0, True),
     "text_config.linear_attn_config.kda_layers.0"),
    ("float for an integer", lambda d: d["text_config"].update(kv_lora_rank=512.0),
     "text_config.kv_lora_rank"),
    ("non-string model_type", lambda d: d.update(model_type=3), "model_type"),
    ("non-string nested model_type", lambda d: d["text_config"].update(model_type=["k"]),
     "text_config.model_type"),
    ("flat field conflicting with text_config", lambda d: d.update(num_hidden_layers=27),
     "num_hidden_layers"),
    ("text_config not an object", lambda d: d.update(text_config=[1]), "text_config"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "mutate", "field"), SILENT, ids=[c[0] for c in SILENT])
def test_the_config_loader_refuses_what_it_used_to_accept(
    case: str, mutate: Callable[[dict[str, Any]], object], field: str
) -> None:
    refusal = refused(lambda: model_from_config(_k3(mutate)))
    assert refusal.code == "invalid_config"
    assert refusal.facts["field"] == field


def test_a_conflict_names_both_fields() -> None:
    refusal = refused(lambda: model_from_config(_k3(lambda d: d.update(num_hidden_layers=27))))
    assert "num_hidden_layers=27" in str(refusal)
    assert "text_config.num_hidden_layers=93" in str(refusal)


def test_kimis_own_pattern_still_loads_without_full_attn_layers() -> None:
    assert model_from_config(_k3(_drop_full), name="kimi-k3") == preset("kimi-k3")
    agreeing = _k3(lambda d: d.update(num_hidden_layers=93, model_type="kimi_k3"))
    assert model_from_config(agreeing, name="kimi-k3") == preset("kimi-k3")


def test_a_huge_sweep_limit_is_refused_not_looped_over() -> None:
    kimi_linear = preset("kimi-linear-48b")
    with pytest.raises(Refusal) as caught:
        default_attn_tps(kimi_linear, 10**18)
    assert (caught.value.code, caught.value.facts["field"]) == ("size_limit", "limit")
    # up to the bound it answers from the divisors of the heads, not a walk to the limit
    assert default_attn_tps(kimi_linear, (1 << 31) - 1)[:6] == (1, 2, 4, 8, 16, 32)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: default_attn_tps(preset("kimi-k3"), float("inf")), "limit"),  # type: ignore[arg-type]
        (lambda: sweep(preset("kimi-k3"), [1, None]), "attn_tps[1]"),  # type: ignore[list-item]
        (lambda: engine_layer_names(preset("kimi-k3")).name(2.0), "layer"),  # type: ignore[arg-type]
        (lambda: engine_layer_names(preset("kimi-k3")).layer_of(3), "name"),  # type: ignore[arg-type]
        (lambda: sweep(preset("kimi-k3"), [8], engines=[None]), "engines[0]"),  # type: ignore[list-item]
    ],
)
def test_ill_typed_arguments_are_refusals_naming_the_argument(call: Any, field: str) -> None:
    with pytest.raises(Refusal) as caught:
        call()
    assert caught.value.code == "invalid_argument"
    assert field in str(caught.value)


def test_a_transfer_from_a_lifted_padding_limit_plans_at_once() -> None:
    # once a hang: a packing search run to its end for every segment (the engine now pins
    # #1152's packing), and both sides run the channel-major conv layout tokenspeed keeps
    transfer = plan_transfer(
        preset("kimi-k3"),
        Deployment(engine="tokenspeed", attn_tp=16, max_padding=1.0, conv_layout="DS"),
        Deployment(attn_tp=32, dcp=8, conv_layout="DS"),
        prompt_tokens=56_799,
    )
    assert transfer.num_consumers == 32


HUGE = 10**5000
"""An integer Python will not print in decimal (over 4,300 digits)."""


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda c: c.update(architectures=[HUGE]), "architectures.0"),
        (
            lambda c: c.update(
                quantization_config={
                    "quant_method": "modelopt",
                    "quant_algo": "NVFP4",
                    "group_size": HUGE,
                }
            ),
            "group_size",
        ),
        (lambda c: c.update(quantization_config={"quant_method": HUGE}), "quant_method"),
    ],
)
def test_a_huge_integer_in_a_config_is_refused_naming_it(
    edit: Callable[[dict[str, Any]], None], field: str
) -> None:
    # once a ValueError: the loader's message printed the value, which Python will not do
    data = config()
    edit(data)
    with pytest.raises(Refusal) as caught:
        weights_per_rank(model_from_config(data), Deployment(attn_tp=8))
    assert field in str(caught.value) and "bits" in str(caught.value)


# Huge token counts in the ride and the transfer (issue 39, item 9) ----------------------------


@pytest.fixture(scope="module")
def dspark_ride() -> RidePlan:
    return plan_ride(plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2)))


@pytest.mark.parametrize("tokens", [10**18, 2**62, INT64_MAX, 2**33])
@pytest.mark.parametrize("call", ["store", "store_from_half", "capped_hit", "load", "report"])
def test_huge_token_counts_in_the_ride_are_answered_or_refused_at_once(
    dspark_ride: RidePlan, tokens: int, call: str
) -> None:
    calls: dict[str, Callable[[], object]] = {
        "store": lambda: dspark_ride.store_boundaries(tokens),
        "store_from_half": lambda: dspark_ride.store_boundaries(tokens, tokens // 2),
        "capped_hit": lambda: dspark_ride.capped_hit(tokens),
        "load": lambda: dspark_ride.load_destination(tokens),
        "report": lambda: ride_report(dspark_ride, tokens),
    }
    start = time.perf_counter()
    try:
        calls[call]()  # once a MemoryError for the stores, after seconds
    except Refusal as refusal:
        assert refusal.code == "size_limit"
        assert refusal.facts["field"] == "num_tokens"
        assert isinstance(refusal.facts["bound"], int) and refusal.facts["bound"] < tokens
    assert time.perf_counter() - start < QUICK_S


@pytest.mark.parametrize("tokens", [INT64_MAX + 1, 10**30])
def test_token_counts_beyond_int64_are_refused_naming_the_argument(
    dspark_ride: RidePlan, tokens: int
) -> None:
    for call, field in (
        (lambda: dspark_ride.store_boundaries(tokens), "num_tokens"),
        (lambda: dspark_ride.store_boundaries(5000, tokens), "start_tokens"),
        (lambda: dspark_ride.capped_hit(tokens), "hit_tokens"),
        (lambda: dspark_ride.load_destination(tokens), "computed_tokens"),
    ):
        refusal = refused(call)
        assert (refusal.code, refusal.facts) == ("size_limit", {"field": field, "bound": INT64_MAX})


def test_a_transfer_of_2_to_the_32_tokens_is_checked_without_listing_its_copies() -> None:
    # DCP 8 at interleave 1: each decode rank owns every 8th token, 2**29 strided copies per
    # segment; the invariants once listed them all (a MemoryError after seconds)
    transfer = plan_transfer(
        preset("kimi-k3"), Deployment(pp=8), Deployment(attn_tp=8, dcp=8), prompt_tokens=2**32
    )
    start = time.perf_counter()
    assert transfer_violations(transfer) == []
    assert time.perf_counter() - start < 5 * QUICK_S
    widest = max((s for pair in transfer.pairs for s in pair.segments), key=lambda s: s.num_copies)
    assert widest.num_copies == 2**32 // 8
    refusal = refused(widest.copies)
    assert (refusal.code, refusal.facts) == (
        "size_limit",
        {"field": "num_copies", "bound": MAX_LISTED_ITEMS},
    )
