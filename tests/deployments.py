"""Deployments whose weights each engine fits on its GPU, for the tests whose answers the GPU's
budget now bounds (issue 29): the bf16 Kimi-K3 checkpoint holds ~1.28 TiB per rank at attention
TP 8 and fits no small deployment.

- vLLM and SGLang: Kimi-K3 (bf16) at attention TP 8 x attention DP 16 with expert parallelism
  on B200s (128 ranks: the experts split whole), and Kimi-Linear on one H200 node.
- tokenspeed: it has no Kimi-Linear model and runs bf16 experts without expert parallelism
  only, so no bf16 Kimi-K3 deployment fits; its recorder's compressed-tensors MXFP4 checkpoint
  (``tests/fixtures/tokenspeed-1152/weights.json``, ``quantizations["ct-mxfp4"]``) at attention
  TP 4 (which divides the vision tower's 12 heads) x attention DP 16 with expert parallelism
  fits an H200. Its cache is bf16: tokenspeed ``main`` (the default revision) pins 12 MLA pages
  per plane, which hold a TP 4 KDA state in bf16 but not in fp8 (refused below TP 8).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from k3layout import Deployment, EngineLayout, HybridModel, plan, preset
from k3layout.model.hf_config import model_from_config

FIXTURES = Path(__file__).parent / "fixtures"
K3_MXFP4 = "kimi-k3-ct-mxfp4"
"""The name of the MXFP4 Kimi-K3 checkpoint below."""


def k3_mxfp4_config() -> dict[str, Any]:
    """The Kimi-K3 fixture with the compressed-tensors MXFP4 quantization tokenspeed's recorder
    loaded (the experts MXFP4, every other Linear ignored)."""
    config: dict[str, Any] = json.loads((FIXTURES / "kimi-k3.config.json").read_text())
    recorded = json.loads((FIXTURES / "tokenspeed-1152" / "weights.json").read_text())
    config["text_config"]["quantization_config"] = recorded["quantizations"]["ct-mxfp4"]
    return config


@cache
def k3_mxfp4() -> HybridModel:
    """:func:`k3_mxfp4_config` as k3layout loads it."""
    return model_from_config(k3_mxfp4_config(), name=K3_MXFP4)


def write_k3_mxfp4(directory: Path) -> Path:
    """:func:`k3_mxfp4_config` as a ``config.json`` in ``directory`` (for the command line)."""
    path = directory / "config.json"
    path.write_text(json.dumps(k3_mxfp4_config()))
    return path


def model_named(name: str) -> HybridModel:
    """A preset, or :data:`K3_MXFP4`."""
    return k3_mxfp4() if name == K3_MXFP4 else preset(name)


@dataclass(frozen=True)
class Case:
    """A deployment that fits its GPU, and a workload its engine's default flag holds."""

    id: str
    model: str
    fields: dict[str, Any] = field(hash=False)
    requests: int
    max_model_len: int

    @property
    def engine(self) -> str:
        return str(self.fields["engine"])

    def loaded(self) -> HybridModel:
        return model_named(self.model)

    def deployment(self, **extra: Any) -> Deployment:
        return Deployment.model_validate({**self.fields, **extra})

    def plan(self, **extra: Any) -> EngineLayout:
        result: EngineLayout = plan(self.loaded(), self.deployment(**extra))
        return result

    def options(self, model_path: Path | None = None) -> list[str]:
        """The command line's options for the model and the deployment."""
        model = str(model_path) if self.model == K3_MXFP4 and model_path else self.model
        args = ["--model", model]
        for name, value in self.fields.items():
            option = f"--{name.replace('_', '-')}"
            if value is True:
                args.append(option)
            else:
                args += [option, str(value)]
        return args


K3_EP = {"gpu": "b200", "attn_tp": 8, "attn_dp": 16, "expert_parallel": True}
TOKENSPEED_EP = {
    "gpu": "h200",
    "attn_tp": 4,
    "attn_dp": 16,
    "expert_parallel": True,
    "kv_dtype": "bf16",
}

FITTING: tuple[Case, ...] = (
    Case("vllm-k3-b200-ep128", "kimi-k3", {"engine": "vllm", **K3_EP}, 8, 131_072),
    Case(
        "vllm-linear-h200-tp8",
        "kimi-linear-48b",
        {"engine": "vllm", "gpu": "h200", "attn_tp": 8},
        64,
        131_072,
    ),
    Case("sglang-k3-b200-ep128", "kimi-k3", {"engine": "sglang", **K3_EP}, 8, 8192),
    Case(
        "sglang-linear-h200-tp8",
        "kimi-linear-48b",
        {"engine": "sglang", "gpu": "h200", "attn_tp": 8},
        64,
        131_072,
    ),
    Case(
        "tokenspeed-k3-mxfp4-h200-ep64",
        K3_MXFP4,
        {"engine": "tokenspeed", **TOKENSPEED_EP},
        8,
        131_072,
    ),
)
"""One or two fitting deployments per engine, each with a workload its default flag holds."""

BY_ENGINE: dict[str, Case] = {
    "vllm": FITTING[0],
    "sglang": FITTING[3],
    "tokenspeed": FITTING[4],
}
"""One fitting case per engine."""
