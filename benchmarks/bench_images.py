"""Checkpoint image pack and restore against a plain torch copy of the same bytes (same run).

Run by hand: ``python benchmarks/bench_images.py``. Kimi-K3 + DSpark at attention TP 8, fp8,
2 spec tokens: the image of one boundary is 3 units x 23 planes x 884,736 B = 61,046,784 B.

- *views*: building the image from the registered tensors, and the bytes it copies (0: every
  page is a view of the plane an attention layer registered, checked by data pointer);
- *pack*: the image's 69 pages into one contiguous tier buffer, against ``dst.copy_(src)`` of
  one contiguous buffer of the same size (the ratio is the price of 69 page copies);
- *restore*: the tier back into other blocks of another cache, against the same plain copy.

Exits 1 if the views copied a byte or the round trip is not byte-exact.
"""

from __future__ import annotations

import sys

import torch
from timing import median_seconds

from k3layout import Deployment, plan_vllm, preset
from k3layout.offload import checkpoint_image, engine_layer_names
from k3layout.torch import PageUnits, allocate, image_units, pack_units, restore_units, validate

NUM_BLOCKS = 4
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
    plain_source, plain_target = torch.empty_like(tier), torch.empty_like(tier)
    plain_source.copy_(pack_units(units, out=tier))

    copied = bytes_copied(units, kda_pages)
    view_s = median_seconds(views)
    pack_s = median_seconds(lambda: pack_units(units, out=tier))
    restore_s = median_seconds(lambda: restore_units(tier, targets))
    plain_s = median_seconds(lambda: plain_target.copy_(plain_source))
    exact = torch.equal(pack_units(targets), tier) and torch.equal(tier, plain_source)

    mib = units.num_bytes / 2**20
    print(
        f"K3 + DSpark TP8 fp8 s2: image {units.num_bytes:,} B = {image.num_units} units x "
        f"{image.num_planes} planes x {image.page_bytes:,} B ({mib:.1f} MiB), "
        f"{torch.get_num_threads()} torch threads"
    )
    print("{:>28} {:>10} {:>10} {:>16}".format("", "time", "GiB/s", "vs plain copy"))
    print(f"{'views (zero copy)':>28} {view_s * 1e3:7.2f} ms {'-':>10} {'-':>16}")
    for label, seconds in (
        ("pack to tier", pack_s),
        ("restore into other blocks", restore_s),
        ("plain torch copy, same bytes", plain_s),
    ):
        rate = units.num_bytes / seconds / 2**30
        print(f"{label:>28} {seconds * 1e3:7.2f} ms {rate:10.2f} {seconds / plain_s:15.2f}x")
    print(f"bytes copied by the views: {copied}")
    print(f"round trip byte-exact: {exact}")
    return 0 if copied == 0 and exact else 1


if __name__ == "__main__":
    sys.exit(main())
