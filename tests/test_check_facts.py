"""One facts schema for every check (errors.CheckFacts): validate on the registered dict and on
vLLM's bound dict, check_aliasing, plane_order on addresses, SGLang's check_pools and vLLM's
bridge (check_kv_cache_config, check_kv_caches) refuse with the same keys, each of one type:
``layer`` the module layer index, ``group`` the group's name, ``expected`` and ``actual``
numbers, strings or tuples. A property test corrupts live tensors at random (planes and layers
permuted, layers moved, aliased, re-typed) and checks every refusal against the schema."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

import torch
from test_engines_vllm import kv_cache_config, vllm_config
from test_sglang import pools_of, sglang

from k3layout import Deployment, Refusal, plan_vllm, preset
from k3layout.engines.sglang import check_pools
from k3layout.engines.vllm import check_kv_cache_config
from k3layout.engines.vllm.caches import check_bound_views
from k3layout.errors import CHECK_FACT_KEYS, check_facts_violations
from k3layout.offload import TensorView, check_aliasing, plane_order
from k3layout.torch import allocate, cut, validate

K3 = plan_vllm(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2))


def refused(action: Callable[[], object], check: str) -> Refusal:
    with pytest.raises(Refusal) as caught:
        action()
    facts = caught.value.facts
    assert check_facts_violations(facts) == [], (caught.value, facts)
    assert tuple(facts)[: len(CHECK_FACT_KEYS)] == CHECK_FACT_KEYS
    assert facts["check"] == check
    return caught.value


def test_the_schema_names_what_is_missing_extra_or_mistyped() -> None:
    assert check_facts_violations({"check": "validate"})[0] == "missing key field"
    good = refused(lambda: validate(K3, {}), "validate").facts
    assert check_facts_violations({**good, "group": 1}) == [
        "group=1 is a int, not (<class 'str'>, <class 'NoneType'>)"
    ]
    assert check_facts_violations({**good, "num_tensors": 1}) == [
        "key num_tensors is not in the schema"
    ]
    assert check_facts_violations({**good, "layer": True})  # a bool is not a layer index


def test_validate_on_the_registered_dict() -> None:
    cache = allocate(K3, 1)
    registered = dict(cache.registered)
    # layer 41 shares layer 40's plane (position 10 of the next group): layer 44's is the next
    registered["model.layers.40.self_attn"] = registered["model.layers.44.self_attn"]
    facts = refused(lambda: validate(K3, registered), "validate").facts
    # module layer 40 (its index, not its position 10 in group linear_attention_0)
    assert (facts["layer"], facts["group"], facts["position"]) == (40, "linear_attention_0", 10)
    assert facts["found_plane"] == 11
    assert isinstance(facts["expected"], int) and isinstance(facts["actual"], int)


def test_validate_on_vllms_bound_dict() -> None:
    cache = allocate(K3, 2)
    bound = dict(cache.bound)
    name = "language_model.model.layers.40.self_attn"
    bound[name] = bound[name].view(torch.int16)  # another dtype: the raw page is int8
    facts = refused(lambda: validate(K3, bound), "validate").facts
    assert (facts["layer"], facts["layer_name"], facts["field"]) == (40, name, "dtype")
    assert (facts["group"], facts["position"], facts["plane"]) == ("linear_attention_0", 10, 10)


def test_check_kv_caches_on_a_bound_dict() -> None:
    cache = allocate(K3, 2)
    bound = dict(cache.bound)
    bound.pop(next(iter(bound)))
    facts = refused(lambda: check_bound_views(K3, bound, 2), "check_kv_caches").facts
    assert facts["field"] == "names" and facts["missing"]


def test_check_aliasing_and_plane_order() -> None:
    order = plane_order(K3)
    page = K3.page_bytes
    views = {
        name: TensorView(base_address=j * 10 * page, block_stride_bytes=page, num_bytes=page)
        for j, name in enumerate(order.order)
    }
    # KDA layer j of every group on plane j (KDA layer 40: group 0, position 10)
    for group in K3.groups_of("kda"):
        for j, layer in enumerate(group.layers):
            views[f"model.layers.{layer}.self_attn"] = views[order.order[j]]
    views["model.layers.40.self_attn"] = views[order.order[11]]
    facts = refused(lambda: check_aliasing(K3, views, order.order), "check_aliasing").facts
    assert (facts["layer"], facts["group"], facts["position"], facts["found_plane"]) == (
        40,
        "linear_attention_0",
        10,
        11,
    )
    facts = refused(lambda: plane_order(K3, views=views), "plane_order").facts
    assert facts["group"] == "linear_attention_0" and facts["position"] in (10, 11)


def test_check_pools() -> None:
    p = sglang(attn_tp=8)
    req, tok = pools_of(p)
    tok.full_kv_pool.kv_buffer[3] = tok.full_kv_pool.kv_buffer[2]
    facts = refused(lambda: check_pools(p, req, tok), "check_pools").facts
    assert (facts["layer"], facts["group"], facts["field"]) == (15, "full_attention", "overlap")


def test_check_kv_cache_config() -> None:
    config = kv_cache_config()
    config.kv_cache_tensors[2].layer_stride += 1
    facts = refused(
        lambda: check_kv_cache_config(vllm_config(), config), "check_kv_cache_config"
    ).facts
    assert (facts["field"], facts["block"]) == ("offset_bytes", 0)
    assert isinstance(facts["layer"], int) and isinstance(facts["group"], str)
    config = kv_cache_config()
    config.kv_cache_groups[1].layer_names.reverse()
    facts = refused(
        lambda: check_kv_cache_config(vllm_config(), config), "check_kv_cache_config"
    ).facts
    assert facts["field"] == "groups" and isinstance(facts["expected"], tuple)


CORRUPTIONS = ("plane_perm", "layer_swap", "shift", "alias", "dtype", "extra", "missing")


@settings(max_examples=60, deadline=None)
@given(how=st.sampled_from(CORRUPTIONS), data=st.data())
def test_every_corruption_is_refused_with_the_schema(how: str, data: st.DataObject) -> None:
    """Random corruptions of one correct backing: each is refused (never accepted, never a bare
    exception), with the schema; a permutation of planes is named as one."""
    cache = allocate(K3, 2)
    spec = cache.spec
    registered: dict[str, object] = dict(cache.registered)
    names = list(spec.names)
    storage = cache.planes[0].untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))

    def recut(name: str, start: int) -> None:
        layer = spec.layer(name)
        plane = flat[start : start + spec.plane_spans[layer.plane]]
        parts = tuple(cut(plane, part) for part in layer.parts)
        registered[name] = parts if layer.kind == "kda" else parts[0]

    if how == "plane_perm":
        perm = data.draw(st.permutations(range(spec.num_planes)))
        if list(perm) == list(range(spec.num_planes)):
            perm = [*perm[1:], perm[0]]
        for layer in spec.layers:
            recut(layer.name, spec.plane_starts[perm[layer.plane]])
    elif how in ("layer_swap", "alias"):
        # two layers on other planes (layer j of every group shares plane j: the same view)
        a = data.draw(st.sampled_from(names))
        kind = spec.layer(a).kind
        others = [
            name
            for name in names
            if spec.layer(name).plane != spec.layer(a).plane
            and (how == "alias" or spec.layer(name).kind == kind)
        ]
        b = data.draw(st.sampled_from(others))
        if how == "alias":
            registered[a] = registered[b]
        else:
            registered[a], registered[b] = registered[b], registered[a]
    elif how == "shift":
        name = data.draw(st.sampled_from(names))
        layer = spec.layer(name)
        # a shift that stays inside the backing: the first plane cannot go back, the last on
        shifts = [-256, 256][layer.plane == 0 : 1 + (layer.plane < spec.num_planes - 1)]
        shift = data.draw(st.sampled_from(shifts))
        recut(name, spec.plane_starts[layer.plane] + shift)
    elif how == "dtype":
        name = data.draw(st.sampled_from(names))
        value = registered[name]
        first = value[0] if isinstance(value, tuple) else value
        assert isinstance(first, torch.Tensor)
        registered[name] = first.view(torch.uint8) if first.dtype != torch.uint8 else first.float()
    elif how == "extra":
        registered["model.layers.999.self_attn"] = torch.zeros(1)
    else:
        del registered[data.draw(st.sampled_from(names))]
    refusal = refused(lambda: validate(K3, registered), "validate")  # type: ignore[arg-type]
    if how == "plane_perm":
        assert refusal.facts["field"] == "plane_order", refusal
        assert "the planes are published in another order" in str(refusal)


def test_the_plugins_refusal_is_the_checks() -> None:
    """The startup plugin raises the check's refusal unchanged (its facts included)."""
    from k3layout.engines.vllm.plugin import check_after_kv_cache_init  # noqa: PLC0415

    config = kv_cache_config()
    config.kv_cache_tensors[0].offset = 7
    caches: dict[str, object] = {}
    refused(
        lambda: check_after_kv_cache_init(vllm_config(), config, caches, 0),
        "check_kv_cache_config",
    )
