"""``k3layout transfer``: the summary tables, ``--json`` and refusals (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

H, D, K = 96, 128, 4  # K3's KDA heads, head dim, short conv kernel
S8 = (3 * H * D // 8) * (K - 1) * 2 + (H // 8) * D * D * 4  # S(8, 0) = 814,080


def k3layout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3layout", "transfer", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_json_reports_pairs_segments_and_bytes_per_consumer_rank() -> None:
    done = k3layout("--prefill", "pp8xtp1", "--decode", "tp8xdcp8", "--tokens", "4096", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["pairs"] == 8 * 8  # 8 consumers x 8 prefill stages
    # per pair: the stage's latent rows, conv and recurrent state, each one segment naming
    # every layer of the stage that holds it
    assert report["segments"] == 8 * 8 * 3
    # 69 KDA layers at S(8, 0) + 24 MLA layers x 4096/8 tokens x 576 B, on each of 8 ranks
    assert report["bytes_per_consumer"] == [69 * S8 + 24 * 4096 // 8 * 576] * 8
    assert len(report["bytes_per_producer"]) == 8
    assert sum(report["bytes_per_producer"]) == sum(report["bytes_per_consumer"])


def test_replayssm_adds_records_and_a_cursor_to_each_consumer() -> None:
    plain = k3layout("--prefill", "pp8xtp1", "--decode", "tp8xdcp8", "--json", "--spec-tokens", "2")
    replay = k3layout(
        "--prefill", "pp8xtp1", "--decode", "tp8xdcp8", "--json", "--spec-tokens", "2",
        "--replayssm",
    )  # fmt: skip
    records = 16 * (H // 8) * 128 * (2 + 2 + 4)  # L x heads x D x (k, u, g): 196,608
    extra = [
        with_replay - without
        for with_replay, without in zip(
            json.loads(replay.stdout)["bytes_per_consumer"],
            json.loads(plain.stdout)["bytes_per_consumer"],
            strict=True,
        )
    ]
    assert extra == [69 * records + 4] * 8


def test_the_table_shows_pairs_segments_and_both_rank_tables() -> None:
    done = k3layout("--prefill", "pp8xtp1", "--decode", "tp8xdcp8")
    assert done.returncode == 0, done.stderr
    for text in ("pairs", "segments", "bytes per consumer rank", "bytes per producer rank"):
        assert text in done.stdout
    assert f"{69 * S8 + 24 * 512 * 576:,}" in done.stdout


def test_a_refused_transfer_exits_2_with_the_refusal_on_both_streams() -> None:
    done = k3layout("--prefill", "pp8xtp2", "--decode", "tp3", "--json")
    assert done.returncode == 2
    assert "tp_not_multiple" in done.stderr
    refused = json.loads(done.stdout)["refused"]
    assert refused["code"] == "tp_not_multiple"
    assert refused["facts"] == {"prefill_tp": 2, "decode_tp": 3}


def test_chunked_transfer_to_a_dcp_decode_is_refused_at_admission() -> None:
    done = k3layout("--prefill", "pp8xtp1", "--decode", "tp8xdcp8", "--chunked", "--json")
    assert done.returncode == 2
    assert json.loads(done.stdout)["refused"]["code"] == "chunked_dcp_stateful"


def test_an_unreadable_topology_is_an_invalid_argument() -> None:
    done = k3layout("--prefill", "pp8xep1", "--decode", "tp8", "--json")
    assert done.returncode == 2
    refused = json.loads(done.stdout)["refused"]
    assert refused["code"] == "invalid_argument"
    assert refused["facts"] == {"option": "--prefill", "value": "pp8xep1", "part": "ep1"}
