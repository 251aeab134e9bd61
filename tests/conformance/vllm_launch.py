"""A ``vllm serve`` launch line, parsed and started by vLLM 0.33's own code on CPU.

What the recommend conformance needs between a printed command line and vLLM's sizing:

* :func:`split_launch` - the line's environment assignments, launcher, model and flags
  (``shlex``, as a shell splits it), with the ``MODEL`` / ``DRAFT`` placeholders replaced by
  directories: the model where the line names it, the draft inside ``--speculative-config``'s
  JSON (its ``model`` key, the JSON re-encoded).
* :func:`parse_launch` - ``vllm serve MODEL flags`` through vLLM's own parser and
  ``create_engine_config`` (:func:`vllm_budget.engine_config`) on the GPU's compute capability,
  under the line's environment. ``vllm serve``'s own parser (``entrypoints/cli/serve.py``)
  imports the API server (uvicorn), which this CPU install does not have; its positional
  ``model_tag`` becomes ``--model`` of ``EngineArgs`` here, as ``ServeSubcommand.cmd`` copies
  ``args.model_tag`` to ``args.model``. ``--skip-tokenizer-init`` is added: the fixtures ship
  no tokenizer, and nothing on the sizing path reads one.
* :func:`start_parsed` - ``vllm_engine.start``'s KV-cache start-up run on the parsed
  ``VllmConfig`` itself: ``start`` builds its config from a ``Case`` (``vllm_config``); here
  that one call answers with (a copy of) the parsed config, and the ``Case`` carries only what
  ``start`` reads besides it - the model's layer prefix, TP, PP, the MLA backend, the KDA
  prefill backend, the KV layout and the budget - each read off the parsed config
  (:func:`case_of`).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import vllm_engine
from vllm.config import VllmConfig
from vllm_budget import engine_config
from vllm_engine import Case, Engine

LAUNCHER = ("vllm", "serve")
MODEL = "MODEL"
DRAFT = "DRAFT"


@dataclass(frozen=True)
class Launch:
    """A launch line taken apart: its environment and the flags after ``vllm serve MODEL``."""

    env: dict[str, str]
    flags: list[str]


def split_launch(line: str, model: Path, draft: Path | None = None) -> Launch:
    """``line`` split as a shell splits it, the placeholders replaced (module docstring).
    Fails where the line does not start ``[NAME=value ...] vllm serve MODEL``."""
    words = shlex.split(line)
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    assert tuple(words[:2]) == LAUNCHER, line
    assert words[2] == MODEL, line
    flags = ["--model", str(model), *words[3:]]
    if "--speculative-config" in flags:
        at = flags.index("--speculative-config") + 1
        speculative = json.loads(flags[at])
        if speculative.get("model") == DRAFT:
            assert draft is not None, "the line names a draft: give its directory"
            speculative["model"] = str(draft)
        flags[at] = json.dumps(speculative)
    assert MODEL not in flags and DRAFT not in " ".join(flags), flags
    return Launch(env=env, flags=flags)


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block (vLLM reads its ``VLLM_*`` settings there)."""
    with mock.patch.dict(os.environ, values):
        yield


def parse_launch(launch: Launch, capability: tuple[int, int]) -> VllmConfig:
    """The ``VllmConfig`` vLLM builds for ``launch`` on a GPU of ``capability``. Raises
    ``SystemExit`` where vLLM's parser rejects a flag, and what ``create_engine_config``
    raises for a configuration vLLM refuses."""
    with environment(launch.env):
        return engine_config([*launch.flags, "--skip-tokenizer-init"], capability)


KV_CACHE_DTYPE = {theirs: ours for ours, theirs in vllm_engine.KV_CACHE_DTYPE.items()}
"""vLLM's ``--kv-cache-dtype`` -> the harness's name (``auto``: bf16)."""


def case_of(config: VllmConfig, launch: Launch, model: str, memory_bytes: int) -> Case:
    """The harness ``Case`` of a parsed config: ``model`` is the harness's model key (the
    layers' name prefix), ``memory_bytes`` the KV budget each rank gives."""
    parallel, cache = config.parallel_config, config.cache_config
    backend = config.attention_config.backend
    assert backend is not None, "the harness builds MLA layers for a named --attention-backend"
    speculative = config.speculative_config
    partition = launch.env.get("VLLM_PP_LAYER_PARTITION")
    return Case(
        model=model,
        attn_tp=parallel.tensor_parallel_size,
        kv_dtype=KV_CACHE_DTYPE[cache.cache_dtype],
        pp=parallel.pipeline_parallel_size,
        dcp=parallel.decode_context_parallel_size,
        backend=backend.name,
        block_tokens=cache.block_size if "--block-size" in launch.flags else None,
        kv_cache_layout=launch.env.get("VLLM_KV_CACHE_LAYOUT", "LBNHC"),
        max_model_len=config.model_config.max_model_len,
        prefix_caching=bool(cache.enable_prefix_caching),
        # vLLM resolves "auto" on the GPU (resolve_kda_prefill_backend); the lines tested
        # name the backend, and a model without K3's full-rank gate never reads it
        kda_prefill_backend=(config.additional_config or {}).get("kda_prefill_backend", "triton"),
        memory_bytes=memory_bytes,
        spec_tokens=speculative.num_speculative_tokens if speculative is not None else 0,
        drafter=speculative.method if speculative is not None else None,
        pp_partition=tuple(map(int, partition.split(","))) if partition else None,
    )


def start_parsed(config: VllmConfig, case: Case, tmp: Path) -> Engine:
    """``vllm_engine.start`` for ``case`` with the parsed ``config`` as the engine core's
    config (the one ``start`` would otherwise build from ``case``)."""
    # what the harness's own config sets for a CUDA engine: the parsed one must say the same
    assert not config.scheduler_config.disable_hybrid_kv_cache_manager
    with mock.patch.object(vllm_engine, "vllm_config", lambda *_: copy.deepcopy(config)):
        return vllm_engine.start(case, tmp)
