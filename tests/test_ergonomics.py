"""Working with k3layout from a notebook, an IDE and a worker (issue 39, item 4): ``plan`` is
typed by the plan protocol or by the engine it names, plans, capacities and memory budgets show
themselves in one line and as a table, and a plan goes to a file and back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.pretty import pretty_repr
from typing_extensions import assert_type

from k3layout import (
    Deployment,
    EngineLayout,
    ParentPlan,
    Recommendation,
    Refusal,
    RequestCapacity,
    SglangPlan,
    VllmPlan,
    load_plan,
    plan,
    plan_vllm,
    preset,
    save_plan,
)

K3 = preset("kimi-k3")
LINEAR = preset("kimi-linear-48b")
DSPARK = preset("kimi-k3-dspark")
TP8_SPEC2 = Deployment(attn_tp=8, spec_tokens=2)
VLLM = plan_vllm(DSPARK, TP8_SPEC2)
PLANS: dict[str, EngineLayout] = {
    "vllm": VLLM,
    "tokenspeed": plan(DSPARK, TP8_SPEC2, engine="tokenspeed"),
    "sglang": plan(K3, Deployment(attn_tp=8, gpu="h200"), engine="sglang"),
}
ROOT = Path(__file__).resolve().parent.parent


# ---- typing -------------------------------------------------------------------------------


def test_plan_is_typed_by_the_protocol_or_by_the_engine_it_names() -> None:
    # mypy checks these lines (the project's strict run covers tests/): assert_type fails the
    # run where a call's type is not the one named, and the ignore below fails it as unused
    # the day plan() is typed Any again
    planned = plan(LINEAR, Deployment(attn_tp=8))
    assert_type(planned, EngineLayout)
    assert_type(plan(DSPARK, TP8_SPEC2, engine="vllm"), VllmPlan)
    assert_type(plan(DSPARK, TP8_SPEC2, engine="tokenspeed"), ParentPlan)
    assert_type(plan(K3, Deployment(attn_tp=8), engine="sglang"), SglangPlan)
    assert_type(planned.capacity(40 << 30, 8192), RequestCapacity)
    assert_type(planned.memory_for(4, 8192), int)
    assert_type(planned.recommend(4, 8192), Recommendation)
    assert_type(load_plan(planned.model_dump_json()), EngineLayout)
    assert planned.block_tokens == 512  # type: ignore[attr-defined]  # vLLM's own: narrow first
    assert isinstance(planned, VllmPlan) and planned.block_tokens == 512
    # at run time the type named is the type returned, the deployment re-aimed at the engine
    assert plan(DSPARK, TP8_SPEC2, engine="vllm") == VLLM  # the same plan
    assert isinstance(PLANS["tokenspeed"], ParentPlan)
    assert isinstance(PLANS["sglang"], SglangPlan)
    assert PLANS["sglang"].deployment.engine == "sglang"


def test_plans_engine_argument_is_refused_naming_it() -> None:
    with pytest.raises(Refusal) as caught:
        plan(K3, Deployment(), engine=8)  # type: ignore[call-overload]
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts["field"] == "engine"
    with pytest.raises(Refusal):
        plan(K3, Deployment(), engine="no-such-engine")


SNIPPET = """\
from k3layout import Deployment, load_plan, plan, preset

planned = plan(preset("kimi-k3"), Deployment(engine="vllm", attn_tp=8))
reveal_type(planned)
reveal_type(plan(preset("kimi-k3"), Deployment(attn_tp=8), engine="vllm"))
reveal_type(planned.capacity(40 << 30, 8192))
reveal_type(load_plan("plan.json"))
planned.capacity(40 << 30, 8192).max_requests + planned.memory().kv_memory_bytes
planned.block_tokens
"""


def test_a_type_checker_reveals_the_types_an_engine_team_sees(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    script = tmp_path / "engine_team.py"
    script.write_text(SNIPPET)
    # the project's own mypy settings (strict, the pydantic plugin); errors of k3layout itself
    # are another test's (the strict run over the tree)
    config = str(ROOT / "pyproject.toml")
    out, _, _ = api.run(
        [str(script), "--config-file", config, "--follow-imports=silent", "--no-error-summary"]
    )
    # mypy names a file its cache answers for by the path it first had: match the name
    ours = [
        line.split(": ", 1)[1]
        for line in out.splitlines()
        if line.split(":", 1)[0].endswith(script.name)
    ]
    assert ours == [
        'note: Revealed type is "k3layout.layouts.protocol.EngineLayout"',
        'note: Revealed type is "k3layout.engines.vllm.layout.VllmPlan"',
        'note: Revealed type is "k3layout.layouts.answer.RequestCapacity"',
        'note: Revealed type is "k3layout.layouts.protocol.EngineLayout"',
        'error: "EngineLayout" has no attribute "block_tokens"; maybe "block_bytes"?  '
        "[attr-defined]",
    ]


# ---- one line, and a table ----------------------------------------------------------------


def test_a_plan_shows_itself_in_one_line_of_its_inputs_and_its_block() -> None:
    release = VLLM.deployment.engine_version
    caption = VLLM.block_caption(VLLM.num_planes)
    assert repr(VLLM) == str(VLLM) == (
        f"VllmPlan(kimi-k3-dspark, vllm {release}, attn_tp=8, spec_tokens=2, fp8; {caption})"
    )
    # SPEC section 3: K3 + DSpark at TP 8, fp8, s 2 raises the block to 1,536 tokens, a
    # 576 x 1,536 B page, on 29 planes
    assert f"{1536:,} tokens" in caption and f"{576 * 1536:,} B" in caption and "29" in caption
    assert len(pydantic_repr(VLLM)) > 10_000  # what repr was: every field, every layer


def pydantic_repr(record: Any) -> str:
    return f"{type(record).__name__}({record.__repr_str__(', ')})"


@pytest.mark.parametrize("engine", PLANS)
def test_every_engines_plan_is_short_and_names_its_inputs(engine: str) -> None:
    shown = PLANS[engine]
    text = repr(shown)
    assert text.startswith(f"{type(shown).__name__}({shown.model.name}, {engine} ")
    assert "attn_tp=8" in text and len(text) < 250
    assert shown.block_caption(shown.num_planes) in text


@pytest.mark.parametrize("engine", PLANS)
def test_a_plans_table_holds_its_inputs_its_summary_and_its_groups(engine: str) -> None:
    shown = PLANS[engine]
    rows = shown.display_rows()
    assert rows[:2] == [
        ("model", f"{shown.model.name} ({shown.model.num_layers} layers)"),
        ("engine", f"{engine} {shown.deployment.engine_version}"),
    ]
    assert all(row in rows for row in shown.summary())
    assert [label for label, _ in rows if label.startswith("group ")] == [
        f"group {group.name}" for group in shown.groups
    ]
    html = shown._repr_html_()
    assert html.count("<tr>") == len(rows)
    assert html.startswith('<table class="k3layout"><caption')
    console = Console(record=True, width=200)
    console.print(shown)  # __rich__: the same table
    drawn = console.export_text()
    assert all(label in drawn for label, _ in rows)


def test_views_change_neither_equality_nor_hashing_nor_json() -> None:
    again = VllmPlan.model_validate_json(VLLM.model_dump_json())
    assert again == VLLM and hash(again) == hash(VLLM) and again is not VLLM
    assert {"model", "deployment", "groups", "stages", "block_tokens"} <= set(VLLM.model_dump())
    assert json.loads(VLLM.model_dump_json())["block_tokens"] == 1536


def test_a_capacity_shows_the_answer_every_engine_gives() -> None:
    for engine, shown in PLANS.items():
        capacity = shown.capacity(40 << 30, 65_536)
        expected = (
            f"{type(capacity).__name__}({capacity.max_requests:,} requests of 65,536 tokens in "
            f"40.00 GiB per rank, KDA share {capacity.kda_share:.3f}, "
            f"waste {capacity.waste_fraction:.3f})"
        )
        assert repr(capacity) == expected, engine
        assert capacity.display_rows() == capacity.rows()
        assert capacity._repr_html_().count("<tr>") == len(capacity.rows())


def test_a_memory_budget_shows_its_sum_and_escapes_its_text() -> None:
    budget = plan(LINEAR, Deployment(attn_tp=8, gpu="h200")).memory()
    flag, value = budget.memory_flag
    gib = 1 << 30
    assert repr(budget) == (
        f"MemoryBudget(vllm on h200, {flag} {value}: weights {budget.weights_bytes / gib:,.2f} "
        f"+ reserve {budget.reserve_bytes / gib:,.2f} + KV {budget.kv_memory_bytes / gib:,.2f} "
        f"of {budget.gpu_memory_bytes / gib:,.2f} GiB)"
    )
    odd = budget.model_copy(update={"rule": "a < b & c"})  # a view only: no validation needed
    assert "a &lt; b &amp; c" in odd._repr_html_() and "a < b" not in odd._repr_html_()


def test_rich_shows_a_record_inside_a_container_in_its_one_line() -> None:
    budget = plan(LINEAR, Deployment(attn_tp=8, gpu="h200")).memory()
    text = pretty_repr({"plan": VLLM, "budget": budget}, max_width=1000)
    assert repr(VLLM) in text and repr(budget) in text
    assert "HybridModel" not in text  # not pydantic's field-by-field view


def test_a_recommendation_names_its_capacity_and_budget_by_their_short_views() -> None:
    advice = plan(LINEAR, Deployment(attn_tp=8, gpu="h200")).recommend(
        16, 65_536
    )
    assert repr(advice.capacity) in repr(advice)
    assert advice.memory is not None and repr(advice.memory) in repr(advice)


# ---- to a file and back -------------------------------------------------------------------


@pytest.mark.parametrize("engine", PLANS)
def test_a_plan_round_trips_through_a_file_text_bytes_and_a_dict(
    engine: str, tmp_path: Path
) -> None:
    stored = PLANS[engine]
    path = save_plan(stored, tmp_path / "plan.json")
    assert path == tmp_path / "plan.json"
    assert load_plan(path) == stored
    assert load_plan(str(path)) == stored
    assert load_plan(path.read_text()) == stored
    assert load_plan(path.read_bytes()) == stored
    assert load_plan(f"\n  {stored.model_dump_json()}") == stored  # JSON after whitespace
    assert load_plan(stored.model_dump()) == stored
    assert load_plan(stored.model_dump(mode="json")) == stored
    assert load_plan(json.loads(path.read_text())) == stored
    assert type(load_plan(path)) is type(stored)


def test_a_saved_plan_is_replaced_whole_and_leaves_no_scratch_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(PLANS["tokenspeed"], path)
    save_plan(VLLM, str(path))
    assert load_plan(path) == VLLM
    assert os.listdir(tmp_path) == ["plan.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() would create it


def test_a_doctored_file_is_refused_naming_the_field_and_the_file(tmp_path: Path) -> None:
    data = json.loads(VLLM.model_dump_json())
    data["block_tokens"] = 768
    path = tmp_path / "doctored.json"
    path.write_text(json.dumps(data))
    sources: list[tuple[Any, str | None]] = [
        (path, str(path)),  # a file: named
        (str(path), str(path)),
        (json.dumps(data), None),
        (data, None),
    ]
    for source, named in sources:
        with pytest.raises(Refusal) as caught:
            load_plan(source)
        assert caught.value.code == "plan_mismatch"
        assert caught.value.facts["field"] == "block_tokens"
        assert caught.value.facts.get("path") == named


def test_a_path_that_is_no_plan_file_is_refused_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    (tmp_path / "folder").mkdir()
    (tmp_path / "bad.json").write_text("{not json")
    cases: dict[str, object] = {
        str(missing): missing,
        str(missing) + "-as-text": str(missing),
        str(tmp_path / "folder"): tmp_path / "folder",
        os.devnull: os.devnull,  # a device, never read (it could be read without end)
    }
    for expected, source in cases.items():
        with pytest.raises(Refusal) as caught:
            load_plan(source)  # type: ignore[arg-type]
        assert caught.value.code == "invalid_argument"
        assert caught.value.facts == {"field": "path", "path": expected.removesuffix("-as-text")}
        assert caught.value.hint is not None and "save_plan" in caught.value.hint
    with pytest.raises(Refusal) as caught:
        load_plan(tmp_path / "bad.json")
    assert caught.value.facts["path"] == str(tmp_path / "bad.json")
    assert caught.value.facts["record"] == "plan"
    with pytest.raises(Refusal) as caught:  # JSON text, not a path: refused as no plan
        load_plan(" [1, 2]")
    assert caught.value.facts == {"record": "plan", "field": "<root>"}


def test_save_plan_refuses_what_is_no_plan_and_no_path(tmp_path: Path) -> None:
    class BytesPath:
        def __fspath__(self) -> bytes:
            return b"plan.json"

    cases: list[tuple[object, object, str]] = [
        (VLLM.model_dump(), tmp_path / "a.json", "plan"),
        (VLLM, 8, "path"),
        (VLLM, BytesPath(), "path"),
        (VLLM, tmp_path, "path"),  # a folder
        (VLLM, tmp_path / "no" / "such" / "folder.json", "path"),
        (VLLM, "", "path"),  # the current folder
    ]
    for stored, path, field in cases:
        with pytest.raises(Refusal) as caught:
            save_plan(stored, path)  # type: ignore[arg-type]
        assert caught.value.code == "invalid_argument"
        assert caught.value.facts["field"] == field
        assert caught.value.hint is not None
    assert os.listdir(tmp_path) == []


def test_a_path_a_worker_was_given_loads_in_a_fresh_process(tmp_path: Path) -> None:
    # the driver plans and saves; a worker (another process) loads and re-checks it
    path = save_plan(VLLM, tmp_path / "plan.json")
    code = textwrap.dedent(
        f"""
        import k3layout
        loaded = k3layout.load_plan({str(path)!r})
        print(repr(loaded))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert run.stdout.strip() == repr(VLLM)
