"""The command line in a subprocess: tables, JSON, refusal exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def k3layout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3layout", *args], capture_output=True, text=True, check=False
    )


def test_plan_prints_a_table_with_the_golden_numbers() -> None:
    run = k3layout("plan", "--model", "kimi-k3-dspark", "--attn-tp", "8", "--spec-tokens", "2")
    assert run.returncode == 0, run.stderr
    for text in ("1,536", "884,736", "25,657,344", "linear_attention_2", "full_attention"):
        assert text in run.stdout


def test_plan_json_holds_the_documented_fields_for_vllm() -> None:
    run = k3layout(
        "plan", "--model", "kimi-k3-dspark", "--attn-tp", "8", "--spec-tokens", "2", "--json"
    )
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["engine"] == "vllm"
    assert data["kda_state_bytes"] == 832_512
    assert (data["block_tokens"], data["page_bytes"], data["block_bytes"]) == (
        1536,
        884_736,
        25_657_344,
    )
    assert data["planes"] == 29
    assert [(g["name"], g["kind"], len(g["layers"])) for g in data["groups"]] == [
        ("linear_attention_0", "kda", 23),
        ("linear_attention_1", "kda", 23),
        ("linear_attention_2", "kda", 23),
        ("full_attention", "attention", 29),
    ]


def test_plan_json_holds_the_documented_fields_for_tokenspeed() -> None:
    run = k3layout(
        "plan", "--engine", "tokenspeed", "--attn-tp", "16", "--kv-dtype", "bf16", "--json"
    )
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["engine"] == "tokenspeed"
    assert data["mla_page_bytes"] == 147_456
    # tokenspeed main pins 12 MLA pages per plane: 24 planes of 12 bf16 pages, 4 state pages
    assert data["parent_bytes"] == 24 * 12 * 147_456 == 42_467_328
    assert data["packing"] == {
        "full_attention": 12,
        "linear_attention_0": 4,
        "linear_attention_1": 4,
        "linear_attention_2": 4,
    }
    assert round(data["padding_fraction"]["linear_attention_0"], 3) == 0.134
    assert data["packing_rule"]["chosen"] is True
    assert data["rule_1152"] is None  # the plan follows main, not #1152
    # K3 without a draft at bf16 TP 6: one state page per 12 MLA pages pads 0.701
    refused = k3layout("plan", "--engine", "tokenspeed", "--attn-tp", "6", "--kv-dtype", "bf16")
    assert refused.returncode == 2
    assert "padding fraction 0.701066 exceeds limit 0.250000" in refused.stderr


def test_the_old_engine_name_still_plans_and_says_it_is_deprecated() -> None:
    run = k3layout("plan", "--engine", "parent", "--attn-tp", "8", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["engine"] == "tokenspeed"
    assert "--engine parent is deprecated" in run.stderr and "--engine tokenspeed" in run.stderr


def test_plan_reads_a_config_path() -> None:
    run = k3layout("plan", "--model", str(FIXTURES / "kimi-linear-48b-a3b.config.json"), "--json")
    assert run.returncode == 0, run.stderr
    assert [len(g["layers"]) for g in json.loads(run.stdout)["groups"]] == [7, 7, 6, 7]


def test_a_refusal_exits_2_with_the_message_on_stderr() -> None:
    run = k3layout("plan", "--attn-tp", "5")
    assert run.returncode == 2
    assert "KDA num_heads=96 must be divisible by attn_tp=5" in run.stderr
    assert run.stdout == ""


def test_a_refusal_with_json_also_prints_it_on_stdout() -> None:
    run = k3layout("plan", "--attn-tp", "5", "--json")
    assert run.returncode == 2
    refused = json.loads(run.stdout)["refused"]
    assert refused["code"] == "heads_not_divisible"
    assert "attn_tp=5" in refused["message"]


def test_bad_option_values_are_refusals_naming_the_option() -> None:
    run = k3layout("plan", "--attn-tp", "0", "--json")
    assert run.returncode == 2
    assert json.loads(run.stdout)["refused"]["code"] == "invalid_argument"
    assert "--attn-tp" in run.stderr
    run = k3layout("plan", "--model", "kimi-k4")
    assert run.returncode == 2 and "unknown_model" in run.stderr


def test_sweep_shows_every_engine_and_the_refused_points() -> None:
    run = k3layout("sweep", "--tps", "5,6,8,32", "--json")
    assert run.returncode == 0, run.stderr
    cells = {(c["engine"], c["kv_dtype"], c["attn_tp"]): c for c in json.loads(run.stdout)}
    assert len(cells) == 3 * 2 * 4  # vllm, tokenspeed, sglang x fp8, bf16 x four TPs
    assert cells[("sglang", "fp8", 8)]["packing"] == "page 1"
    # tokenspeed main: fp8 below TP 8 breaks the exact MLA stride, bf16 TP 6 pads 0.701
    assert cells[("tokenspeed", "fp8", 6)]["refusal"] == "layout_unsupported"
    assert cells[("tokenspeed", "bf16", 6)]["refusal"] == "padding_limit"
    assert cells[("tokenspeed", "bf16", 32)]["packing"] == "12/8"
    assert cells[("tokenspeed", "fp8", 8)]["packing"] == "12/1"
    assert cells[("vllm", "fp8", 8)]["packing"] == "block 1536"
    engines = ("vllm", "tokenspeed", "sglang")
    assert {cells[(e, d, 5)]["refusal"] for e in engines for d in ("fp8", "bf16")} == {
        "heads_not_divisible"
    }
    table = k3layout("sweep", "--tps", "5,8")
    assert table.returncode == 0
    assert all(f" {name} " in table.stdout for name in (*engines, "fp8", "bf16"))
    assert "heads_not_divisible" in table.stdout
