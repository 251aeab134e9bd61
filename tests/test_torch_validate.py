"""Validation of live tensors: accepts what the engine's allocation builds, refuses (naming layer,
group and plane) every way a registered layout can differ from its plan."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest

pytest.importorskip("torch")

import torch

from k3layout import Deployment, Refusal, VllmPlan, plan_parent, plan_vllm, preset
from k3layout.offload import engine_layer_names, name_order
from k3layout.torch import (
    Allocation,
    LiveLayout,
    allocate,
    cache_spec,
    cut,
    layer_parts,
    validate,
)

K3_TP8 = Deployment(attn_tp=8, spec_tokens=2)

Registered = dict[str, "torch.Tensor | tuple[torch.Tensor, ...]"]


@pytest.fixture(scope="module")
def k3_plan() -> VllmPlan:
    return plan_vllm(preset("kimi-k3-dspark"), K3_TP8)


@pytest.fixture
def cache(k3_plan: VllmPlan) -> Allocation:
    return allocate(k3_plan, num_blocks=1)


def refusal(action: Callable[[], object]) -> Refusal:
    with pytest.raises(Refusal) as refused:
        action()
    assert refused.value.hint, "every refusal says what would work"
    return refused.value


def recut(cache: Allocation, name: str, plane: int, shift: int = 0) -> tuple[torch.Tensor, ...]:
    """Layer ``name``'s parts cut from plane ``plane`` moved ``shift`` bytes (either way)."""
    source = cache.planes[plane]
    moved = source.as_strided(source.shape, source.stride(), source.storage_offset() + shift)
    return tuple(cut(moved, part) for part in cache.spec.layer(name).parts)


def where(
    name: str,
    group: str,
    position: int,
    plane: int | None = None,
    *,
    field: str,
    expected: object,
    actual: object,
    part: str | None = None,
    block: int | None = None,
) -> dict[str, object]:
    """The facts a layer's refusal carries, in the checks' one schema (CheckFacts): the
    module layer is read off the name (``model.layers.<i>...``)."""
    return {
        "check": "validate",
        "field": field,
        "stage": 0,
        "layer": int(name.split(".")[2]),
        "layer_name": name,
        "group": group,
        "position": position,
        "plane": position if plane is None else plane,
        "part": part,
        "block": block,
        "expected": expected,
        "actual": actual,
    }


def test_the_allocated_layout_validates_and_publishes_aliased_planes_first(
    k3_plan: VllmPlan, cache: Allocation
) -> None:
    live = validate(k3_plan, cache.registered)
    # K3 + DSpark: KDA layer j of every group rides attention layer 4j + 3, j < 23; the rest
    # (layer 92 and the five draft layers) follow in name order.
    assert live.published[:23] == tuple(
        f"model.layers.{4 * j + 3}.self_attn.attn" for j in range(23)
    )
    assert live.published[23] == "draft.layers.0.self_attn.attn"
    assert live.plane_bases == tuple(plane.data_ptr() for plane in cache.planes)
    assert LiveLayout.model_validate_json(live.model_dump_json()) == live
    assert hash(live) == hash(LiveLayout.model_validate_json(live.model_dump_json()))


def test_a_missing_and_an_extra_layer_are_named(k3_plan: VllmPlan, cache: Allocation) -> None:
    registered: Registered = dict(cache.registered)
    del registered["model.layers.5.self_attn"]
    registered["model.layers.99.self_attn"] = torch.zeros(1)
    refused = refusal(lambda: validate(k3_plan, registered))
    assert refused.code == "tensor_mismatch"
    facts = refused.facts
    assert (facts["field"], facts["missing"], facts["extra"]) == (
        "names",
        ("model.layers.5.self_attn",),
        ("model.layers.99.self_attn",),
    )
    # the first missing layer, named as every layer refusal names one: module layer 5 is layer
    # 1 of KDA group 1 (the groups are strided: 1, 5, 9, ...)
    assert (facts["layer"], facts["layer_name"], facts["group"], facts["position"]) == (
        5,
        "model.layers.5.self_attn",
        "linear_attention_1",
        1,
    )
    assert facts["expected"] == cache.spec.names
    assert isinstance(facts["actual"], tuple) and "model.layers.99.self_attn" in facts["actual"]


def test_a_kda_layer_needs_its_two_tensors(k3_plan: VllmPlan, cache: Allocation) -> None:
    registered: Registered = dict(cache.registered)
    conv, state = cache.layers["model.layers.4.self_attn"]
    registered["model.layers.4.self_attn"] = (conv,)
    refused = refusal(lambda: validate(k3_plan, registered))
    assert refused.code == "tensor_mismatch"
    # module layer 4 is layer 1 of KDA group 0 (the groups are strided: 0, 4, 8, ...)
    assert refused.facts == where(
        "model.layers.4.self_attn", "linear_attention_0", 1, field="count", expected=2, actual=1
    )
    # the old three-part conv state: four tensors where the plan has (conv, recurrent)
    registered["model.layers.4.self_attn"] = (conv, conv, conv, state)
    assert refusal(lambda: validate(k3_plan, registered)).facts["actual"] == 4
    registered["model.layers.4.self_attn"] = ("conv", "state")  # type: ignore[assignment]
    refused = refusal(lambda: validate(k3_plan, registered))
    assert (refused.facts["field"], refused.facts["actual"]) == ("type", "tuple")
    assert "(conv, recurrent)" in str(refused)  # the parts the plan cuts, not four


def test_a_dtype_that_is_not_the_plans(k3_plan: VllmPlan, cache: Allocation) -> None:
    registered: Registered = dict(cache.registered)
    latent = cache.registered["model.layers.7.self_attn.attn"]
    assert isinstance(latent, torch.Tensor)
    registered["model.layers.7.self_attn.attn"] = latent.view(torch.uint8)  # fp8 bytes as uint8
    refused = refusal(lambda: validate(k3_plan, registered))
    assert refused.code == "tensor_mismatch"
    assert refused.facts == where(
        "model.layers.7.self_attn.attn",
        "full_attention",
        1,
        field="dtype",
        part="latent",
        expected="torch.float8_e4m3fn",
        actual="torch.uint8",
    )


def test_a_conv_state_in_the_other_layout_is_a_shape_mismatch(
    k3_plan: VllmPlan, cache: Allocation
) -> None:
    # DS (channel-major) views registered where the plan was validated SD (time-major)
    ds_plan = plan_vllm(k3_plan.model, Deployment(attn_tp=8, spec_tokens=2, conv_layout="DS"))
    ds = allocate(ds_plan, num_blocks=1)
    refused = refusal(lambda: validate(k3_plan, ds.registered))
    assert refused.code == "tensor_mismatch"
    rows, channels = 4 - 1 + 2, 3 * 96 // 8 * 128  # one tensor: q|k|v channels
    assert refused.facts == where(
        "model.layers.0.self_attn",
        "linear_attention_0",
        0,
        field="shape",
        part="conv",
        expected=(1, rows, channels),
        actual=(1, channels, rows),
    )
    validate(ds_plan, ds.registered)
    # ...and SD views where the plan is DS, the other way round
    refused = refusal(lambda: validate(ds_plan, cache.registered))
    assert (refused.facts["actual"], refused.facts["expected"]) == (
        (1, rows, channels),
        (1, channels, rows),
    )


def test_a_wrong_stride_is_refused(k3_plan: VllmPlan) -> None:
    cache = allocate(k3_plan, num_blocks=2)
    registered: Registered = dict(cache.registered)
    conv, state = cache.layers["model.layers.8.self_attn"]
    # the state copied into its own tensor: the block stride is the state, not the page
    registered["model.layers.8.self_attn"] = (conv, state.contiguous())
    refused = refusal(lambda: validate(k3_plan, registered))
    assert refused.code == "tensor_mismatch"
    page = 1536 * 576
    assert refused.facts == where(
        "model.layers.8.self_attn",
        "linear_attention_0",
        2,
        field="strides",
        part="recurrent",
        expected=(page // 4, 128 * 128, 128, 1),
        actual=(96 // 8 * 128 * 128, 128 * 128, 128, 1),
    )


def test_a_kda_layer_cut_from_the_wrong_plane_names_both_planes(
    k3_plan: VllmPlan, cache: Allocation
) -> None:
    registered: Registered = dict(cache.registered)
    registered["model.layers.5.self_attn"] = recut(cache, "model.layers.5.self_attn", plane=2)
    refused = refusal(lambda: validate(k3_plan, registered))
    assert refused.code == "aliasing"
    span = cache.spec.plane_span_bytes  # one block of 884,736 B per plane
    assert refused.facts == {
        **where(
            "model.layers.5.self_attn",
            "linear_attention_1",
            1,
            field="offset_bytes",
            part="conv",
            block=0,
            expected=1 * span,
            actual=2 * span,
        ),
        "found_plane": 2,
    }
    assert "plane 2" in str(refused) and "plane 1" in str(refused)


def test_a_state_shifted_inside_its_plane_is_refused(k3_plan: VllmPlan, cache: Allocation) -> None:
    registered: Registered = dict(cache.registered)
    registered["model.layers.6.self_attn"] = recut(cache, "model.layers.6.self_attn", 1, shift=64)
    refused = refusal(lambda: validate(k3_plan, registered))
    assert refused.code == "aliasing"
    span = cache.spec.plane_span_bytes
    assert (refused.facts["found_plane"], refused.facts["actual"]) == (1, span + 64)
    assert refused.facts["expected"] == span


def test_permuted_layers_of_a_group_are_refused_at_the_first(
    k3_plan: VllmPlan, cache: Allocation
) -> None:
    registered: Registered = dict(cache.registered)
    # layers 1 and 2 of KDA group 2 (module layers 6 and 10) exchange their tensors
    registered["model.layers.6.self_attn"] = cache.registered["model.layers.10.self_attn"]
    registered["model.layers.10.self_attn"] = cache.registered["model.layers.6.self_attn"]
    refused = refusal(lambda: validate(k3_plan, registered))
    assert refused.code == "aliasing"
    assert refused.facts["layer_name"] == "model.layers.6.self_attn"
    assert (refused.facts["plane"], refused.facts["found_plane"]) == (1, 2)
    # a permutation of layers across planes is named as one, both layers it moves
    assert refused.facts["field"] == "layer_order"
    assert refused.facts["moved"] == ("model.layers.6.self_attn", "model.layers.10.self_attn")
    assert "another order" in str(refused)


def test_swapped_groups_are_refused_against_the_engines_groups(
    k3_plan: VllmPlan, cache: Allocation
) -> None:
    names = engine_layer_names(k3_plan.model)
    groups = [[names.name(layer) for layer in group.layers] for group in k3_plan.groups]
    validate(k3_plan, cache.registered, groups=groups)
    groups[0], groups[1] = groups[1], groups[0]
    refused = refusal(lambda: validate(k3_plan, cache.registered, groups=groups))
    assert refused.code == "aliasing"
    assert refused.facts == where(
        "model.layers.0.self_attn",
        "linear_attention_0",
        0,
        field="groups",
        expected="model.layers.0.self_attn",
        actual="model.layers.1.self_attn",
    )


def test_two_attention_layers_on_one_plane_are_refused(
    k3_plan: VllmPlan, cache: Allocation
) -> None:
    registered: Registered = dict(cache.registered)
    registered["model.layers.7.self_attn.attn"] = cache.registered["model.layers.3.self_attn.attn"]
    refused = refusal(lambda: validate(k3_plan, registered))
    assert refused.code == "aliasing"
    # plane 1's KDA layers say where it is: layer 7 is named, found on plane 0
    assert refused.facts == {
        **where(
            "model.layers.7.self_attn.attn",
            "full_attention",
            1,
            field="offset_bytes",
            part="latent",
            block=0,
            expected=cache.spec.plane_span_bytes,
            actual=0,
        ),
        "found_plane": 0,
    }


def test_planes_published_in_name_order_are_refused_by_the_rides_check(
    k3_plan: VllmPlan, cache: Allocation
) -> None:
    """The seed's first boot, on live tensors: with the draft, name order puts attention layer
    3 (which KDA layer 0 of every group rides) at published plane 10."""
    published = name_order(validate(k3_plan, cache.registered).published)
    refused = refusal(lambda: validate(k3_plan, cache.registered, published=published))
    assert refused.code == "aliasing"
    facts = refused.facts
    assert (facts["group"], facts["position"], facts["found_plane"], facts["plane"]) == (
        "linear_attention_0",
        0,
        10,
        0,
    )


def test_a_stage_whose_state_cannot_ride_validates_without_a_publish_order() -> None:
    p = plan_vllm(preset("kimi-k3"), Deployment(attn_tp=8, pp=8))
    # stage 0 holds layers 0..10: attention 3 and 7, KDA groups (0, 4, 8), (1, 5, 9), (2, 6, 10)
    cache = allocate(p, num_blocks=1, stage=0)
    assert validate(p, cache.registered, stage=0).published == ()
    refused = refusal(
        lambda: validate(
            p,
            cache.registered,
            stage=0,
            published=("model.layers.3.self_attn.attn", "model.layers.7.self_attn.attn"),
        )
    )
    assert refused.code == "aliasing"
    facts = refused.facts
    assert (facts["position"], facts["expected"], facts["actual"]) == (2, 3, 2)


def test_the_parent_arena_validates_and_refuses_a_misplaced_state() -> None:
    p = plan_parent(preset("kimi-k3"), K3_TP8)
    cache = allocate(p, num_blocks=2)
    assert validate(p, cache.registered).published == ()
    registered: Registered = dict(cache.registered)
    registered["model.layers.1.self_attn"] = recut(cache, "model.layers.1.self_attn", 2)
    refused = refusal(lambda: validate(p, registered))
    assert refused.code == "aliasing"
    # parent groups are contiguous runs: module layer 1 is layer 1 of linear_attention_0
    assert refused.facts["layer_name"] == "model.layers.1.self_attn"
    assert (refused.facts["plane"], refused.facts["found_plane"]) == (1, 2)
    refused = refusal(lambda: validate(p, cache.registered, published=("x",)))
    assert refused.code == "engine_mismatch"


def test_vllms_list_of_state_tensors_is_accepted_and_views_are_named(
    k3_plan: VllmPlan, cache: Allocation
) -> None:
    # vLLM hands a mamba layer's state as a list [conv, recurrent]
    registered = {name: list(parts) for name, parts in cache.layers.items()}
    live = validate(k3_plan, registered)
    view = live.view("model.layers.4.self_attn")
    assert view.base_address == cache.planes[1].data_ptr()  # layer 1 of its group: plane 1
    assert view.block_stride_bytes == 1536 * 576
    refused = refusal(lambda: live.view("model.layers.4.mlp"))
    assert (refused.code, refused.facts) == (
        "layer_names",
        {"name": "model.layers.4.mlp", "stage": 0},
    )


def test_a_key_that_is_not_a_layer_name_is_refused_by_name(
    k3_plan: VllmPlan, cache: Allocation
) -> None:
    registered: dict[object, object] = {name: value for name, value in cache.registered.items()}
    # keyed by module layer, and one left unkeyed: extra keys that do not even sort
    registered[7] = registered.pop("model.layers.7.self_attn.attn")
    registered[None] = registered.pop("model.layers.11.self_attn.attn")
    refused = refusal(lambda: validate(k3_plan, registered))  # type: ignore[arg-type]
    assert refused.code == "tensor_mismatch"
    facts = refused.facts
    assert (facts["field"], facts["layer_name"], facts["expected"], facts["actual"]) == (
        "names",
        "7",
        "str",
        "int",
    )
    assert "7" in str(refused)
    refused = refusal(lambda: validate(k3_plan, list(cache.registered)))  # type: ignore[arg-type]
    assert refused.code == "invalid_argument"
    assert (refused.facts["field"], refused.facts["actual"]) == ("type", "list")


def per_plane_registration(p: VllmPlan) -> tuple[Allocation, Registered]:
    """The layout cut from a tensor per plane (an engine allocating planes one by one), each
    with 64 B to spare on both sides, so that a shifted view is still a view."""
    cache = allocate(p, num_blocks=2)
    span = cache.spec.plane_span_bytes
    planes = tuple(
        torch.zeros(span + 128, dtype=torch.uint8)[64 : 64 + span].view(plane.shape)
        for plane in cache.planes
    )
    layers = {
        layer.name: tuple(cut(planes[layer.plane], part) for part in layer.parts)
        for layer in cache.spec.layers
    }
    return Allocation(spec=cache.spec, planes=planes, layers=layers), {
        name: parts[0] if len(parts) == 1 else parts for name, parts in layers.items()
    }


CORRUPTION_PLANS = {
    "kimi-linear-48b TP8": ("kimi-linear-48b", Deployment(attn_tp=8)),
    "kimi-k3-dspark TP8": ("kimi-k3-dspark", K3_TP8),
}


def test_a_tensor_per_plane_is_refused_for_its_first_layer_off_the_backing() -> None:
    """The plan's byte ranges count from the start of one backing per rank (what vLLM and
    tokenspeed allocate, and what the ride, the images and transfers read): planes cut from
    tensors of their own are refused, naming the first layer off the backing most layers
    view (module layer 4: layer 1 of KDA group 0, on plane 1)."""
    p = plan_vllm(preset("kimi-linear-48b"), Deployment(attn_tp=8))
    _, registered = per_plane_registration(p)
    refused = refusal(partial(validate, p, registered))
    assert refused.code == "aliasing"
    facts = refused.facts
    assert (facts["field"], facts["layer_name"], facts["plane"]) == (
        "storage",
        "model.layers.4.self_attn",
        1,
    )
    assert (facts["expected"], facts["actual"]) == (1, 7)  # one backing; seven planes


@pytest.mark.parametrize("case", sorted(CORRUPTION_PLANS))
def test_a_corrupted_layer_is_the_layer_the_refusal_names(case: str) -> None:
    """Each layer in turn, shifted inside its plane or cut from the next plane: the refusal
    names it, never the attention layer or the KDA riders sharing its plane."""
    model, deployment = CORRUPTION_PLANS[case]
    p = plan_vllm(preset(model), deployment)
    cache = allocate(p, num_blocks=2)
    registered: Registered = dict(cache.registered)
    validate(p, registered)
    spec = cache.spec
    for layer in spec.layers:
        last = layer.plane == spec.num_planes - 1  # shifted back: no bytes after the backing
        for how, plane, shift in (
            ("shifted", layer.plane, -64 if last else 64),
            ("on another plane", (layer.plane + 1) % spec.num_planes, 0),
        ):
            corrupted = dict(registered)
            parts = recut(cache, layer.name, plane, shift)
            corrupted[layer.name] = parts if layer.kind == "kda" else parts[0]
            refused = refusal(partial(validate, p, corrupted))
            assert refused.code == "aliasing", (layer.name, how)
            assert refused.facts["layer_name"] == layer.name, (how, refused.facts)


def test_a_first_layer_of_another_block_count_is_the_one_named(k3_plan: VllmPlan) -> None:
    """The block count is the one most layers were cut for, not the first layer's."""
    cache, other = allocate(k3_plan, num_blocks=1), allocate(k3_plan, num_blocks=2)
    registered: Registered = dict(cache.registered)
    registered["model.layers.0.self_attn"] = other.registered["model.layers.0.self_attn"]
    refused = refusal(lambda: validate(k3_plan, registered))
    assert refused.code == "tensor_mismatch"
    assert refused.facts["layer_name"] == "model.layers.0.self_attn"
    shape, expected = refused.facts["actual"], refused.facts["expected"]
    assert isinstance(shape, tuple) and isinstance(expected, tuple)
    assert (shape[0], expected[0]) == (2, 1)


BLOCK_OUTERMOST = {
    "glm-5.3-flash TP8 packed": ("glm-5.3-flash", Deployment(attn_tp=8)),
    "glm-5.3-flash TP2 B200 bf16 packed": (
        "glm-5.3-flash",
        Deployment(attn_tp=2, gpu="b200", kv_dtype="bf16"),
    ),
    "kimi-linear-48b TP4 BLHNC": (
        "kimi-linear-48b",
        Deployment(attn_tp=4, attention_backend="TRITON_MLA", kv_cache_layout="BLHNC"),
    ),
}


@pytest.mark.parametrize("case", sorted(BLOCK_OUTERMOST))
def test_a_moved_part_of_a_block_outermost_backing_is_the_one_named(case: str) -> None:
    """A block-outermost backing (vLLM's packed layout of GLM-5.3-Flash, or BLHNC): what
    allocation builds validates, from the adapter's parts and from vLLM's own binding; each
    layer in turn moved 64 bytes inside the backing is refused by its name."""
    model, deployment = BLOCK_OUTERMOST[case]
    p = plan_vllm(preset(model), deployment)
    cache = allocate(p, num_blocks=2)
    assert validate(p, cache.registered).published == ()  # nothing rides a packed block
    bound = validate(p, cache.bound)
    backing = cache.planes[0].data_ptr()
    for layer in bound.spec.layers:  # vLLM's caches cut into the adapter's parts
        cut_parts = layer_parts(bound, cache.bound, layer.name)
        assert [t.data_ptr() - backing for t in cut_parts] == [
            part.offset_bytes for part in layer.parts
        ]
        assert [tuple(t.shape) for t in cut_parts] == [part.shape for part in layer.parts]
    # two blocks' views over a backing of three: room to move any of them 64 bytes on
    spare = allocate(p, num_blocks=3).planes[0]
    spec = cache_spec(p, 2)

    def cut_at(name: str, shift: int) -> tuple[torch.Tensor, ...]:
        moved = spare.as_strided((2, spec.page_bytes), spare.stride(), shift)
        return tuple(cut(moved, part) for part in spec.layer(name).parts)

    def registration(parts: tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return parts if len(parts) > 1 else parts[0]

    registered = {name: registration(cut_at(name, 0)) for name in spec.names}
    validate(p, registered)
    for layer in spec.layers:
        corrupted = {**registered, layer.name: registration(cut_at(layer.name, 64))}
        refused = refusal(partial(validate, p, corrupted))
        assert refused.code == "aliasing", layer.name
        assert refused.facts["layer_name"] == layer.name, refused.facts
