"""A hybrid model: its layers in module order, each MLA or KDA, and optional draft layers."""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal

from pydantic import Field, model_validator

from .._frozen import Frozen
from ..cache import DSAIndexer
from ..constants import MAX_MODULE_LAYERS, MAX_PROMPT_TOKENS
from ..errors import Refusal
from ..limits import check_bound
from .architecture import Architecture
from .layers import AnyLayer, KDALayer, Layer, MLALayer


class HybridModel(Frozen):
    """A hybrid decoder as the KV-cache planner sees it.

    ``layers`` are the target's layers in module order (module layer ``i`` is ``layers[i]``);
    ``draft_layers`` (a speculative draft such as K3's DSpark) are dense MLA layers that join the
    attention pool after the target, as module layers ``len(layers) ..``. ``model_type`` is the
    checkpoint's family (``kimi_k3``, ``kimi_linear``, ...); offload features gate on it.
    ``context_tokens`` is the checkpoint's ``max_position_embeddings`` (``None``: not said).
    ``drafter`` names how the draft speculates: ``dspark`` (a draft model of its own, any
    number of speculative tokens) or ``mtp`` (``num_nextn_predict_layers`` modules, which vLLM
    reuses for at most ``n`` or a multiple of ``n`` tokens); ``None``: not said.
    """

    name: Annotated[str, Field(min_length=1)] = Field(
        description="the model's name in plans and reports (a preset's, such as kimi-k3, or "
        "the checkpoint's)"
    )
    model_type: Annotated[str, Field(min_length=1)] = Field(
        description="the checkpoint's model family (kimi_k3, kimi_linear, ...); offload "
        "features gate on it"
    )
    layers: Annotated[
        tuple[Layer, ...],
        Field(
            min_length=1,
            max_length=MAX_MODULE_LAYERS,
            description="the target's layers in module order (module layer i is layers[i]), "
            "each MLA, GQA or KDA",
        ),
    ]
    draft_layers: tuple[Layer, ...] = Field(
        (),
        description="a speculative draft's attention layers (MLA or GQA), module layers "
        "len(layers) onwards; they join the attention pool",
    )
    drafter: Literal["dspark", "mtp"] | None = Field(
        None,
        description="how the draft speculates: dspark (a draft model of its own) or mtp "
        "(num_nextn_predict_layers modules); None: not said",
    )
    context_tokens: Annotated[int, Field(gt=0, le=MAX_PROMPT_TOKENS)] | None = Field(
        None,
        description="the checkpoint's max_position_embeddings, in tokens: an engine's default "
        "context length; None: not said",
    )
    """The checkpoint's longest context (``max_position_embeddings``), where it says; an
    engine's default context length (SGLang's ``context_len``)."""
    architecture: Architecture | None = Field(
        None,
        description="what the checkpoint's weights are (dimensions, dtype, quantization, vision "
        "tower); None: a model built by hand, whose weights are not known",
    )

    @model_validator(mode="after")
    def _needs_attention(self) -> HybridModel:
        check_bound(
            "layers + draft_layers",
            len(self.layers) + len(self.draft_layers),
            MAX_MODULE_LAYERS,
            why="module layers of target and draft",
        )
        if not any(layer.paging == "token" for layer in self.layers):
            raise Refusal(
                "invalid_argument",
                "layers: a hybrid model needs at least one attention layer to page "
                f"(got {len(self.layers)} state layers and no attention layer)",
                facts={"field": "layers", "state_layers": len(self.layers)},
                hint="give the model at least one attention (MLA or GQA) layer",
            )
        if self.drafter is not None and not self.draft_layers:
            raise Refusal(
                "invalid_argument",
                f"drafter={self.drafter!r} names a draft, but the model has no draft layers",
                facts={"field": "drafter", "drafter": self.drafter},
                hint="give the draft's layers, or leave drafter unset",
            )
        slots = [i for i, layer in enumerate(self.draft_layers) if layer.paging != "token"]
        if slots:
            raise Refusal(
                "invalid_argument",
                f"draft_layers: draft layers {slots} keep a state; a draft joins the attention "
                "pool, so its layers must be attention layers (mla or gqa)",
                facts={"field": "draft_layers", "state_layers": tuple(slots)},
                hint="give the draft MLA or GQA layers",
            )
        return self

    def without_draft(self) -> HybridModel:
        """The target alone (what an engine builds without speculative tokens): no draft
        layers, no drafter; ``self`` when there is no draft."""
        if not self.draft_layers:
            return self
        return HybridModel(
            name=self.name,
            model_type=self.model_type,
            layers=self.layers,
            context_tokens=self.context_tokens,
            architecture=self.architecture,
        )

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
    def indexer(self) -> DSAIndexer | None:
        """The pooled DSA indexer the MLA layers keep (the first one's; ``None`` without one):
        an indexed hybrid (GLM-5.3-Flash), whose engines lay out its key cache and tail ring
        (:mod:`k3layout.cache.pooled`, :mod:`k3layout.cache.ring`)."""
        return next((layer.indexer for layer in self.mla_layers if layer.indexer), None)

    @cached_property
    def kda_layers(self) -> tuple[KDALayer, ...]:
        """Every KDA layer, in module order."""
        return tuple(layer for layer in self.layers if isinstance(layer, KDALayer))

    @cached_property
    def distinct_layers(self) -> tuple[tuple[AnyLayer, ...], tuple[int, ...]]:
        """The distinct layer records in module order of first use, and for every module layer
        the index of its record among them (computed once per model): a layer's cache spec
        is built once per record, not once per layer."""
        index: dict[AnyLayer, int] = {}
        per_layer = tuple(index.setdefault(layer, len(index)) for layer in self.module_layers)
        return tuple(index), per_layer

    @cached_property
    def record_uses(self) -> tuple[tuple[tuple[int, bool], ...], tuple[int, ...]]:
        """The distinct ``(record, in the draft)`` pairs of the module layers in order of first
        use (a record of :attr:`distinct_layers`; whether the layer is a draft's, which may
        keep a cache dtype of its own), and for every module layer the index of its pair
        (computed once per model: a plan builds one cache spec per pair)."""
        _, per_layer = self.distinct_layers
        target = self.num_layers
        index: dict[tuple[int, bool], int] = {}
        uses = tuple(
            index.setdefault((record, layer_id >= target), len(index))
            for layer_id, record in enumerate(per_layer)
        )
        return tuple(index), uses

    @cached_property
    def layer_ids_by_record(self) -> tuple[tuple[int, ...], ...]:
        """For every distinct layer record (:attr:`distinct_layers`), the module ids of the
        layers that use it, in module order (computed once per model)."""
        records, per_layer = self.distinct_layers
        ids: list[list[int]] = [[] for _ in records]
        for layer_id, record in enumerate(per_layer):
            ids[record].append(layer_id)
        return tuple(tuple(group) for group in ids)

    @cached_property
    def head_counts(self) -> tuple[tuple[str, int], ...]:
        """The distinct ``(kind, num_heads)`` of the model's layers, sorted (``KDA`` before
        ``MLA``): what attention TP must divide (computed once per model)."""
        return tuple(
            sorted({(layer.kind.upper(), layer.num_heads) for layer in self.module_layers})
        )
