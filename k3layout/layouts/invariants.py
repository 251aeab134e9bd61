"""The invariants every plan holds, as checks an engine can run without hypothesis.

:func:`plan_invariant_violations` lists every rule a plan breaks (``[]`` when all hold):
groups partition the module layers by kind, planes match groups, stages partition the layers
and project the groups, sizes are positive; per engine, the block raise or the packing rules.
A plan re-derives itself on construction (``plan_mismatch``), so a plan that reached an engine
holds these; they state *why* it is right, and :mod:`k3layout.testing` sweeps them.
"""

from __future__ import annotations

from .._args import expect
from .groups import num_planes, stage_bounds
from .protocol import EngineLayout, LayoutBase
from .seams import rules_for

__all__ = ["plan_invariant_violations"]


def _common_violations(result: EngineLayout) -> list[str]:
    model = result.model
    problems: list[str] = []
    module_ids = list(range(len(model.module_layers)))
    owning = [group for group in result.groups if group.kind != "ring"]
    grouped = sorted(layer for group in owning for layer in group.layers)
    if grouped != module_ids:
        problems.append(f"groups do not partition the module layers: {grouped} != {module_ids}")
    # A ring group names the indexed layers whose tail rings it holds: each exactly once.
    ringed = sorted(
        layer for group in result.groups if group.kind == "ring" for layer in group.layers
    )
    rings = [i for i, layer in enumerate(model.module_layers) if getattr(layer, "indexer", None)]
    if ringed and ringed != rings:
        problems.append(f"ring groups hold {ringed}, not the indexed layers {rings}")
    for group in owning:
        # An attention group pages tokens; a state group keeps slots; one spec per group.
        wanted = "token" if group.kind == "attention" else "slot"
        wrong = [i for i in group.layers if model.module_layers[i].paging != wanted]
        if wrong:
            problems.append(f"group {group.name} ({group.kind}) holds layers {wrong}")
        # one spec for the group's target layers, one for its draft layers (a draft may keep
        # a cache dtype of its own: tokenspeed #1152's bf16 draft)
        for side in (False, True):
            specs = {
                result.sizes.layer_specs[i] for i in group.layers if (i >= model.num_layers) == side
            }
            if len(specs) > 1:
                problems.append(f"group {group.name} mixes {len(specs)} cache specs")
    if result.num_planes != num_planes(result.groups):
        problems.append(f"num_planes {result.num_planes} != longest group")
    bounds = stage_bounds(model, result.deployment)
    held = [layer for stage in result.stages for layer in stage.layers]
    if sorted(held) != module_ids or len(result.stages) != len(bounds):
        problems.append("stages do not partition the module layers")
    for stage in result.stages:
        if len(stage.groups) != len(result.groups):
            problems.append(f"stage {stage.index} has {len(stage.groups)} groups")
        for mine, whole in zip(stage.groups, result.groups, strict=False):
            kept = tuple(layer for layer in whole.layers if layer in stage.layers)
            if mine.name != whole.name or mine.layers != kept:
                problems.append(f"stage {stage.index} group {mine.name} is not a projection")
    sizes = result.sizes
    if sizes.attention_bytes_per_token <= 0 or (sizes.state and sizes.state_bytes <= 0):
        problems.append("a size is not positive")
    if (sizes.state is None) != (not model.kda_layer_ids):
        problems.append("KDA sizes present without KDA layers (or missing with them)")
    return problems


def plan_invariant_violations(result: EngineLayout) -> list[str]:
    """Every invariant of ``result`` that does not hold, described (``[]`` when all hold):
    groups partition the layers by kind, planes match groups, stages partition the layers and
    project the groups, sizes positive; per engine, the block raise or the packing rules.
    Refuses (``invalid_argument``) a ``result`` that is not a plan."""
    expect("result", result, LayoutBase)
    return _common_violations(result) + rules_for(result.engine).violations(result)
