"""``check_kv_caches`` on the caches vLLM 0.33 really binds (its own ``allocate_kv_cache`` and
``map_kv_caches_to_kernel_blocks``, on ``meta``, or on CPU for a small budget): the checks pass
on what vLLM binds, and every corruption is a named refusal that blames the corrupted layer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from vllm_required import require_vllm

require_vllm()

import torch  # noqa: E402
from test_conformance_binding import CASES  # noqa: E402
from vllm_engine import Case, Engine, bind, start  # noqa: E402

from k3layout import Refusal, engine_layer_names  # noqa: E402
from k3layout.engines.vllm import (  # noqa: E402
    check_kv_caches,
    plan_from_vllm,
    vllm_bound_views,
)

Caches = dict[str, torch.Tensor]

DSPARK = Case(attn_tp=8, drafter="dspark", spec_tokens=2)
LINEAR = Case("kimi-linear", attn_tp=4, max_model_len=4096)
BLOCK_OUTERMOST = Case(attn_tp=8, backend="TRITON_MLA", kv_cache_layout="BLHNC")
CORRUPTED = [DSPARK, LINEAR, BLOCK_OUTERMOST]


def refusal(engine: Engine, caches: object, stage: int = 0) -> Refusal:
    with pytest.raises(Refusal) as refused:
        check_kv_caches(engine.workers[stage], engine.kv_cache_configs[stage], caches, stage)
    return refused.value


def shifted(tensor: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The same view ``nbytes`` further into the backing."""
    step = nbytes // tensor.element_size()
    return torch.as_strided(tensor, tensor.shape, tensor.stride(), tensor.storage_offset() + step)


def kda_names(engine: Engine, caches: Caches) -> list[str]:
    """The bound KDA layers (raw int8 page views), in module order."""
    return [name for name, view in caches.items() if view.dtype == torch.int8]


def attention_names(caches: Caches) -> list[str]:
    return [name for name, view in caches.items() if view.dtype != torch.int8]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_what_vllm_binds_passes(case: Case, tmp_path: Path) -> None:
    if case.kv_cache_layout == "BLHNC" and case.backend != "TRITON_MLA":
        pytest.skip("vLLM refuses to bind it (test_conformance_binding)")
    engine = start(case, tmp_path)
    for stage, config in enumerate(engine.kv_cache_configs):
        caches = bind(engine, stage)
        result = check_kv_caches(engine.workers[stage], config, caches, stage)
        assert result == plan_from_vllm(engine.workers[stage])
        names = engine_layer_names(result.model, "vllm")
        assert set(caches) == {names.name(layer) for layer in result.stage(stage).layers}
        for view in vllm_bound_views(result, config.num_blocks, stage):  # exactly, axes of one too
            bound = caches[view.name]
            assert (tuple(bound.shape), bound.stride(), str(bound.dtype)) == (
                view.shape,
                view.strides,
                f"torch.{view.dtype}",
            )


def test_on_cpu_a_layer_with_its_own_storage_is_refused(tmp_path: Path) -> None:
    small = Case("kimi-linear", attn_tp=4, max_model_len=4096, memory_bytes=64 << 20)
    engine = start(small, tmp_path)
    caches = bind(engine, device="cpu")
    check_kv_caches(engine.workers[0], engine.kv_cache_configs[0], caches)
    name = kda_names(engine, caches)[3]
    copied = torch.empty_strided(caches[name].shape, caches[name].stride(), dtype=torch.int8)
    refused = refusal(engine, {**caches, name: copied})
    assert refused.code == "aliasing" and refused.facts["layer_name"] == name
    assert "another storage" in refused.message


Corruption = Callable[[Engine, Caches], tuple[Caches, str]]


def swap_kda(engine: Engine, caches: Caches) -> tuple[Caches, str]:
    first, second = kda_names(engine, caches)[0], kda_names(engine, caches)[5]
    return {**caches, first: caches[second], second: caches[first]}, first


def swap_attention(engine: Engine, caches: Caches) -> tuple[Caches, str]:
    first, second = attention_names(caches)[1], attention_names(caches)[2]
    return {**caches, first: caches[second], second: caches[first]}, first


def shift_plane(engine: Engine, caches: Caches) -> tuple[Caches, str]:
    name = attention_names(caches)[2]
    config = engine.kv_cache_configs[0]
    layer_stride = config.kv_cache_tensors[0].layer_stride
    return {**caches, name: shifted(caches[name], layer_stride)}, name


def shift_kda_plane(engine: Engine, caches: Caches) -> tuple[Caches, str]:
    name = kda_names(engine, caches)[4]
    layer_stride = engine.kv_cache_configs[0].kv_cache_tensors[0].layer_stride
    return {**caches, name: shifted(caches[name], layer_stride)}, name


def wrong_page(engine: Engine, caches: Caches) -> tuple[Caches, str]:
    name = kda_names(engine, caches)[2]
    view = caches[name]
    stride = (view.stride(0) + 4096, *view.stride()[1:])
    return {**caches, name: torch.as_strided(view, view.shape, stride, view.storage_offset())}, name


def short_state(engine: Engine, caches: Caches) -> tuple[Caches, str]:
    name = kda_names(engine, caches)[1]
    return {**caches, name: caches[name][..., :-64]}, name


def wrong_dtype(engine: Engine, caches: Caches) -> tuple[Caches, str]:
    name = kda_names(engine, caches)[6]
    return {**caches, name: caches[name].view(torch.uint8)}, name


def missing(engine: Engine, caches: Caches) -> tuple[Caches, str]:
    name = attention_names(caches)[0]
    return {key: value for key, value in caches.items() if key != name}, name


def extra(engine: Engine, caches: Caches) -> tuple[Caches, str]:
    name = "model.layers.999.self_attn"
    return {**caches, name: next(iter(caches.values()))}, name


CORRUPTIONS: dict[str, tuple[Corruption, str]] = {
    "two KDA layers swapped": (swap_kda, "aliasing"),
    "two attention layers swapped": (swap_attention, "aliasing"),
    "an attention layer on the next plane": (shift_plane, "aliasing"),
    "a KDA layer on the next plane": (shift_kda_plane, "aliasing"),
    "a wrong page size": (wrong_page, "tensor_mismatch"),
    "a state view short of the state": (short_state, "tensor_mismatch"),
    "a wrong dtype": (wrong_dtype, "tensor_mismatch"),
}


@pytest.mark.parametrize("case", CORRUPTED, ids=str)
@pytest.mark.parametrize("corruption", CORRUPTIONS, ids=str)
def test_each_corruption_blames_its_layer(corruption: str, case: Case, tmp_path: Path) -> None:
    engine = start(case, tmp_path)
    corrupt, code = CORRUPTIONS[corruption]
    caches, blamed = corrupt(engine, bind(engine))
    refused = refusal(engine, caches)
    assert refused.code == code
    assert refused.facts["layer_name"] == blamed
    assert blamed in str(refused)


@pytest.mark.parametrize("case", CORRUPTED, ids=str)
def test_a_missing_or_extra_layer_is_named(case: Case, tmp_path: Path) -> None:
    engine = start(case, tmp_path)
    caches = bind(engine)
    for corrupt, side in ((missing, "missing"), (extra, "extra")):
        changed, name = corrupt(engine, caches)
        refused = refusal(engine, changed)
        assert refused.code == "tensor_mismatch"
        assert refused.facts[side] == (name,)


def test_block_outermost_caches_against_a_layer_outermost_plan(tmp_path: Path) -> None:
    layer_outermost = start(Case(attn_tp=8, backend="TRITON_MLA"), tmp_path)
    block_outermost = start(BLOCK_OUTERMOST, tmp_path)
    caches = bind(block_outermost)
    config = layer_outermost.kv_cache_configs[0]
    assert config.num_blocks == block_outermost.kv_cache_configs[0].num_blocks
    with pytest.raises(Refusal) as refused:
        check_kv_caches(layer_outermost.workers[0], config, caches)
    assert refused.value.code == "tensor_mismatch"
    assert "block-outermost, BLHNC; the plan is LBNHC" in refused.value.message
    assert refused.value.facts["layer_name"] == next(iter(caches))


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    engine = start(LINEAR, tmp_path)
    caches = bind(engine)
    assert refusal(engine, [1, 2]).code == "invalid_argument"
    keyed: dict[object, torch.Tensor] = dict(caches.items())
    keyed[7] = caches[next(iter(caches))]
    assert refusal(engine, keyed).code == "tensor_mismatch"
    name = next(iter(caches))
    not_tensor = refusal(engine, {**caches, name: "a string"})
    assert not_tensor.code == "tensor_mismatch" and not_tensor.facts["layer_name"] == name


def test_a_pipeline_stage_is_checked_against_its_own_layers(tmp_path: Path) -> None:
    engine = start(Case(attn_tp=8, pp=2), tmp_path)
    first, second = bind(engine, 0), bind(engine, 1)
    check_kv_caches(engine.workers[1], engine.kv_cache_configs[1], second, 1)
    refused = refusal(engine, second, 0)  # stage 1's caches on a stage-0 rank
    assert refused.code == "tensor_mismatch" and refused.facts["missing"]
    extra = refused.facts["extra"]
    assert isinstance(extra, tuple) and set(extra) <= set(second) - set(first)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.kv_cache_layout == "LBNHC" and c.pp == 1], ids=str
)
def test_what_vllm_binds_goes_through_the_adapters_validate(case: Case, tmp_path: Path) -> None:
    """One adapter for both worlds: vLLM's own binding (meta) validates as allocate's does,
    under vLLM's names, with the ride's publish order taken on those names."""
    from k3layout.torch import allocate, validate  # noqa: PLC0415

    engine = start(case, tmp_path)
    result = plan_from_vllm(engine.workers[0])
    caches = bind(engine)
    live = validate(result, caches)
    n = engine.kv_cache_configs[0].num_blocks
    assert live.spec.num_blocks == n
    assert set(live.names.names) >= set(caches)
    own = allocate(result, n, device="meta").bound
    assert {k: (v.shape, v.stride(), v.dtype) for k, v in own.items()} == {
        k: (v.shape, v.stride(), v.dtype) for k, v in caches.items()
    }
    assert validate(result, own).published == live.published


def test_a_repeated_block_id_in_an_image_of_vllms_binding_is_refused(tmp_path: Path) -> None:
    from k3layout.torch import image_units, validate  # noqa: PLC0415

    engine = start(DSPARK, tmp_path)
    caches = bind(engine)
    live = validate(plan_from_vllm(engine.workers[0]), caches)
    assert image_units(live, caches, [3, 1, 0]).num_bytes > 0  # distinct blocks: a view
    with pytest.raises(Refusal) as refused:
        image_units(live, caches, [1, 1, 1])
    assert refused.value.code == "aliasing"
    assert refused.value.facts["block_id"] == 1


class OnDevice:
    """A bound tensor as another device would show it, with only the attributes
    ``check_kv_caches`` documents reading: its ``device`` is ``cuda:0`` and its storage sits
    at a GPU-like address. Any other attribute (a copy to the host, ``data_ptr``, ``numel``)
    raises ``AttributeError``, so a check that needed the tensor on this host would fail."""

    BASE = 0x7F3A_0000_0000  # where CUDA's allocator puts large blocks, far from host memory

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor
        self.device = torch.device("cuda", 0)
        self.dtype = tensor.dtype
        self.shape = tensor.shape

    def stride(self) -> tuple[int, ...]:
        return self._tensor.stride()

    def storage_offset(self) -> int:
        return int(self._tensor.storage_offset())

    def element_size(self) -> int:
        return self._tensor.element_size()

    def untyped_storage(self) -> OnDevice.Storage:
        return OnDevice.Storage(self._tensor.untyped_storage())

    class Storage:
        def __init__(self, storage: torch.UntypedStorage) -> None:
            self._storage = storage

        def data_ptr(self) -> int:
            return OnDevice.BASE + self._storage.data_ptr()

        def nbytes(self) -> int:
            return self._storage.nbytes()


@pytest.mark.parametrize("case", [DSPARK, BLOCK_OUTERMOST], ids=str)
def test_a_binding_on_another_device_is_read_by_attribute(case: Case, tmp_path: Path) -> None:
    """The check reads tensors by their attributes and addresses relative to the backing, so
    a binding on CUDA checks as it does here: it passes, and a corruption is still blamed on
    its layer (no GPU is lent to these tests; this pins the attributes the check may use)."""
    engine = start(case, tmp_path)
    caches = bind(engine)
    check_kv_caches(
        engine.workers[0],
        engine.kv_cache_configs[0],
        {name: OnDevice(view) for name, view in caches.items()},
    )
    swapped, blamed = swap_kda(engine, caches)
    refused = refusal(engine, {name: OnDevice(view) for name, view in swapped.items()})
    assert (refused.code, refused.facts["layer_name"]) == ("aliasing", blamed)


def replaned(engine: Engine, caches: Caches, moved_to: Callable[[int, int], int]) -> Caches:
    """Every view vLLM bound, its plane ``j`` moved to plane ``moved_to(j, planes)`` of the
    same backing (its shape, dtype and strides untouched)."""
    result = plan_from_vllm(engine.workers[0])
    num_blocks = engine.kv_cache_configs[0].num_blocks
    span = result.layer_stride_bytes(num_blocks)
    planes = result.stage(0).num_planes
    moved = {}
    for name, view in caches.items():
        start = view.storage_offset() * view.element_size()
        j = start // span
        moved[name] = shifted(view, (moved_to(j, planes) - j) * span)
    return moved


@pytest.mark.parametrize("case", [DSPARK, LINEAR], ids=str)
def test_planes_bound_in_another_order_are_named_as_an_order(case: Case, tmp_path: Path) -> None:
    """vLLM's own binding with its planes reversed, or rotated by one: each view keeps its
    shape, dtype and strides; the refusal names the planes' order (both releases)."""
    engine = start(case, tmp_path)
    caches = bind(engine)
    for moved_to in (lambda j, n: n - 1 - j, lambda j, n: (j + 1) % n):
        refused = refusal(engine, replaned(engine, caches, moved_to))
        assert refused.code == "aliasing"
        assert refused.facts["field"] == "plane_order", refused
        planes = len(refused.facts["expected"])  # type: ignore[arg-type]
        assert refused.facts["order"] == tuple(
            sorted(range(planes), key=lambda j, m=moved_to, n=planes: m(j, n))  # type: ignore[misc]
        )
        assert "the planes are published in another order" in str(refused)
