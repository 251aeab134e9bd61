"""GLM-5.3-Flash's MLA backend and pages on vLLM, every backend by every cache dtype, against
vLLM's own planning run on CPU (``vllm_glm.plan_glm``, under whichever followed release is
installed: 0.33.0 in the ``tests`` environment, 0.34.0 in ``vllm034``).

- **Backends**: for each GPU, ``--attention-backend`` (none, each dense MLA backend, each sparse
  one k3layout plans), ``--kv-cache-dtype`` (fp8, bf16, fp8_ds_mla) and DCP, vLLM's selector
  accepts the backend exactly where k3layout plans it. Where both plan, they plan the same
  (backend, block, groups, strides, every cache's offset and page: ``test_conformance_glm``'s
  ``compare``); where both refuse, k3layout's refusal is ``kernel_unsupported`` naming the
  backend (and, for a sparse backend, the cache dtype and GPU vLLM was asked for), with a hint
  that leads elsewhere: every sparse backend it names for the cache dtype vLLM plans.
- **Pages**: every page vLLM's groups keep (each layer spec's ``page_size_bytes`` in each
  stage's ``KVCacheConfig``) is one the plan reports (:attr:`VllmPlan.pages`), by group kind
  and part, and the plan reports no other: the ``fp8_ds_mla`` latent page of 656-byte rows
  among them.
- The counterpart: a sparse backend named for Kimi-K3 (MLA without an indexer) is refused by
  vLLM's selector ("non-sparse not supported") and by k3layout.
"""

from __future__ import annotations

import itertools
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from vllm_required import require_vllm, running

require_vllm()
RELEASE = running()
"""The vLLM release installed, which k3layout plans for."""

from test_conformance_glm import BUDGET, DTYPES, GPUS, LENGTH, compare, glm  # noqa: E402
from vllm_glm import plan_glm  # noqa: E402

from k3layout import Deployment, Refusal, plan, plan_vllm, preset  # noqa: E402
from k3layout.engines.vllm import plan_from_vllm  # noqa: E402
from k3layout.engines.vllm.layout import VllmPlan  # noqa: E402
from k3layout.engines.vllm.rules import (  # noqa: E402
    DENSE_ATTENTION_BACKENDS,
    SPARSE_ATTENTION_BACKENDS,
)
from k3layout.engines.vllm.sparse import serving_backends  # noqa: E402

BACKENDS = (None, *DENSE_ATTENTION_BACKENDS, *SPARSE_ATTENTION_BACKENDS)

Case = tuple[str, str | None, str, int]
"""gpu, --attention-backend (None: vLLM's pick), cache dtype (k3layout's name), DCP."""

CASES: list[Case] = [
    (gpu, backend, dtype, dcp)
    for gpu, backend, dtype, dcp in itertools.product(GPUS, BACKENDS, DTYPES, (1, 2))
]


def case_id(case: Case) -> str:
    gpu, backend, dtype, dcp = case
    return f"{gpu}-{backend or 'auto'}-{dtype}-dcp{dcp}"


@cache
def vllms(case: Case) -> dict[str, Any]:
    """vLLM's plan of GLM-5.3-Flash at attention TP 8 for ``case`` (its own objects kept)."""
    gpu, backend, dtype, dcp = case
    return plan_glm(
        gpu=GPUS[gpu],
        tp=8,
        kv_dtype=DTYPES[dtype],
        dcp=dcp,
        backend=backend,
        max_model_len=LENGTH,
        budget_bytes=BUDGET,
        objects=True,
    )


def deployment(case: Case) -> Deployment:
    gpu, backend, dtype, dcp = case
    return Deployment(
        engine_version=RELEASE,
        attn_tp=8,
        gpu=gpu,
        kv_dtype=dtype,
        dcp=dcp,
        attention_backend=backend,
    )


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_backend_is_planned_or_refused_as_vllm_does(case: Case) -> None:
    gpu, backend, dtype, dcp = case
    theirs = vllms(case)
    if "unsupported" in theirs:  # FLASH_ATTN_MLA cannot be imported on a CPU build
        assert backend is not None and backend in DENSE_ATTENTION_BACKENDS, theirs
        pytest.skip(theirs["unsupported"])
    try:
        ours = plan_vllm(glm(0), deployment(case))
    except Refusal as refusal:
        assert "refused" in theirs, f"k3layout refused, vLLM planned: {refusal}"
        assert theirs["refused_at"] == "attention backend", theirs
        assert refusal.code == "kernel_unsupported", refusal
        assert refusal.hint
        if backend is None:
            assert (refusal.facts["kv_dtype"], refusal.facts["gpu"]) == (dtype, gpu)
            return
        assert refusal.facts["attention_backend"] == backend
        if backend in DENSE_ATTENTION_BACKENDS:
            assert "sparse not supported" in theirs["refused"]
            return
        assert (refusal.facts["kv_dtype"], refusal.facts["gpu"]) == (dtype, gpu)
        for other in serving_backends(deployment((gpu, None, dtype, dcp))):
            assert other in refusal.hint  # what the hint names, vLLM plans
            assert "refused" not in vllms((gpu, other, dtype, dcp))
        return
    assert "refused" not in theirs, f"vLLM refused: {theirs['refused']}; k3layout planned"
    assert theirs["backend"] == ours.attention_backend
    if backend is not None:
        assert ours.attention_backend == backend
    compare({k: v for k, v in theirs.items() if k != "objects"}, glm(0), deployment(case))
    from_vllm = plan_from_vllm(theirs["objects"]["config"], gpu=gpu)  # type: ignore[arg-type]
    assert (from_vllm.attention_backend, from_vllm.block_tokens, from_vllm.block_bytes) == (
        ours.attention_backend,
        ours.block_tokens,
        ours.block_bytes,
    )


def kept_pages(theirs: dict[str, Any]) -> set[tuple[str, str, int]]:
    """Every page vLLM's groups keep, on every stage: (group kind, the plan's part the cache
    starts with, ``page_size_bytes``) of each layer spec in each ``KVCacheConfig`` group."""
    from vllm.v1.kv_cache_interface import (  # noqa: PLC0415
        CircularBufferSpec,
        MambaSpec,
        UniformTypeKVCacheSpecs,
    )

    kept: set[tuple[str, str, int]] = set()
    for kv_cache_config in theirs["objects"]["kv_cache_configs"]:
        for group in kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            specs = (
                spec.kv_cache_specs.values()
                if isinstance(spec, UniformTypeKVCacheSpecs)
                else [spec]
            )
            for each in specs:
                role = getattr(getattr(each, "cache_role", None), "name", None)
                if isinstance(each, MambaSpec):
                    where = ("kda", "conv")
                elif isinstance(each, CircularBufferSpec):
                    where = ("ring", "k")
                else:
                    where = ("attention", "index" if role == "INDEXER" else "latent")
                kept.add((*where, each.page_size_bytes))
    return kept


def reported_pages(ours: VllmPlan) -> set[tuple[str, str, int]]:
    return {(page.kind, page.parts[0], page.page_bytes) for page in ours.pages}


PAGE_CASES: list[tuple[str, int, str, int, int]] = [
    # gpu, attention TP, cache dtype, spec tokens (MTP), block
    ("h200", 8, "fp8_ds_mla", 0, 0),
    ("h200", 1, "fp8_ds_mla", 0, 0),
    ("h200", 4, "fp8_ds_mla", 2, 0),
    ("h200", 8, "fp8_ds_mla", 0, 2048),
    ("h200", 8, "fp8", 0, 0),
    ("h200", 2, "bf16", 1, 0),
    ("b200", 8, "fp8", 3, 0),
    ("b200", 16, "bf16", 0, 0),
]


@pytest.mark.parametrize("case", PAGE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_every_page_vllm_keeps_is_one_the_plan_reports(
    case: tuple[str, int, str, int, int],
) -> None:
    gpu, tp, dtype, spec, block = case
    theirs = plan_glm(
        gpu=GPUS[gpu],
        tp=tp,
        kv_dtype=DTYPES[dtype],
        spec_tokens=spec,
        mtp_layers=spec or None,
        block_size=block or None,
        max_model_len=LENGTH,
        budget_bytes=BUDGET,
        objects=True,
    )
    ours = plan_vllm(
        glm(spec),
        Deployment(
            engine_version=RELEASE,
            attn_tp=tp,
            gpu=gpu,
            kv_dtype=dtype,
            spec_tokens=spec,
            speculative_method="mtp" if spec else None,
            block_tokens=block or None,
        ),
    )
    assert kept_pages(theirs) == reported_pages(ours)
    if dtype == "fp8_ds_mla":  # 512 fp8 + 4 fp32 scales + 64 bf16 rope per token, as vLLM sizes it
        latent = ("attention", "latent", (512 + 4 * 4 + 64 * 2) * theirs["block_size"])
        assert latent in kept_pages(theirs)


def test_a_sparse_backend_named_for_kimi_k3_is_refused_as_vllm_refuses_it() -> None:
    from vllm_engine import Case as K3Case  # noqa: PLC0415
    from vllm_engine import mla_backend, start  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as directory:
        engine = start(K3Case(attn_tp=8), Path(directory))
        config = engine.workers[0]
        for backend in SPARSE_ATTENTION_BACKENDS:
            with pytest.raises(ValueError, match="non-sparse not supported"):
                mla_backend(config, backend, 96 // 8)
            with pytest.raises(Refusal) as caught:
                plan(
                    preset("kimi-k3"),
                    Deployment(engine_version=RELEASE, attn_tp=8, attention_backend=backend),
                )
            assert caught.value.code == "kernel_unsupported"
            assert caught.value.facts["attention_backend"] == backend
