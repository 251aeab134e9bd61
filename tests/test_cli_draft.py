"""``--draft PATH``: a DSpark draft checkpoint's config.json joins a config.json model on every
command that takes ``--model``, as ``load_config(path, draft=PATH)`` does; with a preset, or
with a ``--draft-layers`` the draft contradicts, it is refused naming the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3layout import Deployment, load_config, plan, preset
from k3layout.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
TARGET = str(FIXTURES / "kimi-k3.config.json")
DRAFT = str(FIXTURES / "kimi-k3-dspark-draft")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 2
    answer: dict[str, object] = json.loads(out)["refused"]
    return answer


def test_a_draft_config_plans_as_load_config_with_the_draft(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ("plan", "--model", TARGET, "--draft", DRAFT, "--attn-tp", "8", "--spec-tokens", "2")
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0
    expected = plan(load_config(TARGET, draft=DRAFT), Deployment(attn_tp=8, spec_tokens=2))
    answer = json.loads(out)
    assert answer["block_bytes"] == expected.block_bytes == 25_657_344  # 29 planes x 1536 x 576
    # the preset K3 + DSpark is the same model: 24 MLA + 5 draft layers of 64 heads
    assert load_config(TARGET, draft=DRAFT).draft_layers == preset("kimi-k3-dspark").draft_layers


@pytest.mark.parametrize(
    "command",
    [
        ("plan",),
        ("sweep",),
        ("ride",),
        ("recommend", "--requests", "8"),
        ("transfer", "--prefill", "pp8xtp1", "--decode", "tp8xdcp8"),
    ],
)
def test_every_command_that_takes_a_model_takes_a_draft(
    capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    # a preset with --draft: refused naming --draft, before anything is planned
    answer = refused(capsys, *command, "--model", "kimi-k3", "--draft", DRAFT)
    assert answer["code"] == "invalid_argument"
    assert answer["facts"] == {"model": "kimi-k3", "option": "--draft"}


def test_draw_takes_a_draft(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    picture = str(tmp_path / "planes.png")
    code, _, err = run(
        capsys, "draw", "planes", "-o", picture, "--model", "kimi-k3", "--draft", DRAFT
    )
    assert code == 2 and "--draft applies to a config.json model" in err
    drawn = ("draw", "planes", "-o", picture, "--model", TARGET, "--draft", DRAFT, "--attn-tp", "8")
    assert run(capsys, *drawn)[0] == 0 and Path(picture).stat().st_size > 0


def test_a_draft_layers_count_the_draft_contradicts_is_refused_naming_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    answer = refused(capsys, "plan", "--model", TARGET, "--draft", DRAFT, "--draft-layers", "4")
    assert answer["facts"] == {
        "option": "--draft-layers",
        "draft_layers": 4,
        "draft_config_layers": 5,
    }
    assert "--draft-layers=4 contradicts --draft" in str(answer["message"])
    # the same count is no contradiction
    code, _, _ = run(capsys, "plan", "--model", TARGET, "--draft", DRAFT, "--draft-layers", "5")
    assert code == 0


def test_a_missing_draft_path_is_refused_naming_the_option(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    answer = refused(capsys, "plan", "--model", TARGET, "--draft", str(tmp_path / "nothing"))
    assert answer["facts"] == {"field": "draft", "option": "--draft"}


def test_a_draft_config_the_loader_refuses_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = json.loads((Path(DRAFT) / "config.json").read_text())
    del data["num_attention_heads"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    answer = refused(capsys, "plan", "--model", TARGET, "--draft", str(tmp_path))
    assert answer["code"] == "invalid_config"
    assert answer["facts"]["field"] == "num_attention_heads"  # type: ignore[index]
