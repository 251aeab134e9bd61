"""Checkpoint image pack and restore against a plain torch copy of the same bytes (same run).

Run by hand: ``python benchmarks/bench_images.py``. Kimi-K3 + DSpark at attention TP 8, fp8,
2 spec tokens: the image of one boundary is 3 units x 23 planes x 884,736 B = 61,046,784 B.

- *views*: building the image from the registered tensors, and the bytes it copies (0: every
  page is a view of the plane an attention layer registered, checked by data pointer);
- *pack*: the image's 69 pages into one contiguous tier buffer, against ``tier.copy_(src)``
  from one contiguous run of the source cache's backing, as many bytes;
- *restore*: the tier back into other blocks of another cache, against ``dst.copy_(tier)``
  into one contiguous run of the target cache's backing.

Each baseline copies between the same memory as its action, so that the ratio is the price of
the pages' layout and nothing else: two buffers of one size copy at speeds a few percent
apart on these machines depending on where they lie. For reference: a plain copy between two
fresh buffers, and a pack from planes in tensors of their own (page by page, 69 copies).

The actions take turns in every round (``timing.interleaved_seconds``); a speed is the median
over rounds of plain time / action time. Target (issue 11): pack and restore at least 0.95x
the plain copy, at torch's default thread count.

Exits 1 if the views copied a byte, the round trip is not byte-exact, or a target is missed.
"""

from __future__ import annotations

import statistics
import sys

import torch
from timing import interleaved_seconds, median_seconds

from k3layout import Deployment, plan_vllm, preset
from k3layout.offload import checkpoint_image, engine_layer_names
from k3layout.torch import (
    Allocation,
    PageUnits,
    allocate,
    image_units,
    pack_units,
    restore_units,
    validate,
)

NUM_BLOCKS = 4
TARGET = 0.95  # pack and restore speed / plain copy speed, at least
ROUNDS = 81
SOURCE_BLOCKS = (3, 1, 0)  # the boundary block of KDA groups 0, 1, 2
TARGET_BLOCKS = (0, 2, 3)


def bytes_copied(units: PageUnits, kda_pages: list[torch.Tensor]) -> int:
    """Bytes of image pages that are not the KDA state's own bytes (views copy none)."""
    return sum(
        page.numel()
        for page, state in zip(units.pages(), kda_pages, strict=True)
        if page.data_ptr() != state.data_ptr()
        or page.untyped_storage().data_ptr() != state.untyped_storage().data_ptr()
    )


def backing_run(cache: Allocation, num_bytes: int) -> torch.Tensor:
    """The first ``num_bytes`` of the cache's one backing, as one contiguous ``uint8`` view."""
    storage = cache.planes[0].untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(storage)[:num_bytes]


def speed(plain: list[float], action: list[float]) -> float:
    """Median over rounds of plain time / action time (above 1: faster than the plain copy)."""
    return statistics.median(p / a for p, a in zip(plain, action, strict=True))


def main() -> int:
    plan = plan_vllm(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2))
    image = checkpoint_image(plan)
    source = allocate(plan, NUM_BLOCKS)
    target = allocate(plan, NUM_BLOCKS)
    gen = torch.Generator().manual_seed(0)
    for plane in source.planes:
        plane.copy_(torch.randint(0, 256, plane.shape, generator=gen, dtype=torch.uint8))
    source_live = validate(plan, source.registered)
    target_live = validate(plan, target.registered)
    names = engine_layer_names(plan.model)
    # the state each image page must be: KDA layer j of group g in its boundary block
    kda_pages = [
        source.layers[names.name(group.layers[j])][0][SOURCE_BLOCKS[unit]]
        for unit, group in enumerate(image.groups)
        for j in range(image.num_planes)
    ]

    def views() -> PageUnits:
        return image_units(source_live, source.registered, SOURCE_BLOCKS)

    units = views()
    targets = image_units(target_live, target.registered, TARGET_BLOCKS)
    tier = torch.empty(units.num_bytes, dtype=torch.uint8)
    pack_units(units, out=tier)
    source_run, target_run = backing_run(source, tier.numel()), backing_run(target, tier.numel())
    fresh_source, fresh_target = tier.clone(), torch.empty_like(tier)
    apart = PageUnits(planes=tuple(p.clone() for p in units.planes), blocks=units.blocks)

    copied = bytes_copied(units, kda_pages)
    view_s = median_seconds(views)
    runs = interleaved_seconds(
        {
            "pack": lambda: pack_units(units, out=tier),
            "plain pack": lambda: tier.copy_(source_run),
            "restore": lambda: restore_units(tier, targets),
            "plain restore": lambda: target_run.copy_(tier),
            "fresh": lambda: fresh_target.copy_(fresh_source),
            "apart": lambda: pack_units(apart, out=tier),
        },
        repeats=ROUNDS,
    )
    pack_units(units, out=tier)
    restore_units(tier, targets)
    exact = torch.equal(pack_units(targets), tier) and torch.equal(tier, fresh_source)

    mib = units.num_bytes / 2**20
    print(
        f"K3 + DSpark TP8 fp8 s2: image {units.num_bytes:,} B = {image.num_units} units x "
        f"{image.num_planes} planes x {image.page_bytes:,} B ({mib:.1f} MiB), "
        f"{torch.get_num_threads()} torch threads, {ROUNDS} rounds"
    )
    print("{:>40} {:>10} {:>10} {:>8} {:>10}".format("", "median", "fastest", "GiB/s", "speed"))
    print(f"{'views (zero copy)':>40} {view_s * 1e3:7.2f} ms {'-':>10} {'-':>8} {'-':>10}")
    rows = (
        ("pack to tier (one backing)", "pack", "plain pack"),
        ("plain copy, source backing -> tier", "plain pack", "plain pack"),
        ("restore into other blocks", "restore", "plain restore"),
        ("plain copy, tier -> target backing", "plain restore", "plain restore"),
        ("plain copy, two fresh buffers", "fresh", "plain pack"),
        ("pack, a tensor per plane (page by page)", "apart", "plain pack"),
    )
    for label, name, baseline in rows:
        median = statistics.median(runs[name])
        rate = units.num_bytes / median / 2**30
        print(
            f"{label:>40} {median * 1e3:7.2f} ms {min(runs[name]) * 1e3:7.2f} ms {rate:8.2f} "
            f"{speed(runs[baseline], runs[name]):9.2f}x"
        )
    met = True
    for name in ("pack", "restore"):
        ratio = speed(runs[f"plain {name}"], runs[name])
        verdict = "ok" if ratio >= TARGET else "OVER"
        met = met and verdict == "ok"
        print(f"{name}: {ratio:.2f}x the plain copy's speed (target >= {TARGET}x): {verdict}")
    print(f"bytes copied by the views: {copied}")
    print(f"round trip byte-exact: {exact}")
    return 0 if copied == 0 and exact and met else 1


if __name__ == "__main__":
    sys.exit(main())
