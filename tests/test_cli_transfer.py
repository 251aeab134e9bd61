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
    # vLLM's own check refuses it: TransferTopology.tp_ratio, the decode's 3 not divisible
    # by the prefill's 2 (tests/conformance/test_conformance_nixl_tp.py runs it)
    assert refused["facts"] == {"prefill_tp": 2, "decode_tp": 3}
    assert "TransferTopology.tp_ratio" in refused["message"]
    assert "decode attn_tp=3 is not divisible by prefill attn_tp=2" in refused["message"]
    assert "[2, 4]" in refused["hint"]  # the decode TPs nearest 3 that pair with 2


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


def test_the_header_names_both_engines_layouts_and_the_default_prompt_length() -> None:
    done = k3layout("--prefill", "pp8xtp1", "--decode", "tp8xdcp8")
    assert done.returncode == 0, done.stderr
    # the console may wrap the first line anywhere: compare it with its spaces collapsed
    header = " ".join(" ".join(done.stdout.split("\n")[:3]).split())
    # vLLM's hybrid allocator on both sides: block 11,392 at TP 1, 1,536 at TP 8
    assert (
        "prefill vllm 0.34.0 (block 11392) pp8xtp1 -> decode vllm 0.34.0 (block 1536) tp8xdcp8"
        in header
    )
    assert "4,096 tokens (default)" in header
    # the TP pairing rule the decode's engine registered
    assert "vLLM 0.33.0 and 0.34.0 NIXL" in done.stdout


def test_a_given_prompt_length_is_not_marked_default() -> None:
    done = k3layout("--prefill", "pp8xtp1", "--decode", "tp8xdcp8", "--tokens", "4096")
    assert done.returncode == 0, done.stderr
    assert "4,096 tokens |" in " ".join(done.stdout.split("\n")[:2]).replace("\n", " ")
    assert "(default)" not in done.stdout


def test_json_names_engines_layouts_rule_and_whether_the_prompt_length_defaulted() -> None:
    given = json.loads(
        k3layout("--prefill", "tp8", "--decode", "tp2", "--tokens", "64", "--json").stdout
    )
    defaulted = json.loads(k3layout("--prefill", "tp8", "--decode", "tp2", "--json").stdout)
    assert (given["prompt_tokens"], given["prompt_tokens_default"]) == (64, False)
    assert (defaulted["prompt_tokens"], defaulted["prompt_tokens_default"]) == (4096, True)
    assert given["prefill_engine"] == given["decode_engine"] == "vllm"
    assert given["prefill_engine_version"] == given["decode_engine_version"] == "0.34.0"
    assert (given["prefill_layout"], given["decode_layout"]) == ("block 1536", "block 5760")
    assert given["pd_rule"] == "vLLM 0.33.0 and 0.34.0 NIXL"


def test_sglang_names_its_engine_and_layout_and_registers_no_rule() -> None:
    done = k3layout("--engine", "sglang", "--prefill", "tp8", "--decode", "tp2", "--json")
    report = json.loads(done.stdout)
    assert (report["prefill_engine"], report["decode_engine"]) == ("sglang", "sglang")
    assert report["pd_rule"] is None  # SGLang's pairing comes from its engine facts


def test_a_vllm_decode_gathers_its_heads_from_several_prefill_ranks() -> None:
    report = json.loads(k3layout("--prefill", "tp8", "--decode", "tp2", "--json").stdout)
    producers = {
        consumer: sorted(p["producer"] for p in report["rank_pairs"] if p["consumer"] == consumer)
        for consumer in (0, 1)
    }
    assert producers == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}  # vLLM's compute_tp_mapping
    # each consumer's 48 heads: S(2, 0) = 4 x S(8, 0), in 4 shares of S(8, 0)
    assert report["slot_bytes_per_consumer"] == [69 * 4 * S8] * 2


def test_a_prefill_tp_the_decode_tp_does_not_divide_is_refused_with_vllms_reason() -> None:
    done = k3layout("--prefill", "tp6", "--decode", "tp4", "--json")
    assert done.returncode == 2
    refused = json.loads(done.stdout)["refused"]
    assert refused["code"] == "tp_not_multiple"
    assert refused["facts"] == {"prefill_tp": 6, "decode_tp": 4}
    assert "TransferTopology.tp_ratio" in refused["message"]
    assert "prefill attn_tp=6 is not divisible by decode attn_tp=4" in refused["message"]
    assert "[3, 6]" in refused["hint"]
