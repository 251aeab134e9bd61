"""Per-rank sizes of a model's layers under one deployment, derived from their cache specs.

Each layer kind describes its cache once (:mod:`k3layout.cache`); this module builds the
specs of a model's layers for a deployment and answers the per-rank numbers every layout is
built from. KDA keeps a per-request state, head-sharded by attention TP::

    S(tp, s) = (3*H*D/tp) * (K-1+s) * 2   +   (H/tp) * D * D * 4
               conv q|k|v, bf16, K-1+s rows     recurrent state, fp32

K3 (H = 96, D = 128, K = 4) at tp 8, s 2: 46,080 + 786,432 = 832,512 bytes.
"""

from __future__ import annotations

import math
from functools import cached_property, reduce

from pydantic import NonNegativeInt, PositiveInt

from ._args import expect_args, expect_int
from ._divisors import nearest_divisors
from ._frozen import Frozen, trusted
from .cache import LayerCacheSpec, cursor_spec
from .constants import PARENT_PAGE_TOKENS
from .deployment import Deployment
from .errors import Refusal
from .model import HybridModel


class RankSizes(Frozen):
    """The cache specs of a model's layers under one deployment, and their per-rank bytes.

    ``specs`` holds each distinct spec once, in module order of first use; module layer ``i``
    uses ``specs[layer_specs[i]]``. ``attention`` is the target's first attention spec (the
    one vLLM raises its block for), ``state`` the state layers' spec, ``replay`` the ReplaySSM
    records beside each state slot (``None`` when not kept), ``ring`` the tail ring beside
    each page of a pooled indexer's layer (``None`` without one: :mod:`k3layout.cache.ring`).
    """

    attn_tp: PositiveInt
    specs: tuple[LayerCacheSpec, ...]
    layer_specs: tuple[NonNegativeInt, ...]
    replay: LayerCacheSpec | None = None
    ring: LayerCacheSpec | None = None

    def spec_of(self, layer: int) -> LayerCacheSpec:
        """The cache spec of module layer ``layer``."""
        if not 0 <= expect_int("layer", layer) < len(self.layer_specs):
            raise Refusal(
                "invalid_argument",
                f"layer={layer} is not a module layer (the model has {len(self.layer_specs)})",
                facts={"layer": layer, "num_layers": len(self.layer_specs)},
                hint=f"use 0 <= layer < {len(self.layer_specs)}",
            )
        return self.specs[self.layer_specs[layer]]

    @cached_property
    def attention(self) -> LayerCacheSpec:
        """The target's first attention (token-paged) spec."""
        return next(spec for spec in self.specs if spec.paging == "token")

    @cached_property
    def state(self) -> LayerCacheSpec | None:
        """The state layers' spec (``None`` for a model without state layers)."""
        return next((spec for spec in self.specs if spec.paging == "slot"), None)

    @property
    def cursor(self) -> LayerCacheSpec | None:
        """The slot's ReplaySSM write cursor, when records are kept."""
        return None if self.replay is None else cursor_spec()

    @cached_property
    def attention_bytes_per_token(self) -> int:
        """Movable bytes per token of the target's attention layer (576 for K3 fp8; a DSA
        index row is a part of its layer)."""
        return self.attention.bytes_per_token(self.attn_tp)

    def attention_page_bytes(self, tokens: int = PARENT_PAGE_TOKENS) -> int:
        """Bytes of one attention page of ``tokens`` tokens (73,728 for K3 fp8, 128 tokens)."""
        return self.attention.payload_bytes(self.attn_tp, tokens)

    @cached_property
    def state_bytes(self) -> int:
        """``S(tp, s)`` per state layer per rank; 0 for a model without state layers."""
        return 0 if self.state is None else self.state.payload_bytes(self.attn_tp)

    @property
    def kda_state_bytes(self) -> int:
        """The same as :attr:`state_bytes` (K3's state layers are KDA)."""
        return self.state_bytes


def check_uniform_layers(model: HybridModel, specs: tuple[LayerCacheSpec, ...]) -> None:
    """One cache spec per layer kind; refuses (``mixed_layer_specs``) a model that mixes them.

    The engines group layers by identical specs; a model mixing geometries of one kind needs
    one bucket per geometry, which neither layout here plans.
    """
    kinds: dict[str, int] = {}
    for spec in specs:
        kinds[spec.kind] = kinds.get(spec.kind, 0) + 1
    for kind, count in kinds.items():
        if count > 1:
            raise Refusal(
                "mixed_layer_specs",
                f"model {model.name}: {kind.upper()} layers have {count} cache geometries; "
                "one per kind is planned",
                facts={"model": model.name, "kind": kind.upper(), "geometries": count},
                hint=f"give every {kind.upper()} layer the same cache dimensions",
            )


def check_heads(model: HybridModel, attn_tp: int) -> None:
    """Refuse (``heads_not_divisible``) an attention TP that does not divide every head count.

    KDA heads are sharded by attention TP, and so are MLA query heads; the hint names the
    nearest attention TP sizes that divide them all.
    """
    counts = model.head_counts
    for kind, heads in counts:
        if heads % attn_tp:
            common = reduce(math.gcd, (h for _, h in counts))
            below, above = nearest_divisors(common, attn_tp)
            nearest = " or ".join(f"attn_tp={d}" for d in (below, above) if d is not None)
            raise Refusal(
                "heads_not_divisible",
                f"{kind} num_heads={heads} must be divisible by attn_tp={attn_tp}",
                facts={"kind": kind, "num_heads": heads, "attn_tp": attn_tp},
                hint=f"{nearest} would divide the heads",
            )


def rank_sizes(model: HybridModel, deployment: Deployment) -> RankSizes:
    """Per-rank sizes of ``model``'s layers under ``deployment`` (refuses what cannot shard)."""
    expect_args(("model", model, HybridModel), ("deployment", deployment, Deployment))
    check_heads(model, deployment.attn_tp)
    records, _ = model.distinct_layers
    pairs, per_layer = model.record_uses
    # A draft's attention cache may keep a dtype of its own (tokenspeed #1152 keeps bf16).
    draft = deployment
    if model.draft_layers and deployment.draft_cache_dtype != deployment.kv_dtype:
        draft = deployment.model_copy(update={"kv_dtype": deployment.draft_cache_dtype})
    specs: list[LayerCacheSpec] = []
    spec_of_pair: list[int] = []
    sides: dict[str, LayerCacheSpec] = {}  # one side spec per kind (replay, tail)
    for index, in_draft in pairs:  # one spec per (record, draft or not), not one per layer
        record = records[index]
        spec = record.cache_spec(draft if in_draft else deployment)
        for side in record.side_specs(deployment):
            sides.setdefault(side.kind, side)
        if spec not in specs:
            specs.append(spec)
        spec_of_pair.append(specs.index(spec))
    layer_specs = tuple(map(spec_of_pair.__getitem__, per_layer))
    target = {spec_of_pair[i] for i, (_, in_draft) in enumerate(pairs) if not in_draft}
    check_uniform_layers(model, tuple(specs[i] for i in sorted(target)))
    check_uniform_layers(model, tuple(specs[i] for i in sorted(set(spec_of_pair) - target)))
    # Specs built by the layer kinds from validated records: nothing to re-validate.
    sizes = trusted(
        RankSizes,
        attn_tp=deployment.attn_tp,
        specs=tuple(specs),
        layer_specs=layer_specs,
        replay=sides.get("replay"),
        ring=sides.get("tail"),
    )
    for spec in specs:  # every part splits evenly (KV heads, records) or is refused here
        for part in spec.parts:
            part.local_shape(deployment.attn_tp)
    return sizes
