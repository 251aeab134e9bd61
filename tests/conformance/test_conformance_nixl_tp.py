"""The planner's vLLM prefill-to-decode rules against vLLM 0.33's NIXL connector, run on CPU.

For each prefill / decode pair, ``vllm_nixl.nixl_outcome`` starts both sides' KV caches and
NIXL workers with vLLM's own code and runs the decode's handshake with every prefill rank it
reads from (the ``nixl`` package is not installed: its agent is a recorder, see the harness).
The planner must answer the same:

* ``nixl_refusal`` (``k3layout.engines.vllm``) refuses exactly where vLLM raises, at the same
  step (a side's start-up, named by ``facts["side"]``; the handshake) and check (the vLLM
  function that raised, named in the refusal), and, at the handshake, with every number
  vLLM's message gives (its TP sizes, DCP sizes, kernel-block counts);
* ``plan_transfer`` with ``engine="vllm"`` refuses (``tp_not_multiple``, naming
  ``TransferTopology.tp_ratio``) exactly where vLLM's TP rule raises, and where vLLM serves
  the pair, every decode rank reads its MLA latent and its KDA state from the prefill ranks
  vLLM's TP mapping names.

Grid: prefill TP x decode TP over ``TP_SIZES`` for Kimi-K3 and over the TPs that divide
Kimi-Linear's 32 KDA heads, channel-major conv state and prefix caching off (what vLLM needs
for heterogeneous TP of a hybrid model); then prefix caching on, decode DCP, a time-major conv
state and pipeline stages, each where vLLM refuses.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from vllm_required import require_vllm, running

require_vllm()
RELEASE = running()
"""The vLLM release installed, which k3layout plans for."""

import vllm_nixl  # noqa: E402

from k3layout import Deployment, Refusal, plan_transfer, preset  # noqa: E402
from k3layout.engines.vllm import nixl_refusal  # noqa: E402

TP_SIZES = (1, 2, 3, 4, 6, 8, 16)
LINEAR_TP_SIZES = (1, 2, 4, 8, 16)  # the TPs that divide Kimi-Linear's 32 KDA heads
PRESETS = {"kimi-k3": "kimi-k3", "kimi-linear": "kimi-linear-48b"}
CHECKS = {
    "tp_not_multiple": "tp_ratio",
    "dcp_unsupported": "_validate_remote_agent_handshake",
    "block_unsupported": "_validate_remote_agent_handshake",
    "layout_unsupported": "__init__",
    "engine_setting": "__init__",
}
"""The vLLM function that raises for each of the planner's refusal codes."""


@dataclass(frozen=True)
class Case:
    model: str
    prefill_tp: int
    decode_tp: int
    dcp: int = 1
    prefix_caching: bool = False
    conv_layout: str = "DS"
    prefill_pp: int = 1
    decode_pp: int = 1

    @property
    def id(self) -> str:
        parts = [self.model, f"P{self.prefill_tp}", f"D{self.decode_tp}"]
        parts += [f"dcp{self.dcp}"] * (self.dcp > 1)
        parts += ["prefix"] * self.prefix_caching + [self.conv_layout] * (self.conv_layout != "DS")
        parts += [f"pp{self.prefill_pp}to{self.decode_pp}"] * (self.prefill_pp * self.decode_pp > 1)
        return "-".join(parts)

    def deployments(self) -> tuple[Deployment, Deployment]:
        shared: dict[str, Any] = {
            "conv_layout": self.conv_layout,
            "prefix_caching": self.prefix_caching,
            "attention_backend": "FLASHMLA",  # the harness's backend
        }
        return (
            Deployment(
                engine_version=RELEASE, attn_tp=self.prefill_tp, pp=self.prefill_pp, **shared
            ),
            Deployment(
                engine_version=RELEASE,
                attn_tp=self.decode_tp,
                pp=self.decode_pp,
                dcp=self.dcp,
                **shared,
            ),
        )


GRID = [Case("kimi-k3", p, d) for p, d in itertools.product(TP_SIZES, repeat=2)] + [
    Case("kimi-linear", p, d) for p, d in itertools.product(LINEAR_TP_SIZES, repeat=2)
]
PREFIX = [
    Case(model, p, d, prefix_caching=True)
    for model in PRESETS
    for p, d in itertools.product((1, 2, 4, 8), repeat=2)
]
DCP = [
    Case("kimi-k3", p, d, dcp=c)
    for p, d, c in ((1, 8, 8), (2, 4, 2), (4, 4, 2), (8, 8, 8), (8, 2, 2), (2, 3, 3), (3, 6, 3))
] + [Case("kimi-linear", 2, 8, dcp=4), Case("kimi-linear", 8, 8, dcp=2, prefix_caching=True)]
LAYOUT = [Case("kimi-k3", p, d, conv_layout="SD") for p, d in ((2, 2), (2, 3), (8, 2))]
PP = [
    Case("kimi-k3", 2, 2, prefill_pp=2),
    Case("kimi-k3", 2, 4, decode_pp=2),
    Case("kimi-k3", 1, 8, dcp=8, prefill_pp=8, conv_layout="SD"),  # the docs' golden case
    Case("kimi-linear", 4, 4, prefill_pp=2, decode_pp=2),
]
CASES = GRID + PREFIX + DCP + LAYOUT + PP


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nixl")


@functools.cache
def _outcome(case: Case, tmp: Path) -> dict[str, Any]:
    return vllm_nixl.nixl_outcome(
        case.model,
        vllm_nixl.Side(
            case.model, case.prefill_tp, pp=case.prefill_pp, prefix_caching=case.prefix_caching
        ),
        vllm_nixl.Side(
            case.model,
            case.decode_tp,
            pp=case.decode_pp,
            dcp=case.dcp,
            prefix_caching=case.prefix_caching,
        ),
        conv_layout=case.conv_layout,
        tmp=tmp,
    )


def _numbers(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"\d+", text.replace(",", ""))}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_nixl_refusal_refuses_where_vllms_connector_raises(case: Case, tmp: Path) -> None:
    outcome = _outcome(case, tmp)
    prefill, decode = case.deployments()
    ours = nixl_refusal(preset(PRESETS[case.model]), prefill, decode)
    theirs = outcome["refused"]
    if theirs is None:
        assert ours is None, f"vLLM serves it; the planner refuses: {ours}"
        return
    assert ours is not None, f"vLLM refuses it ({theirs}); the planner does not"
    assert CHECKS[ours.code] == theirs["check"], (ours, theirs)
    assert theirs["check"] in str(ours)  # the refusal names vLLM's check
    if theirs["step"] == "handshake":
        # vLLM's message gives the values it compared; the refusal gives each of them
        assert _numbers(theirs["message"]) <= _numbers(str(ours)), (ours, theirs)
    else:
        assert theirs["step"] == f"{ours.facts['side']}_init", (ours, theirs)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_plan_transfer_refuses_where_vllms_tp_rule_raises_and_pairs_as_vllm_maps(
    case: Case, tmp: Path
) -> None:
    outcome = _outcome(case, tmp)
    theirs = outcome["refused"]
    prefill, decode = case.deployments()
    if theirs is not None and theirs["step"] != "handshake":
        # vLLM refused at a side's start-up, before its TP rule: the planner refuses there too
        ours = nixl_refusal(preset(PRESETS[case.model]), prefill, decode)
        assert ours is not None and theirs["step"] == f"{ours.facts['side']}_init", (ours, theirs)
        return
    try:
        result = plan_transfer(preset(PRESETS[case.model]), prefill, decode, prompt_tokens=64)
    except Refusal as refusal:
        assert theirs is not None and theirs["check"] == "tp_ratio", refusal
        assert refusal.code == "tp_not_multiple"
        assert "TransferTopology.tp_ratio" in str(refusal)
        assert _numbers(theirs["message"]) <= _numbers(str(refusal))
        return
    assert theirs is None or theirs["check"] != "tp_ratio", "vLLM's TP rule refuses it"
    if theirs is not None:
        return  # refused after the TP rule: nixl_refusal's (the test above)
    for consumer, sources in outcome["sources"].items():
        pairs = result.pairs_to(consumer)
        latent = sorted(p.producer for p in pairs if p.kind_bytes("page"))
        state = sorted(p.producer for p in pairs if p.kind_bytes("slot"))
        assert {"attention": latent, "state": state} == sources, consumer


def test_the_grid_holds_pairs_vllm_serves_and_pairs_it_refuses(tmp: Path) -> None:
    """No test that cannot fail: each kind of outcome occurs in the grid."""
    checks = {(_outcome(c, tmp)["refused"] or {}).get("check") for c in CASES}
    assert checks == {None, "tp_ratio", "_validate_remote_agent_handshake", "__init__"}
    gathered = _outcome(Case("kimi-k3", 8, 2), tmp)["sources"]
    assert gathered[1] == {"attention": [4], "state": [4, 5, 6, 7]}
