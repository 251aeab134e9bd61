"""Write the pictures the docs show into ``docs/img/`` (needs ``k3layout[draw]``).

    python docs/make_pictures.py [folder]

Every picture is drawn from a plan; nothing here is a number of its own. ``tests/test_docs.py``
checks that the docs show exactly these pictures and that each is under the size limit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from matplotlib.figure import Figure

from k3layout import Deployment, plan, plan_ride, plan_transfer, preset
from k3layout.draw import (
    draw_image,
    draw_plane_order,
    draw_planes,
    draw_requests,
    draw_segment_map,
    draw_sweep,
    draw_transfer,
    save,
)
from k3layout.sweep import default_attn_tps, requests_sweep, sweep

IMG = Path(__file__).parent / "img"

K3_DECODE = Deployment(attn_tp=8, spec_tokens=2)
"""The seeds' decode: attention TP 8, fp8, DSpark's 2 speculative tokens."""


def _sweep() -> Figure:
    k3 = preset("kimi-k3")
    return draw_sweep(sweep(k3, default_attn_tps(k3)), title="kimi-k3: padding fraction")


PICTURES: dict[str, Callable[[], Figure]] = {
    "planes-vllm-k3-dspark-tp8.png": lambda: draw_planes(plan(preset("kimi-k3-dspark"), K3_DECODE)),
    "planes-tokenspeed-k3-tp8.png": lambda: draw_planes(
        plan(preset("kimi-k3"), Deployment(engine="tokenspeed", attn_tp=8))
    ),
    "planes-tokenspeed-k3-dspark-tp8.png": lambda: draw_planes(
        plan(preset("kimi-k3-dspark"), Deployment(engine="tokenspeed", attn_tp=8, spec_tokens=8))
    ),
    "requests-kimi-linear-tp8-h200.png": lambda: draw_requests(
        requests_sweep(
            preset("kimi-linear-48b"),
            60 << 30,
            (4096, 16_384, 65_536, 131_072, 262_144, 524_288, 1 << 20),
            Deployment(attn_tp=8, expert_parallel=True, gpu="h200"),
            recommended=True,
        ),
        title="kimi-linear-48b, 8 x H200, 60 GiB per rank, recommended flags",
    ),
    "image-k3-dspark-tp8.png": lambda: draw_image(
        plan_ride(plan(preset("kimi-k3-dspark"), K3_DECODE))
    ),
    "order-k3-dspark-tp8.svg": lambda: draw_plane_order(plan(preset("kimi-k3-dspark"), K3_DECODE)),
    "transfer-pp8tp1-tp8dcp8.png": lambda: draw_transfer(
        plan_transfer(
            preset("kimi-k3"), Deployment(pp=8), Deployment(attn_tp=8, dcp=8), prompt_tokens=4096
        )
    ),
    "segments-pp8tp1-tp8dcp8.png": lambda: draw_segment_map(
        plan_transfer(
            preset("kimi-k3"), Deployment(pp=8), Deployment(attn_tp=8, dcp=8), prompt_tokens=4096
        )
    ),
    "sweep-padding-k3.png": _sweep,
}
"""File name -> the picture it holds."""


def main(folder: Path = IMG) -> list[Path]:
    """Draw every picture into ``folder``; returns the paths written."""
    return [save(draw(), folder / name) for name, draw in PICTURES.items()]


if __name__ == "__main__":
    for path in main(Path(sys.argv[1]) if len(sys.argv) > 1 else IMG):
        print(f"{path} ({path.stat().st_size:,} B)")
