"""A DSpark draft's ``config.json`` with fields left out reads as vLLM 0.33 reads it.

vLLM loads a draft model's config with ``get_config`` (``vllm/transformers_utils/config.py``),
which builds its ``K3DSparkConfig`` (``configs/k3_dspark.py``) for ``model_type: k3_dspark``;
that class is transformers' ``DeepseekV3Config``, so a field the file leaves out takes that
class's default. Each case below writes the fixture draft without some fields, runs vLLM's
loader on it, and compares what it reads with the draft layers ``load_config(draft=...)``
gives. The layer count and query heads are the exception, by choice: vLLM fills DeepSeek-V3's
61 layers of 128 heads, which no DSpark draft has, and the planner refuses instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from vllm_required import require_vllm

require_vllm()

from k3layout import Deployment, MLALayer, Refusal, load_config, plan  # noqa: E402
from k3layout.model.hf_config import DSPARK_DRAFT_DEFAULTS  # noqa: E402

FIXTURES = Path(__file__).parent.parent / "fixtures"
DRAFT = FIXTURES / "kimi-k3-dspark-draft" / "config.json"
TARGET = FIXTURES / "kimi-k3.config.json"
MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def draft_without(tmp_path: Path, *fields: str, **values: Any) -> Path:
    data = json.loads(DRAFT.read_text())
    for field in fields:
        del data[field]
    data.update(values)
    folder = tmp_path / "draft"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(data))
    return folder


def vllms_read(folder: Path) -> Any:
    """The draft's config as vLLM 0.33 loads it (the speculative config's draft model)."""
    from vllm.transformers_utils.config import get_config  # noqa: PLC0415

    return get_config(str(folder), trust_remote_code=False)


CASES = [(field,) for field in MLA_FIELDS] + [MLA_FIELDS]


@pytest.mark.parametrize("fields", CASES, ids=["+".join(c) for c in CASES])
def test_a_missing_mla_dimension_reads_as_vllms_draft_config_reads_it(
    tmp_path: Path, fields: tuple[str, ...]
) -> None:
    folder = draft_without(tmp_path, *fields)
    theirs = vllms_read(folder)
    assert type(theirs).__name__ == "K3DSparkConfig"
    ours = load_config(TARGET, draft=folder).draft_layers
    assert len(ours) == theirs.num_hidden_layers == 5
    for layer in ours:
        for field in MLA_FIELDS:
            assert getattr(layer, field) == getattr(theirs, field), field
        assert layer.num_heads == theirs.num_attention_heads == 64
    assert {field: getattr(theirs, field) for field in fields} == {
        field: DSPARK_DRAFT_DEFAULTS[field] for field in fields
    }


@pytest.mark.parametrize(
    ("field", "vllms_default"), [("num_hidden_layers", 61), ("num_attention_heads", 128)]
)
def test_a_draft_without_its_layers_or_heads_is_refused_not_read_as_deepseek_v3(
    tmp_path: Path, field: str, vllms_default: int
) -> None:
    folder = draft_without(tmp_path, field)
    assert getattr(vllms_read(folder), field) == vllms_default  # DeepSeek-V3's, not a draft's
    with pytest.raises(Refusal) as refused:
        load_config(TARGET, draft=folder)
    assert refused.value.code == "invalid_config"
    assert refused.value.facts["field"] == field


def test_a_null_q_lora_rank_is_refused_as_vllms_dspark_refuses_it(tmp_path: Path) -> None:
    folder = draft_without(tmp_path, q_lora_rank=None)
    with pytest.raises(ValueError, match="q_lora_rank=None"):
        vllms_read(folder)
    with pytest.raises(Refusal) as refused:
        load_config(TARGET, draft=folder)
    assert (refused.value.code, refused.value.facts["field"]) == (
        "draft_unsupported",
        "q_lora_rank",
    )


def test_the_full_draft_reads_the_same_with_and_without_defaults(tmp_path: Path) -> None:
    theirs = vllms_read(DRAFT.parent)
    full = load_config(TARGET, draft=DRAFT)
    assert full == load_config(TARGET, draft=draft_without(tmp_path, *MLA_FIELDS))
    layer = full.draft_layers[0]
    assert isinstance(layer, MLALayer)
    assert layer.kv_lora_rank + layer.qk_rope_head_dim == (
        theirs.kv_lora_rank + theirs.qk_rope_head_dim
    )


# Kimi-Linear with MTP: which step of the installed release refuses it, and k3layout's reason.
MTP_REFUSALS = {
    "0.33.0": (NotImplementedError, "Unsupported speculative method", "NotImplementedError"),
    "0.34.0": (ValueError, "Duplicate layer name", "duplicate layer name"),
}


def test_kimi_linear_mtp_is_refused_as_the_installed_release_refuses_it(tmp_path: Path) -> None:
    from vllm_required import running  # noqa: PLC0415
    from vllm_weights import vllm_weights  # noqa: PLC0415

    release = running()
    error, engines_words, our_words = MTP_REFUSALS[release]
    linear = FIXTURES / "kimi-linear-48b-a3b.config.json"
    # 0.33 at its speculative config; 0.34 when its proposer loads the draft
    with pytest.raises(error, match=engines_words):
        vllm_weights(linear, draft="mtp", mtp_modules=1, spec_tokens=1)
    data = json.loads(linear.read_text())
    (tmp_path / "config.json").write_text(json.dumps({**data, "num_nextn_predict_layers": 1}))
    model = load_config(tmp_path / "config.json")
    with pytest.raises(Refusal) as caught:
        plan(model, Deployment(engine_version=release, spec_tokens=1))
    assert caught.value.code == "draft_unsupported" and our_words in caught.value.message
