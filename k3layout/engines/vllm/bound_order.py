"""Planes (or layers across planes) bound in another order, on vLLM's bound caches: named as
that (:mod:`k3layout.layouts.reorder`), not blamed on the first layer they move."""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import CheckName
from ...layouts.reorder import Placed, reordering
from .bound import BoundView
from .bound_facts import Reading, refuse_bound, where_bound
from .layout import VllmPlan


def check_order(
    result: VllmPlan,
    views: Mapping[str, BoundView],
    reads: Mapping[str, Reading],
    num_blocks: int,
    *,
    stage: int,
    check: CheckName,
) -> None:
    """Where every view's page of block 0 starts: when layers are off because the planes (or
    the layers across them) were bound in another order, refuse that, naming the order and
    the first layers it moves; a layer off alone is left to :func:`_check_pages`."""
    planes = result.stage(stage).num_planes
    stride = result.layer_stride_bytes(num_blocks, stage)
    starts = tuple(j * stride for j in range(planes))
    items = []
    for name, view in views.items():
        group, position = result.group_of(view.module_layer, stage)
        want = view.page_offset_bytes(0)
        items.append(
            Placed(
                name=name,
                group=group.name,
                position=position,
                plane=position,
                offset_bytes=want - starts[position],
                expected_bytes=want,
                actual_bytes=reads[name][3] * view.elem_bytes,
            )
        )
    found = reordering(items, starts, (stride,) * planes)
    if found is None or found.kind == "shift":
        return
    where = where_bound(result, views[found.moved[0]], stage, check)
    if found.kind == "planes":
        raise refuse_bound(
            "aliasing",
            where,
            found.sentence,
            "bind layer j of every group to plane j of the backing (the plan's groups)",
            field="plane_order",
            expected=found.planned,
            actual=found.order,
            block=0,
            moved=found.moved,
            order=found.order,
        )
    plane = next(k for name, _, k in found.moves if name == where["layer_name"])
    raise refuse_bound(
        "aliasing",
        where,
        found.sentence,
        f"bind layer {where['position']} of every group to plane {where['position']}",
        field="layer_order",
        expected=where["plane"],
        actual=plane,
        block=0,
        moved=found.moved,
        found_plane=plane,
    )
