"""Issue 32 research: a pytest plugin that lets the vLLM conformance suites run against
vLLM 0.34.0 in the side environment ``.venv-vllm034`` (tests/fixtures/vllm-0.34-notes.md).

Loaded only on request, never by the project's own runs::

    PYTHONPATH=tests/conformance .venv-vllm034/bin/python -m pytest -p vllm034_shim ...

What stands between the suites and 0.34, none of it in the planning that is compared:

- ``vllm_required.require_vllm`` skips every vLLM suite unless exactly ``VLLM_VERSION``
  ("0.33.0") is installed: the constant is pointed at the installed release;
- the bridge (``k3layout.engines.vllm.bridge.deployment_from_vllm``) stamps the running vLLM's
  ``__version__`` on the deployment, and k3layout refuses releases it does not follow
  (``engine_version='0.34.0'``): the bridge is told it runs under 0.33.0, so k3layout plans
  with its 0.33 rules and every failure left is 0.34's engine resolving something else;
- 0.34 removed Model Runner V1, and with it ``VllmConfig.use_v2_model_runner``,
  ``VllmConfig._get_v2_model_runner_unsupported_features`` and ``vllm.config.vllm``'s import
  of ``HAS_TRITON`` (the V1/V2 choice they fed): the budget and weights harnesses save, set
  and restore that module attribute, the budget harness copies the property onto its worker,
  the GLM binding record stores the feature list. They are given back as constants (V2 is
  the only runner: no unsupported feature);
- ``MLAAttention.get_kv_cache_spec`` asks the layer's attention implementation
  (``self.impl.get_fp8_ds_mla_row_bytes()``) for an ``fp8_ds_mla`` row where 0.33 had a
  table: the harnesses' stand-in layers have no ``impl``, so one is made on demand from the
  layer's backend (``get_impl_cls`` without its ``__init__``), holding the model's latent and
  rope widths, which is all the row-size hook reads;
- the NIXL worker no longer keeps ``_scratch_region_indices`` (0.33: the regions of
  ``CircularBufferSpec`` groups); 0.34 keeps ``_group_region_indices`` for every group. The
  old name is answered from the new record;
- ``ModelRunnerOutput`` lost its ``req_id_to_index`` field (the scheduler finds a request's
  row by ``req_ids`` alone): the GLM NIXL harness's finished prefill step still passes it, and
  the keyword is dropped;
- an MLA layer built for a sparse backend that shards prefill queries across TP ranks
  (ShardQ, new in 0.34; B200 cases of the GLM weights suite) allocates its exchange buffers in
  ``__init__`` after asking the TP process group whether it spans symmetric memory; the
  weights harness builds layers without process groups, so the allocation (runtime buffers,
  no weights) is skipped.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest
import vllm_required

import k3layout.engines.vllm.bridge as vllm_bridge

PLANNED_AS = "0.33.0"
"""The release k3layout is asked to plan for, whatever vLLM runs."""


def _running_version(package: str) -> str | None:
    return PLANNED_AS if package == "vllm" else None


def _standin_impl(layer: Any) -> Any:
    """The layer's attention implementation, uninitialised, with the model's MLA widths."""
    from vllm.config import get_current_vllm_config  # noqa: PLC0415

    impl_class = layer.attn_backend.get_impl_cls()
    impl = impl_class.__new__(impl_class)
    text = get_current_vllm_config().model_config.hf_text_config
    impl.kv_lora_rank = text.kv_lora_rank
    impl.qk_rope_head_dim = text.qk_rope_head_dim
    return impl


def _patch_034() -> None:
    import vllm.config.vllm as vllm_config_module  # noqa: PLC0415
    from vllm.config import VllmConfig  # noqa: PLC0415
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (  # noqa: PLC0415
        base_worker,
    )
    from vllm.model_executor.layers.attention.mla_attention import (  # noqa: PLC0415
        MLAAttention,
    )
    from vllm.v1.kv_cache_interface import CircularBufferSpec  # noqa: PLC0415

    if not hasattr(vllm_config_module, "HAS_TRITON"):
        vllm_config_module.HAS_TRITON = True
    if not hasattr(VllmConfig, "use_v2_model_runner"):
        VllmConfig.use_v2_model_runner = True
    if not hasattr(VllmConfig, "_get_v2_model_runner_unsupported_features"):
        VllmConfig._get_v2_model_runner_unsupported_features = lambda self: []

    module_getattr = MLAAttention.__getattr__

    def mla_getattr(self: Any, name: str) -> Any:
        try:
            return module_getattr(self, name)
        except AttributeError:
            if name != "impl" or "attn_backend" not in self.__dict__:
                raise
            return _standin_impl(self)

    MLAAttention.__getattr__ = mla_getattr

    from vllm.model_executor.layers.attention import mla_attention  # noqa: PLC0415
    from vllm.v1.outputs import ModelRunnerOutput  # noqa: PLC0415

    if hasattr(mla_attention, "allocate_shardq_buffers"):
        mla_attention.allocate_shardq_buffers = lambda *args, **kwargs: None

    output_init = ModelRunnerOutput.__init__
    if "req_id_to_index" not in ModelRunnerOutput.__dataclass_fields__:

        def init_without_index(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("req_id_to_index", None)
            output_init(self, *args, **kwargs)

        ModelRunnerOutput.__init__ = init_without_index

    worker_class: Any = base_worker.NixlBaseConnectorWorker
    if not hasattr(worker_class, "_scratch_region_indices"):

        def scratch_regions(self: Any) -> list[int]:
            regions: set[int] = set()
            for group, kind in enumerate(self._group_spec_types):
                if kind is CircularBufferSpec:
                    found = self._group_region_indices[group]
                    regions.update(range(self.num_regions) if found is None else found)
            return sorted(regions)

        worker_class._scratch_region_indices = property(scratch_regions)


def pytest_configure(config: pytest.Config) -> None:
    """Accept the installed vLLM (0.34.0 in ``.venv-vllm034``) as the one under test, have
    k3layout plan it with its 0.33 rules, and stand in for what 0.34 removed."""
    vllm_required.VLLM_VERSION = version("vllm")
    bridge: Any = vllm_bridge  # the bridge's own import of ``_args.running_version``
    bridge.running_version = _running_version
    if version("vllm") != PLANNED_AS:
        _patch_034()
