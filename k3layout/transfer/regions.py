"""The regions one rank holds for one request: PAGE regions (MLA latent rows) and SLOT regions
(the KDA state slot).

Regions are modelled abstractly, independent of any block table or slot index: a PAGE region
is the request's latent rows of one MLA layer, local row ``i`` at byte ``i * row_bytes`` (the
engine maps rows to its blocks); a SLOT region is one field of one KDA layer's state for the
request's slot. A rank holds regions only for the module layers of its pipeline stage, so a
region is named by ``(field, module layer)``, never by its position among a stage's layers.

Per rank, for ``tp`` attention TP ranks and ``s`` speculative tokens (K3: H 96, D 128, K 4)::

    field      global array (TP1)          placed by   bytes on a rank
    latent     (rows, bytes_per_token)     Replicate   rows x 576 (fp8); DCP: own rows
    conv       (3, H, D, K-1+s) ch.-major  Shard(1)    3*H*D/tp*(K-1+s)*2
               (3, K-1+s, H, D) time-major Shard(2)    (q, k, v back to back, as vLLM keeps them)
    recurrent  (H, D, D) fp32              Shard(0)    H/tp*D*D*4
    replay_k/u (L, H, D) bf16              Shard(1)    L*H/tp*D*2     (ReplaySSM)
    replay_g   (L, H, D) fp32              Shard(1)    L*H/tp*D*4     (ReplaySSM)
    cursor     (1,) int32, one per slot    Replicate   4              (ReplaySSM)
"""

from __future__ import annotations

from pydantic import NonNegativeInt

from .._frozen import Frozen
from ..deployment import Deployment
from ..dtypes import DTYPE_BYTES, DTypeName
from ..model import HybridModel
from ..placements import Interleave, Replicate, Shard
from ..sizes import ConvLayout, KdaStateSizes, RankSizes, ReplayRecordSizes
from .pairing import dcp_rank_of
from .segments import FieldLayout, RegionField, RegionKind, region_kind


class Region(Frozen):
    """One buffer of a rank's share of a request: ``field`` of module layer ``layer``
    (``None`` for the slot's cursor), ``size_bytes`` long."""

    field: RegionField
    layer: NonNegativeInt | None
    size_bytes: NonNegativeInt

    @property
    def kind(self) -> RegionKind:
        """``page`` (MLA latent rows) or ``slot`` (KDA state slot)."""
        return region_kind(self.field)

    @property
    def key(self) -> tuple[RegionField, int | None]:
        """``(field, layer)``: how segments name the region."""
        return (self.field, self.layer)


def kda_fields(
    kda: KdaStateSizes, replay: ReplayRecordSizes | None, conv_layout: ConvLayout
) -> tuple[FieldLayout, ...]:
    """The fields of one KDA layer's state slot as TP1 arrays with their TP placement:
    conv split per part (q|k|v) then by heads, recurrent by heads, and with ``replay`` the
    k/u/g records by heads (a head slice is strided per record row)."""
    heads, dim, rows = kda.num_heads, kda.head_dim, kda.conv_rows
    conv_elem = DTYPE_BYTES[kda.conv_dtype]
    conv = (
        FieldLayout(
            field="conv", shape=(3, heads, dim, rows), elem_bytes=conv_elem, tp=Shard(dim=1)
        )
        if conv_layout == "channel_major"
        else FieldLayout(
            field="conv", shape=(3, rows, heads, dim), elem_bytes=conv_elem, tp=Shard(dim=2)
        )
    )
    fields = [
        conv,
        FieldLayout(
            field="recurrent",
            shape=(heads, dim, dim),
            elem_bytes=DTYPE_BYTES[kda.recurrent_dtype],
            tp=Shard(dim=0),
        ),
    ]
    if replay is not None:
        shape = (replay.record_len, heads, replay.head_dim)
        records: tuple[tuple[RegionField, DTypeName], ...] = (
            ("replay_k", replay.k_dtype),
            ("replay_u", replay.u_dtype),
            ("replay_g", replay.g_dtype),
        )
        fields.extend(
            FieldLayout(field=field, shape=shape, elem_bytes=DTYPE_BYTES[dtype], tp=Shard(dim=1))
            for field, dtype in records
        )
    return tuple(fields)


def cursor_field(replay: ReplayRecordSizes) -> FieldLayout:
    """The slot's write cursor: one int32, replicated on every TP rank, written whole."""
    return FieldLayout(field="cursor", shape=(1,), elem_bytes=replay.cursor_bytes, tp=Replicate())


def dcp_placement(deployment: Deployment) -> Interleave:
    """How ``deployment`` deals tokens to DCP ranks (one rank holds all without DCP)."""
    return Interleave(num_ranks=deployment.dcp, interleave=deployment.dcp_interleave)


def latent_rows(deployment: Deployment, tp_rank: int, prompt_tokens: int) -> int:
    """Latent rows of a ``prompt_tokens`` request on ``tp_rank``: its DCP rank's tokens."""
    return dcp_placement(deployment).local_count(
        prompt_tokens, dcp_rank_of(tp_rank, deployment.dcp)
    )


def rank_regions(
    model: HybridModel,
    deployment: Deployment,
    sizes: RankSizes,
    *,
    layers: tuple[int, ...],
    tp_rank: int,
    prompt_tokens: int,
    conv_layout: ConvLayout = "channel_major",
) -> tuple[Region, ...]:
    """The regions of TP rank ``tp_rank`` of a stage holding module ``layers``, in module
    order, then the slot's cursor (ReplaySSM, when the stage holds a KDA layer)."""
    row_bytes = sizes.attention.bytes_per_token
    rows = latent_rows(deployment, tp_rank, prompt_tokens)
    fields = (
        ()
        if sizes.kda is None
        else kda_fields(sizes.kda, sizes.replay if deployment.replayssm else None, conv_layout)
    )
    tp = deployment.attn_tp
    regions: list[Region] = []
    for layer in layers:
        if model.module_layers[layer].kind == "mla":
            regions.append(Region(field="latent", layer=layer, size_bytes=rows * row_bytes))
            continue
        regions.extend(
            Region(field=f.field, layer=layer, size_bytes=f.local_bytes(tp, tp_rank))
            for f in fields
        )
    holds_state = any(model.module_layers[layer].kind == "kda" for layer in layers)
    if deployment.replayssm and sizes.replay is not None and holds_state:
        cursor = cursor_field(sizes.replay)
        regions.append(Region(field="cursor", layer=None, size_bytes=cursor.local_bytes(tp)))
    return tuple(regions)
