"""Every field of the public records says what it is: JSON schemas and IDE hovers are never bare."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from k3layout.cache.gqa import GQALayer
from k3layout.cache.kda import KDALayer
from k3layout.cache.mla import MLALayer
from k3layout.deployment import Deployment
from k3layout.engines.sglang.capacity import SglangCapacity, SglangStageCapacity
from k3layout.engines.tokenspeed.capacity import ParentCapacity
from k3layout.engines.vllm.capacity import GroupBlocks, VllmCapacity
from k3layout.model.spec import HybridModel
from k3layout.offload.ride import RideOptions

DESCRIBED: tuple[type[BaseModel], ...] = (
    Deployment,
    HybridModel,
    MLALayer,
    KDALayer,
    GQALayer,
    RideOptions,
    GroupBlocks,
    VllmCapacity,
    SglangCapacity,
    SglangStageCapacity,
    ParentCapacity,
)
"""The records whose every field (a base's included) carries a ``Field(description=...)``."""


@pytest.mark.parametrize("record", DESCRIBED, ids=lambda record: record.__name__)
def test_every_field_has_a_description(record: type[BaseModel]) -> None:
    assert record.model_fields, f"{record.__name__} has no fields"
    bare = [
        f"{record.__name__}.{name}"
        for name, field in record.model_fields.items()
        if not (field.description and field.description.strip())
    ]
    assert not bare, f"fields without a description: {', '.join(bare)}"


@pytest.mark.parametrize("record", DESCRIBED, ids=lambda record: record.__name__)
def test_the_json_schema_carries_the_descriptions(record: type[BaseModel]) -> None:
    properties = record.model_json_schema(mode="serialization")["properties"]
    for name, field in record.model_fields.items():
        key = field.serialization_alias or field.alias or name
        assert properties[key].get("description") == field.description, (
            f"{record.__name__}.{name}: its JSON schema property has no description"
        )
