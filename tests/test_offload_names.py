"""The naming rule of each engine: the names its layers register under (vLLM 0.33's are
checked against the names vLLM binds in tests/conformance/test_conformance_caches.py)."""

from __future__ import annotations

import pytest

from k3layout import HybridModel, Refusal, engine_layer_names, naming_rule, preset
from k3layout.offload import NAMING_RULES, name_order


def test_vllm_names_kimi_k3_under_its_multimodal_wrapper_and_the_draft_without_it() -> None:
    model = preset("kimi-k3-dspark")
    names = engine_layer_names(model, "vllm")
    assert names.name(0) == "language_model.model.layers.0.self_attn"  # KDA
    assert names.name(3) == "language_model.model.layers.3.self_attn"  # MLA, the same form
    assert names.name(model.num_layers) == f"model.layers.{model.num_layers}.self_attn"
    assert len(names.names) == len(model.module_layers)
    # the draft sorts after the target in vLLM's names, before it in ATOM's
    assert name_order(names.names)[-1].startswith("model.layers.")
    atom = engine_layer_names(model, "atom")
    assert name_order(atom.names)[0] == "draft.layers.0.self_attn.attn"


def test_vllm_names_kimi_linear_without_a_prefix() -> None:
    names = engine_layer_names(preset("kimi-linear-48b"), "vllm")
    assert names.names[:2] == ("model.layers.0.self_attn", "model.layers.1.self_attn")


def test_atom_is_the_default_rule() -> None:
    model = preset("kimi-k3")
    assert engine_layer_names(model) == engine_layer_names(model, "atom")
    assert engine_layer_names(model).name(3) == "model.layers.3.self_attn.attn"


def test_every_rule_names_each_layer_once() -> None:
    model: HybridModel = preset("kimi-k3-dspark")
    for rule in NAMING_RULES:
        if rule.model_types and model.model_type not in rule.model_types:
            continue
        names = engine_layer_names(model, rule.engine)
        assert len(set(names.names)) == len(model.module_layers)
        assert naming_rule(model, rule.engine).source


def test_an_engine_without_a_rule_is_refused() -> None:
    with pytest.raises(Refusal) as refused:
        engine_layer_names(preset("kimi-k3"), "sglang")
    assert refused.value.code == "invalid_argument"
    assert refused.value.facts["engines"] == ("atom", "vllm")
    with pytest.raises(Refusal):
        naming_rule(preset("kimi-k3"), 3)  # type: ignore[arg-type]
