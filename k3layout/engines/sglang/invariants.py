"""SGLang's own plan invariants: no plane shared, cell sizes summing to the whole model's,
the page the backend takes (:func:`k3layout.layouts.invariants.plan_invariant_violations`
adds the common ones)."""

from __future__ import annotations

from .layout import SglangPlan, resolved_backends


def sglang_violations(result: SglangPlan) -> list[str]:
    """Every SGLang rule ``result`` breaks, described (``[]`` when all hold)."""
    problems: list[str] = []
    owners = [len(members) for members in result.planes]
    if any(count != 1 for count in owners):
        problems.append("a plane is shared: SGLang gives every layer its own tensor")
    resolved = (result.prefill_attention_backend, result.attention_backend, result.page_tokens)
    if resolved != resolved_backends(result.model, result.deployment):
        problems.append("backend / page is not what SGLang resolves on the GPU")
    # Every stage prices the draft's rows: the target's once, the draft's once per stage.
    model = result.model
    whole = sum(
        result.layer_cell_bytes(layer) * (1 if layer < model.num_layers else len(result.stages))
        for group in result.groups
        if group.kind == "attention"
        for layer in group.layers
    )
    if result.bytes_per_token != whole:
        problems.append("stage cell sizes do not sum to the whole model's")
    if result.state_slot_bytes() != len(result.model.kda_layer_ids) * result.sizes.state_bytes:
        problems.append("the state slot is not one state per KDA layer")
    return problems
