"""``save`` and ``k3layout draw``: PNG or SVG by suffix, reproducible bytes, the content in the
SVG, refusals exit 2, and matplotlib only when a picture is asked for."""

from __future__ import annotations

import doctest
import importlib
import inspect
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from k3layout import Deployment, HybridModel, Refusal, plan

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG = "{http://www.w3.org/2000/svg}"
K3_TP8 = ("--model", "kimi-k3-dspark", "--attn-tp", "8", "--spec-tokens", "2")


def k3layout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3layout", *args], capture_output=True, text=True, check=False
    )


def svg_ids(path: Path) -> set[str]:
    return {e.attrib["id"] for e in ET.parse(path).iter() if "id" in e.attrib}


def svg_texts(path: Path) -> list[str]:
    return [e.text or "" for e in ET.parse(path).iter(f"{SVG}text")]


def test_save_writes_png_or_svg_by_suffix_and_the_same_bytes_twice(
    tmp_path: Path, k3_dspark: HybridModel
) -> None:
    pytest.importorskip("matplotlib")
    draw = pytest.importorskip("k3layout.draw")
    result = plan(k3_dspark, Deployment(attn_tp=8, spec_tokens=2))
    for name in ("a.png", "b.png", "a.svg", "b.svg"):
        draw.save(draw.draw_planes(result), tmp_path / name)
    assert (tmp_path / "a.png").read_bytes().startswith(PNG_SIGNATURE)
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert (tmp_path / "a.svg").read_text() == (tmp_path / "b.svg").read_text()
    ids = svg_ids(tmp_path / "a.svg")
    assert {i for i in ids if i.startswith("plane.")} == {f"plane.{j}" for j in range(29)}
    assert sum(i.startswith("page.") for i in ids) == 29 + 3 * 23
    assert "88" in svg_texts(tmp_path / "a.svg")  # KDA layer 88 rides plane 22


def test_save_refuses_another_suffix_or_a_missing_folder(tmp_path: Path, k3: HybridModel) -> None:
    pytest.importorskip("matplotlib")
    draw = pytest.importorskip("k3layout.draw")
    figure = draw.draw_planes(plan(k3, Deployment(attn_tp=8)))
    with pytest.raises(Refusal) as caught:
        draw.save(figure, tmp_path / "planes.pdf")
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts["suffix"] == ".pdf"
    with pytest.raises(Refusal) as caught:
        draw.save(figure, tmp_path / "missing" / "planes.png")
    assert caught.value.code == "invalid_argument"
    assert caught.value.facts["folder"] == str(tmp_path / "missing")


def test_draw_planes_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "planes.png"
    run = k3layout("draw", "planes", *K3_TP8, "-o", str(out))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(out)
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_draw_image_writes_an_svg_of_3_units_and_69_states(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "image.svg"
    run = k3layout("draw", "image", *K3_TP8, "-o", str(out))
    assert run.returncode == 0, run.stderr
    ids = svg_ids(out)
    assert {i for i in ids if i.startswith("unit.")} == {"unit.0", "unit.1", "unit.2"}
    assert sum(i.startswith("state.") for i in ids) == 69
    title = " ".join(svg_texts(out))
    assert "61,046,784 B" in title  # 3 units x 23 planes x 884,736 B
    assert "57,443,328 B" in title  # 69 x 832,512 B


def test_draw_transfer_writes_the_matrix_as_an_svg(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "transfer.svg"
    run = k3layout(
        "draw", "transfer", "--prefill", "pp8xtp1", "--decode", "tp8xdcp8", "-o", str(out)
    )
    assert run.returncode == 0, run.stderr
    ids = svg_ids(out)
    assert sum(i.startswith("cell.") for i in ids) == 64  # every stage writes every rank
    assert sum(i.startswith("total.consumer.") for i in ids) == 8


def test_a_refused_pairing_exits_2_before_drawing(tmp_path: Path) -> None:
    out = tmp_path / "transfer.png"
    run = k3layout("draw", "segments", "--prefill", "pp8xtp2", "--decode", "tp3", "-o", str(out))
    assert run.returncode == 2
    assert "refused [tp_not_multiple]" in run.stderr
    assert not out.exists()


def test_an_image_of_a_parent_plan_is_refused_with_or_without_matplotlib(tmp_path: Path) -> None:
    out = str(tmp_path / "i.png")
    run = k3layout("draw", "image", "--engine", "tokenspeed", "--attn-tp", "8", "-o", out)
    assert run.returncode == 2
    assert "refused [engine_mismatch]" in run.stderr


def test_a_pdf_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run = k3layout("draw", "sweep", "--tps", "8", "-o", str(tmp_path / "s.pdf"))
    assert run.returncode == 2
    assert "refused [invalid_argument]" in run.stderr


def test_the_cli_and_the_planner_import_without_matplotlib() -> None:
    code = "import sys, k3layout, k3layout.cli\nprint('matplotlib' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"


def test_without_matplotlib_draw_names_the_extra_to_install(tmp_path: Path) -> None:
    blocked = "import sys; sys.modules['matplotlib'] = None\n"
    code = blocked + "import k3layout.draw"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert "ImportError" in run.stderr
    assert "pip install 'k3layout[draw]'" in run.stderr
    code = blocked + (
        "from k3layout.cli import main\n"
        f"sys.exit(main(['draw', 'planes', '-o', {str(tmp_path / 'p.png')!r}]))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 1
    assert "k3layout[draw]" in run.stderr


@pytest.mark.parametrize(
    "module", ["figure", "planes", "image", "order", "transfer", "segments", "sweep"]
)
def test_the_draw_modules_worked_examples_hold(module: str) -> None:
    pytest.importorskip("matplotlib")
    failures, _ = doctest.testmod(importlib.import_module(f"k3layout.draw.{module}"))
    assert failures == 0


def test_every_public_draw_name_is_documented() -> None:
    pytest.importorskip("matplotlib")
    draw = pytest.importorskip("k3layout.draw")
    for name in draw.__all__:
        value = getattr(draw, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{name} has no docstring"
    examples = sum(
        doctest.testmod(importlib.import_module(f"k3layout.draw.{m}")).attempted
        for m in ("planes", "transfer", "segments")
    )
    assert examples >= 3
