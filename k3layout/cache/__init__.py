"""What each layer keeps, described once: named parts with a global shape, a dtype and a
placement over attention TP, paged per token or kept per request (slot).

Per-rank shapes and bytes, page contents and padding, transfer regions, image units and the
adapter's tensors are all derived from these specs. A layer kind is one module here.
"""

from .gqa import GQALayer
from .kda import CONV_CHANNEL_GROUPS, KDALayer, conv_channel_offset
from .mla import MLALayer
from .part import CachePart, ElementDtype, element_bytes
from .pooled import DSAIndexer, IndexerType
from .replay import cursor_spec, record_len, replay_spec
from .ring import RING_PARTS, ring_spec, ring_tokens
from .spec import LayerCacheSpec, Paging, PartRange

__all__ = [
    "CONV_CHANNEL_GROUPS",
    "RING_PARTS",
    "CachePart",
    "DSAIndexer",
    "ElementDtype",
    "GQALayer",
    "IndexerType",
    "KDALayer",
    "LayerCacheSpec",
    "MLALayer",
    "Paging",
    "PartRange",
    "conv_channel_offset",
    "cursor_spec",
    "element_bytes",
    "record_len",
    "replay_spec",
    "ring_spec",
    "ring_tokens",
]
