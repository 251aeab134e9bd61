"""The invariants every plan holds, as checks an engine can run without hypothesis.

:func:`plan_invariant_violations` lists every rule a plan breaks (``[]`` when all hold):
groups partition the module layers by kind, planes match groups, stages partition the layers
and project the groups, sizes are positive; per engine, the block raise or the packing rules.
A plan re-derives itself on construction (``plan_mismatch``), so a plan that reached an engine
holds these; they state *why* it is right, and :mod:`k3layout.testing` sweeps them.
"""

from __future__ import annotations

from .._args import expect
from ..constants import MLA_KERNEL_BLOCK_TOKENS, PARENT_ALIGNMENT_BYTES
from ..placements import pp_stage_bounds
from ..vllm_rules import smallest_kernel_block
from .groups import num_planes
from .parent import ParentPlan
from .protocol import EngineLayout
from .vllm import VllmPlan, block_tokens_for

__all__ = ["plan_invariant_violations"]


def _common_violations(result: EngineLayout) -> list[str]:
    model = result.model
    problems: list[str] = []
    module_ids = list(range(len(model.module_layers)))
    grouped = sorted(layer for group in result.groups for layer in group.layers)
    if grouped != module_ids:
        problems.append(f"groups do not partition the module layers: {grouped} != {module_ids}")
    for group in result.groups:
        # An attention group pages tokens; a state group keeps slots; one spec per group.
        wanted = "token" if group.kind == "attention" else "slot"
        wrong = [i for i in group.layers if model.module_layers[i].paging != wanted]
        if wrong:
            problems.append(f"group {group.name} ({group.kind}) holds layers {wrong}")
        specs = {result.sizes.layer_specs[i] for i in group.layers}
        if len(specs) > 1:
            problems.append(f"group {group.name} mixes {len(specs)} cache specs")
    if result.num_planes != num_planes(result.groups):
        problems.append(f"num_planes {result.num_planes} != longest group")
    bounds = pp_stage_bounds(model.num_layers, result.deployment.pp, result.deployment.pp_partition)
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


def _vllm_violations(result: VllmPlan) -> list[str]:
    problems: list[str] = []
    sizes = result.sizes
    deployment = result.deployment
    kernel = smallest_kernel_block(deployment.attention_backend)
    requested = deployment.block_tokens or 0
    align = max(MLA_KERNEL_BLOCK_TOKENS, requested, kernel)
    if result.block_tokens % kernel:
        problems.append(f"block {result.block_tokens} is not on {kernel}-token kernel blocks")
    if result.block_tokens < requested:
        problems.append(f"block {result.block_tokens} is below the requested {requested}")
    if result.block_tokens % result.kernel_block_tokens:
        problems.append("the kernel block does not divide the block")
    raised = block_tokens_for(sizes, deployment.block_tokens, deployment.attention_backend)
    if result.block_tokens != raised:
        problems.append("block is not the raise of the requested block")
    if result.page_bytes != result.block_tokens * sizes.attention_bytes_per_token:
        problems.append("page is not block x attention bytes per token")
    state = sizes.kda_state_bytes
    if state > result.page_bytes:
        problems.append(f"KDA state {state} does not fit the page {result.page_bytes}")
    if state and (result.block_tokens - align) * sizes.attention_bytes_per_token >= state:
        problems.append("a smaller block would hold the state: the raise is not minimal")
    if result.block_bytes != result.num_planes * result.page_bytes:
        problems.append("block bytes are not planes x page")
    if result.block_tokens % result.deployment.dcp_interleave:
        problems.append("DCP interleave does not divide the block")
    return problems


def _parent_violations(result: ParentPlan) -> list[str]:
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


def plan_invariant_violations(result: VllmPlan | ParentPlan) -> list[str]:
    """Every invariant of ``result`` that does not hold, described (``[]`` when all hold):
    groups partition the layers by kind, planes match groups, stages partition the layers and
    project the groups, sizes positive; per engine, the block raise or the packing rules.
    Refuses (``invalid_argument``) a ``result`` that is not a plan."""
    expect("result", result, (VllmPlan, ParentPlan))
    problems = _common_violations(result)
    if isinstance(result, VllmPlan):
        return problems + _vllm_violations(result)
    return problems + _parent_violations(result)
