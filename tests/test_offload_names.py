"""The naming rule of each engine: the names its layers register under (vLLM 0.33's are
checked against the names vLLM binds in tests/conformance/test_conformance_caches.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3layout import HybridModel, Refusal, engine_layer_names, naming_rule, preset
from k3layout.engines.tokenspeed.releases import REVISIONS
from k3layout.offload import NAMING_RULES, name_order

FIXTURES = Path(__file__).parent / "fixtures"


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
    assert refused.value.facts["engines"] == ("atom", "tokenspeed", "vllm")
    with pytest.raises(Refusal):
        naming_rule(preset("kimi-k3"), 3)  # type: ignore[arg-type]


def test_tokenspeed_names_each_layer_by_its_global_id_the_draft_continuing_the_target() -> None:
    # tokenspeed's cache plan ids a layer's fields layer.{id}.<field>; a draft's layer i is
    # global layer num_target_layers + i (93 + i for K3's 93 target layers)
    k3 = engine_layer_names(preset("kimi-k3"), "tokenspeed")
    assert k3.names == tuple(f"layer.{i}" for i in range(93))
    dspark = engine_layer_names(preset("kimi-k3-dspark"), "tokenspeed")
    assert dspark.names[:93] == k3.names
    assert dspark.names[93:] == ("layer.93", "layer.94", "layer.95", "layer.96", "layer.97")
    assert (dspark.name(3), dspark.layer_of("layer.97")) == ("layer.3", 97)
    rule = naming_rule(preset("kimi-k3-dspark"), "tokenspeed")
    assert all(REVISIONS[r].commit[:8] in rule.source for r in ("main", "pr1152"))
    assert "kimi_k3.py" in rule.source
    # ATOM's names stay the default (the adapter's registered dict)
    assert engine_layer_names(preset("kimi-k3")).name(3) == "model.layers.3.self_attn.attn"


@pytest.mark.parametrize("recording", ["tokenspeed-main", "tokenspeed-1152"])
def test_tokenspeeds_own_field_ids_are_its_layer_names_and_its_fields(recording: str) -> None:
    """Every field id tokenspeed's recipe gave (run at the revision, recorded in bind.json),
    target and draft layers alike, is the layer's name and the field's."""
    fields = {"latent_kv": "attention", "conv_state": "kda", "recurrent_state": "kda"}
    cells = json.loads((FIXTURES / recording / "bind.json").read_text())["cells"]
    seen: set[tuple[str, int]] = set()
    for cell in cells:
        model = preset(cell["model"])
        names = engine_layer_names(model, "tokenspeed")
        for address in cell.get("addresses", ()):  # none where tokenspeed refused the cell
            layer_name, _, field = address["field_id"].rpartition(".")
            layer = names.layer_of(layer_name)
            draft = layer >= model.num_layers  # the draft's layers are MLA
            kind = "attention" if draft or layer in model.attention_layer_ids else "kda"
            assert fields[field] == kind, address["field_id"]
            seen.add((cell["model"], layer))
    # the recording holds target KDA and MLA layers and a draft layer (K3 + DSpark's last)
    assert {("kimi-k3-dspark", 97), ("kimi-k3", 0), ("kimi-k3", 3)} <= seen
