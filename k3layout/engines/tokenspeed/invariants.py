"""The tokenspeed engine's own plan invariants: exact MLA page stride, aligned planes, every
page tiling its plane, the parent holding every plane, padding within its limit
(:func:`k3layout.layouts.invariants.plan_invariant_violations` adds the common ones)."""

from __future__ import annotations

from .layout import ParentPlan
from .recipe import PLANE_ALIGNMENT


def parent_violations(result: ParentPlan) -> list[str]:
    problems: list[str] = []
    sizes = result.plane_sizes
    for group in result.groups:
        for position, layer in enumerate(group.layers):
            plane = group.plane_of(position)
            stride = result.page_stride_at(group, plane)
            if stride * result.pages_per_parent(group) != sizes[plane]:
                problems.append(f"{group.name} pages do not tile plane {plane}")
            if stride < result.layer_payload_bytes(layer):
                problems.append(f"layer {layer}'s page does not fit its stride on plane {plane}")
            if group.kind == "attention" and stride != result.layer_payload_bytes(layer):
                problems.append(f"layer {layer}: no exact MLA page stride on plane {plane}")
    if any(size % PLANE_ALIGNMENT for size in sizes):
        problems.append("a plane is not 256-byte aligned")
    if result.parent_bytes < sum(sizes):
        problems.append("the parent does not hold its planes")
    limit = result.max_padding
    for name, fraction in result.padding_fraction.items():
        if fraction < -1e-12:
            problems.append(f"negative padding {fraction} for {name}")
        if limit is not None and fraction > limit:
            problems.append(f"padding {fraction:.4f} of {name} exceeds {limit}")
    for name, share in result.utilization.items():
        if not 0 < share <= 1 + 1e-12:
            problems.append(f"utilization {share} of {name} outside (0, 1]")
    if result.num_planes != len(result.model.attention_layer_ids):
        problems.append("planes are not one per MLA layer plus draft")
    return problems
