"""LMCache MP offload: the KDA state rides the PAGE object (SPEC section 5, seed 000).

From a ``vllm`` plan: the PAGE plane order (:func:`plane_order`), the checkpoint image of one
boundary (:func:`checkpoint_image`), the aliasing check on the addresses an engine registered
(:func:`check_aliasing`, on :class:`TensorView` s; :func:`vllm_views` builds the true ones) and
the ride planner with its startup refusals (:func:`plan_ride`). Layer names follow one
convention (:mod:`k3layout.names`). Every function takes a pipeline ``stage``.
"""

from ..names import (
    NAMING_RULES,
    LayerNames,
    NamingEngine,
    NamingRule,
    engine_layer_names,
    index_region_name,
    name_order,
    naming_rule,
    ring_region_name,
)
from ..settings import MambaCacheMode
from .aliasing import Misplaced, MisplacedBy, aliasing_problems, check_aliasing
from .image import (
    CheckpointImage,
    PageRegion,
    RegionPart,
    StateRange,
    checkpoint_image,
    page_regions,
)
from .lmcache import (
    LMCACHE_VERSION,
    LMCacheGroup,
    LMCacheOptions,
    LMCachePlan,
    plan_lmcache,
)
from .plane_order import PlaneOrder, PlaneShare, plane_order
from .report import HitReport, RideReport, ride_report
from .ride import (
    RIDABLE_MODEL_TYPE,
    GroupSpan,
    KvLoadFailurePolicy,
    LoadDestination,
    RideOptions,
    RidePlan,
    check_options,
    check_ridable,
    plan_ride,
)
from .views import TensorView, vllm_views

__all__ = [
    "LMCACHE_VERSION",
    "NAMING_RULES",
    "RIDABLE_MODEL_TYPE",
    "CheckpointImage",
    "GroupSpan",
    "HitReport",
    "KvLoadFailurePolicy",
    "LMCacheGroup",
    "LMCacheOptions",
    "LMCachePlan",
    "LayerNames",
    "LoadDestination",
    "MambaCacheMode",
    "Misplaced",
    "MisplacedBy",
    "NamingEngine",
    "NamingRule",
    "PageRegion",
    "PlaneOrder",
    "PlaneShare",
    "RegionPart",
    "RideOptions",
    "RidePlan",
    "RideReport",
    "StateRange",
    "TensorView",
    "aliasing_problems",
    "check_aliasing",
    "check_options",
    "check_ridable",
    "checkpoint_image",
    "engine_layer_names",
    "index_region_name",
    "name_order",
    "naming_rule",
    "page_regions",
    "plan_lmcache",
    "plan_ride",
    "plane_order",
    "ride_report",
    "ring_region_name",
    "vllm_views",
]
