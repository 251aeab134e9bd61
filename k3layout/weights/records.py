"""The records of a rank's weights: tensors, the groups they repeat in, a rank, a plan."""

from __future__ import annotations

from collections.abc import Iterable
from math import prod
from typing import Annotated, Final, Literal, TypeAlias

from pydantic import Field, NonNegativeInt

from .._frozen import Frozen

WeightDtype: TypeAlias = Literal[
    "bfloat16", "float16", "float32", "float8_e4m3fn", "uint8", "int8", "int32", "int64"
]
"""Element dtypes of weight tensors, spelled as torch spells them (4-bit formats are packed
into ``uint8`` or ``int32`` elements, their scales into ``float8_e4m3fn`` or ``uint8``)."""

WEIGHT_DTYPE_BYTES: Final[dict[WeightDtype, int]] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "uint8": 1,
    "int8": 1,
    "int32": 4,
    "int64": 8,
}

WeightKind: TypeAlias = Literal[
    "embedding",
    "lm_head",
    "norm",
    "mla",
    "indexer",
    "kda",
    "hyper_connections",
    "dense_mlp",
    "moe_router",
    "shared_experts",
    "routed_experts",
    "attention_residual",
    "vision",
    "draft",
    "mtp",
]
"""What a group of tensors is, in the engines' words (``mla`` and ``kda``: one attention
layer's projections and state parameters; ``routed_experts``: one MoE layer's experts)."""


class WeightTensor(Frozen):
    """One tensor as one rank holds it: the engine's parameter (or GPU buffer) name within
    its module, the rank's shape and the dtype."""

    name: Annotated[str, Field(min_length=1)] = Field(description="the engine's name")
    shape: tuple[NonNegativeInt, ...] = Field(description="the rank's shape")
    dtype: WeightDtype = Field(description="element dtype")

    @property
    def nbytes(self) -> int:
        """``prod(shape) x`` the dtype's bytes."""
        return prod(self.shape) * WEIGHT_DTYPE_BYTES[self.dtype]


class WeightGroup(Frozen):
    """The tensors one module kind holds, repeated on ``layers`` (module layer ids; empty: a
    module held once, such as the embedding)."""

    kind: WeightKind = Field(description="the module kind")
    layers: tuple[NonNegativeInt, ...] = Field(
        (), description="module layers the tensors repeat on (empty: held once)"
    )
    tensors: tuple[WeightTensor, ...] = Field(description="one instance's tensors")

    @property
    def instance_bytes(self) -> int:
        """Bytes of one instance (one layer's)."""
        return sum(tensor.nbytes for tensor in self.tensors)

    @property
    def nbytes(self) -> int:
        """Bytes of every instance."""
        return max(1, len(self.layers)) * self.instance_bytes


class RankWeights(Frozen):
    """The weights one rank of pipeline stage ``stage`` holds (the heaviest rank of the stage,
    where experts do not split evenly), as engine ``engine`` lays them out."""

    engine: str = Field(description="the engine that lays them out")
    stage: NonNegativeInt = Field(description="the pipeline stage")
    groups: tuple[WeightGroup, ...] = Field(description="the target's groups")
    draft_groups: tuple[WeightGroup, ...] = Field(
        (), description="the draft's own groups (what it shares with the target is not here)"
    )

    @property
    def target_bytes(self) -> int:
        """The target's weights."""
        return sum(group.nbytes for group in self.groups)

    @property
    def draft_bytes(self) -> int:
        """The draft's own weights."""
        return sum(group.nbytes for group in self.draft_groups)

    @property
    def total_bytes(self) -> int:
        """Target and draft."""
        return self.target_bytes + self.draft_bytes

    def bytes_by_kind(self) -> dict[str, int]:
        """Bytes per module kind (target and draft together), in first-seen order."""
        found: dict[str, int] = {}
        for group in (*self.groups, *self.draft_groups):
            found[group.kind] = found.get(group.kind, 0) + group.nbytes
        return found


class WeightsPlan(Frozen):
    """Every pipeline stage's :class:`RankWeights` of a deployment."""

    stages: tuple[RankWeights, ...] = Field(min_length=1, description="stage by stage")

    @property
    def max_bytes(self) -> int:
        """The most any rank holds: what must fit on every GPU."""
        return max(stage.total_bytes for stage in self.stages)


Entry: TypeAlias = tuple[str, int | None, tuple[WeightTensor, ...]]
"""One module's tensors as an engine's rule lists them: its kind, its module layer (``None``:
held once) and its tensors."""


def grouped(entries: Iterable[Entry]) -> tuple[WeightGroup, ...]:
    """``entries`` of the same kind and tensors merged into one group over their layers, in
    order of first appearance (a module held once stays a group of its own)."""
    found: dict[tuple[str, bool, tuple[WeightTensor, ...]], list[int]] = {}
    for kind, layer, tensors in entries:
        layers = found.setdefault((kind, layer is None, tensors), [])
        if layer is not None:
            layers.append(layer)
    return tuple(
        WeightGroup.model_validate({"kind": kind, "layers": tuple(layers), "tensors": tensors})
        for (kind, _, tensors), layers in found.items()
    )
