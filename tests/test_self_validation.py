"""Plans and the other public records check themselves on construction.

A plan is valid when it equals what its planner derives from its own inputs: ``load_plan`` of a
tampered plan, a plan or ride built by hand, and a ``model_copy`` that changes a stored number
are refused (``plan_mismatch``, naming the field, its stored and its derived value). Records
that do not store their inputs (plane order, checkpoint image, binding) check their rules.

pydantic wraps an error raised inside validation in a ``ValidationError``; :func:`refusal_of`
finds the ``Refusal`` either way, so these tests hold whether or not the record layer re-raises
the refusal itself.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import ValidationError

from k3layout import (
    Binding,
    CheckpointImage,
    Deployment,
    EngineLayout,
    HybridModel,
    ParentPlan,
    PlaneOrder,
    Refusal,
    RideOptions,
    RidePlan,
    TransferPlan,
    VllmPlan,
    load_plan,
    plan,
    plan_ride,
    plan_transfer,
    testing,
)
from k3layout.layouts import invariants, rederive
from k3layout.testing import plannable_inputs

K3_TP8 = Deployment(attn_tp=8, spec_tokens=2)


def refusal_of(error: BaseException) -> Refusal:
    """The refusal behind ``error``: itself, or the one a ``ValidationError`` wraps."""
    if isinstance(error, Refusal):
        return error
    assert isinstance(error, ValidationError), repr(error)
    causes = [detail.get("ctx", {}).get("error") for detail in error.errors()]
    refusals = [cause for cause in causes if isinstance(cause, Refusal)]
    assert refusals, f"no refusal behind {error}"
    return refusals[0]


def refused(action: Callable[[], object], code: str, field: str | None = None) -> Refusal:
    """Run ``action``, expect a refusal with ``code`` (and ``field``, named in the message)."""
    with pytest.raises(ValueError) as excinfo:
        action()
    refusal = refusal_of(excinfo.value)
    assert refusal.code == code, str(excinfo.value)
    if field is not None:
        assert refusal.facts["field"] == field
        assert field.rsplit(".", 1)[-1] in str(excinfo.value)  # the message names the field
    return refusal


def tampered(result: EngineLayout, edit: Callable[[dict[str, Any]], None]) -> str:
    """The plan's JSON with ``edit`` applied to its data."""
    data = json.loads(result.model_dump_json())
    edit(data)
    return json.dumps(data)


@pytest.fixture(scope="module")
def vllm_plan(k3_dspark: HybridModel) -> VllmPlan:
    result = plan(k3_dspark, K3_TP8)
    assert isinstance(result, VllmPlan)
    return result


@pytest.fixture(scope="module")
def parent_plan(k3_dspark: HybridModel) -> ParentPlan:
    result = plan(k3_dspark, K3_TP8.model_validate({**K3_TP8.model_dump(), "engine": "tokenspeed"}))
    assert isinstance(result, ParentPlan)
    return result


# -- plans: load_plan re-plans from the stored model and deployment ------------------------------


@pytest.mark.parametrize(
    "deployment",
    [
        {"attn_tp": 8, "spec_tokens": 2},
        {"engine": "tokenspeed", "attn_tp": 8, "spec_tokens": 2},
        {"attn_tp": 8, "dcp": 8, "dcp_interleave": 4},
        {"attn_tp": 4, "pp": 4, "kv_dtype": "bf16"},
        {"engine": "tokenspeed", "attn_tp": 8, "draft_kv_dtype": "fp8"},
        {"engine": "tokenspeed", "engine_version": "pr1152", "attn_tp": 2},
        {"attn_tp": 16, "replayssm": True, "spec_tokens": 3},
    ],
)
def test_a_plan_of_any_engine_pp_or_dcp_round_trips_through_load_plan(
    k3_dspark: HybridModel, deployment: dict[str, object]
) -> None:
    result = plan(k3_dspark, Deployment.model_validate(deployment))
    assert load_plan(result.model_dump_json()) == result


def test_a_tampered_page_and_block_are_refused_naming_the_first_field(vllm_plan: VllmPlan) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["page_bytes"], data["block_tokens"] = 12345, 7

    refusal = refused(lambda: load_plan(tampered(vllm_plan, edit)), "plan_mismatch", "block_tokens")
    assert (refusal.facts["stored"], refusal.facts["derived"]) == (7, 1536)
    assert refusal.hint is not None and "re-plan" in refusal.hint


def test_a_tampered_page_is_refused_with_stored_and_derived_bytes(vllm_plan: VllmPlan) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["page_bytes"] = 12345

    refusal = refused(lambda: load_plan(tampered(vllm_plan, edit)), "plan_mismatch", "page_bytes")
    # 1,536 tokens x 576 B per token (fp8 latent 512 + rope 64 x 2 B - as the planner gives)
    assert (refusal.facts["stored"], refusal.facts["derived"]) == (12345, 1536 * 576)


def test_a_layer_moved_between_groups_is_refused(vllm_plan: VllmPlan) -> None:
    def edit(data: dict[str, Any]) -> None:
        moved = data["groups"][0]["layers"].pop()
        data["groups"][1]["layers"].append(moved)

    refusal = refused(
        lambda: load_plan(tampered(vllm_plan, edit)), "plan_mismatch", "groups[0].layers"
    )
    assert refusal.facts["derived"] == vllm_plan.groups[0].layers


def test_a_changed_stage_is_refused(k3_dspark: HybridModel) -> None:
    two_stages = plan(k3_dspark, Deployment(attn_tp=8, pp=2))

    def edit(data: dict[str, Any]) -> None:
        data["stages"][1]["layers"].insert(0, data["stages"][0]["layers"].pop())

    refused(lambda: load_plan(tampered(two_stages, edit)), "plan_mismatch", "stages[0].layers")


def test_a_changed_packing_is_refused(parent_plan: ParentPlan) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["packing"]["mla_pages"] += 1

    refused(lambda: load_plan(tampered(parent_plan, edit)), "plan_mismatch", "packing.mla_pages")


def test_a_wrong_rule_1152_is_refused(k3_dspark: HybridModel) -> None:
    # ``rule_1152`` is stored only where the plan follows #1152 (``packing_rule`` otherwise)
    pr1152 = plan(
        k3_dspark,
        K3_TP8.model_validate(
            {**K3_TP8.model_dump(), "engine": "tokenspeed", "engine_version": "pr1152"}
        ),
    )
    assert isinstance(pr1152, ParentPlan) and pr1152.rule_1152 is not None

    def edit(data: dict[str, Any]) -> None:
        data["rule_1152"]["chosen"] = not data["rule_1152"]["chosen"]

    refused(lambda: load_plan(tampered(pr1152, edit)), "plan_mismatch", "rule_1152.chosen")


def test_a_wrong_packing_rule_is_refused(parent_plan: ParentPlan) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["packing_rule"]["chosen"] = not data["packing_rule"]["chosen"]

    refused(lambda: load_plan(tampered(parent_plan, edit)), "plan_mismatch", "packing_rule.chosen")


def test_a_stored_deployment_the_planner_refuses_is_refused_with_the_planners_code(
    vllm_plan: VllmPlan,
) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["deployment"]["attn_tp"] = 5  # 96 heads do not split over 5 ranks

    refused(lambda: load_plan(tampered(vllm_plan, edit)), "heads_not_divisible")


def test_a_plan_whose_deployment_names_the_other_engine_is_refused(
    parent_plan: ParentPlan,
) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["deployment"]["engine"] = "vllm"
        data["deployment"]["engine_version"] = "0.33.0"  # a release of the engine named

    refusal = refused(lambda: load_plan(tampered(parent_plan, edit)), "plan_mismatch", "engine")
    assert (refusal.facts["stored"], refusal.facts["derived"]) == ("tokenspeed", "vllm")


def test_a_plan_built_by_hand_is_checked_like_a_loaded_one(vllm_plan: VllmPlan) -> None:
    fields = {name: getattr(vllm_plan, name) for name in VllmPlan.model_fields}
    assert VllmPlan(**fields) == vllm_plan
    refused(lambda: VllmPlan(**{**fields, "page_bytes": 12345}), "plan_mismatch", "page_bytes")


def test_model_copy_re_validates_a_changed_plan(
    vllm_plan: VllmPlan, parent_plan: ParentPlan
) -> None:
    assert vllm_plan.model_copy() == vllm_plan
    refused(lambda: vllm_plan.model_copy(update={"page_bytes": 5}), "plan_mismatch", "page_bytes")
    # A new deployment with the old numbers is a plan of the old deployment: refused.
    refused(
        lambda: vllm_plan.model_copy(update={"deployment": Deployment(attn_tp=4, spec_tokens=2)}),
        "plan_mismatch",
    )
    refused(
        lambda: parent_plan.model_copy(update={"max_padding": 0.5}), "plan_mismatch", "max_padding"
    )


def test_the_pipeline_never_re_derives_its_own_plans(
    monkeypatch: pytest.MonkeyPatch, k3_dspark: HybridModel, vllm_plan: VllmPlan
) -> None:
    def fail(stored: object) -> None:
        raise RuntimeError("re-derived")  # not a ValueError: pydantic lets it through

    monkeypatch.setattr(rederive, "check_plan", fail)
    plan(k3_dspark, K3_TP8)
    plan_ride(plan(k3_dspark, K3_TP8))
    plan_transfer(k3_dspark, Deployment(pp=2), Deployment(attn_tp=8), prompt_tokens=100)
    with pytest.raises(RuntimeError, match="re-derived"):
        load_plan(vllm_plan.model_dump_json())


# -- the ride: re-planned with plan_ride from its plan and options -------------------------------


def test_a_hand_built_ride_outside_align_mode_is_refused(vllm_plan: VllmPlan) -> None:
    ride = plan_ride(vllm_plan)
    refused(
        lambda: RidePlan(
            plan=vllm_plan,
            stage=0,
            options=RideOptions(mamba_cache_mode="none"),
            names=ride.names,
            published=ride.published,
        ),
        "mamba_cache_mode",
    )


def test_a_hand_built_ride_with_a_chunk_off_the_grid_is_refused(vllm_plan: VllmPlan) -> None:
    ride = plan_ride(vllm_plan)
    refusal = refused(
        lambda: RidePlan(
            plan=vllm_plan,
            stage=0,
            options=RideOptions(chunk_tokens=7),
            names=ride.names,
            published=ride.published,
        ),
        "chunk_off_grid",
    )
    assert refusal.facts["smallest_chunk_tokens"] == 1536


def test_a_ride_round_trips_and_refuses_a_tampered_plan_or_options(vllm_plan: VllmPlan) -> None:
    ride = plan_ride(vllm_plan)
    assert RidePlan.model_validate_json(ride.model_dump_json()) == ride
    data = json.loads(ride.model_dump_json())
    data["plan"]["page_bytes"] = 12345
    refused(
        lambda: RidePlan.model_validate_json(json.dumps(data)), "plan_mismatch", "plan.page_bytes"
    )
    refused(
        lambda: ride.model_copy(update={"options": RideOptions(prefix_caching=False)}),
        "prefix_caching_off",
    )
    refused(lambda: ride.model_copy(update={"published": ride.published[1:]}), "layer_names")


# -- transfer, plane order, checkpoint image, binding --------------------------------------------


def test_a_transfer_plan_round_trips_and_refuses_a_tampered_segment(k3: HybridModel) -> None:
    result = plan_transfer(k3, Deployment(pp=2), Deployment(attn_tp=8, dcp=2), prompt_tokens=4096)
    assert TransferPlan.model_validate_json(result.model_dump_json()) == result
    data = json.loads(result.model_dump_json())
    data["pairs"][0]["segments"][0]["src_offset_bytes"] += 1
    refusal = refused(lambda: TransferPlan.model_validate_json(json.dumps(data)), "plan_mismatch")
    assert refusal.facts["field"] == "pairs[0].segments[0].src_offset_bytes"
    refused(lambda: result.model_copy(update={"pairs": result.pairs[1:]}), "plan_mismatch")
    refused(lambda: result.model_copy(update={"prompt_tokens": 4097}), "plan_mismatch")


def test_a_transfer_plan_refuses_a_segment_naming_other_layers(k3: HybridModel) -> None:
    result = plan_transfer(k3, Deployment(pp=2), Deployment(attn_tp=8, dcp=2), prompt_tokens=4096)
    layers = result.pairs[0].segments[0].layers
    assert len(layers) > 1  # a run of layers: stage 0's KDA layers
    for changed in (layers[1:], (*layers, 99), ()):  # one dropped, one not held, none
        data = json.loads(result.model_dump_json())
        data["pairs"][0]["segments"][0]["layers"] = list(changed)
        text = json.dumps(data)
        refusal = refused(lambda: TransferPlan.model_validate_json(text), "plan_mismatch")  # noqa: B023
        assert refusal.facts["field"] == "pairs[0].segments[0].layers"
        assert refusal.facts["stored"] == changed and refusal.facts["derived"] == layers
    data = json.loads(result.model_dump_json())
    data["pairs"][0]["segments"][0]["layers"] = list(reversed(layers))  # not increasing
    refused(lambda: TransferPlan.model_validate_json(json.dumps(data)), "invalid_argument")


def test_a_plane_order_checks_its_planes(vllm_plan: VllmPlan) -> None:
    order = plan_ride(vllm_plan).order
    assert PlaneOrder.model_validate_json(order.model_dump_json()) == order
    refused(
        lambda: order.model_copy(update={"num_image_planes": len(order.planes) + 1}),
        "plan_mismatch",
        "num_image_planes",
    )
    swapped = (order.planes[1], order.planes[0], *order.planes[2:])
    refused(
        lambda: order.model_copy(update={"planes": swapped}), "plan_mismatch", "planes[0].plane"
    )


def test_a_checkpoint_image_checks_its_pages_and_regions(vllm_plan: VllmPlan) -> None:
    image = plan_ride(vllm_plan).image
    assert CheckpointImage.model_validate_json(image.model_dump_json()) == image
    refused(
        lambda: image.model_copy(update={"page_bytes": image.page_bytes - 256}), "plan_mismatch"
    )
    refused(
        lambda: image.model_copy(update={"layer_state_bytes": image.page_bytes + 1}),
        "plan_mismatch",
        "layer_state_bytes",
    )
    refused(lambda: image.model_copy(update={"planes": image.planes[1:]}), "plan_mismatch")


def test_a_binding_checks_every_address(parent_plan: ParentPlan) -> None:
    bound = parent_plan.bind(10)
    assert Binding.model_validate_json(bound.model_dump_json()) == bound
    data = json.loads(bound.model_dump_json())
    data["layers"][3]["base_offset"] += 256
    refused(lambda: Binding.model_validate_json(json.dumps(data)), "plan_mismatch", "layers[3]")
    refused(lambda: bound.model_copy(update={"num_parents": 11}), "plan_mismatch")
    layer = bound.layers[0]
    refused(
        lambda: layer.model_copy(update={"page_stride": layer.parent_stride + 1}),
        "plan_mismatch",
        "page_stride",
    )
    pages = bound.groups[0]
    refused(
        lambda: pages.model_copy(update={"page_count": pages.page_count + 1}),
        "plan_mismatch",
        "page_count",
    )


# -- property: every plan round-trips, every tampered integer is refused -------------------------

DERIVED_FIELDS = (
    "groups",
    "sizes",
    "block_tokens",
    "page_bytes",
    "stages",
    "packing",
    "packing_rule",
    "rule_1152",
)


def integer_paths(data: object, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every path to an integer (not a bool) inside ``data``."""
    if isinstance(data, dict):
        return [p for key, value in data.items() for p in integer_paths(value, (*path, key))]
    if isinstance(data, list):
        return [p for i, value in enumerate(data) for p in integer_paths(value, (*path, i))]
    return [path] if isinstance(data, int) and not isinstance(data, bool) else []


@given(inputs=plannable_inputs(), choice=st.data(), delta=st.integers(1, 10**6))
def test_every_plan_round_trips_and_any_tampered_derived_integer_is_refused(
    inputs: tuple[HybridModel, Deployment], choice: st.DataObject, delta: int
) -> None:
    model, deployment = inputs
    try:
        result = plan(model, deployment)
    except Refusal:
        assume(False)
        return
    dumped = result.model_dump_json()
    assert load_plan(dumped) == result
    data = json.loads(dumped)
    paths = [p for p in integer_paths(data) if p[0] in DERIVED_FIELDS]
    path = choice.draw(st.sampled_from(paths), label="tampered field")
    *parents, last = path
    holder: Any = data
    for key in parents:
        holder = holder[key]
    holder[last] += delta
    refusal = refused(lambda: load_plan(json.dumps(data)), "plan_mismatch")
    root = re.match(r"(?:len\()?(\w+)", str(refusal.facts["field"]))
    assert root is not None and root.group(1) in DERIVED_FIELDS


@given(inputs=plannable_inputs())
def test_every_ride_order_image_and_binding_the_planners_build_passes_its_own_checks(
    inputs: tuple[HybridModel, Deployment],
) -> None:
    # The planners build these records unchecked (they are their own derivation); loading
    # them back runs the checks, which must accept every one of them.
    model, deployment = inputs
    try:
        result = plan(model, deployment)
    except Refusal:
        assume(False)
        return
    for stage in range(len(result.stages)):
        if isinstance(result, ParentPlan):
            bound = result.bind(3, stage=stage)
            assert Binding.model_validate_json(bound.model_dump_json()) == bound
            continue
        try:
            ride = plan_ride(result, stage=stage)
        except Refusal:
            continue
        assert RidePlan.model_validate_json(ride.model_dump_json()) == ride
        assert PlaneOrder.model_validate_json(ride.order.model_dump_json()) == ride.order
        assert CheckpointImage.model_validate_json(ride.image.model_dump_json()) == ride.image


# -- the invariants need no hypothesis -----------------------------------------------------------


def test_the_plan_invariants_import_and_run_without_hypothesis() -> None:
    script = (
        "import sys\n"
        "sys.modules['hypothesis'] = None\n"
        "from k3layout import Deployment, plan, preset\n"
        "from k3layout.layouts.invariants import plan_invariant_violations\n"
        "p = plan(preset('kimi-k3-dspark'), Deployment(attn_tp=8, spec_tokens=2))\n"
        "assert plan_invariant_violations(p) == [], plan_invariant_violations(p)\n"
        "try:\n"
        "    import k3layout.testing\n"
        "except ImportError:\n"
        "    print('testing needs hypothesis')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "testing needs hypothesis"


def test_testing_re_exports_the_same_invariant_checks() -> None:
    assert testing.plan_invariant_violations is invariants.plan_invariant_violations
