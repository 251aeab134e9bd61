"""The ride report: the numbers of a ride plan, flat and JSON-ready (``k3layout ride --json``).

Build one with :func:`ride_report`; it is data only. ``plane_order`` holds the attention layer
names in publish order, ``planes`` what shares each of them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .._args import expect_args
from .._frozen import Frozen
from .image import StateRange
from .plane_order import PlaneShare
from .ride import GroupSpan, LoadDestination, RideOptions, RidePlan

SCHEMA_VERSION: Literal[1] = 1


class HitReport(Frozen):
    """One prefix hit: capped to the grid, and where its state lands."""

    hit_tokens: int
    capped_tokens: int
    load: LoadDestination | None


class RideReport(Frozen):
    """``k3layout ride --json``."""

    schema_version: Literal[1] = SCHEMA_VERSION
    model: str
    engine: str = Field(description="the engine whose plan rides")
    engine_version: str = Field(description="the engine release planned for")
    stage: int
    options: RideOptions
    block_tokens: int
    page_bytes: int
    units: int
    image_planes: int
    image_regions: int
    unit_bytes: int
    image_bytes: int
    state_bytes: int
    layer_state_bytes: int
    chunk_tokens: int
    smallest_chunk_tokens: int
    spans: tuple[GroupSpan, ...]
    plane_order: tuple[str, ...]
    given_order: tuple[str, ...]
    planes: tuple[PlaneShare, ...]
    state_ranges: tuple[StateRange, ...]
    hit: HitReport | None = None


def ride_report(ride: RidePlan, hit_tokens: int | None = None) -> RideReport:
    """Every number of ``ride`` under its JSON name; with ``hit_tokens``, that hit capped."""
    expect_args(("ride", ride, RidePlan), ("hit_tokens", hit_tokens, (int, type(None))))
    image = ride.image
    hit = None
    if hit_tokens is not None:
        capped = ride.capped_hit(hit_tokens)
        hit = HitReport(
            hit_tokens=hit_tokens, capped_tokens=capped, load=ride.load_destination(capped)
        )
    return RideReport(
        model=ride.plan.model.name,
        engine=ride.plan.engine,
        engine_version=ride.plan.deployment.version_run,
        stage=ride.stage,
        options=ride.options,
        block_tokens=ride.block_tokens,
        page_bytes=image.page_bytes,
        units=image.num_units,
        image_planes=image.num_planes,
        image_regions=image.num_regions,
        unit_bytes=image.unit_bytes,
        image_bytes=image.image_bytes,
        state_bytes=image.state_bytes,
        layer_state_bytes=image.layer_state_bytes,
        chunk_tokens=ride.chunk_tokens,
        smallest_chunk_tokens=ride.grid_tokens,
        spans=ride.spans,
        plane_order=ride.order.order,
        given_order=ride.order.given,
        planes=ride.order.planes,
        state_ranges=image.ranges,
        hit=hit,
    )
