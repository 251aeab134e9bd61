"""vLLM 0.33 startup check: a ``vllm.general_plugins`` plugin that checks every worker's KV
cache against the plan right after vLLM binds it, when ``K3LAYOUT_CHECK=1``.

vLLM calls :func:`register` in each of its processes (the front end, the engine core, every
worker). With the switch on, it wraps ``WorkerWrapperBase.initialize_from_config``: the one
call every executor (uniprocess, multiprocess, Ray) makes on every worker to allocate and bind
the real KV cache, whatever the model runner (V1 or V2, GPU or CPU). During that call it
records what each attention layer of the worker is handed through the layer API
``bind_kv_cache``: the tensors as bound, one view per layer name. After it, it runs
:func:`check_after_kv_cache_init` on the worker's ``VllmConfig``, the rank's
``KVCacheConfig``, those tensors and the worker's pipeline stage: one log line when they
match the plan, the planner's :class:`~k3layout.Refusal` when they do not, which stops the
engine's startup. ``docs/integration.md`` says why this hook and not another.

Importing this module imports neither vLLM nor torch; :func:`register` imports vLLM only when
the switch is on.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ...errors import Refusal
from .bridge import check_kv_caches, worker_stage
from .layout import VllmPlan

__all__ = ["SWITCH", "check_after_kv_cache_init", "register"]

SWITCH = "K3LAYOUT_CHECK"
"""The environment variable that switches the check on (``1``); anything else leaves vLLM
untouched."""

# A child of vLLM's "vllm" logger, so the line goes through vLLM's own handler, format and
# level (VLLM_LOGGING_LEVEL); vLLM stops propagation there, and a logger outside its tree
# would be dropped at INFO by the root logger's default WARNING level.
logger = logging.getLogger("vllm.k3layout")

_MARK = "__k3layout_check__"  # set on the wrapper, so a second register() sees it is there


def register() -> None:
    """The plugin's entry point (``vllm.general_plugins``). With ``K3LAYOUT_CHECK=1``, wraps
    ``WorkerWrapperBase.initialize_from_config`` so that every worker checks its KV cache
    after binding it; otherwise does nothing. Safe to call more than once in a process."""
    if os.environ.get(SWITCH) != "1":
        return
    from vllm.v1.worker.worker_base import WorkerWrapperBase  # noqa: PLC0415

    current = WorkerWrapperBase.initialize_from_config
    if getattr(current, _MARK, False):
        return
    WorkerWrapperBase.initialize_from_config = _checked(current)


def check_after_kv_cache_init(
    vllm_config: Any,
    kv_cache_config: Any,
    kv_caches: Mapping[str, Any],
    stage: int | None = None,
) -> VllmPlan | None:
    """Check a worker's KV cache right after vLLM bound it: ``kv_cache_config`` (the rank's
    ``KVCacheConfig``) and ``kv_caches`` (layer name -> the tensor bound to that layer) of
    pipeline stage ``stage`` (default: the worker's own) against the plan of
    ``vllm_config``, with :func:`~k3layout.engines.vllm.check_kv_caches` (which checks
    ``kv_cache_config`` first). Logs one line and returns the plan when they agree; logs the
    refusal and raises it unchanged when they do not. A setting vLLM serves that k3layout does
    not model (:func:`~k3layout.engines.vllm.bridge.unmodelled`) never stops the engine: it
    logs that the cache cannot be checked and returns ``None``."""
    where: object = "?" if stage is None else stage  # a config without a stage: refused
    try:
        stage = worker_stage(vllm_config) if stage is None else stage
        where = stage
        result = check_kv_caches(vllm_config, kv_cache_config, kv_caches, stage)
    except Refusal as refusal:
        if "unmodelled" in refusal.facts:
            logger.warning(
                "k3layout: cannot check the KV cache of stage %s, the engine starts: %s",
                where,
                refusal,
            )
            return None
        logger.error(
            "k3layout: refused the KV cache of stage %s; stopping startup (%s=1): %s",
            where,
            SWITCH,
            refusal,
        )
        raise
    logger.info(
        "k3layout: KV cache of %s stage %d matches the plan (%d blocks, page %d B, %d planes)",
        result.model.name,
        stage,
        kv_cache_config.num_blocks,
        result.page_bytes,
        result.stage(stage).num_planes,
    )
    return result


def _checked(initialize_from_config: Callable[..., Any]) -> Callable[..., Any]:
    """``WorkerWrapperBase.initialize_from_config`` that records the layers' bindings while it
    runs, then checks them."""

    @functools.wraps(initialize_from_config)
    def checked(self: Any, kv_cache_configs: list[Any], *args: Any, **kwargs: Any) -> Any:
        layers = self.vllm_config.compilation_config.static_forward_context
        with _recording_bindings(layers) as bound:
            returned = initialize_from_config(self, kv_cache_configs, *args, **kwargs)
        # The same entry vLLM's wrapper hands its worker.
        kv_cache_config = kv_cache_configs[self.global_rank]
        check_after_kv_cache_init(
            self.vllm_config, kv_cache_config, bound, worker_stage(self.vllm_config)
        )
        return returned

    setattr(checked, _MARK, True)
    return checked


@contextmanager
def _recording_bindings(layers: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """While the block runs, each layer's ``bind_kv_cache`` also records the tensor it is
    handed under the layer's name. The recorder is an attribute of the layer object itself,
    removed afterwards, so nothing of vLLM's classes or modules changes and only the binding of
    this worker, in this call, is seen (not the profiling caches bound before it)."""
    bound: dict[str, Any] = {}
    shadowed: list[tuple[Any, Any]] = []
    for name, layer in layers.items():
        bind = getattr(layer, "bind_kv_cache", None)
        if not callable(bind):
            continue
        own = vars(layer).get("bind_kv_cache")  # a recorder already on the object, kept
        layer.bind_kv_cache = functools.partial(_record, bound, name, bind)
        shadowed.append((layer, own))
    try:
        yield bound
    finally:
        for layer, own in shadowed:
            if own is None:
                del layer.bind_kv_cache  # the class's method again
            else:
                layer.bind_kv_cache = own


def _record(bound: dict[str, Any], name: str, bind: Callable[[Any], Any], kv_cache: Any) -> Any:
    bound[name] = kv_cache
    return bind(kv_cache)
