"""The ride planner: LMCache MP offload with the KDA state riding the PAGE object.

LMCache stores and loads KV in *chunks* of ``chunk_tokens``. With the state riding, a chunk
boundary is also a state checkpoint, so the chunk must end where every group's block ends:
it must be a multiple of every group's span (attention ``block x dcp``, KDA ``block``), so of
their least common multiple. K3 + DSpark, TP 8, fp8, 2 spec tokens: block 1,536, so 1,536 is
the smallest chunk; with DCP 8 the attention span is 12,288 and so is the smallest chunk.

A prefix hit of ``n`` tokens is capped to the grid, ``(n // chunk) * chunk``. Restoring the
state for ``n`` computed tokens writes row ``(n - 1) // block`` of every KDA group (in
``align`` mode row ``p`` holds the state after exactly ``(p + 1) * block`` tokens); off the
grid there is nothing to restore.

Startup refusals: a ``mamba_cache_mode`` other than ``align``, prefix caching off, a
``kv_load_failure_policy`` other than ``recompute``, a chunk off the grid, and a model other
than Kimi-K3 (gated on ``model_type``: Qwen's GDN layers report the same mamba layer type).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property
from typing import Annotated, Final, Literal, TypeAlias

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from .._args import expect, expect_args, expect_bounded_int, expect_int, expect_items
from .._derivation import SelfChecked, check_derivation, deriving, is_deriving
from .._frozen import Frozen, trusted
from .._validation import describe
from ..constants import MAX_LISTED_ITEMS, MAX_PROMPT_TOKENS, MAX_RANKS
from ..errors import Refusal
from ..layouts import EngineLayout, GroupKind, LayoutBase, Plan
from ..limits import check_int64
from ..model import HybridModel
from ..names import LayerNames, engine_layer_names
from ..settings import MambaCacheMode
from .image import CheckpointImage, image_of_order
from .plane_order import PlaneOrder, plane_order
from .stage import ridable

KvLoadFailurePolicy: TypeAlias = Literal["recompute", "fail"]
"""vLLM's ``kv_transfer_config.kv_load_failure_policy`` (its default is ``fail``)."""

RIDABLE_MODEL_TYPE: Final = "kimi_k3"
"""The one model family whose state is known to ride (seed 000 gates on the K3 layout)."""


class RideOptions(Frozen):
    """The engine settings the ride depends on. ``chunk_tokens=None`` takes the smallest valid
    chunk; the other defaults are the settings the ride needs (vLLM's own defaults differ:
    ``mamba_cache_mode`` follows prefix caching and ``kv_load_failure_policy`` is ``fail``)."""

    chunk_tokens: Annotated[int, Field(gt=0, le=MAX_PROMPT_TOKENS)] | None = Field(
        None,
        description="LMCache chunk in tokens, a multiple of every group's span (attention "
        "block x dcp, KDA block); None: the smallest such chunk",
    )
    mamba_cache_mode: MambaCacheMode = Field(
        "align", description="vLLM's --mamba-cache-mode; the state rides only in align mode"
    )
    prefix_caching: bool = Field(
        True, description="vLLM's --enable-prefix-caching; the ride needs it on"
    )
    kv_load_failure_policy: KvLoadFailurePolicy = Field(
        "recompute",
        description="vLLM's kv_transfer_config.kv_load_failure_policy; the ride needs "
        "recompute (vLLM's default is fail)",
    )


class GroupSpan(Frozen):
    """Tokens one block of a group covers: attention ``block x dcp``, KDA ``block``."""

    group: str
    kind: GroupKind
    span_tokens: PositiveInt


class LoadDestination(Frozen):
    """Where the state for ``computed_tokens`` tokens lands: row ``row`` of every KDA group."""

    computed_tokens: PositiveInt
    row: NonNegativeInt
    groups: tuple[str, ...]


class RidePlan(SelfChecked):
    """The ride of one rank of pipeline stage ``stage``: build it with :func:`plan_ride`.

    ``published`` is the order the engine would publish its attention layers in; ``order``
    moves the aliased ones first and ``image`` is the checkpoint image of one boundary.

    A ride built by hand (or loaded, or ``model_copy``'d) is re-planned with :func:`plan_ride`
    from its own plan, options, stage, names and publish order, so it refuses what
    :func:`plan_ride` refuses (``mamba_cache_mode="none"``, a chunk off the grid, ..) and a
    stored field the ride would not give (``plan_mismatch``).
    """

    plan: Plan
    stage: NonNegativeInt
    options: RideOptions
    names: LayerNames
    published: tuple[str, ...]

    @model_validator(mode="after")
    def _is_its_own_derivation(self) -> RidePlan:
        # Built outside plan_ride: check the ride's rules by planning it again, then compare.
        if not is_deriving():
            derived = plan_ride(
                self.plan,
                self.options,
                stage=self.stage,
                published=self.published,
                names=self.names,
            )
            check_derivation(
                f"ride plan of {self.plan.model.name} stage {self.stage}",
                self,
                derived,
                hint="build the ride with k3layout.plan_ride",
            )
        return self

    @cached_property
    def order(self) -> PlaneOrder:
        """The PAGE plane order: aliased attention layers first."""
        return plane_order(self.plan, self.published, stage=self.stage, names=self.names)

    @cached_property
    def image(self) -> CheckpointImage:
        """The checkpoint image of one boundary on this rank."""
        return image_of_order(self.plan, self.order, self.stage)

    @property
    def block_tokens(self) -> int:
        """Tokens of one block on a rank (one state checkpoint in ``align`` mode): the span
        of a state group's block."""
        return self.plan.state_span_tokens

    @property
    def spans(self) -> tuple[GroupSpan, ...]:
        """The span of every group of the stage that holds layers."""
        return tuple(
            trusted(
                GroupSpan,
                group=group.name,
                kind=group.kind,
                span_tokens=self.plan.span_tokens(group),
            )
            for group in self.plan.stage(self.stage).groups
            if group.layers
        )

    @property
    def grid_tokens(self) -> int:
        """The smallest valid chunk: the lcm of every group's span."""
        groups = self.plan.stage(self.stage).groups
        return math.lcm(*{self.plan.span_tokens(group) for group in groups if group.layers})

    @property
    def chunk_tokens(self) -> int:
        """The LMCache chunk: the one asked for, else the smallest valid one."""
        return self.options.chunk_tokens or self.grid_tokens

    def capped_hit(self, hit_tokens: int) -> int:
        """A prefix hit capped to the chunk grid: ``(hit // chunk) * chunk`` (0 if none)."""
        _check_tokens("hit_tokens", hit_tokens)
        return hit_tokens // self.chunk_tokens * self.chunk_tokens

    def load_destination(self, computed_tokens: int) -> LoadDestination | None:
        """Where the state for ``computed_tokens`` lands: row ``(n-1)//block`` of every KDA
        group; ``None`` when ``n`` is 0 or off the chunk grid (nothing is restored)."""
        _check_tokens("computed_tokens", computed_tokens)
        if computed_tokens == 0 or computed_tokens % self.chunk_tokens:
            return None
        return LoadDestination(
            computed_tokens=computed_tokens,
            row=(computed_tokens - 1) // self.block_tokens,
            groups=tuple(group.name for group in self.image.groups),
        )

    def store_boundaries(self, num_tokens: int, start_tokens: int = 0) -> tuple[int, ...]:
        """Boundaries a store of tokens ``(start, num_tokens]`` checkpoints: the chunk
        multiples in that range (the state after each is stored with its chunk)."""
        _check_tokens("num_tokens", num_tokens)
        _check_tokens("start_tokens", start_tokens)
        chunk = self.chunk_tokens
        first = start_tokens // chunk + 1  # boundaries counted in chunks
        # A tuple of every boundary: bounded, so a huge count is refused, not a MemoryError.
        if num_tokens // chunk - first + 1 > MAX_LISTED_ITEMS:
            bound = (first + MAX_LISTED_ITEMS) * chunk - 1  # the last token count under it
            raise Refusal(
                "size_limit",
                f"num_tokens={num_tokens:,} is above the bound {bound:,}: a store from "
                f"start_tokens={start_tokens:,} lists at most {MAX_LISTED_ITEMS:,} boundaries "
                f"of {chunk:,} tokens",
                facts={
                    "field": "num_tokens",
                    "bound": bound,
                    "start_tokens": start_tokens,
                    "chunk_tokens": chunk,
                    "max_boundaries": MAX_LISTED_ITEMS,
                },
                hint=f"store at most {MAX_LISTED_ITEMS * chunk:,} tokens at a time "
                f"(num_tokens <= {bound:,}), or ask capped_hit / load_destination of one "
                "token count",
            )
        return tuple(range(first * chunk, num_tokens + 1, chunk))


def _check_tokens(name: str, tokens: int) -> None:
    if expect_int(name, tokens) < 0:
        raise Refusal(
            "invalid_argument",
            f"{name}={describe(tokens)} must be >= 0",
            facts={name: tokens},
            hint=f"pass a token count for {name}",
        )
    check_int64(name, tokens)


def check_ridable(model: HybridModel) -> None:
    """Refuse (``model_not_ridable``) a model without KDA state or other than Kimi-K3."""
    expect("model", model, HybridModel)
    if not model.kda_layer_ids:
        raise Refusal(
            "model_not_ridable",
            f"model {model.name}: has no KDA layers, so no state rides the PAGE object",
            facts={"model": model.name, "model_type": model.model_type, "num_kda_layers": 0},
            hint="offload an attention-only model without a ride plan",
        )
    if model.model_type != RIDABLE_MODEL_TYPE:
        raise Refusal(
            "model_not_ridable",
            f"model {model.name}: model_type={model.model_type} has mamba-type (KDA) layers "
            f"but is not {RIDABLE_MODEL_TYPE}; only Kimi-K3's state is known to ride the PAGE "
            "object (Qwen's GDN reports the same layer type, so the gate is the model)",
            facts={
                "model": model.name,
                "model_type": model.model_type,
                "required_model_type": RIDABLE_MODEL_TYPE,
            },
            hint="offload this model in-process, or serve Kimi-K3",
        )


def check_options(options: RideOptions) -> None:
    """Refuse engine settings the ride cannot run under (mode, prefix caching, policy)."""
    expect("options", options, RideOptions)
    if options.mamba_cache_mode != "align":
        raise Refusal(
            "mamba_cache_mode",
            f"mamba_cache_mode={options.mamba_cache_mode}: the state rides only in align mode, "
            "where block-table row p holds the state after exactly (p + 1) x block tokens",
            facts={"mamba_cache_mode": options.mamba_cache_mode, "required": "align"},
            hint="start the engine with --mamba-cache-mode align",
        )
    if not options.prefix_caching:
        raise Refusal(
            "prefix_caching_off",
            "prefix caching is off: the state is checkpointed into prefix-cached blocks, so "
            "without it no boundary is kept to store or restore",
            facts={"prefix_caching": False},
            hint="start the engine with --enable-prefix-caching",
        )
    if options.kv_load_failure_policy != "recompute":
        raise Refusal(
            "load_failure_policy",
            f"kv_load_failure_policy={options.kv_load_failure_policy}: a failed load must be "
            "recomputed, since the KV and the state restore as one object or not at all",
            facts={
                "kv_load_failure_policy": options.kv_load_failure_policy,
                "required": "recompute",
            },
            hint='set kv_transfer_config {"kv_load_failure_policy": "recompute"}',
        )


def check_chunk(ride: RidePlan) -> None:
    """Refuse (``chunk_off_grid``) a chunk that is not a multiple of every group's span."""
    chunk = ride.chunk_tokens
    grid = ride.grid_tokens
    if chunk % grid == 0:
        return
    spans = {span.kind: span.span_tokens for span in ride.spans}
    attention = spans.get("attention", 0)
    kda = spans.get("kda", 0)
    below = chunk // grid * grid
    nearest = " or ".join(f"{c:,}" for c in (below, below + grid) if c > 0)
    raise Refusal(
        "chunk_off_grid",
        f"chunk_tokens={chunk:,} is not a multiple of every group's span (attention block x "
        f"dcp = {attention:,}, KDA block = {kda:,}); the smallest valid chunk is {grid:,}",
        facts={
            "chunk_tokens": chunk,
            "attention_span_tokens": attention,
            "kda_span_tokens": kda,
            "smallest_chunk_tokens": grid,
        },
        hint=f"use a multiple of {grid:,}: {nearest}",
    )


def plan_ride(
    plan: EngineLayout,
    options: RideOptions | None = None,
    *,
    stage: int = 0,
    published: Sequence[str] | None = None,
    names: LayerNames | None = None,
) -> RidePlan:
    """Plan the ride for a rank of pipeline stage ``stage``, or refuse at startup.

    ``published`` is the engine's publish order of attention layer names (name order when
    ``None``). Refuses, in order: ``engine_mismatch``, ``model_not_ridable`` (before a
    vLLM layout the ride does not take, ``layout_unsupported``), ``mamba_cache_mode``,
    ``prefix_caching_off``, ``load_failure_policy``, the plane-order refusals
    (``layer_names``, ``aliasing``) and ``chunk_off_grid``.

    >>> from k3layout import Deployment, plan, preset
    >>> ride = plan_ride(plan(preset("kimi-k3-dspark"), Deployment(attn_tp=8, spec_tokens=2)))
    >>> ride.chunk_tokens, ride.capped_hit(5000), ride.load_destination(4608).row
    (1536, 4608, 2)
    """
    expect_args(
        ("plan", plan, (LayoutBase,)),
        ("options", options, (RideOptions, type(None))),
        ("names", names, (LayerNames, type(None))),
    )
    expect_bounded_int("stage", stage, MAX_RANKS)
    expect_items("published", published, str, optional=True)
    try:
        plan = ridable(plan)
    except Refusal as refusal:
        if refusal.code == "layout_unsupported":  # a vLLM layout off planes: ATOM's gate on
            check_ridable(plan.model)  # the model (Kimi-K3 only) refuses such models first
        raise
    check_ridable(plan.model)
    options = options or RideOptions()
    check_options(options)
    names = names or engine_layer_names(plan.model)
    order = plane_order(plan, published, stage=stage, names=names)
    with deriving():  # the ride is its own derivation: its validator need not re-plan
        ride = RidePlan(plan=plan, stage=stage, options=options, names=names, published=order.given)
    # ride.order would be plane_order(plan, order.given, ...): this very order (a cached
    # property keeps its value in the instance dict, so it is seeded there).
    ride.__dict__["order"] = order
    check_chunk(ride)
    _ = ride.image  # every refusal at startup, none on first use
    return ride
