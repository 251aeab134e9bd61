"""The planner's ``sglang`` engine against SGLang 0.5.23's own sizing, run on CPU.

For every case of the grid, SGLang resolves its flags on the case's GPU and sizes its pools
(``sglang_engine.sglang_case``: its ``ServerArgs`` resolution, ``ModelConfig`` and
``KVCacheConfigurator``, the pools built on the meta device); the planner, given the same model
(loaded from the same ``config.json``) and the same flags, must answer the same: the prefill
and decode attention backends, the page, each pipeline stage's layer range, MLA and KDA layers
and cell size, ``max_total_num_tokens`` of every stage before the scheduler's MIN and after
it, the logical tokens (x DCP), ``max_mamba_cache_size``, ``max_running_requests``, the state
slot and the verify scratch, and the shape and dtype of every pool tensor SGLang allocates at
its own pool sizes. A case SGLang refuses, the planner refuses too, for the same reason.

One harness call serves every check of a case (answers are cached per case).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sglang_engine import require_sglang

require_sglang()

from sglang_engine import FIXTURES, GIB, MODEL_FILES, sglang_case  # noqa: E402

from k3layout import (  # noqa: E402
    Deployment,
    GQALayer,
    HybridModel,
    Refusal,
    load_config,
    plan,
    preset,
)
from k3layout.engines.sglang import SglangCapacity, SglangPlan  # noqa: E402
from k3layout.engines.sglang.pools import pool_tensors  # noqa: E402

PRESETS = {"kimi-k3": "kimi-k3", "kimi-linear": "kimi-linear-48b"}
DSPARK_DRAFT = FIXTURES / "sglang-dspark-draft"
"""A hand-written SGLang-format DSpark draft (not a released checkpoint): 5 dense layers of
64 KV heads x 128, ``block_size`` 7."""


@functools.cache
def target(model: str) -> HybridModel:
    """The planner's model, from the same ``config.json`` SGLang reads."""
    return load_config(MODEL_FILES[model])


@functools.cache
def k3_with_gqa_draft() -> HybridModel:
    """Kimi-K3 with the DSpark draft of ``DSPARK_DRAFT``, as GQA layers read off its config."""
    k3 = target("kimi-k3")
    config = json.loads((DSPARK_DRAFT / "config.json").read_text())
    layer = GQALayer(
        num_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
    )
    return HybridModel(
        name="kimi-k3-sglang-dspark",
        model_type=k3.model_type,
        layers=k3.layers,
        draft_layers=(layer,) * config["num_hidden_layers"],
        drafter="dspark",
    )


@dataclass(frozen=True)
class Case:
    """One SGLang launch: ``tp`` is SGLang's ``--tp-size``; ``dp`` with attention DP
    (``--dp-size D --enable-dp-attention``); ``eagle`` EAGLE's ``--speculative-num-steps``
    (topk 1, ``eagle + 1`` draft tokens); ``dspark`` DSpark with ``DSPARK_DRAFT``."""

    model: str = "kimi-k3"
    tp: int = 8
    kv_dtype: str = "fp8"
    gpu: str = "h200"
    budget_gib: int = 60
    dp: int = 1
    pp: int = 1
    dcp: int = 1
    eagle: int = 0
    dspark: bool = False
    max_running_requests: int | None = None
    mamba_full_memory_ratio: float | None = None
    max_mamba_cache_size: int | None = None
    disable_radix_cache: bool = False

    def __str__(self) -> str:
        parts = [self.model, f"tp{self.tp}", self.kv_dtype, self.gpu, f"{self.budget_gib}GiB"]
        for name, value, default in (
            ("dp", self.dp, 1),
            ("pp", self.pp, 1),
            ("dcp", self.dcp, 1),
            ("eagle", self.eagle, 0),
            ("mrr", self.max_running_requests, None),
            ("ratio", self.mamba_full_memory_ratio, None),
            ("mmcs", self.max_mamba_cache_size, None),
        ):
            if value != default:
                parts.append(f"{name}{value}")
        if self.dspark:
            parts.append("dspark")
        if self.disable_radix_cache:
            parts.append("no-radix")
        return "-".join(parts)

    @property
    def spec_tokens(self) -> int:
        if self.dspark:
            return int(json.loads((DSPARK_DRAFT / "config.json").read_text())["block_size"])
        return self.eagle

    def harness_kwargs(self) -> dict[str, Any]:
        """``sglang_case`` arguments (SGLang's flags) for this case."""
        kwargs: dict[str, Any] = dict(
            tp=self.tp,
            kv_dtype=self.kv_dtype,
            gpu=self.gpu,
            budget_bytes=self.budget_gib * GIB,
            pp=self.pp,
            dcp=self.dcp,
            max_running_requests=self.max_running_requests,
            mamba_full_memory_ratio=self.mamba_full_memory_ratio,
            max_mamba_cache_size=self.max_mamba_cache_size,
        )
        if self.dp != 1:
            kwargs.update(dp=self.dp, enable_dp_attention=True)
        if self.eagle:
            kwargs["spec"] = {
                "algorithm": "EAGLE",
                "num_steps": self.eagle,
                "eagle_topk": 1,
                "num_draft_tokens": self.eagle + 1,
            }
        if self.dspark:
            kwargs["spec"] = {"algorithm": "DSPARK", "draft_model_path": DSPARK_DRAFT}
        if self.disable_radix_cache:
            kwargs["server_args"] = {"disable_radix_cache": True}
        return kwargs

    def planner_model(self) -> HybridModel:
        return k3_with_gqa_draft() if self.dspark else target(self.model)

    def deployment(self) -> Deployment:
        """The Deployment a user writes by hand for the same launch."""
        return Deployment(
            engine="sglang",
            gpu=self.gpu,
            attn_tp=self.tp // self.dp,
            attn_dp=self.dp,
            pp=self.pp,
            dcp=self.dcp,
            kv_dtype=self.kv_dtype,
            spec_tokens=self.spec_tokens,
            prefix_caching=not self.disable_radix_cache,
            max_running_requests=self.max_running_requests,
            mamba_full_memory_ratio=self.mamba_full_memory_ratio,
            max_mamba_cache_size=self.max_mamba_cache_size,
        )


def grid() -> list[Case]:
    """Models x attention TP x cache dtype x GPU x budget; the refused TP 5 and 64; then
    attention DP, PP, DCP, EAGLE, the GQA DSpark draft and SGLang's memory flags."""
    cases = []
    for model in PRESETS:
        for tp in (1, 2, 4, 8, 16, 32):
            for kv_dtype in ("fp8", "bf16"):
                for gpu in ("h100", "h200", "b200"):
                    for gib in (60, 8, 1):
                        cases.append(Case(model, tp, kv_dtype, gpu, gib))
        for tp in (5, 64):
            cases.append(Case(model, tp))
        for gpu in ("h200", "b200"):
            cases.append(Case(model, 8, gpu=gpu, dp=8))
            for pp in (2, 4):
                cases.append(Case(model, 8, gpu=gpu, pp=pp))
            for dcp in (2, 8):
                cases.append(Case(model, 8, gpu=gpu, dcp=dcp))
        cases.append(Case(model, 4, eagle=3))
        cases.append(Case(model, 8, "bf16", pp=2))
        cases.append(Case(model, 8, dp=2))
    cases += [
        Case(tp=8, pp=4, budget_gib=8),
        Case(tp=8, pp=2, gpu="b200", budget_gib=8),
        Case(tp=4, pp=2, dcp=2, gpu="b200"),
        Case(tp=16, dp=2, dcp=2, gpu="b200"),
        Case(tp=8, dcp=8, kv_dtype="bf16", gpu="b200", budget_gib=8),
        # EAGLE, target side: num_steps s, topk 1, s + 1 draft tokens
        Case(eagle=1),
        Case(eagle=3),
        Case(eagle=7),
        Case(eagle=3, gpu="b200"),
        Case(eagle=3, budget_gib=8),
        Case(eagle=3, pp=2),
        Case(eagle=3, dp=8),
        Case(eagle=3, max_running_requests=16),
        Case(eagle=3, max_mamba_cache_size=200),
        Case(eagle=3, disable_radix_cache=True),
        Case(eagle=3, mamba_full_memory_ratio=0.5),
        # the GQA DSpark draft (gamma 7: 8 draft tokens)
        Case(dspark=True),
        Case(dspark=True, gpu="b200"),
        Case(tp=4, dspark=True),
        Case(dspark=True, kv_dtype="bf16", budget_gib=8),
        Case(dspark=True, pp=2),
        # SGLang's memory flags
        Case(max_running_requests=64),
        Case(max_running_requests=4096),
        Case(mamba_full_memory_ratio=0.5),
        Case(mamba_full_memory_ratio=2.0),
        Case(max_mamba_cache_size=200),
        Case(max_mamba_cache_size=200, max_running_requests=16),
        Case(disable_radix_cache=True),
        Case(disable_radix_cache=True, max_running_requests=256),
        Case(tp=1, disable_radix_cache=True, budget_gib=8),
        Case(dp=8, max_running_requests=64),
        Case(dp=8, max_mamba_cache_size=800),
        Case(pp=2, max_running_requests=64),
        Case(pp=2, disable_radix_cache=True),
        Case(pp=4, mamba_full_memory_ratio=0.5),
        Case(dcp=8, gpu="b200", max_running_requests=64),
        Case("kimi-linear", 4, mamba_full_memory_ratio=0.5),
        Case("kimi-linear", 4, disable_radix_cache=True),
        Case("kimi-linear", 8, max_mamba_cache_size=100),
    ]
    return cases


CASES = grid()


@functools.cache
def sglang(case: Case) -> dict[str, Any]:
    """SGLang's answer, pools included (one harness call per case)."""
    return sglang_case(MODEL_FILES[case.model], **case.harness_kwargs())


# SGLang's refusal messages, and the planner's refusal code for the same reason.
REASONS = {
    "is not divisible by": "heads_not_divisible",
    "Not enough GPU memory for hybrid": "budget_too_small",
    "too small to serve any requests": "budget_too_small",
    "CuteDSL MLA backend is only supported on Blackwell": "dcp_unsupported",
    "DSpark pipeline parallelism requires PD prefill": "draft_unsupported",
}


@dataclass(frozen=True)
class Planned:
    plan: SglangPlan
    capacity: SglangCapacity


@functools.cache
def planner(case: Case) -> Planned | Refusal:
    """The planner's plan and capacity of the case, at SGLang's context length, or its
    refusal."""
    answer = sglang(case)
    context = answer.get("context_len") or 1
    try:
        p = plan(case.planner_model(), case.deployment())
        assert isinstance(p, SglangPlan)
        return Planned(p, p.capacity(case.budget_gib * GIB, context))
    except Refusal as refusal:
        return refusal


def served(case: Case) -> tuple[dict[str, Any], Planned] | None:
    """SGLang's answer and the planner's, or ``None`` where both refuse (a case only one of
    them refuses fails here)."""
    answer = sglang(case)
    mine = planner(case)
    if "refused" in answer:
        assert isinstance(mine, Refusal), (
            f"SGLang refuses {case} ({answer['refused'][:200]} at {answer.get('where')}); "
            f"the planner serves it: {_numbers(mine)}"
        )
        return None
    assert isinstance(mine, Planned), (
        f"SGLang serves {case} ({_sglang_numbers(answer)}); the planner refuses: "
        f"{mine.code}: {mine}"
    )
    return answer, mine


def _numbers(mine: Planned | Refusal) -> str:
    if isinstance(mine, Refusal):
        return f"{mine.code}: {mine}"
    cap = mine.capacity
    return (
        f"tokens {cap.max_total_num_tokens}, slots {cap.max_mamba_cache_size}, "
        f"requests {cap.max_running_requests}"
    )


def _sglang_numbers(answer: dict[str, Any]) -> str:
    return (
        f"tokens {answer['max_total_num_tokens']}, slots {answer.get('max_mamba_cache_size')}, "
        f"requests {answer['max_running_requests']}"
    )


# --------------------------------------------------------------------------------------------
# The models
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_the_fixture_configs_sglang_reads_load_as_the_presets(model: str) -> None:
    loaded, built = target(model), preset(PRESETS[model])
    assert loaded.model_type == built.model_type
    assert loaded.layers == built.layers
    assert loaded.draft_layers == built.draft_layers == ()


def test_the_sglang_dspark_draft_fixture_is_marked_hand_written() -> None:
    readme = (DSPARK_DRAFT / "README.md").read_text()
    assert "hand-written" in readme
    assert "not a released checkpoint" in readme


# --------------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_planner_refuses_exactly_the_cases_sglang_refuses_and_for_the_same_reason(
    case: Case,
) -> None:
    answer = sglang(case)
    if served(case) is not None:
        return
    mine = planner(case)
    assert isinstance(mine, Refusal)
    reasons = {code for text, code in REASONS.items() if text in answer["refused"]}
    assert reasons, f"an SGLang refusal this test has no reason for: {answer['refused']}"
    assert mine.code in reasons, (
        f"{case}: SGLang refuses ({answer['refused'][:200]}), the planner for another "
        f"reason: {mine.code}: {mine}"
    )


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_planner_resolves_the_attention_backends_and_page_sglang_resolves(
    case: Case,
) -> None:
    both = served(case)
    if both is None:
        return
    answer, mine = both
    got = (mine.plan.prefill_attention_backend, mine.plan.attention_backend, mine.plan.page_tokens)
    want = (
        answer["prefill_attention_backend"],
        answer["decode_attention_backend"],
        answer["page_size"],
    )
    assert got == want, f"{case}: (prefill, decode, page) planned {got}, SGLang {want}"
    assert mine.plan.deployment.attn_tp == answer["attn_tp_size"]
    assert mine.plan.deployment.attn_dp == answer["attn_dp_size"]
    assert mine.plan.deployment.dcp == answer["attn_dcp_size"]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_stage_holds_the_layers_and_cell_size_sglang_gives_it(case: Case) -> None:
    both = served(case)
    if both is None:
        return
    answer, mine = both
    p = mine.plan
    assert len(p.stages) == len(answer["stages"]) == case.pp
    for stage, theirs in zip(p.stages, answer["stages"], strict=True):
        i = stage.index
        target_layers = tuple(layer for layer in stage.layers if layer < p.model.num_layers)
        assert target_layers == tuple(range(theirs["start_layer"], theirs["end_layer"])), (
            f"{case} stage {i}: layers planned {target_layers[0]}..{target_layers[-1]}, "
            f"SGLang [{theirs['start_layer']}, {theirs['end_layer']})"
        )
        mla = tuple(
            layer
            for g in p.stage(i).groups_of("attention")
            if g.name == "full_attention"
            for layer in g.layers
        )
        kda = tuple(layer for g in p.groups_of("kda", i) for layer in g.layers)
        assert mla == tuple(theirs["full_attention_layer_ids"]), f"{case} stage {i}: MLA layers"
        assert kda == tuple(theirs["mamba_layer_ids"]), f"{case} stage {i}: KDA layers"
        assert p.cell_bytes(i) == theirs["cell_size"], (
            f"{case} stage {i}: cell size planned {p.cell_bytes(i)}, SGLang {theirs['cell_size']}"
        )
        cap = mine.capacity.stages[i]
        assert cap.cell_bytes == theirs["cell_size"]
        assert cap.layers == stage.layers
        draft = theirs.get("dflash_draft_cell_size_per_token")
        assert mine.capacity.draft_bytes_per_token == (draft or 0), (
            f"{case} stage {i}: draft cell planned {mine.capacity.draft_bytes_per_token}, "
            f"SGLang {draft}"
        )


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_planner_sizes_tokens_slots_and_requests_as_sglang_does(case: Case) -> None:
    both = served(case)
    if both is None:
        return
    answer, mine = both
    cap = mine.capacity
    for stage, theirs in zip(cap.stages, answer["stages"], strict=True):
        # Each stage's own capacity, what it contributes to the scheduler's MIN (PP only).
        own = theirs["contributed_max_total_num_tokens"]
        if own is None:
            own = theirs["max_total_num_tokens"]
        assert stage.max_total_num_tokens == own, (
            f"{case} stage {stage.stage}: own tokens planned {stage.max_total_num_tokens}, "
            f"SGLang {own}"
        )
        # After the MIN every stage agrees.
        assert theirs["max_total_num_tokens"] == answer["max_total_num_tokens"]
    got = {
        "max_total_num_tokens": cap.max_total_num_tokens,
        "logical_max_total_num_tokens": cap.logical_tokens,
        "max_mamba_cache_size": cap.max_mamba_cache_size,
        "max_running_requests": cap.max_running_requests,
    }
    want = {name: answer.get(name) for name in got}
    assert got == want, f"{case}: planned {got}, SGLang {want}"
    first = answer["stages"][0]
    assert cap.state_slots_per_request == first["mamba_ratio"]
    assert cap.multimodal_reservation_bytes == round(answer["multimodal_reservation_gib"] * GIB)
    assert cap.mamba_full_memory_ratio == answer["mamba_full_memory_ratio"]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_planned_pool_tensors_are_the_tensors_sglang_allocates(case: Case) -> None:
    both = served(case)
    if both is None:
        return
    answer, mine = both
    p, cap = mine.plan, mine.capacity
    for theirs in answer["stages"]:
        i = theirs["pp_rank"]
        pools = theirs["pools"]
        kv = pools["token_to_kv_pool"]
        mamba = pools["mamba_pool"]
        # SGLang's pools are the sizes the planner gives.
        assert (kv["size"], mamba["size"]) == (
            cap.max_total_num_tokens,
            cap.max_mamba_cache_size,
        ), f"{case} stage {i}: pool sizes"
        assert kv["page_size"] == p.page_tokens
        planned = pool_tensors(p, kv["size"], mamba["size"], i)
        got = [(t.name, t.dtype, list(t.shape)) for t in planned]
        want = [
            *((f"kv_buffer[{j}]", b["dtype"], b["shape"]) for j, b in enumerate(kv["kv_buffer"])),
            *((f"conv[{j}]", c["dtype"], c["shape"]) for j, c in enumerate(mamba["conv"])),
            ("temporal", mamba["temporal"]["dtype"], mamba["temporal"]["shape"]),
        ]
        assert got == want, f"{case} stage {i}: pool tensors differ"
        assert [t.layers[0] for t in planned if t.name.startswith("kv_buffer")] == kv[
            "full_attention_layer_ids"
        ], f"{case} stage {i}: the MLA layers of the kv_buffers"
        assert all(t.layers == tuple(mamba["mamba_layer_ids"]) for t in planned[-2:])
        # One state slot of this stage's KDA layers (the pool's bytes over its slots).
        assert p.state_slot_bytes(i) == theirs["bytes_per_state_slot"], (
            f"{case} stage {i}: state slot planned {p.state_slot_bytes(i)}, "
            f"SGLang {theirs['bytes_per_state_slot']}"
        )
    # Speculative decoding's verify scratch (intermediate_ssm + intermediate_conv_window):
    # every stage charges the largest stage's, which is what that stage allocates.
    scratch = max(theirs.get("verify_scratch_bytes", 0) for theirs in answer["stages"])
    assert cap.verify_scratch_bytes == scratch, (
        f"{case}: verify scratch planned {cap.verify_scratch_bytes}, SGLang {scratch}"
    )


def test_the_grid_covers_what_it_says() -> None:
    """The grid holds refused and served cases of every kind it names."""
    kinds = {
        "attention DP": [c for c in CASES if c.dp > 1],
        "PP": [c for c in CASES if c.pp > 1],
        "DCP": [c for c in CASES if c.dcp > 1],
        "EAGLE": [c for c in CASES if c.eagle],
        "DSpark": [c for c in CASES if c.dspark],
        "no radix cache": [c for c in CASES if c.disable_radix_cache],
    }
    for kind, cases in kinds.items():
        assert any("refused" not in sglang(c) for c in cases), f"no served {kind} case"
    assert sum("refused" in sglang(c) for c in CASES) >= 10
    assert {c.gpu for c in CASES} == {"h100", "h200", "b200"}
    assert Path(MODEL_FILES["kimi-k3"]).exists()
