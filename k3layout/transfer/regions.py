"""The regions one rank holds for one request: PAGE regions (attention rows) and SLOT regions
(the state slot), one per part of each layer's cache spec.

Regions are modelled abstractly, independent of any block table or slot index: a PAGE region
is the request's rows of one part of an attention layer, local row ``i`` at byte
``i * row_bytes`` (the engine maps rows to its blocks); a SLOT region is one part of one state
layer's slot for the request. A rank holds regions only for the module layers of its pipeline
stage, so a region is named by ``(part, module layer)``, never by its position among a
stage's layers. Every size comes from the layer's :class:`~k3layout.LayerCacheSpec`.

Per rank, for ``tp`` attention TP ranks and ``s`` speculative tokens (K3: H 96, D 128, K 4)::

    part       TP1 array (SD)             placed by   bytes on a rank
    latent     (rows, 576)                Replicate   rows x 576 (fp8); DCP: own rows
    conv       (K-1+s, 3, H, D) bf16      Shard(2)    3*H/tp*D*(K-1+s)*2  (ONE tensor)
    recurrent  (H, D, D) fp32             Shard(0)    H/tp*D*D*4
    replay_k/u (L, H, D) bf16             Shard(1)    L*H/tp*D*2     (ReplaySSM)
    replay_g   (L, H, D) fp32             Shard(1)    L*H/tp*D*4     (ReplaySSM)
    cursor     (1,) int32, one per slot   Replicate   4              (ReplaySSM)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from pydantic import NonNegativeInt

from .._args import expect, expect_args, expect_int, expect_non_negative, expect_sequence
from .._frozen import Frozen
from .._validation import describe
from ..cache import CachePart
from ..constants import MAX_PROMPT_TOKENS
from ..deployment import Deployment
from ..errors import Refusal
from ..limits import check_bound
from ..sizes import RankSizes
from .pairing import dcp_rank_of
from .segments import RegionField, RegionKey, RegionKind


class Region(Frozen):
    """One buffer of a rank's share of a request: part ``field`` of module layer ``layer``
    (``None`` for the slot's cursor), ``size_bytes`` long."""

    field: RegionField
    layer: NonNegativeInt | None
    kind: RegionKind
    size_bytes: NonNegativeInt

    @property
    def key(self) -> RegionKey:
        """``(field, layer)``: how segments name the region."""
        return (self.field, self.layer)


def slot_parts(sizes: RankSizes, layer: int) -> tuple[CachePart, ...]:
    """The parts of a state layer's slot: its spec's, then ReplaySSM's records when kept.
    Refuses (``invalid_argument``) a ``sizes`` that is not a :class:`~k3layout.RankSizes`, a
    ``layer`` that is not one of its module layers or not a state layer."""
    expect("sizes", sizes, RankSizes)
    spec = sizes.spec_of(layer)  # refuses a layer that is not a module layer
    if spec.paging != "slot":
        raise Refusal(
            "invalid_argument",
            f"layer={layer} is a {spec.kind} layer, which keeps no state slot",
            facts={"field": "layer", "layer": layer, "kind": spec.kind},
            hint="pass a state (KDA) layer",
        )
    return layer_slot_parts(sizes, layer)


def layer_slot_parts(sizes: RankSizes, layer: int) -> tuple[CachePart, ...]:
    """:func:`slot_parts` of a state layer known to be one (the planner's own)."""
    parts = sizes.spec_of(layer).parts
    return parts if sizes.replay is None else (*parts, *sizes.replay.parts)


def latent_rows(deployment: Deployment, tp_rank: int, prompt_tokens: int) -> int:
    """Attention rows of a ``prompt_tokens`` request on ``tp_rank``: its DCP rank's tokens."""
    return deployment.dcp_placement.local_count(prompt_tokens, dcp_rank_of(tp_rank, deployment.dcp))


def rank_regions(
    deployment: Deployment,
    sizes: RankSizes,
    *,
    layers: tuple[int, ...],
    tp_rank: int,
    prompt_tokens: int,
    rings: bool = False,
) -> tuple[Region, ...]:
    """The regions of TP rank ``tp_rank`` of a stage holding module ``layers``, in module
    order, then the slot's cursor (ReplaySSM, when the stage holds a state layer). A pooled
    part holds a row per ``tokens_per_row`` tokens (the last one partly filled); with
    ``rings`` (an engine that keeps an indexed layer's tail ring, :mod:`k3layout.cache.ring`)
    an indexed layer also holds its ring, a slot region per part. Refuses
    (``invalid_argument``) arguments of the wrong type, a ``tp_rank`` outside ``attn_tp``, a
    layer ``sizes`` does not have and a negative ``prompt_tokens``; (``size_limit``) more than
    ``MAX_PROMPT_TOKENS``."""
    expect_args(("deployment", deployment, Deployment), ("sizes", sizes, RankSizes))
    layers = tuple(cast(Sequence[int], expect_sequence("layers", layers, int)))
    if not 0 <= expect_int("tp_rank", tp_rank) < deployment.attn_tp:
        raise Refusal(
            "invalid_argument",
            f"tp_rank={describe(tp_rank)} is not a rank of attn_tp={deployment.attn_tp}",
            facts={"field": "tp_rank", "attn_tp": deployment.attn_tp},
            hint=f"use 0 <= tp_rank < {deployment.attn_tp}",
        )
    expect_non_negative(
        "prompt_tokens", prompt_tokens, "pass the request's number of prompt tokens"
    )
    check_bound("prompt_tokens", prompt_tokens, MAX_PROMPT_TOKENS, why="a request's tokens")
    tp = deployment.attn_tp
    rows = latent_rows(deployment, tp_rank, prompt_tokens)
    regions: list[Region] = []
    holds_state = False
    for layer in layers:
        spec = sizes.spec_of(layer)
        if spec.paging == "token":
            regions.extend(
                Region(
                    field=p.name,
                    layer=layer,
                    kind="page",
                    size_bytes=-(-rows // p.tokens_per_row) * p.local_bytes(tp),
                )
                for p in spec.parts
            )
            if rings and spec.pooled and sizes.ring is not None:
                regions.extend(
                    Region(field=p.name, layer=layer, kind="slot", size_bytes=p.local_bytes(tp))
                    for p in sizes.ring.parts
                )
            continue
        holds_state = True
        regions.extend(
            Region(field=p.name, layer=layer, kind="slot", size_bytes=p.local_bytes(tp))
            for p in layer_slot_parts(sizes, layer)
        )
    cursor = sizes.cursor
    if cursor is not None and holds_state:
        part = cursor.parts[0]
        regions.append(
            Region(field=part.name, layer=None, kind="slot", size_bytes=part.local_bytes(tp))
        )
    return tuple(regions)
