"""Models: the presets agree with the Hugging Face configs; malformed configs name the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from k3layout import HybridModel, KDALayer, MLALayer, Refusal, load_config, model_from_config
from k3layout import preset as get_preset

FIXTURES = Path(__file__).parent / "fixtures"


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


@pytest.mark.parametrize(
    ("fixture", "preset"),
    [("kimi-k3.config.json", "kimi-k3"), ("kimi-linear-48b-a3b.config.json", "kimi-linear-48b")],
)
def test_presets_equal_their_hugging_face_configs(fixture: str, preset: str) -> None:
    loaded = load_config(FIXTURES / fixture, name=preset)
    assert loaded == get_preset(preset)


def test_k3_layers_are_24_mla_every_fourth_and_the_last(k3: HybridModel) -> None:
    assert k3.num_layers == 93
    assert k3.attention_layer_ids == (*range(3, 92, 4), 92)
    assert len(k3.attention_layer_ids) == 24 and len(k3.kda_layer_ids) == 69
    assert k3.model_type == "kimi_k3"


def test_kimi_linear_has_7_mla_and_20_kda(kimi_linear: HybridModel) -> None:
    assert kimi_linear.attention_layer_ids == (3, 7, 11, 15, 19, 23, 26)
    assert len(kimi_linear.kda_layer_ids) == 20


def test_dspark_adds_five_mla_layers_after_the_target(k3_dspark: HybridModel) -> None:
    assert k3_dspark.draft_layer_ids == (93, 94, 95, 96, 97)
    assert k3_dspark.attention_layer_ids[-5:] == (93, 94, 95, 96, 97)
    assert all(
        isinstance(layer, MLALayer) and layer.latent_dim == 576 for layer in k3_dspark.draft_layers
    )


def test_config_draft_layers_join_a_loaded_model() -> None:
    # the draft's own config.json gives its layers and heads: K3's DSpark preset
    model = load_config(
        FIXTURES / "kimi-k3.config.json",
        name="kimi-k3-dspark",
        draft=FIXTURES / "kimi-k3-dspark-draft",
    )
    assert model == get_preset("kimi-k3-dspark")
    assert {layer.num_heads for layer in model.draft_layers} == {64}
    # a bare count copies the target's MLA layer (96 heads)
    counted = load_config(FIXTURES / "kimi-k3.config.json", num_draft_layers=5)
    assert counted.draft_layers == (counted.mla_layers[0],) * 5
    with pytest.raises(Refusal) as caught:
        load_config(
            FIXTURES / "kimi-k3.config.json",
            num_draft_layers=4,
            draft=FIXTURES / "kimi-k3-dspark-draft",
        )
    assert caught.value.facts["field"] == "num_draft_layers"
    with pytest.raises(Refusal) as caught:
        load_config(
            FIXTURES / "kimi-k3.config.json", draft=FIXTURES / "kimi-linear-48b-a3b.config.json"
        )
    assert caught.value.code == "draft_unsupported"


def test_text_config_nesting_and_flat_configs_load_alike() -> None:
    nested = config("kimi-k3.config.json")
    flat = {**nested["text_config"], "model_type": "kimi_k3"}
    assert model_from_config(flat, name="k") == model_from_config(nested, name="k")


def test_a_config_without_linear_attention_is_pure_mla_with_dsa_and_mtp() -> None:
    deepseek = {
        "model_type": "deepseek_v32",
        "num_hidden_layers": 4,
        "num_attention_heads": 128,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "q_lora_rank": 1536,
        "index_head_dim": 128,
        "num_nextn_predict_layers": 1,
    }
    model = model_from_config(deepseek)
    assert not model.kda_layer_ids
    assert model.attention_layer_ids == (0, 1, 2, 3, 4)
    assert all(layer.index_bytes_per_token == 132 for layer in model.mla_layers)


def _broken(mutate: Any) -> dict[str, Any]:
    data = copy.deepcopy(config("kimi-k3.config.json"))
    mutate(data["text_config"])
    return data


CASES = [
    (
        "overlapping lists",
        lambda t: t["linear_attn_config"]["kda_layers"].append(4),
        "text_config.linear_attn_config",
        "overlap at layers [4]",
    ),
    (
        "missing layer",
        lambda t: t["linear_attn_config"]["kda_layers"].remove(1),
        "text_config.linear_attn_config",
        "layers [1] are in neither",
    ),
    (
        "0-based list",
        lambda t: t["linear_attn_config"]["kda_layers"].append(0),
        "text_config.linear_attn_config",
        "kda_layers: layers [0] are outside 1..num_hidden_layers=93",
    ),
    (
        "non-positive heads",
        lambda t: t["linear_attn_config"].update(num_heads=0),
        "text_config.linear_attn_config.num_heads",
        "greater than 0",
    ),
    (
        "negative latent",
        lambda t: t.update(kv_lora_rank=-512),
        "text_config.kv_lora_rank",
        "greater than 0",
    ),
    (
        "heads not divisible",
        lambda t: t.update(num_key_value_heads=7),
        "text_config.num_key_value_heads",
        "num_attention_heads=96 must be divisible by num_key_value_heads=7",
    ),
    (
        "unknown dtype",
        lambda t: t.update(torch_dtype="float7"),
        "text_config.torch_dtype",
        "float7",
    ),
    (
        "missing field",
        lambda t: t.pop("qk_rope_head_dim"),
        "text_config.qk_rope_head_dim",
        "Field required",
    ),
    (
        "string dims",
        lambda t: t["linear_attn_config"].update(head_dim="wide"),
        "text_config.linear_attn_config.head_dim",
        "integer",
    ),
]


@pytest.mark.parametrize(("case", "mutate", "field", "words"), CASES, ids=[c[0] for c in CASES])
def test_malformed_configs_are_refused_naming_the_field(
    case: str, mutate: Any, field: str, words: str
) -> None:
    with pytest.raises(Refusal) as refused:
        model_from_config(_broken(mutate))
    assert refused.value.code == "invalid_config"
    assert str(refused.value.facts["field"]).startswith(field.split(".", maxsplit=1)[0])
    assert field in str(refused.value)
    assert words in str(refused.value)


def test_unreadable_and_non_object_files_are_refused(tmp_path: Path) -> None:
    for text in ("{not json", "[1, 2]"):
        path = tmp_path / "config.json"
        path.write_text(text)
        with pytest.raises(Refusal) as refused:
            load_config(tmp_path)
        assert refused.value.code == "invalid_config"
    with pytest.raises(Refusal) as refused:
        load_config(tmp_path / "missing.json")
    assert refused.value.code == "invalid_config"


def test_an_all_kda_config_is_refused() -> None:
    def all_kda(t: dict[str, Any]) -> None:
        t["linear_attn_config"]["kda_layers"] = list(range(1, 94))
        t["linear_attn_config"].pop("full_attn_layers")

    with pytest.raises(Refusal) as refused:
        model_from_config(_broken(all_kda))
    assert refused.value.code == "invalid_config"


def test_unknown_preset_names_the_presets() -> None:
    with pytest.raises(Refusal) as refused:
        get_preset("kimi-k4")
    assert refused.value.code == "unknown_model"
    assert "kimi-k3" in refused.value.facts["presets"]  # type: ignore[operator]


def test_models_are_frozen_and_validated() -> None:
    mla = MLALayer(num_heads=8)
    with pytest.raises(Refusal):
        MLALayer(num_heads=0)
    with pytest.raises(Refusal):
        KDALayer(num_heads=8, head_dim=64, conv_kernel=1)
    with pytest.raises(Refusal, match="at least one attention layer"):
        HybridModel(name="x", model_type="x", layers=(KDALayer(num_heads=8, head_dim=64),))
    with pytest.raises(Refusal):
        mla.num_heads = 4  # type: ignore[misc]


def test_a_model_round_trips_through_json(k3_dspark: HybridModel) -> None:
    assert HybridModel.model_validate_json(k3_dspark.model_dump_json()) == k3_dspark
    assert hash(HybridModel.model_validate_json(k3_dspark.model_dump_json())) == hash(k3_dspark)


def test_a_model_of_another_family_is_refused_by_its_model_type() -> None:
    llama = {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
    }
    with pytest.raises(Refusal) as caught:
        model_from_config(llama)
    assert caught.value.code == "invalid_config"
    assert "model_type llama is not a hybrid MLA + KDA model" in str(caught.value)
    assert caught.value.facts["field"] == "model_type"
    nested = {"model_type": "llava", "text_config": llama}
    with pytest.raises(Refusal) as caught:
        model_from_config(nested)
    assert "model_type llama is not a hybrid MLA + KDA model" in str(caught.value)


def _glm() -> dict[str, Any]:
    config: dict[str, Any] = json.loads((FIXTURES / "glm-5.3-flash" / "config.json").read_text())
    return config


@pytest.mark.parametrize("form", ["nested", "flat", "full_attention"])
def test_a_layer_types_hybrid_loads_in_every_form(form: str) -> None:
    """GLM-5.3-Flash (``glm5_next``) nested, flat (transformers' text-only form) or with
    ``full_attention`` for ``indexed_attention`` loads as the preset (NoPE MLA layers with a
    pooled indexer, ``qk_rope_head_dim`` 0)."""
    config = _glm()
    if form == "flat":  # transformers' text-only form
        config = {**config["text_config"], "model_type": "glm5_next"}
    if form == "full_attention":  # read as indexed_attention, as transformers does
        text = config["text_config"]
        text["layer_types"] = [
            "full_attention" if kind == "indexed_attention" else kind
            for kind in text["layer_types"]
        ]
    model = model_from_config(config)
    assert model.layers == get_preset("glm-5.3-flash").layers
    assert model.model_type == "glm5_next"


def test_a_layer_types_model_without_hybrid_kinds_is_not_refused_for_them() -> None:
    """Only linear_attention / indexed_attention layers mark the indexed family: a Kimi config
    that also lists ``layer_types`` of another vocabulary is planned as before."""
    config = json.loads((FIXTURES / "kimi-linear-48b-a3b.config.json").read_text())
    config["layer_types"] = ["sliding_attention"] * 2
    assert (
        model_from_config(config).layers
        == model_from_config(
            json.loads((FIXTURES / "kimi-linear-48b-a3b.config.json").read_text())
        ).layers
    )
