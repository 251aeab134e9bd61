"""LMCache 0.5.6's own vLLM connector over k3layout's vLLM plans (``k3layout.plan_lmcache``):
the groups, the chunk, the bytes, every refusal; the figures are those LMCache's code gave on
vLLM's live objects (``tests/fixtures/lmcache-0.5.6-notes.md``; the conformance suite runs it
again)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import k3layout

from k3layout import (
    Deployment,
    LMCacheOptions,
    LMCachePlan,
    Refusal,
    plan,
    plan_lmcache,
    preset,
)

GiB = 1 << 30


def lmcache(
    model: str = "kimi-k3", options: dict[str, Any] | None = None, **fields: Any
) -> LMCachePlan:
    deployment = Deployment.model_validate({"attn_tp": 8, **fields})
    return plan_lmcache(plan(preset(model), deployment), LMCacheOptions(**(options or {})))


def test_kimi_k3_at_tp8_is_three_recurrent_kda_groups_and_one_mla_group() -> None:
    lm = lmcache()
    groups = lm.stages[0]
    assert [(len(g.layers), g.recurrent, g.window_tokens) for g in groups] == [
        (23, True, 1536),
        (23, True, 1536),
        (23, True, 1536),
        (24, False, -1),
    ]
    assert {g.tokens_per_block for g in groups} == {1536} and lm.chunk_tokens == 1536
    # a KDA layer's 814,080-byte state re-viewed as 1,536 rows of ceil16(530) = 544 bytes
    assert groups[0].bytes_per_chunk == 23 * 1536 * 544
    assert groups[3].bytes_per_chunk == 24 * 884_736  # one 1,536-token latent page a layer
    assert lm.stage_bytes_per_chunk == (78_888_960,)
    assert lm.writers_per_server == (8,) and not lm.mla_only  # a hybrid: every rank writes
    assert lm.bytes_per_token == 410_880


def test_dcp_scales_the_attention_block_alone_and_the_chunk_to_their_lcm() -> None:
    lm = lmcache(dcp=8)
    assert [g.tokens_per_block for g in lm.stages[0]] == [1536, 1536, 1536, 12_288]
    assert lm.smallest_chunk_tokens == lm.chunk_tokens == 12_288
    # every group sized for the whole chunk: eight KDA pages a layer, one latent page
    assert lm.stages[0][0].bytes_per_chunk == 23 * 12_288 * 544
    assert lm.stages[0][3].bytes_per_chunk == 24 * 884_736
    assert lm.bytes_per_token == 314_112
    assert lm.cache_model_suffix == ""
    assert lmcache(dcp=8, dcp_interleave=64).cache_model_suffix.endswith("-d8-interleave64")


@pytest.mark.parametrize(
    ("model", "fields", "server_bytes_per_token"),
    [
        ("kimi-k3", {"kv_dtype": "bf16"}, 812_928),
        ("kimi-k3", {"pp": 2}, 410_880),
        ("kimi-k3-dspark", {"spec_tokens": 2}, 433_920),
        ("kimi-linear-48b", {}, 119_296),
        ("kimi-linear-48b", {"kv_dtype": "bf16"}, 236_032),
        ("glm-5.3-flash", {"gpu": "h200"}, 145_878),
    ],
)
def test_each_grid_cases_server_bytes_are_lmcaches(
    model: str, fields: dict[str, Any], server_bytes_per_token: int
) -> None:
    lm = lmcache(model, **fields)
    assert lm.bytes_per_token == server_bytes_per_token


def test_glm_keeps_its_index_keys_apart_and_its_tail_ring_out() -> None:
    lm = lmcache("glm-5.3-flash", gpu="h200")
    parts = [(g.part, len(g.layers), g.kv_format) for g in lm.stages[0]]
    assert parts[-2:] == [("index", 11, "NL_X_NB_BSV_BSS"), ("latent", 11, "NL_X_NB_NH_BS_CS")]
    assert all(g.vllm_group != "tail" for g in lm.stages[0])
    assert lm.stages[0][-2].bytes_per_chunk == 11 * (1536 // 16) * 132


def test_tokens_fit_and_memory_for_are_whole_chunks_both_ways() -> None:
    lm = lmcache()
    held = lm.tokens_fit(100 * GiB)
    assert held % lm.chunk_tokens == 0 and held == 261_120
    assert lm.memory_for(held) <= 100 * GiB < lm.memory_for(held + 1)
    assert lm.memory_for(0) == 0 and lm.tokens_fit(0) == 0


def test_two_servers_halve_each_servers_bytes() -> None:
    one, two = lmcache(), lmcache(options={"servers": 2})
    assert two.writers_per_server == (4, 4)
    assert two.bytes_per_chunk_per_server == (one.bytes_per_chunk_per_server[0] // 2,) * 2


def test_a_pure_mla_model_writes_one_copy() -> None:
    from k3layout import HybridModel  # noqa: PLC0415

    k3 = preset("kimi-k3")
    mla = HybridModel.model_validate(
        {
            **k3.model_dump(),
            "name": "pure-mla",
            "layers": [layer for layer in k3.model_dump()["layers"] if layer["kind"] == "mla"],
            "architecture": None,
            "model_type": "deepseek_v3",
        }
    )
    lm = plan_lmcache(plan(mla, Deployment(attn_tp=8)))
    assert lm.mla_only and lm.writers_per_server == (1,)


@pytest.mark.parametrize(
    ("options", "fields", "code", "rule"),
    [
        ({"chunk_tokens": 256}, {}, "chunk_off_grid", None),
        ({"chunk_tokens": 2304}, {}, "chunk_off_grid", None),
        ({"max_num_batched_tokens": 1024}, {}, "connector_unsupported", "max_num_batched_tokens"),
        ({"pcp": 2}, {"dcp": 8}, "connector_unsupported", "pcp_with_dcp"),
        # LMCache's interleave rule is vLLM's, which refuses it first
        ({}, {"dcp": 8, "dcp_interleave": 7}, "dcp_interleave", None),
        ({"servers": 2}, {"dcp": 8}, "connector_unsupported", "servers_for_dcp"),
        ({"servers": 3}, {}, "connector_unsupported", "servers_divide_world"),
        ({"servers": 2}, {"attn_dp": 2}, "connector_unsupported", "servers_with_dp"),
        ({"servers": 2}, {"pp": 2}, "connector_unsupported", "servers_with_pp"),
        ({}, {"prefix_caching": False}, "mamba_cache_mode", None),
    ],
)
def test_every_startup_refusal_names_lmcaches_rule_and_what_works(
    options: dict[str, Any], fields: dict[str, Any], code: str, rule: str | None
) -> None:
    with pytest.raises(Refusal) as caught:
        lmcache(options=options, **fields)
    assert caught.value.code == code and caught.value.hint
    if rule is not None:
        assert caught.value.facts["rule"] == rule


def test_only_vllm_plans_are_lmcaches() -> None:
    with pytest.raises(Refusal) as caught:
        plan_lmcache(plan(preset("kimi-k3"), Deployment(engine="sglang", attn_tp=8)))
    assert caught.value.code == "engine_mismatch"
    with pytest.raises(Refusal):
        plan_lmcache("not a plan")  # type: ignore[arg-type]
    with pytest.raises(Refusal):
        LMCacheOptions.model_validate({"servers": 0})


@settings(max_examples=40, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4, 8, 16]),
    dtype=st.sampled_from(["fp8", "bf16"]),
    multiple=st.integers(1, 4),
    pp=st.sampled_from([1, 2]),
)
def test_any_multiple_of_the_smallest_chunk_plans_and_round_trips(
    tp: int, dtype: str, multiple: int, pp: int
) -> None:
    model = preset("kimi-linear-48b")
    result = plan(model, Deployment(attn_tp=tp, kv_dtype=dtype, pp=pp))
    base = plan_lmcache(result, LMCacheOptions(max_num_batched_tokens=1 << 16))
    chunk = base.smallest_chunk_tokens * multiple
    lm = plan_lmcache(result, LMCacheOptions(chunk_tokens=chunk, max_num_batched_tokens=1 << 16))
    assert all(chunk % g.tokens_per_block == 0 for groups in lm.stages for g in groups)
    assert lm.stage_bytes_per_chunk == tuple(multiple * b for b in base.stage_bytes_per_chunk)
    assert LMCachePlan.model_validate_json(lm.model_dump_json()) == lm
    assert lm == plan_lmcache(result, lm.options)  # deterministic


def test_the_cli_plans_lmcaches_connector_and_refuses_its_chunk() -> None:
    done = k3layout("ride", "--connector", "lmcache", "--attn-tp", "8", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["chunk_tokens"] == 1536
    table = k3layout("ride", "--connector", "lmcache", "--attn-tp", "8", "--lmcache-gib", "100")
    assert "261,120" in table.stdout and "410,880.00" in table.stdout
    refused = k3layout("ride", "--connector", "lmcache", "--attn-tp", "8", "--chunk", "256")
    assert refused.returncode == 2 and "chunk_off_grid" in refused.stdout + refused.stderr
    atom = k3layout("ride", "--connector", "atom", "--attn-tp", "8", "--json")
    assert atom.returncode == 0 and "image_bytes" in atom.stdout


def test_recommend_adds_the_flags_that_start_lmcaches_connector() -> None:
    done = k3layout(
        "recommend",
        *("--model", "kimi-linear-48b", "--attn-tp", "1", "--gpu", "h200"),
        *("--requests", "20", "--max-model-len", "4096", "--offload", "lmcache"),
    )
    assert done.returncode == 0, done.stderr
    launch, server = done.stdout.splitlines()[1:3]
    assert '--kv-transfer-config \'{"kv_connector":"LMCacheMPConnector"' in launch
    # vLLM's default 2,048 batched tokens do not cover the 3,840-token KDA block at TP 1
    assert launch.endswith("--max-num-batched-tokens 3840")
    assert server == "lmcache server --chunk-size 3840"
    at_tp8 = k3layout(
        "recommend",
        *("--model", "kimi-linear-48b", "--attn-tp", "8", "--gpu", "h200"),
        *("--requests", "20", "--max-model-len", "4096", "--offload", "lmcache", "--json"),
    )
    flags = dict(json.loads(at_tp8.stdout)["flags"])
    assert "--kv-transfer-config" in flags and "--max-num-batched-tokens" not in flags


@pytest.mark.parametrize(
    "fields",
    [
        {"chunk_tokens": 10**5000},
        {"max_num_batched_tokens": 10**30},
        {"servers": 0},
        {"pcp": -1},
        {"chunk_tokens": "1536"},
    ],
)
def test_bad_options_are_refused_naming_the_field(fields: dict[str, Any]) -> None:
    with pytest.raises(Refusal) as caught:
        LMCacheOptions.model_validate(fields)
    assert next(iter(fields)) in str(caught.value)


def test_the_cli_refuses_bad_lmcache_options_without_a_traceback() -> None:
    for argv in (("--chunk", "9" * 40), ("--servers", "0"), ("--lmcache-gib", "-1")):
        done = k3layout("ride", "--connector", "lmcache", "--attn-tp", "8", *argv)
        assert done.returncode == 2 and "Traceback" not in done.stderr, argv
