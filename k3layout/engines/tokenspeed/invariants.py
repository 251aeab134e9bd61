"""The parent engine's own plan invariants: exact page stride, alignment, padding within its
limit (:func:`k3layout.layouts.invariants.plan_invariant_violations` adds the common ones)."""

from __future__ import annotations

from ...constants import PARENT_ALIGNMENT_BYTES
from .layout import ParentPlan


def parent_violations(result: ParentPlan) -> list[str]:
    problems: list[str] = []
    packing = result.packing
    page = result.mla_page_bytes
    state = result.sizes.kda_state_bytes
    if packing.plane_bytes != packing.mla_pages * page:
        problems.append("plane is not exactly p_m MLA pages (exact page stride)")
    if packing.plane_bytes % PARENT_ALIGNMENT_BYTES:
        problems.append("plane is not 256-byte aligned")
    if state and packing.state_pages * state > packing.plane_bytes:
        problems.append("p_l states do not fit the plane")
    if state and packing.state_pages < 1:
        problems.append("no state page per plane")
    if result.parent_bytes != result.num_planes * packing.plane_bytes:
        problems.append("parent is not planes x plane")
    limit = result.max_padding
    for name, fraction in result.padding_fraction.items():
        if fraction < -1e-12:
            problems.append(f"negative padding {fraction} for {name}")
        if limit is not None and fraction > limit + 1e-12:
            problems.append(f"padding {fraction:.4f} of {name} exceeds {limit}")
    for name, share in result.utilization.items():
        if not 0 < share <= 1 + 1e-12:
            problems.append(f"utilization {share} of {name} outside (0, 1]")
    if result.num_planes != len(result.model.attention_layer_ids):
        problems.append("planes are not one per MLA layer plus draft")
    return problems
