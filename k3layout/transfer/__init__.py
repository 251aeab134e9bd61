"""Prefill-to-decode transfer: which producer rank copies which bytes to which consumer rank.

:func:`plan_transfer` turns a prefill deployment (PP x TP) and a decode deployment (TP x DCP)
of one model into a :class:`TransferPlan` for one request: PAGE regions (MLA latent rows) go
to the DCP rank that owns each token, SLOT regions (KDA state, ReplaySSM records) to each
consumer's TP share, placed by module layer. :func:`check_pairing` and :func:`check_admission`
are the checks an engine runs on a proposed pairing and on each request.
"""

from .admission import admission_refusal, check_admission
from .checks import transfer_violations
from .pairing import (
    check_pairing,
    dcp_rank_of,
    head_group,
    paired_producer,
    pairing_refusal,
    tp_multiple_refusal,
)
from .plan import (
    MATCHED_FIELDS,
    RankPair,
    TransferPlan,
    check_matching_deployments,
    check_same_model,
    plan_transfer,
)
from .regions import Region, rank_regions, slot_parts
from .report import RankPairReport, TransferReport, transfer_report
from .segments import (
    RegionField,
    RegionKey,
    RegionKind,
    Segment,
    part_segment,
    token_segments,
)

__all__ = [
    "MATCHED_FIELDS",
    "RankPair",
    "RankPairReport",
    "Region",
    "RegionField",
    "RegionKey",
    "RegionKind",
    "Segment",
    "TransferPlan",
    "TransferReport",
    "admission_refusal",
    "check_admission",
    "check_matching_deployments",
    "check_pairing",
    "check_same_model",
    "dcp_rank_of",
    "head_group",
    "paired_producer",
    "pairing_refusal",
    "part_segment",
    "plan_transfer",
    "rank_regions",
    "slot_parts",
    "token_segments",
    "tp_multiple_refusal",
    "transfer_report",
    "transfer_violations",
]
