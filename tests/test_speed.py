"""What keeps planning fast stays correct: integer arithmetic at any size, trusted records equal to
validated ones, the grouping and packing shortcuts equal to their plain definitions, and the
lazy imports (``import k3layout`` loads no submodule; ``plan --json`` never loads rich)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from k3layout import (
    Deployment,
    Group,
    HybridModel,
    KDALayer,
    MLALayer,
    Refusal,
    VllmPlan,
    load_plan,
    plan,
    plan_vllm,
    rank_sizes,
)
from k3layout._frozen import (
    trusted,
    trusted_filler,
    trusted_maker,
    trusted_record,
    trusted_variant,
    trusted_variants,
)
from k3layout.engines.tokenspeed.layout import group_tokenspeed
from k3layout.engines.vllm.layout import group_vllm
from k3layout.layouts.pipeline import PLANS_KEPT, _planned
from k3layout.transfer import Segment

ROOT = Path(__file__).resolve().parent.parent


def state_bytes(heads: int, head_dim: int, kernel: int, tp: int, spec: int) -> int:
    """``S(tp, s)`` by the formula, in Python integers."""
    return (3 * heads * head_dim // tp) * (kernel - 1 + spec) * 2 + (
        heads // tp
    ) * head_dim * head_dim * 4


def huge_model(heads: int, head_dim: int, kv_lora_rank: int = 512) -> HybridModel:
    kda = KDALayer(num_heads=heads, head_dim=head_dim)
    mla = MLALayer(num_heads=heads, kv_lora_rank=kv_lora_rank)
    return HybridModel(name="huge", model_type="kimi_k3", layers=(kda, mla))


def test_a_state_near_2_to_the_62_raises_the_block_exactly() -> None:
    # A 62-bit state within the model bounds (MAX_MODEL_DIM heads and head dim): float
    # division would give a block 128 tokens short.
    heads, head_dim = 1_048_575, 1_048_343
    state = state_bytes(heads, head_dim, 4, 1, 0)
    assert state.bit_length() == 62
    per_token = 576  # fp8 latent
    block = 128 * -(-state // (128 * per_token))
    assert block != 128 * math.ceil(state / (128 * per_token))  # the float formula is off here
    result = plan(huge_model(heads, head_dim), Deployment())
    assert isinstance(result, VllmPlan)
    assert result.sizes.kda_state_bytes == state
    assert (result.block_tokens, result.page_bytes) == (block, block * per_token)
    assert result.page_bytes >= state > result.page_bytes - 128 * per_token
    assert result.kda_page_padding_bytes == block * per_token - state


def reference_vllm_groups(model: HybridModel) -> list[tuple[str, tuple[int, ...]]]:
    """vLLM's grouping written plainly: buckets by kind in order of first appearance."""
    buckets: dict[str, list[int]] = {}
    for layer_id, layer in enumerate(model.module_layers):
        buckets.setdefault("attention" if layer.kind == "mla" else "kda", []).append(layer_id)
    smallest = min(len(ids) for ids in buckets.values())
    largest = max(len(ids) for ids in buckets.values())
    size = largest if 2 * largest < 3 * smallest else smallest
    groups = []
    for kind, ids in buckets.items():
        count = math.ceil(len(ids) / size)
        groups += [(kind, tuple(ids[i::count])) for i in range(count)]
    return groups


@pytest.mark.parametrize(
    "pattern", ["kkkm" * 6 + "m", "mkkk" * 5, "mk", "km", "mmmmkk", "kkkkkkkm", "m"]
)
@pytest.mark.parametrize("draft", [0, 3])
def test_grouping_from_cached_layer_ids_matches_its_definition(pattern: str, draft: int) -> None:
    mla, kda = MLALayer(num_heads=8), KDALayer(num_heads=8, head_dim=16)
    layers = tuple(mla if c == "m" else kda for c in pattern)
    model = HybridModel(name="t", model_type="kimi_k3", layers=layers, draft_layers=(mla,) * draft)
    sizes = rank_sizes(model, Deployment())
    groups = group_vllm(model, sizes)
    assert [(g.kind, g.layers) for g in groups] == reference_vllm_groups(model)
    for group in (*groups, *group_tokenspeed(model, sizes)):
        assert group == Group.model_validate(group.model_dump())


def test_trusted_records_equal_validated_ones_field_for_field() -> None:
    made = trusted(Group, name="g", kind="kda", layers=(0, 4))
    checked = Group(name="g", kind="kda", layers=(0, 4))
    assert made == checked
    assert made.model_dump_json() == checked.model_dump_json()
    assert made.model_fields_set == checked.model_fields_set
    assert hash(made) == hash(checked)
    segment = Segment(
        field="conv", layers=(3,), kind="slot", src_offset_bytes=0, dst_offset_bytes=0,
        length_bytes=8,
    )  # fmt: skip
    moved = trusted_variant(segment, layers=(3, 7))
    assert moved == segment.model_copy(update={"layers": (3, 7)})
    assert moved.model_dump_json() == Segment.model_validate(moved.model_dump()).model_dump_json()
    given = {"name": "g", "kind": "kda", "layers": (0, 4), "first_plane": 0}
    every = Group(**given)  # every field given
    for fast in (trusted_record(Group, dict(given)), trusted_maker(Group)(dict(given))):
        assert fast == every and hash(fast) == hash(every)
        assert fast.model_dump_json() == every.model_dump_json()
        assert fast.model_fields_set == every.model_fields_set
    template = dict(segment.model_dump())
    filled = trusted_filler(Segment, "layers")((template,), (2, 9))
    assert filled == [segment.model_copy(update={"layers": (2, 9)})]
    assert template["layers"] == (3,)  # the template is left as it was
    with pytest.raises(TypeError, match="colour"):
        trusted_filler(Segment, "colour")
    many = trusted_variants((segment, moved), layers=(1, 2))
    assert [m.layers for m in many] == [(1, 2), (1, 2)]
    assert many[0] == segment.model_copy(update={"layers": (1, 2)})
    # a shared fields set is never changed: a copy that updates it gets its own
    before = set(many[0].model_fields_set)
    updated = many[0].model_copy(update={"num_copies": 1})
    assert updated.model_fields_set == before | {"num_copies"}
    assert many[0].model_fields_set == many[1].model_fields_set == before
    with pytest.raises(TypeError, match="no fields"):
        trusted(Group, name="g", kind="kda", layers=(), colour="red")
    with pytest.raises(TypeError, match="required"):
        trusted(Group, name="g", kind="kda")


def test_plans_built_from_trusted_records_round_trip() -> None:
    from k3layout import preset  # noqa: PLC0415

    for deployment in (
        Deployment(attn_tp=8, spec_tokens=2, pp=3),
        Deployment(engine="tokenspeed", attn_tp=8, spec_tokens=8),
    ):
        result = plan(preset("kimi-k3-dspark"), deployment)
        assert load_plan(result.model_dump_json()) == result
        assert load_plan(result.model_dump_json()).model_dump_json() == result.model_dump_json()


def run_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=ROOT
    )
    return done.stdout.strip()


def test_import_k3layout_loads_no_submodule_and_plan_loads_only_the_planner() -> None:
    heavy = ("rich", "k3layout.offload", "k3layout.transfer", "k3layout.torch", "torch")
    code = (
        "import sys, k3layout\n"
        f"heavy = {heavy!r}\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "k3layout.plan(k3layout.preset('kimi-k3'), k3layout.Deployment(attn_tp=8))\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "print(k3layout.plan_ride.__module__, 'k3layout.offload' in sys.modules)\n"
    )
    at_import, after_plan, lazy = run_python(code).splitlines()
    assert at_import == "[]"
    assert after_plan == "[]"
    assert lazy == "k3layout.offload.ride True"


def test_plan_json_does_not_import_rich() -> None:
    code = (
        "import contextlib, io, sys\n"
        "from k3layout.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    code = main(['plan', '--model', 'kimi-k3', '--json'])\n"
        "print(code, out.getvalue().lstrip()[:1], 'rich' in sys.modules)\n"
    )
    assert run_python(code) == "0 { False"


# The pipeline's memo of recent plans: a plan is a value of its inputs, so planning the same
# model object and an equal deployment again returns the plan already made.


def _k3_model() -> HybridModel:
    kda = KDALayer(num_heads=96, head_dim=128)
    mla = MLALayer(num_heads=96, q_lora_rank=1536)
    return HybridModel(
        name="k3-like",
        model_type="kimi_k3",
        layers=tuple(mla if i % 4 == 3 else kda for i in range(8)),
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tokenspeed"])
def test_planning_again_returns_the_plan_made_and_equals_a_first_plan(engine: str) -> None:
    model = _k3_model()
    first = plan(model, Deployment(engine=engine, attn_tp=8))
    again = plan(model, Deployment(engine=engine, attn_tp=8))  # equal, not the same object
    assert again is first
    _planned.cache_clear()
    fresh = plan(model, Deployment(engine=engine, attn_tp=8))
    assert fresh is not first and fresh == first
    assert fresh.model_dump_json() == first.model_dump_json()


def test_an_equal_model_built_anew_or_another_deployment_is_planned_anew() -> None:
    model = _k3_model()
    base = plan_vllm(model, Deployment(attn_tp=8))
    assert plan_vllm(_k3_model(), Deployment(attn_tp=8)) is not base
    other = plan_vllm(model, Deployment(attn_tp=8, kv_dtype="bf16"))
    assert other is not base and other.block_tokens * 2 == base.block_tokens


def test_the_memo_is_bounded_and_keeps_no_refusal() -> None:
    _planned.cache_clear()
    model = _k3_model()
    for gib in range(PLANS_KEPT + 50):
        plan(model, Deployment(attn_tp=8, kv_memory_bytes=(gib + 1) << 30))
    assert _planned.cache_info().currsize == PLANS_KEPT
    for _ in range(2):  # refused each time, never kept as an answer
        with pytest.raises(Refusal):
            plan(model, Deployment(attn_tp=5))
    assert _planned.cache_info().currsize == PLANS_KEPT
