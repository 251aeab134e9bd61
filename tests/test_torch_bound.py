"""One adapter for both worlds: ``allocate(...).bound`` is exactly what vLLM 0.33 binds (vLLM's
names, one backing, raw KDA page views, MLA kernel blocks; compared with vLLM's own binding in
tests/conformance/test_conformance_caches.py), and ``validate`` takes it as it takes an
engine's: the ride's plane order on vLLM's names, images packed and restored through it, every
corruption named."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from k3layout import Deployment, Refusal, VllmPlan, engine_layer_names, plan, preset  # noqa: E402
from k3layout.engines.vllm import vllm_bound_views  # noqa: E402
from k3layout.torch import (  # noqa: E402
    allocate,
    image_units,
    layer_parts,
    pack_units,
    restore_units,
    validate,
)


def dspark() -> VllmPlan:
    result = plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2))
    assert isinstance(result, VllmPlan)
    return result


def test_allocate_binds_what_vllm_binds() -> None:
    result = dspark()
    cache = allocate(result, 3)
    views = vllm_bound_views(result, 3)
    assert list(cache.bound) == [view.name for view in views]
    backing = cache.planes[0].untyped_storage().data_ptr()
    for view in views:
        tensor = cache.bound[view.name]
        assert tuple(tensor.shape) == view.shape and tensor.stride() == view.strides
        assert tensor.untyped_storage().data_ptr() == backing  # one backing
        assert tensor.data_ptr() - backing == view.offset_bytes
    kda = cache.bound["language_model.model.layers.0.self_attn"]
    assert (kda.dtype, tuple(kda.shape)) == (torch.int8, (3, 1, 1, result.sizes.state_bytes))
    draft = cache.bound["model.layers.93.self_attn"]
    assert (draft.dtype, tuple(draft.shape)) == (torch.uint8, (3 * 24, 1, 64, 576))


def test_validate_takes_vllms_binding_under_vllms_names() -> None:
    result = dspark()
    cache = allocate(result, 2)
    live = validate(result, cache.bound)
    assert live.names == engine_layer_names(result.model, "vllm")
    # the aliased planes publish first, by address, whatever the names sort as
    assert live.published[0] == "language_model.model.layers.3.self_attn"
    assert len(live.published) == 29
    conv = live.spec.layer("language_model.model.layers.0.self_attn").parts[0]
    assert (conv.part, conv.shape) == ("conv", (2, 5, 4608))


def test_an_image_round_trips_through_vllms_binding() -> None:
    result = dspark()
    source, target = allocate(result, 4, fill=None), allocate(result, 4)
    for plane in source.planes:
        plane.copy_(torch.randint(0, 256, plane.shape, dtype=torch.uint8))
    units = image_units(validate(result, source.bound), source.bound, [3, 1, 0])
    restored = image_units(validate(result, target.bound), target.bound, [0, 2, 3])
    restore_units(pack_units(units), restored)
    assert all(torch.equal(a, b) for a, b in zip(units.pages(), restored.pages(), strict=True))


def test_each_corruption_of_the_binding_names_its_layer() -> None:
    result = dspark()
    bound = dict(allocate(result, 3).bound)
    first, second = (
        "language_model.model.layers.0.self_attn",
        "language_model.model.layers.4.self_attn",
    )
    swapped = {**bound, first: bound[second], second: bound[first]}
    late = "language_model.model.layers.11.self_attn"
    view = bound[late]
    shifted = torch.as_strided(view, view.shape, view.stride(), view.storage_offset() + 576)
    cases = {
        "swapped": (swapped, "aliasing", first),
        "shifted": ({**bound, late: shifted}, "aliasing", late),
        "dtype": ({**bound, second: bound[second].view(torch.uint8)}, "tensor_mismatch", second),
    }
    for what, (registered, code, name) in cases.items():
        with pytest.raises(Refusal) as refused:
            validate(result, registered)
        assert (refused.value.code, refused.value.facts["layer_name"]) == (code, name), what
    missing = {key: value for key, value in bound.items() if key != late}
    with pytest.raises(Refusal) as refused:
        validate(result, missing)
    assert refused.value.facts["missing"] == (late,)


def test_meta_binding_validates() -> None:
    result = dspark()
    assert validate(result, allocate(result, 5, device="meta").bound).spec.num_blocks == 5


class _NotATensor:
    """Has a storage and strides, nothing else a tensor has."""

    def untyped_storage(self) -> object:
        return type("S", (), {"data_ptr": lambda self: 0, "nbytes": lambda self: 10})()

    def stride(self) -> tuple[int, ...]:
        return (1,)


@pytest.mark.parametrize("junk", [None, 3, "x", _NotATensor()], ids=repr)
@pytest.mark.parametrize("where", ["every layer", "one layer"])
def test_junk_in_a_binding_is_refused(junk: object, where: str) -> None:
    from types import SimpleNamespace  # noqa: PLC0415

    from k3layout.engines.vllm.caches import check_bound_caches, check_bound_views  # noqa: PLC0415

    result = dspark()
    good = dict(allocate(result, 2, device="meta").bound)
    first = next(iter(good))
    caches = dict.fromkeys(good, junk) if where == "every layer" else {**good, first: junk}
    junk_spec = SimpleNamespace(shapes=[(1,)], dtypes=["not a dtype"])
    config = SimpleNamespace(
        num_blocks=2,
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=junk_spec, layer_names=[first])],
    )
    for check in (
        lambda: check_bound_views(result, caches, 2),
        lambda: check_bound_caches(result, config, good),
        lambda: check_bound_caches(result, SimpleNamespace(), good),
        lambda: validate(result, caches),  # type: ignore[arg-type]
    ):
        with pytest.raises(Refusal):
            check()


def test_layer_parts_of_a_layer_not_registered_is_refused() -> None:
    result = dspark()
    bound = allocate(result, 2).bound
    live = validate(result, bound)
    name = next(iter(bound))
    assert len(layer_parts(live, bound, name)) == 2  # conv, recurrent
    for registered, asked in (({}, name), (bound, "nope")):
        with pytest.raises(Refusal) as refused:
            layer_parts(live, registered, asked)
        assert refused.value.code == "layer_names"
