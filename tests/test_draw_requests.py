"""``draw_requests`` and ``k3layout draw requests``: requests against context, one line per
engine, each point the engine's own ``max_requests``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from k3layout import Deployment, Refusal, plan, preset
from k3layout.draw import draw_requests
from k3layout.sweep import requests_sweep

CONTEXTS = (8192, 131_072, 1 << 20)


def test_every_engine_draws_a_line_of_its_own_answers() -> None:
    k3 = preset("kimi-k3")
    cells = requests_sweep(k3, 60 << 30, CONTEXTS, Deployment(attn_tp=8))
    figure = draw_requests(cells)
    lines = {line.get_gid(): line for line in figure.axes[0].get_lines()}
    assert set(lines) == {"line.vllm", "line.tokenspeed", "line.sglang"}
    for engine in ("vllm", "tokenspeed", "sglang"):
        planned = plan(k3, Deployment(engine=engine, attn_tp=8))
        want = [planned.capacity(60 << 30, n).max_requests for n in CONTEXTS]
        ydata: Any = lines[f"line.{engine}"].get_ydata()
        assert [int(y) for y in ydata] == want
        # longer requests: never more of them
        assert want == sorted(want, reverse=True)


def test_a_deployment_an_engine_does_not_run_is_a_refused_cell() -> None:
    cells = requests_sweep(preset("kimi-k3"), 60 << 30, (8192,), Deployment(attn_tp=8, pp=2))
    refused = {c.engine: c.refusal for c in cells}
    assert refused["tokenspeed"] == "engine_setting" and refused["vllm"] is None
    with pytest.raises(Refusal):
        draw_requests(())
    with pytest.raises(Refusal):
        requests_sweep(preset("kimi-k3"), 60 << 30, (None,))  # type: ignore[arg-type]


def test_the_cli_writes_the_picture(tmp_path: Path) -> None:
    out = tmp_path / "requests.svg"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "k3layout",
            "draw",
            "requests",
            "--model",
            "kimi-linear-48b",  # whose weights leave the H200 60 GiB for KV at TP 8
            "--attn-tp",
            "8",
            "--kv-memory-gib",
            "60",
            "--contexts",
            "8192,131072",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert 'id="line.sglang"' in out.read_text()
    assert 'id="point.sglang.8192"' in out.read_text()


def test_the_cli_refuses_a_picture_of_nothing(tmp_path: Path) -> None:
    """K3's weights do not fit one H200 at TP 8 beside 60 GiB of KV: no engine holds a
    request, and the CLI says why rather than drawing empty lines."""
    run = subprocess.run(
        [
            *(sys.executable, "-m", "k3layout", "draw", "requests", "--attn-tp", "8"),
            *("--kv-memory-gib", "60", "--contexts", "8192", "-o", str(tmp_path / "none.svg")),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode != 0 and not (tmp_path / "none.svg").exists()
    assert "no engine holds a request" in run.stderr + run.stdout
