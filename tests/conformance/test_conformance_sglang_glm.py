"""GLM-5.3-Flash on SGLang 0.5.23: k3layout's plan against SGLang's own resolution, memory
configurator and pools, run on CPU by ``sglang_glm.plan_glm``.

Every case compares, or both refuse: the DSA backends and the page SGLang forces, the cell its
configurator budgets (the latent row, 528 B on SM90 fp8, and the pooled index keys at
``ceil(132 / 16)`` bytes a token), the token pool, the mamba slots and the running requests
of a budget, the pool tensors it builds (every latent ``kv_buffer``, every index-key tensor,
the KDA conv and temporal states, each through ``pool_tensors`` and ``byte_range``), and the
launch it takes: the architectures override and the track interval k3layout's flags carry
(without them SGLang does not start, which the last tests show).
"""

from __future__ import annotations

import itertools
import json
from functools import cache
from typing import Any

import pytest
from sglang_engine import require_sglang

require_sglang()

from glm_variants import VARIANTS, variant_id  # noqa: E402
from sglang_glm import GLM_CONFIG, glm_config, plan_glm  # noqa: E402

from k3layout import Deployment, HybridModel, Refusal, model_from_config, plan  # noqa: E402
from k3layout.engines.sglang import (  # noqa: E402
    SglangPlan,
    check_pools,
    plan_from_sglang,
    plan_sglang,
)

BUDGET = 40 << 30
GPUS = ("h200", "b200")
DTYPES = {"fp8": "fp8", "bf16": "bf16"}


@cache
def glm(mtp_layers: int | None = None) -> HybridModel:
    """The fixture, declaring ``mtp_layers`` MTP layers (``None``: absent, as it ships)."""
    config = json.loads(GLM_CONFIG.read_text())
    if mtp_layers is not None:
        config["text_config"]["num_nextn_predict_layers"] = mtp_layers
    return model_from_config(config, name="glm-5.3-flash")


Case = tuple[str, int, str, int, int, bool, int | None, int, int | None]
"""gpu, attention TP, cache dtype, PP, attention DP, radix cache, requested running requests,
NEXTN steps, MTP layers the config declares (``None``: absent)."""


def grid() -> list[Case]:
    cases: list[Case] = [
        (gpu, tp, dtype, pp, 1, True, None, 0, None)
        for gpu, tp, dtype, pp in itertools.product(GPUS, (1, 2, 4, 8, 16), DTYPES, (1, 2, 4))
    ]
    cases += [
        (gpu, tp, "fp8", 1, dp, True, None, 0, None)
        for gpu, (tp, dp) in itertools.product(GPUS, ((4, 2), (2, 4), (8, 2)))
    ]
    cases += [(gpu, 8, "bf16", 1, 1, False, None, 0, None) for gpu in GPUS]
    cases += [  # every attention TP of 64 heads
        (gpu, tp, dtype, 1, 1, True, None, 0, None)
        for gpu, tp, dtype in itertools.product(GPUS, (32, 64), DTYPES)
    ]
    cases += [("h200", 8, "fp8", 1, 1, True, running, 0, None) for running in (16, 256)]
    cases += [
        (gpu, tp, dtype, pp, 1, True, None, spec, mtp)
        for gpu, tp, dtype, pp, spec, mtp in itertools.product(
            GPUS, (1, 8), DTYPES, (1, 2), (1, 2, 3), (None, 1, 2)
        )
    ]
    cases += [
        ("b200", 4, "fp8", 1, 2, True, None, 2, None),
        ("h200", 8, "bf16", 1, 1, False, None, 1, 1),
    ]
    return cases


def case_id(case: Case) -> str:
    gpu, tp, dtype, pp, dp, radix, running, spec, mtp = case
    return (
        f"{gpu}-tp{tp}-{dtype}-pp{pp}-dp{dp}"
        + ("" if radix else "-noradix")
        + ("" if running is None else f"-r{running}")
        + ("" if not spec else f"-nextn{spec}-mtp{mtp}")
    )


def launched(ours: SglangPlan) -> dict[str, Any]:
    """The SGLang settings k3layout's launch line gives beyond the parallelism."""
    flags = dict(ours.launch_flags())
    override = flags.get("--json-model-override-args")
    return {
        "mamba_track_interval": flags.get("--mamba-track-interval"),
        "override": None if override is None else json.loads(override),
    }


@pytest.mark.parametrize("case", grid(), ids=case_id)
def test_glm_plan_matches_sglang(case: Case) -> None:
    gpu, tp, dtype, pp, dp, radix, running, spec, mtp = case
    deployment = Deployment(
        engine="sglang",
        gpu=gpu,
        attn_tp=tp,
        attn_dp=dp,
        pp=pp,
        kv_dtype=dtype,
        prefix_caching=radix,
        max_running_requests=running,
        spec_tokens=spec,
    )
    compare(glm(mtp), deployment, mtp)


def compare(
    model: HybridModel,
    deployment: Deployment,
    mtp: int | None = None,
    config_override: dict[str, Any] | None = None,
) -> tuple[Refusal, dict[str, Any]] | None:
    """k3layout's plan of ``model`` for ``deployment`` against SGLang's (``plan_glm`` on the
    fixture with ``mtp`` MTP layers and ``config_override``, at k3layout's launch flags): both
    refuse (returned, for their reasons), or the backends, page, cells, token pool, state
    slots, running requests and every stage's latent and index-key tensors agree."""
    gpu, tp, dp, pp = deployment.gpu, deployment.attn_tp, deployment.attn_dp, deployment.pp
    dtype, spec = deployment.kv_dtype, deployment.spec_tokens
    try:
        ours = plan_sglang(model, deployment)
    except Refusal as refusal:
        theirs = plan_glm(
            gpu,
            tp * dp,
            DTYPES[dtype],
            spec,
            mtp,
            dp=dp,
            pp=pp,
            mamba_track_interval=starting_interval(mtp, config_override),
            config_override=config_override,
            draft=False,
        )
        assert "refused" in theirs, f"k3layout refused, SGLang planned: {refusal}"
        return refusal, theirs
    flags = launched(ours)
    interval = flags["mamba_track_interval"]
    server: dict[str, Any] = {"disable_radix_cache": not deployment.prefix_caching}
    if deployment.max_running_requests is not None:
        server["max_running_requests"] = deployment.max_running_requests
    theirs = plan_glm(
        gpu,
        tp * dp,
        "bf16" if dtype == "bf16" else "fp8",
        spec,
        mtp,
        draft=False,
        dp=dp,
        pp=pp,
        budget_bytes=BUDGET,
        mamba_track_interval=None if interval is None else int(interval),
        config_override=config_override,
        server_args={
            **server,
            "json_model_override_args": json.dumps(flags["override"]),
        },
    )
    assert "refused" not in theirs, theirs
    capacity = ours.capacity(BUDGET)
    assert (theirs["dsa_prefill_backend"], theirs["dsa_decode_backend"], theirs["page_size"]) == (
        ours.prefill_attention_backend,
        ours.attention_backend,
        ours.page_tokens,
    )
    assert [stage["cell_size"] for stage in theirs["stages"]] == [
        ours.cell_bytes(stage.index) for stage in ours.stages
    ]
    assert theirs["max_total_num_tokens"] == capacity.max_total_num_tokens
    assert theirs["max_mamba_cache_size"] == capacity.max_mamba_cache_size
    assert theirs["max_running_requests"] == capacity.max_running_requests
    for stage in theirs["stages"]:
        pools = stage["pools"]["kv"]
        held = ours.stage(stage["pp_rank"])
        mla = next(g for g in held.groups if g.name == "full_attention").layers
        size = pools["size"]
        assert [t["shape"] for t in pools["latent"]] == [
            [size + ours.page_tokens, 1, ours.sizes.spec_of(layer).part("latent").shape[0]]
            for layer in mla
        ]
        assert [t["bytes"] for t in pools["index_k"]] == [
            (size // ours.page_tokens + 1)
            * ours.byte_range(layer, "index", 0, 1, stage["pp_rank"]).size_bytes
            for layer in mla
        ]
    return None


def starting_interval(mtp: int | None, config_override: dict[str, Any] | None) -> int:
    """A ``--mamba-track-interval`` SGLang starts the case's config with (for asking SGLang
    about a case k3layout refused): its DSA page, ``64 * index_kpool`` tokens (1024 for the
    fixture), as ``sglang_glm.WORKING_TRACK_INTERVAL`` records."""
    return 64 * int(glm_config(mtp, config_override)["text_config"]["index_kpool"])


VARIANT_DEPLOYMENTS = [
    # gpu, attention TP, cache dtype, NEXTN steps
    ("h200", 8, "fp8", 0),
    ("h200", 2, "bf16", 0),
    ("b200", 4, "fp8", 0),
    ("h200", 8, "bf16", 2),
]

REFUSED_WHERE = {
    "index_head_dim": "sglang/srt/mem_cache/memory_pool.py",
    "qk_rope_head_dim": "sglang/srt/utils/hf_transformers/config.py",
}
"""Where SGLang refuses a variant k3layout refuses, by the field k3layout names."""


@pytest.mark.parametrize(
    "variant",
    [(v, *d) for v in VARIANTS for d in VARIANT_DEPLOYMENTS],
    ids=lambda c: f"{variant_id(c[0])}-{c[1]}-tp{c[2]}-{c[3]}" + (f"-nextn{c[4]}" if c[4] else ""),
)
def test_config_variants_plan_as_sglang(variant: tuple[dict[str, Any], str, int, str, int]) -> None:
    """Each variant as SGLang plans it (or both refuse, for the same field)."""
    fields, gpu, tp, dtype, spec = variant
    override = {"text_config": fields}
    config = glm_config(None, override)
    refused: tuple[Refusal, dict[str, Any]] | None
    try:
        model = model_from_config(config, name="glm-variant")
    except Refusal as config_refusal:
        theirs = plan_glm(
            gpu,
            tp,
            DTYPES[dtype],
            spec,
            mamba_track_interval=starting_interval(None, override),
            config_override=override,
            pools=False,
            draft=False,
        )
        assert "refused" in theirs, f"k3layout refused the config, SGLang planned: {config_refusal}"
        refused = (config_refusal, theirs)
    else:
        deployment = Deployment(
            engine="sglang", gpu=gpu, attn_tp=tp, kv_dtype=dtype, spec_tokens=spec
        )
        refused = compare(model, deployment, config_override=override)
    if refused is not None:  # both refuse: for the same field
        ours, why = refused
        field = str(ours.facts.get("field", "")).rpartition(".")[2]
        assert why["where"].startswith(REFUSED_WHERE[field]), (ours, why)


def test_sglang_does_not_start_without_the_flags() -> None:
    """Why the launch line carries the two settings: SGLang's own defaults fail at start-up,
    the architectures on the nested config (its text config's null wins), the track interval
    on a bare assertion; k3layout refuses a track interval SGLang refuses."""
    without_override = plan_glm("h200", 8, "fp8", mamba_track_interval=1024, fix_architectures=None)
    assert "refused" in without_override and "TypeError" in without_override["refused"]
    default_interval = plan_glm("h200", 8, "fp8")
    assert default_interval["where"].startswith("sglang/srt/arg_groups/mamba_hook.py")
    with pytest.raises(Refusal) as caught:
        plan(glm(), Deployment(engine="sglang", attn_tp=8, mamba_track_interval=256))
    assert caught.value.facts["field"] == "mamba_track_interval"
    assert "refused" in plan_glm("h200", 8, "fp8", mamba_track_interval=1536)
    with pytest.raises(Refusal):
        plan(glm(), Deployment(engine="sglang", attn_tp=8, mamba_track_interval=1536))
    started = plan_glm("h200", 8, "fp8", mamba_track_interval=2048)
    assert "refused" not in started
    plan(glm(), Deployment(engine="sglang", attn_tp=8, mamba_track_interval=2048))


def test_dcp_refused_as_sglang_refuses() -> None:
    theirs = plan_glm("b200", 8, "fp8", mamba_track_interval=1024, server_args={"dcp_size": 2})
    assert "refused" in theirs and "dcp" in theirs["refused"].lower()
    with pytest.raises(Refusal) as caught:
        plan(glm(), Deployment(engine="sglang", gpu="b200", attn_tp=8, dcp=2))
    assert caught.value.code == "dcp_unsupported"


@pytest.mark.parametrize(
    ("gpu", "tp", "dtype", "pp", "spec"),
    [("h200", 8, "fp8", 1, 0), ("b200", 4, "bf16", 2, 0), ("h200", 8, "bf16", 1, 2)],
)
def test_bridge_plans_sglangs_objects_and_checks_its_pools(
    gpu: str, tp: int, dtype: str, pp: int, spec: int
) -> None:
    """``plan_from_sglang`` reads GLM-5.3-Flash's ``ServerArgs`` and ``ModelConfig`` as SGLang
    resolved them (the launch k3layout gives), and ``check_pools`` accepts every stage's pools
    SGLang built: each latent ``kv_buffer``, each pooled ``index_k`` and the KDA states."""
    deployment = Deployment(
        engine="sglang", gpu=gpu, attn_tp=tp, pp=pp, kv_dtype=dtype, spec_tokens=spec
    )
    ours = plan_sglang(glm(), deployment)
    flags = launched(ours)
    theirs = plan_glm(
        gpu,
        tp,
        dtype,
        spec,
        pp=pp,
        draft=False,
        objects=True,
        mamba_track_interval=int(flags["mamba_track_interval"]),
        server_args={"json_model_override_args": json.dumps(flags["override"])},
    )
    engine = theirs["objects"]
    for stage, (model_config, pools) in enumerate(engine["stages"]):
        bridged = plan_from_sglang(engine["server_args"], model_config, gpu)
        assert bridged.model.layers == ours.model.layers
        # the engine runs the interval k3layout's launch gives; the plan left it to k3layout
        assert bridged.mamba_track_interval == ours.mamba_track_interval
        unset = bridged.deployment.model_copy(update={"mamba_track_interval": None})
        assert unset == ours.deployment
        checked = check_pools(bridged, pools.req_to_token_pool, pools.token_to_kv_pool, stage)
        assert checked.page_tokens == 1024


FLAG_CASES = [
    # gpu, attention TP, dtype, NEXTN, MTP layers, PP, mamba ratio, max mamba slots,
    # max total tokens, radix cache, budget GiB
    ("h200", 8, "fp8", 0, None, 1, 0.5, None, None, True, 30),
    ("b200", 4, "bf16", 2, 1, 2, 2.0, 300, None, True, 60),
    ("h200", 2, "bf16", 1, None, 1, None, 64, 500_000, False, 60),
    ("b200", 8, "fp8", 0, None, 2, None, None, 500_000, True, 30),
]


@pytest.mark.parametrize("case", FLAG_CASES, ids=lambda c: "-".join(map(str, c)))
def test_memory_flags_as_sglang_reads_them(case: tuple[Any, ...]) -> None:
    """SGLang's memory flags (``--mamba-full-memory-ratio``, ``--max-mamba-cache-size``,
    ``--max-total-tokens``) and other budgets, on both cache dtypes, with NEXTN and PP."""
    gpu, tp, dtype, spec, mtp, pp, ratio, slots, total, radix, gib = case
    deployment = Deployment(
        engine="sglang",
        gpu=gpu,
        attn_tp=tp,
        pp=pp,
        kv_dtype=dtype,
        spec_tokens=spec,
        prefix_caching=radix,
        mamba_full_memory_ratio=ratio,
        max_mamba_cache_size=slots,
        max_total_tokens=total,
    )
    ours = plan_sglang(glm(mtp), deployment)
    capacity = ours.capacity(gib << 30)
    flags = launched(ours)
    server: dict[str, Any] = {
        "disable_radix_cache": not radix,
        "json_model_override_args": json.dumps(flags["override"]),
    }
    for name, value in (
        ("mamba_full_memory_ratio", ratio),
        ("max_mamba_cache_size", slots),
        ("max_total_tokens", total),
    ):
        if value is not None:
            server[name] = value
    interval = flags["mamba_track_interval"]
    theirs = plan_glm(
        gpu,
        tp,
        dtype,
        spec,
        mtp,
        pp=pp,
        budget_bytes=gib << 30,
        mamba_track_interval=None if interval is None else int(interval),
        server_args=server,
        pools=False,
        draft=False,
    )
    assert "refused" not in theirs, theirs
    assert (
        theirs["max_total_num_tokens"],
        theirs["max_running_requests"],
        theirs["max_mamba_cache_size"],
    ) == (
        capacity.max_total_num_tokens,
        capacity.max_running_requests,
        capacity.max_mamba_cache_size,
    )
