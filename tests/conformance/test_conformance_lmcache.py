"""LMCache 0.5.6's own vLLM connector, run on vLLM's live worker objects (the installed vLLM
release, 0.33 or 0.34), plans what ``k3layout.plan_lmcache`` plans: its groups, their tokens per
block, the smallest chunk, each rank's bytes per chunk, each server's bytes, and every start-up
refusal with LMCache's words (``lmcache_vllm`` runs LMCache's code; the research is
``tests/fixtures/lmcache-0.5.6-notes.md``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_required import require_vllm, running

require_vllm()

import lmcache_vllm as lm  # noqa: E402
import test_conformance_layout as layout  # noqa: E402
from vllm_engine import Case, start  # noqa: E402

from k3layout import (  # noqa: E402
    Deployment,
    LMCacheOptions,
    LMCachePlan,
    Refusal,
    plan,
    plan_lmcache,
    plan_vllm,
)

RELEASE = running()

if not lm.lmcache_available():  # the test sessions install it (tests/conformance/lmcache-*.txt)
    raise ImportError("LMCache 0.5.6 is not installed: the README's test set-up installs it")

GRID: dict[str, dict[str, Any]] = {
    "k3-tp8-fp8": {"attn_tp": 8},
    "k3-tp8-bf16": {"attn_tp": 8, "kv_dtype": "bf16"},
    "k3-tp8-dcp8": {"attn_tp": 8, "dcp": 8},
    "k3-tp8-pp2": {"attn_tp": 8, "pp": 2},
    "k3-tp4-pp2-bf16": {"attn_tp": 4, "pp": 2, "kv_dtype": "bf16"},
    "k3-dspark-s2": {"attn_tp": 8, "drafter": "dspark", "spec_tokens": 2},
    "linear-tp1-bf16": {
        "model": "kimi-linear",
        "attn_tp": 1,
        "kv_dtype": "bf16",
        "max_model_len": 4096,
    },
    "linear-tp8-bf16": {
        "model": "kimi-linear",
        "attn_tp": 8,
        "kv_dtype": "bf16",
        "max_model_len": 4096,
    },
    "linear-tp8-fp8": {"model": "kimi-linear", "attn_tp": 8, "max_model_len": 4096},
}
BATCHED = 1 << 14
"""A ``--max-num-batched-tokens`` that covers every grid case's Mamba block."""
_STARTED: dict[str, Any] = {}


def started(name: str, tmp: Path) -> tuple[Any, LMCachePlan, Case]:
    """vLLM started for grid case ``name`` (once per module), LMCache's view of it, and
    k3layout's LMCache plan of the same deployment."""
    case = Case(**GRID[name])
    if name not in _STARTED:
        _STARTED[name] = lm.from_engine(start(case, tmp))
    ours = plan_lmcache(
        plan(layout.planner_model(case, tmp), layout.deployment(case)),
        LMCacheOptions(max_num_batched_tokens=BATCHED),
    )
    return _STARTED[name], ours, case


@pytest.mark.parametrize("name", sorted(GRID))
def test_the_groups_chunk_and_bytes_are_lmcaches(name: str, tmp_path: Path) -> None:
    theirs, ours, _ = started(name, tmp_path)
    geometry = lm.geometry(theirs)
    assert ours.smallest_chunk_tokens == geometry["smallest_chunk_size"]
    assert ours.mla_only is geometry["mla_only"] is False
    for stage, groups in enumerate(ours.stages):
        found = lm.groups(theirs, stage)["groups"]
        assert [
            (g["num_layers"], g["recurrent"], g["window"], g["tokens_per_block"], g["kv_format"])
            for g in found
        ] == [
            (len(g.layers), g.recurrent, g.window_tokens, g.tokens_per_block, g.kv_format)
            for g in groups
        ]
        chunk = lm.chunk(theirs, ours.chunk_tokens, stage)
        assert [g["bytes_per_chunk"] for g in chunk["kernel_groups"]] == [
            g.bytes_per_chunk for g in groups
        ]
        assert chunk["bytes_per_chunk"] == ours.stage_bytes_per_chunk[stage]
    server = lm.server_bytes(theirs, ours.chunk_tokens)
    assert tuple(server["bytes_per_chunk_per_server"]) == ours.bytes_per_chunk_per_server
    assert tuple(server["writers_per_server"]) == ours.writers_per_server
    assert lm.startup(theirs, ours.chunk_tokens, max_num_batched_tokens=BATCHED)["accepted"]


@pytest.mark.parametrize("name", ["k3-tp8-fp8", "k3-tp8-dcp8", "linear-tp8-bf16"])
@pytest.mark.parametrize("chunk", [256, 768, 2304, 3072, 12288])
def test_a_chunk_size_lmcache_refuses_is_refused_with_its_reason(
    name: str, chunk: int, tmp_path: Path
) -> None:
    theirs, ours, _ = started(name, tmp_path)
    verdict = lm.startup(theirs, chunk, max_num_batched_tokens=BATCHED)
    options = LMCacheOptions(chunk_tokens=chunk, max_num_batched_tokens=BATCHED)
    try:
        planned = plan_lmcache(plan_of(ours, name, tmp_path), options)
    except Refusal as refusal:
        assert not verdict["accepted"]
        assert refusal.code == "chunk_off_grid"
        assert refusal.message in verdict["refusal"]  # LMCache's own sentence
        return
    assert verdict["accepted"] and verdict["chunk_size"] == planned.chunk_tokens


def plan_of(ours: LMCachePlan, name: str, tmp: Path) -> Any:
    case = Case(**GRID[name])
    return plan(layout.planner_model(case, tmp), layout.deployment(case))


STARTUP: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    # (grid case, LMCache's start-up arguments, k3layout's options, the rule)
    (
        "k3-tp8-fp8",
        {"max_num_batched_tokens": 1024},
        {"max_num_batched_tokens": 1024},
        "max_num_batched_tokens",
    ),
    ("k3-tp8-fp8", {"max_num_batched_tokens": 2048}, {"max_num_batched_tokens": 2048}, ""),
    ("k3-tp8-dcp8", {"parallel": {"prefill_context_parallel_size": 2}}, {"pcp": 2}, "pcp_with_dcp"),
    ("k3-tp8-dcp8", {"n_servers": 2}, {"servers": 2}, "servers_for_dcp"),
    ("k3-tp8-fp8", {"n_servers": 2}, {"servers": 2}, ""),
    ("k3-tp8-fp8", {"n_servers": 3}, {"servers": 3}, "servers_divide_world"),
    ("k3-tp8-pp2", {"n_servers": 2}, {"servers": 2}, "servers_with_pp"),
]


@pytest.mark.parametrize(("name", "theirs_args", "our_args", "rule"), STARTUP)
def test_a_startup_lmcache_refuses_is_refused_with_its_reason(
    name: str, theirs_args: dict[str, Any], our_args: dict[str, Any], rule: str, tmp_path: Path
) -> None:
    theirs, ours, _ = started(name, tmp_path)
    args = {"max_num_batched_tokens": BATCHED, **theirs_args}
    verdict = lm.startup(theirs, ours.smallest_chunk_tokens, **args)
    options = LMCacheOptions.model_validate({"max_num_batched_tokens": BATCHED, **our_args})
    if not rule:
        assert verdict["accepted"]
        planned = plan_lmcache(plan_of(ours, name, tmp_path), options)
        if planned.options.servers > 1:
            server = lm.server_bytes(theirs, planned.chunk_tokens, planned.options.servers)
            assert tuple(server["bytes_per_chunk_per_server"]) == planned.bytes_per_chunk_per_server
        return
    with pytest.raises(Refusal) as caught:
        plan_lmcache(plan_of(ours, name, tmp_path), options)
    assert not verdict["accepted"]
    assert caught.value.facts["rule"] == rule
    said = caught.value.message.split("start-up: ", 1)[1]
    assert said in verdict["refusal"]


def test_the_dcp_interleave_lmcache_refuses_is_refused(tmp_path: Path) -> None:
    theirs, ours, _ = started("k3-tp8-dcp8", tmp_path)
    for interleave, refused in ((7, True), (3072, True), (64, False)):
        verdict = lm.startup(
            theirs,
            ours.smallest_chunk_tokens,
            max_num_batched_tokens=BATCHED,
            parallel={"cp_kv_cache_interleave_size": interleave},
        )
        assert verdict["accepted"] is not refused
        case = Case(**GRID["k3-tp8-dcp8"])
        fields = {**dict(layout.deployment(case)), "dcp_interleave": interleave}
        try:
            planned = plan_lmcache(
                plan(layout.planner_model(case, tmp_path), Deployment.model_validate(fields)),
                LMCacheOptions(max_num_batched_tokens=BATCHED),
            )
        except Refusal as refusal:
            assert refused, refusal
            if refusal.code == "connector_unsupported":
                assert refusal.facts["rule"] == "dcp_interleave"
                assert refusal.message.split("start-up: ", 1)[1] in verdict["refusal"]
            continue
        assert not refused
        assert planned.cache_model_suffix.endswith(f"d8-interleave{interleave}")


def test_glm_splits_its_attention_group_into_latent_and_index_as_lmcache_does() -> None:
    theirs = lm.from_glm(tp=8)
    assert isinstance(theirs, lm.Deployment), theirs
    from test_conformance_glm import glm  # noqa: PLC0415

    ours = plan_lmcache(
        plan(glm(0), Deployment(engine_version=RELEASE, attn_tp=8, gpu="h200")),
        LMCacheOptions(max_num_batched_tokens=BATCHED),
    )
    found = lm.groups(theirs)["groups"]
    assert [
        (g["num_layers"], g["recurrent"], g["tokens_per_block"], g["kv_format"]) for g in found
    ] == [(len(g.layers), g.recurrent, g.tokens_per_block, g.kv_format) for g in ours.stages[0]]
    chunk = lm.chunk(theirs, ours.chunk_tokens)
    assert [g["bytes_per_chunk"] for g in chunk["kernel_groups"]] == [
        g.bytes_per_chunk for g in ours.stages[0]
    ]
    assert lm.server_bytes(theirs, ours.chunk_tokens)["bytes_per_chunk_per_server"] == list(
        ours.bytes_per_chunk_per_server
    )


def test_vllm_parses_the_flags_that_start_the_connector(tmp_path: Path) -> None:
    from vllm_budget import engine_args  # noqa: PLC0415

    from k3layout.offload.lmcache import lmcache_flags, lmcache_recommended  # noqa: PLC0415

    case = Case(model="kimi-linear", attn_tp=1, max_model_len=4096)  # a 3,840-token block
    result = plan_vllm(layout.planner_model(case, tmp_path), layout.deployment(case))
    flags = [part for flag in lmcache_flags(lmcache_recommended(result)) for part in flag if part]
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(
        (Path(__file__).parent.parent / "fixtures" / "kimi-linear-48b-a3b.config.json").read_text()
    )
    args = engine_args(["--model", str(directory), "--skip-tokenizer-init", *flags])
    assert args.kv_transfer_config.kv_connector == "LMCacheMPConnector"
    assert args.max_num_batched_tokens == result.block_tokens == 3840  # over vLLM's 2,048
