"""A hybrid model: its layers in module order, each MLA or KDA, and optional draft layers."""

from __future__ import annotations

from functools import cached_property
from typing import Annotated

from pydantic import Field, model_validator

from .._frozen import Frozen
from .layers import AnyLayer, KDALayer, Layer, MLALayer


class HybridModel(Frozen):
    """A hybrid decoder as the KV-cache planner sees it.

    ``layers`` are the target's layers in module order (module layer ``i`` is ``layers[i]``);
    ``draft_layers`` (a speculative draft such as K3's DSpark) are dense MLA layers that join the
    attention pool after the target, as module layers ``len(layers) ..``. ``model_type`` is the
    checkpoint's family (``kimi_k3``, ``kimi_linear``, ...); offload features gate on it.
    """

    name: Annotated[str, Field(min_length=1)]
    model_type: Annotated[str, Field(min_length=1)]
    layers: Annotated[tuple[Layer, ...], Field(min_length=1)]
    draft_layers: tuple[Layer, ...] = ()

    @model_validator(mode="after")
    def _needs_attention(self) -> HybridModel:
        if not any(layer.paging == "token" for layer in self.layers):
            raise ValueError(
                "layers: a hybrid model needs at least one attention layer to page "
                f"(got {len(self.layers)} state layers and no attention layer)"
            )
        slots = [i for i, layer in enumerate(self.draft_layers) if layer.paging != "token"]
        if slots:
            raise ValueError(
                f"draft_layers: draft layers {slots} keep a state; a draft joins the attention "
                "pool, so its layers must be attention layers (mla or gqa)"
            )
        return self

    @property
    def num_layers(self) -> int:
        """Target layers (``num_hidden_layers``), draft excluded."""
        return len(self.layers)

    @cached_property
    def module_layers(self) -> tuple[AnyLayer, ...]:
        """Target then draft layers: module layer id ``i`` is ``module_layers[i]``."""
        return (*self.layers, *self.draft_layers)

    @cached_property
    def attention_layer_ids(self) -> tuple[int, ...]:
        """Module ids of every attention (token-paged) layer, target in module order then
        draft."""
        return tuple(i for i, layer in enumerate(self.module_layers) if layer.paging == "token")

    @cached_property
    def kda_layer_ids(self) -> tuple[int, ...]:
        """Module ids of every state (KDA) layer, in module order."""
        return tuple(i for i, layer in enumerate(self.layers) if layer.paging == "slot")

    @cached_property
    def draft_layer_ids(self) -> tuple[int, ...]:
        """Module ids of the draft layers (after the target's)."""
        return tuple(range(self.num_layers, self.num_layers + len(self.draft_layers)))

    @cached_property
    def mla_layers(self) -> tuple[MLALayer, ...]:
        """Every MLA layer, target then draft."""
        return tuple(layer for layer in self.module_layers if isinstance(layer, MLALayer))

    @cached_property
    def kda_layers(self) -> tuple[KDALayer, ...]:
        """Every KDA layer, in module order."""
        return tuple(layer for layer in self.layers if isinstance(layer, KDALayer))

    @cached_property
    def head_counts(self) -> tuple[tuple[str, int], ...]:
        """The distinct ``(kind, num_heads)`` of the model's layers, sorted (``KDA`` before
        ``MLA``): what attention TP must divide (computed once per model)."""
        return tuple(
            sorted({(layer.kind.upper(), layer.num_heads) for layer in self.module_layers})
        )
