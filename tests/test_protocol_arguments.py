"""The engine-layout protocol and the cache specs refuse bad arguments: a wrong type, an index
that is not there, a channel group that does not exist. Only ``Refusal`` leaves them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from k3layout import (
    Deployment,
    ParentPlan,
    Refusal,
    ReplicaShard,
    VllmPlan,
    conv_channel_offset,
    plan_parent,
    plan_vllm,
    preset,
)

VLLM: VllmPlan = plan_vllm(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2))
PARENT: ParentPlan = plan_parent(preset("kimi-k3"), Deployment(attn_tp=8))
KDA = VLLM.sizes.spec_of(0)

BAD_CALLS: dict[str, Callable[[], object]] = {
    "an unknown conv channel group": lambda: conv_channel_offset(KDA, "x", 8),
    "a conv offset of no spec": lambda: conv_channel_offset(None, "k", 8),  # type: ignore[arg-type]
    "an MLA spec's conv offset": lambda: conv_channel_offset(VLLM.sizes.attention, "k", 8),
    "a local offset of an int": lambda: KDA.part("conv").local_offset(5, 8),  # type: ignore[arg-type]
    "a local offset of strings": lambda: KDA.part("conv").local_offset(("a", 0, 0, 0), 8),  # type: ignore[arg-type]
    "a local offset outside the shape": lambda: KDA.part("conv").local_offset((9, 0, 0, 0), 8),
    "a spec of a string layer": lambda: VLLM.sizes.spec_of("x"),  # type: ignore[arg-type]
    "a spec of a layer past the model": lambda: VLLM.sizes.spec_of(98),
    "a string stage": lambda: VLLM.stage("x"),  # type: ignore[arg-type]
    "groups of a string stage": lambda: VLLM.groups_of("kda", "y"),  # type: ignore[arg-type]
    "the payload of no group": lambda: VLLM.payload_bytes(None),  # type: ignore[arg-type]
    "a parent payload of no group": lambda: PARENT.payload_bytes(None),  # type: ignore[arg-type]
    "parent pages of no group": lambda: PARENT.pages_needed(None, 5),  # type: ignore[arg-type]
    "page axes of no group": lambda: PARENT.page_axes(None, 3),  # type: ignore[arg-type]
    "blocks in a string budget": lambda: VLLM.blocks_in("x"),  # type: ignore[arg-type]
    "parents in a string budget": lambda: PARENT.blocks_in("x"),  # type: ignore[arg-type]
    "bytes of a string block count": lambda: VLLM.blocks_bytes("x"),  # type: ignore[arg-type]
    "a plane of a string block count": lambda: PARENT.plane_span_bytes("x"),  # type: ignore[arg-type]
    "a string block's byte range": lambda: PARENT.byte_range(40, "conv", "x", 3),  # type: ignore[arg-type]
    "a block past the allocation": lambda: VLLM.byte_range(40, "conv", 3, 3),
    "a part the layer does not have": lambda: VLLM.byte_range(40, "latent", 0, 3),
    "a layer the stage does not hold": lambda: VLLM.byte_range(98, "conv", 0, 3),
    "a string layer's ranges": lambda: VLLM.part_range_list("x"),  # type: ignore[arg-type]
    "a caption of a string plane count": lambda: VLLM.block_caption("x"),  # type: ignore[arg-type]
    "a replica shard of a string extent": lambda: ReplicaShard().local_size_and_offset("a", 2, 0),  # type: ignore[arg-type]
    "KV heads neither dividing nor divided": lambda: ReplicaShard().local_size_and_offset(3, 2, 0),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_a_bad_argument_is_a_named_refusal(name: str) -> None:
    with pytest.raises(Refusal) as refused:
        BAD_CALLS[name]()
    assert refused.value.code in {"invalid_argument", "uneven_split"}
