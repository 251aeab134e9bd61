"""``k3layout ride`` in a subprocess: the table, ``--json``, and exit 2 on a refusal."""

from __future__ import annotations

import json
import subprocess
import sys

K3_TP8 = ("--model", "kimi-k3-dspark", "--attn-tp", "8", "--spec-tokens", "2")


def k3layout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3layout", *args], capture_output=True, text=True, check=False
    )


def test_ride_prints_the_image_and_the_publish_order() -> None:
    run = k3layout("ride", *K3_TP8, "--hit", "5000")
    assert run.returncode == 0, run.stderr
    for text in (
        "61,046,784",  # image: 3 units x 23 planes x 884,736 B
        "57,443,328",  # state: 69 x 832,512 B
        "1,536",  # chunk
        "5,000 -> 4,608",  # the hit capped to the chunk grid
        "2 in every KDA group",  # (4,608 - 1) // 1,536
        "model.layers.3.self_attn.attn",
        "draft.layers.0.self_attn.attn",
    ):
        assert text in run.stdout, text


def test_ride_json_holds_the_documented_fields() -> None:
    run = k3layout("ride", *K3_TP8, "--chunk", "3072", "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["units"] == 3
    assert data["image_planes"] == 23
    assert data["image_bytes"] == 3 * 23 * 884_736
    assert data["state_bytes"] == 69 * 832_512
    assert data["chunk_tokens"] == 3072
    assert data["smallest_chunk_tokens"] == 1536
    assert len(data["plane_order"]) == 29
    assert data["plane_order"][:2] == [
        "model.layers.3.self_attn.attn",
        "model.layers.7.self_attn.attn",
    ]
    assert data["given_order"][:1] == ["draft.layers.0.self_attn.attn"]
    assert len(data["state_ranges"]) == 69


def test_with_dcp_8_a_1536_chunk_is_refused_naming_the_smallest() -> None:
    run = k3layout("ride", *K3_TP8, "--dcp", "8", "--chunk", "1536", "--json")
    assert run.returncode == 2
    assert "the smallest valid chunk is 12,288" in run.stderr
    refused = json.loads(run.stdout)["refused"]
    assert refused["code"] == "chunk_off_grid"
    assert refused["facts"]["smallest_chunk_tokens"] == 12_288


def test_each_startup_setting_is_refused_with_its_code() -> None:
    cases = {
        "mamba_cache_mode": ("--mamba-cache-mode", "none"),
        "prefix_caching_off": ("--no-prefix-caching",),
        "load_failure_policy": ("--kv-load-failure-policy", "fail"),
        "engine_mismatch": ("--engine", "tokenspeed"),
    }
    for code, extra in cases.items():
        run = k3layout("ride", *K3_TP8, *extra, "--json")
        assert run.returncode == 2, code
        assert json.loads(run.stdout)["refused"]["code"] == code
        assert f"refused [{code}]" in run.stderr


def test_a_model_other_than_kimi_k3_is_refused_without_json() -> None:
    run = k3layout("ride", "--model", "kimi-linear-48b", "--attn-tp", "8")
    assert run.returncode == 2
    assert run.stdout == ""
    assert "model_type=kimi_linear" in run.stderr


def test_bad_option_values_are_refusals() -> None:
    run = k3layout("ride", *K3_TP8, "--chunk", "0", "--json")
    assert run.returncode == 2
    assert json.loads(run.stdout)["refused"]["code"] == "invalid_argument"
    assert "--chunk" in run.stderr


def test_ride_takes_a_pipeline_stage() -> None:
    run = k3layout("ride", *K3_TP8, "--pp", "2", "--stage", "1", "--publish-order", "module")
    assert run.returncode == 0, run.stderr
    data = json.loads(k3layout("ride", *K3_TP8, "--pp", "2", "--stage", "1", "--json").stdout)
    assert (data["stage"], data["units"], data["image_planes"]) == (1, 3, 11)
    first = k3layout("ride", *K3_TP8, "--pp", "2", "--json")
    assert first.returncode == 2
    assert json.loads(first.stdout)["refused"]["code"] == "aliasing"
