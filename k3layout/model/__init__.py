"""The model: a hybrid decoder's layers in module order, presets and the config loader."""

from .hf_config import config_of, load_config, model_from_config
from .layers import GQALayer, KDALayer, Layer, MLALayer
from .presets import PRESETS, kimi_k3, kimi_k3_dspark, kimi_layer_pattern, kimi_linear_48b, preset
from .spec import HybridModel

__all__ = [
    "PRESETS",
    "GQALayer",
    "HybridModel",
    "KDALayer",
    "Layer",
    "MLALayer",
    "config_of",
    "kimi_k3",
    "kimi_k3_dspark",
    "kimi_layer_pattern",
    "kimi_linear_48b",
    "load_config",
    "model_from_config",
    "preset",
]
