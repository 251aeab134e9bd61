"""``k3layout.engines.vllm`` without vLLM: it reads vLLM's objects by their attributes, so
stand-ins with those attributes plan and check the same (``tests/conformance`` runs it on
vLLM's own objects)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from k3layout import Deployment, Refusal, plan_vllm, preset
from k3layout.engines.vllm import check_kv_cache_config, layer_of, plan_from_vllm
from k3layout.engines.vllm.bridge import worker_stage

K3_CONFIG = json.loads((Path(__file__).parent / "fixtures" / "kimi-k3.config.json").read_text())


class HFConfig:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        return self.data


def vllm_config(tp: int = 8, spec: int = 0, **cache: Any) -> SimpleNamespace:
    speculative = None
    if spec:
        draft = SimpleNamespace(hf_text_config=SimpleNamespace(num_hidden_layers=5))
        speculative = SimpleNamespace(
            method="dspark", num_speculative_tokens=spec, draft_model_config=draft
        )
    # every field vLLM 0.33's records have (the bridge refuses a record without one)
    parallel = SimpleNamespace(
        tensor_parallel_size=tp,
        data_parallel_size=1,
        pipeline_parallel_size=1,
        decode_context_parallel_size=1,
        cp_kv_cache_interleave_size=1,
    )
    caching = {
        "cache_dtype": "fp8",
        "enable_prefix_caching": True,
        "block_size": 16,
        "user_specified_block_size": False,
        "kv_cache_layout": None,
        **cache,
    }
    return SimpleNamespace(
        model_config=SimpleNamespace(hf_config=HFConfig(K3_CONFIG), model="kimi-k3"),
        parallel_config=parallel,
        cache_config=SimpleNamespace(**caching),
        speculative_config=speculative,
        attention_config=SimpleNamespace(backend=None),
        additional_config={},
    )


def kv_cache_config(tp: int = 8, num_blocks: int = 10) -> SimpleNamespace:
    """vLLM's LBNHC config of K3 at ``tp``, written out from its documented meaning."""
    p = plan_vllm(preset("kimi-k3"), Deployment(attn_tp=tp))
    name = "language_model.model.layers.{}.self_attn".format
    groups = [SimpleNamespace(layer_names=[name(i) for i in g.layers]) for g in p.groups]
    tensors = [
        SimpleNamespace(
            size=p.blocks_bytes(num_blocks),
            layers=[name(i) for i in g.layers],
            offset=0,
            layer_stride=num_blocks * p.page_bytes,
            block_stride=p.page_bytes,
        )
        for g in p.groups
    ]
    return SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=groups, kv_cache_tensors=tensors)


def test_plan_from_vllm_reads_the_flags_vllm_holds() -> None:
    p = plan_from_vllm(vllm_config(tp=8, spec=2))
    assert (p.block_tokens, p.page_bytes, p.num_planes) == (1536, 884_736, 29)
    assert p.deployment.spec_tokens == 2 and p.deployment.attn_tp == 8
    assert plan_from_vllm(vllm_config(tp=8)).num_planes == 24
    requested = plan_from_vllm(vllm_config(block_size=2048, user_specified_block_size=True))
    assert requested.block_tokens == 2048


def test_a_kv_cache_config_as_vllm_writes_it_passes() -> None:
    assert check_kv_cache_config(vllm_config(), kv_cache_config()).num_planes == 24


def test_a_swapped_layer_and_a_shifted_plane_are_refused_naming_them() -> None:
    config = kv_cache_config()
    names = config.kv_cache_groups[0].layer_names
    names[0], names[1] = names[1], names[0]
    with pytest.raises(Refusal) as refused:
        check_kv_cache_config(vllm_config(), config)
    assert refused.value.code == "plan_mismatch"
    facts = refused.value.facts
    assert (facts["check"], facts["field"], facts["group"]) == (
        "check_kv_cache_config",
        "groups",
        "linear_attention_0",
    )
    assert "group 0 layers" in str(refused.value)

    config = kv_cache_config()
    config.kv_cache_tensors[1].offset = config.kv_cache_tensors[1].block_stride
    with pytest.raises(Refusal) as refused:
        check_kv_cache_config(vllm_config(), config)
    assert refused.value.facts["layer"] == 1
    assert (refused.value.facts["field"], refused.value.facts["block"]) == ("offset_bytes", 0)


@pytest.mark.parametrize(
    "path",
    [
        "parallel_config",
        "parallel_config.tensor_parallel_size",
        "parallel_config.data_parallel_size",
        "parallel_config.pipeline_parallel_size",
        "parallel_config.decode_context_parallel_size",
        "cache_config",
        "cache_config.cache_dtype",
        "cache_config.enable_prefix_caching",
        "cache_config.user_specified_block_size",
        "attention_config",
        "speculative_config",
        "model_config.hf_config",
    ],
)
def test_a_record_without_a_field_vllm_always_has_is_refused_naming_it(path: str) -> None:
    config = vllm_config(tp=8)
    *parents, last = path.split(".")
    holder = config
    for step in parents:
        holder = getattr(holder, step)
    delattr(holder, last)
    with pytest.raises(Refusal) as refused:
        plan_from_vllm(config)
    assert refused.value.code == "invalid_config"
    assert path in str(refused.value) and refused.value.facts["field"] == path


def test_a_missing_parallel_config_is_not_read_as_tp_1() -> None:
    config = vllm_config(tp=8)
    config.parallel_config.tensor_parallel_size = None
    with pytest.raises(Refusal) as refused:
        plan_from_vllm(config)
    assert refused.value.facts["field"] == "parallel_config.tensor_parallel_size"
    del config.parallel_config
    with pytest.raises(Refusal):
        worker_stage(config)


def test_bad_configs_and_names_are_refused() -> None:
    with pytest.raises(Refusal) as refused:
        plan_from_vllm(SimpleNamespace())
    assert refused.value.code == "invalid_config"
    with pytest.raises(Refusal) as refused:
        layer_of("lm_head")
    assert refused.value.code == "layer_names"
    assert layer_of("model.layers.93.self_attn") == 93


def test_wrong_types_in_vllms_records_are_refused_naming_the_field() -> None:
    config = kv_cache_config()
    config.num_blocks = "10"
    with pytest.raises(Refusal) as refused:
        check_kv_cache_config(vllm_config(), config)
    assert refused.value.code == "invalid_argument"
    assert refused.value.facts["field"] == "kv_cache_config.num_blocks"
    with pytest.raises(Refusal):
        layer_of(7)  # type: ignore[arg-type]
