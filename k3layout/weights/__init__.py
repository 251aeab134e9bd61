"""The weights one rank holds: per-rank tensors (name, shape, dtype) grouped by module kind.

Each engine lays a checkpoint's :class:`~k3layout.model.architecture.Architecture` out its own
way (its model classes' parallel layers, padding and quantization formats): its package
registers a ``weights`` seam (:class:`k3layout.layouts.seams.EngineRules`) that returns the
:class:`RankWeights` of one rank of a pipeline stage, built from the records here.
``k3layout.weights_per_rank`` asks the engine of the deployment.
"""

from .records import (
    WEIGHT_DTYPE_BYTES,
    RankWeights,
    WeightDtype,
    WeightGroup,
    WeightsPlan,
    WeightTensor,
)

__all__ = [
    "WEIGHT_DTYPE_BYTES",
    "RankWeights",
    "WeightDtype",
    "WeightGroup",
    "WeightTensor",
    "WeightsPlan",
]
