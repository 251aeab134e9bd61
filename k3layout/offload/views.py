"""Tensor views: a layer's cache as an engine reads it off the tensor it registered.

The engine side of the ride works on addresses: for every layer, where its cache starts, the
bytes from one block to the next and the bytes it spans. :func:`vllm_views` builds the views
vLLM's hybrid layout gives every layer (plane ``j`` shared by layer ``j`` of every group), for
tests and for the torch adapter to compare against what it finds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import NonNegativeInt

from .._args import expect_args, expect_bounded_int, expect_items
from .._frozen import Frozen
from ..constants import INT64_MAX, MAX_RANKS
from ..errors import CheckName, Refusal, check_refusal
from ..layouts import EngineLayout, LayoutBase
from ..names import LayerNames, engine_layer_names
from .stage import page_bytes, ridable


class TensorView(Frozen):
    """A layer's cache as an engine reads it off its registered tensor: where it starts, the
    bytes from one block to the next, and the bytes it spans."""

    base_address: NonNegativeInt
    block_stride_bytes: int
    num_bytes: NonNegativeInt

    @property
    def end_address(self) -> int:
        """One past the last byte of the view."""
        return self.base_address + self.num_bytes


def vllm_views(
    plan: EngineLayout,
    plane_bases: Sequence[int],
    num_blocks: int,
    *,
    stage: int = 0,
    names: LayerNames | None = None,
) -> dict[str, TensorView]:
    """The views vLLM's layout gives every layer of a stage, from the base address of each of
    its planes (tensor ``j`` shared by layer ``j`` of every group; ``num_blocks`` pages each).

    >>> from k3layout import Deployment, plan, preset
    >>> p = plan(preset("kimi-k3"), Deployment(attn_tp=8, spec_tokens=2))
    >>> views = vllm_views(p, [j << 32 for j in range(p.num_planes)], num_blocks=4)
    >>> views["model.layers.4.self_attn"] == views["model.layers.7.self_attn.attn"]  # plane 1
    True
    """
    expect_args(
        ("plan", plan, (LayoutBase,)),
        ("names", names, (LayerNames, type(None))),
    )
    expect_bounded_int("stage", stage, MAX_RANKS)
    expect_bounded_int("num_blocks", num_blocks, INT64_MAX)
    expect_items("plane_bases", plane_bases, int)
    plan = ridable(plan)
    names = names or engine_layer_names(plan.model)
    names.check_covers(plan.model)
    on_stage = plan.stage(stage)
    if len(plane_bases) != on_stage.num_planes or num_blocks < 1 or any(b < 0 for b in plane_bases):
        raise Refusal(
            "invalid_argument",
            f"stage {stage} has {on_stage.num_planes} planes: give one base address >= 0 per "
            f"plane and num_blocks >= 1 (got {len(plane_bases)} bases, num_blocks={num_blocks})",
            facts={
                "stage": stage,
                "num_planes": on_stage.num_planes,
                "num_bases": len(plane_bases),
                "num_blocks": num_blocks,
            },
            hint=f"pass {on_stage.num_planes} base addresses",
        )
    size = num_blocks * page_bytes(plan)
    return {
        names.name(layer): TensorView(
            base_address=plane_bases[j], block_stride_bytes=page_bytes(plan), num_bytes=size
        )
        for group in on_stage.groups
        for j, layer in enumerate(group.layers)
    }


def views_of(
    views: Mapping[str, TensorView], wanted: Sequence[str], stage: int, check: CheckName
) -> tuple[TensorView, ...]:
    """The views of ``wanted`` layers, refusing (``layer_names``) the ones not given, with
    the facts of ``check``."""
    missing = tuple(name for name in wanted if name not in views)
    if missing:
        raise check_refusal(
            "layer_names",
            f"stage {stage}: no tensor view for {len(missing)} layers ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''})",
            check=check,
            field="names",
            stage=stage,
            expected=tuple(wanted),
            actual=tuple(name for name in wanted if name in views),
            layer_name=missing[0],
            missing=missing,
            hint="pass a view for every attention and KDA layer of the stage, by engine name",
        )
    return tuple(views[name] for name in wanted)
