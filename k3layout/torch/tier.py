"""A prefix on the tier: the packed KV pages of its blocks and the packed image of its boundary.

:func:`store_prefix` is what a rank offloads for a request whose first ``n`` tokens are
computed (``n`` a block multiple): the KV pages of the attention blocks covering them, on every
published plane, and the checkpoint image of the boundary ``n``. :func:`restore_prefix` puts
both into another request's blocks, possibly in another cache of the same plan, so that the
request resumes at token ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from .._args import expect, expect_args
from ..errors import Refusal
from ..offload import CheckpointImage, checkpoint_image
from ..offload.stage import ridable
from ._checks import expect_bytes, expect_registered
from .allocation import Registered
from .images import (
    _publish_order,
    boundary_blocks,
    image_units,
    kv_units,
    pack_units,
    restore_units,
)
from .live import LiveLayout
from .tables import BlockTables, boundary_row


@dataclass(frozen=True, eq=False)
class Tier:
    """What one rank stored for a prefix of ``computed_tokens``: ``kv`` (units = attention
    blocks, every published plane) and ``image`` (units = KDA groups, the image planes), both
    packed unit by unit, plane by plane, under ``layout``'s publish order."""

    layout: LiveLayout
    computed_tokens: int
    kv: torch.Tensor
    image: torch.Tensor

    def __post_init__(self) -> None:
        expect_args(
            ("layout", self.layout, LiveLayout), ("computed_tokens", self.computed_tokens, int)
        )
        rows = _kv_rows(self.layout, self.computed_tokens)
        spec = self.layout.spec
        expect_bytes("kv", self.kv, size=rows * len(self.layout.published) * spec.page_bytes)
        expect_bytes("image", self.image, size=self.geometry.image_bytes)

    @cached_property
    def geometry(self) -> CheckpointImage:
        """The image's geometry: units, planes and every KDA layer's state range (worked out
        once: a transfer reads it for every state region)."""
        return checkpoint_image(
            self.layout.plan, stage=self.layout.spec.stage, names=self.layout.names
        )

    @property
    def num_kv_blocks(self) -> int:
        """Attention blocks the KV holds."""
        return self.kv.numel() // (len(self.layout.published) * self.layout.spec.page_bytes)


def _kv_blocks(layout: LiveLayout, tables: BlockTables, computed_tokens: int) -> tuple[int, ...]:
    """The attention blocks that hold the prefix's tokens, in table order."""
    rows = _kv_rows(layout, computed_tokens)
    group = layout.plan.groups_of("attention", layout.spec.stage)[0].name
    return tuple(tables.block(group, row) for row in range(rows))


def _kv_rows(layout: LiveLayout, computed_tokens: int) -> int:
    """How many attention blocks hold the prefix's tokens: refuses a prefix off the block
    grid, a layout whose state cannot ride and a stage of other than one attention group."""
    plan = ridable(layout.plan)
    boundary_row(plan, computed_tokens)  # refuses a prefix off the block grid
    attention = plan.groups_of("attention", layout.spec.stage)
    if len(attention) != 1:
        raise Refusal(
            "invalid_argument",
            f"stage {layout.spec.stage} has {len(attention)} attention groups; a tier holds the "
            "KV of one",
            facts={"stage": layout.spec.stage, "num_attention_groups": len(attention)},
            hint="store prefixes of stages with one attention group",
        )
    _publish_order(layout)  # refuses a stage whose state cannot ride: no KV order
    return -(-computed_tokens // plan.span_tokens(attention[0]))


def store_prefix(
    layout: LiveLayout, registered: Registered, tables: BlockTables, computed_tokens: int
) -> Tier:
    """Pack the KV and the boundary image of a request's first ``computed_tokens`` tokens."""
    _check_args(layout, registered, tables)
    expect("computed_tokens", computed_tokens, int)
    kv = pack_units(kv_units(layout, registered, _kv_blocks(layout, tables, computed_tokens)))
    image = pack_units(
        image_units(layout, registered, boundary_blocks(layout, tables, computed_tokens))
    )
    return Tier(layout=layout, computed_tokens=computed_tokens, kv=kv, image=image)


def restore_prefix(
    tier: Tier, layout: LiveLayout, registered: Registered, tables: BlockTables
) -> None:
    """Write ``tier`` into the blocks ``tables`` gives a request on a validated layout of the
    same plan: KV into its attention blocks, the image into each KDA group's boundary row."""
    expect("tier", tier, Tier)
    _check_args(layout, registered, tables)
    if layout.plan != tier.layout.plan or layout.published != tier.layout.published:
        raise Refusal(
            "tensor_mismatch",
            "the tier was stored under another plan or publish order than the layout it is "
            "restored into",
            facts={
                "same_plan": layout.plan == tier.layout.plan,
                "same_publish_order": layout.published == tier.layout.published,
            },
            hint="restore on a layout of the same plan; across TP, move it by the transfer plan",
        )
    n = tier.computed_tokens
    restore_units(tier.kv, kv_units(layout, registered, _kv_blocks(layout, tables, n)))
    restore_units(tier.image, image_units(layout, registered, boundary_blocks(layout, tables, n)))


def _check_args(layout: object, registered: object, tables: object) -> None:
    """A validated layout, a registration and block tables: refused (``invalid_argument``)
    as anything else."""
    expect_args(("layout", layout, LiveLayout), ("tables", tables, BlockTables))
    expect_registered("registered", registered)
