"""tokenspeed's Kimi-K3 cache recipe as ``engine="tokenspeed"`` (seed 001, tokenspeed #1152),
followed at two revisions (:mod:`.releases`, ``Deployment.engine_version``): #1152's head
``a6ee91b3`` (``pr1152``) and ``main`` at ``f4d8ec6e`` (``main``, the default). Its refusals
(:mod:`.rules`), groups, the revision's packing and the arena's planes and addresses
(:mod:`.recipe`, :class:`ParentPlan`), and what a budget serves, verify workspace included
(:mod:`.capacity`), registered by :mod:`.engine`."""

from .capacity import ParentCapacity
from .engine import PARENT, TOKENSPEED, plan_parent, plan_tokenspeed
from .layout import Binding, GroupPages, LayerBinding, ParentPlan
from .recipe import REVISION, REVISION_NAME
from .releases import REVISIONS, TOKENSPEED_VERSIONS, TokenspeedRevision, revision_of

__all__ = [
    "PARENT",
    "REVISION",
    "REVISIONS",
    "REVISION_NAME",
    "TOKENSPEED",
    "TOKENSPEED_VERSIONS",
    "Binding",
    "GroupPages",
    "LayerBinding",
    "ParentCapacity",
    "ParentPlan",
    "TokenspeedRevision",
    "plan_parent",
    "plan_tokenspeed",
    "revision_of",
]
