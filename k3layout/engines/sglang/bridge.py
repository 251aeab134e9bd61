"""SGLang 0.5.23: plan from a live ``ServerArgs`` and model config, check the pools it built.

Nothing here imports SGLang: its objects are read by their attributes, so the same code runs
in a scheduler process (where they are SGLang's) and in tests (``tests/conformance`` builds
them with SGLang's own code on CPU).

- :func:`plan_from_sglang`: the model (the HF config SGLang loaded) and the deployment
  (parallelism, cache dtype, speculative decoding, radix cache, the memory flags) a
  ``ServerArgs`` describes, planned for the GPU the engine runs on.
- :func:`check_pools` (:mod:`.checks`): the pools one rank allocated, against the plan,
  memory included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..._args import engine_attribute, expect, running_version
from ...deployment import Deployment
from ...errors import Fact, Refusal
from ...gpus import DEFAULT_GPU
from ...model import GQALayer, HybridModel, config_of, model_from_config
from ...model.architecture import Architecture
from ...model.hf_weights import dspark_draft_of
from .checks import check_pools
from .engine import plan_sglang
from .layout import SglangPlan
from .rules import DEFAULT_TRACK_INTERVAL

__all__ = ["check_pools", "deployment_from_sglang", "model_from_sglang", "plan_from_sglang"]

_KV_DTYPES = {
    "auto": "bf16",  # the checkpoints' dtype (an fp8-quantised KV config aside)
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp8_e4m3": "fp8",
}


def _get(obj: Any, name: str, default: Any = None) -> Any:
    return getattr(obj, name, default)


def _refuse(field: str, message: str, hint: str, **facts: Fact) -> Refusal:
    return Refusal(
        "invalid_argument",
        f"SGLang's {field}: {message}",
        facts={"field": field, **facts},
        hint=hint,
    )


def model_from_sglang(
    model_config: Any, name: str | None = None, draft_model_config: Any = None
) -> HybridModel:
    """The model an SGLang ``ModelConfig`` serves (its ``hf_config``, ``text_config`` nested
    or flat), with the DSpark draft's dense K/V layers when the draft runner's
    ``ModelConfig`` is given (SGLang's draft pool shares the budget)."""
    config = config_of(_get(model_config, "hf_config"), "hf_config", "model_config")
    label = name or _get(model_config, "model_path") or "sglang-model"
    target = model_from_config(config, name=str(label), source="SGLang")
    if draft_model_config is None:
        return target
    draft = _draft_layers(
        config_of(_get(draft_model_config, "hf_config"), "hf_config", "draft_model_config")
    )
    draft_config = config_of(
        _get(draft_model_config, "hf_config"), "hf_config", "draft_model_config"
    )
    architecture = target.architecture
    if architecture is not None:  # the draft's own dimensions, for its weights
        dims = dspark_draft_of(draft_config, "draft_model_config.hf_config")
        architecture = Architecture.model_validate({**dict(architecture), "draft": dims})
    return HybridModel(
        name=target.name,
        model_type=target.model_type,
        layers=target.layers,
        draft_layers=draft,
        drafter="dspark",
        context_tokens=target.context_tokens,
        architecture=architecture,
    )


def _draft_int(config: Mapping[str, object], key: str, default: object = None) -> int:
    value = config.get(key, default)
    if type(value) is not int or value < 1:
        raise _refuse(
            f"draft_model_config.hf_config.{key}",
            f"{value!r} is not a positive integer",
            "pass the DSpark draft runner's ModelConfig",
        )
    return value


def _draft_layers(config: Mapping[str, object]) -> tuple[GQALayer, ...]:
    """SGLang's DSpark draft as GQA layers: ``num_hidden_layers`` of ``num_key_value_heads``
    K and V heads of ``head_dim`` (its pool's ``head_dim + v_head_dim`` per head)."""
    heads = _draft_int(config, "num_attention_heads")
    kv_heads = _draft_int(config, "num_key_value_heads", heads)
    hidden = config.get("hidden_size")
    head_dim = _draft_int(config, "head_dim", hidden // heads if type(hidden) is int else None)
    if config.get("v_head_dim", head_dim) != head_dim:
        raise _refuse(
            "draft_model_config.hf_config.v_head_dim",
            f"{config.get('v_head_dim')!r} differs from head_dim={head_dim}: the planner's GQA "
            "layer keeps K and V rows of one head size",
            "give the draft equal K and V head sizes",
        )
    layer = GQALayer(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
    return (layer,) * _draft_int(config, "num_hidden_layers")


def deployment_from_sglang(server_args: Any, gpu: str = DEFAULT_GPU) -> Deployment:
    """The deployment a ``ServerArgs`` describes (engine ``sglang``) on ``gpu``.

    Attention DP (``attn_dp_size``, or the deprecated ``--enable-dp-attention --dp-size``)
    splits TP into ``dp`` attention TP groups of ``tp / dp``; speculative decoding runs
    ``speculative_num_draft_tokens - 1`` tokens per step (as SGLang resolved it:
    ``resolved_dict()``, where the flag was left to SGLang); ``--disable-radix-cache`` is
    ``prefix_caching=False``."""
    expect("gpu", gpu, str)
    resolved = _resolved(server_args)

    def arg(name: str, default: Any = None) -> Any:
        # every ServerArgs has the field (a record without it is refused, naming it);
        # None is SGLang's "not set"
        value = resolved.get(name)
        if value is None:
            value = engine_attribute(server_args, name, "server_args", nullable=True)
        return default if value is None else value

    def size(name: str) -> int:
        return _count(f"server_args.{name}", arg(name, 1))

    tp = size("tp_size")
    dp = size("attn_dp_size")  # SGLang 0.5.23's spelling
    if dp == 1 and arg("enable_dp_attention"):
        dp = size("dp_size")  # the deprecated --enable-dp-attention --dp-size
    dtype = str(arg("kv_cache_dtype", "auto") or "auto")
    if dtype not in _KV_DTYPES:
        raise _refuse(
            "kv_cache_dtype",
            f"{dtype!r} is not a cache dtype the planner models",
            f"use one of {sorted(_KV_DTYPES)}",
            kv_cache_dtype=dtype,
        )
    draft_tokens = arg("speculative_num_draft_tokens")
    spec = 0
    if arg("speculative_algorithm") and draft_tokens:
        spec = _count("server_args.speculative_num_draft_tokens", draft_tokens) - 1
    fields: dict[str, Any] = {
        "engine": "sglang",
        "engine_version": running_version("sglang"),
        "gpu": gpu,
        "attn_tp": tp // dp if dp and tp % dp == 0 else tp,
        "attn_dp": dp,
        "pp": size("pp_size"),
        "dcp": size("dcp_size"),
        "kv_dtype": _KV_DTYPES[dtype],
        "spec_tokens": spec,
        "prefix_caching": not arg("disable_radix_cache", False),
        # the memory flags as the operator gave them: SGLang's own defaults (the 0.9 ratio,
        # the 48 running requests of speculative decoding) are the planner's too
        "mamba_full_memory_ratio": _flag(server_args, "mamba_full_memory_ratio"),
        "max_running_requests": _flag(server_args, "max_running_requests"),
        "max_mamba_cache_size": _flag(server_args, "max_mamba_cache_size"),
        "max_total_tokens": _flag(server_args, "max_total_tokens"),
        # SGLang's default (256) plans as unset: the planner gives it where it starts
        "mamba_track_interval": _track_interval(server_args),
    }
    return Deployment.model_validate(fields)


def _track_interval(server_args: Any) -> int | None:
    """``--mamba-track-interval`` as the engine runs it, ``None`` at SGLang's default (a
    ``ServerArgs`` without the field: SGLang's default too)."""
    value = getattr(server_args, "mamba_track_interval", None)
    return None if value in (None, DEFAULT_TRACK_INTERVAL) else value


def _flag(server_args: Any, name: str) -> Any:
    """A memory flag as the operator gave it (``None``: SGLang's default); a ``ServerArgs``
    without the field is refused naming it."""
    return engine_attribute(server_args, name, "server_args", nullable=True)


def _resolved(server_args: Any) -> Mapping[str, Any]:
    """What SGLang resolved its flags to (``ServerArgs.resolved_dict()``), where it says."""
    resolve = getattr(server_args, "resolved_dict", None)
    values = resolve() if callable(resolve) else None
    return values if isinstance(values, Mapping) else {}


def plan_from_sglang(
    server_args: Any, model_config: Any, gpu: str = DEFAULT_GPU, draft_model_config: Any = None
) -> SglangPlan:
    """Plan the model and deployment an SGLang ``ServerArgs`` and ``ModelConfig`` describe,
    for engine ``sglang`` on ``gpu`` (with the DSpark draft runner's ``ModelConfig``, where
    one runs)."""
    model = model_from_sglang(model_config, draft_model_config=draft_model_config)
    return plan_sglang(model, deployment_from_sglang(server_args, gpu))


def _count(field: str, value: object) -> int:
    """``value`` as a count, or refused (``invalid_argument``) naming SGLang's ``field``."""
    if type(value) is not int or value < 0:
        raise _refuse(field, f"{value!r} is not a count", f"pass SGLang's own {field}")
    return value


def _ints(field: str, values: object) -> tuple[int, ...]:
    """``values`` as a tuple of ints (a shape, strides, layer ids), or refused naming
    ``field``."""
    found = tuple(values) if isinstance(values, Iterable) else None
    if found is None or not all(type(v) is int for v in found):
        raise _refuse(field, f"{values!r} is not a sequence of ints", "pass SGLang's own pool")
    return found
