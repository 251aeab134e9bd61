"""vLLM 0.33's prefill-to-decode rules, as its NIXL connector applies them (the decode pulls).

The transfer plan finds this module by name (an engine package's ``pd`` module, where one
exists, holds its :class:`~k3layout.transfer.PdRule` as ``PD_RULE``), so importing the engine
package loads none of it.

Read off vLLM 0.33.0 by running its ``NixlConnector`` (the pull connector) on CPU:
``tests/conformance/test_conformance_nixl_tp.py`` starts both sides' workers and runs the
decode's handshake with every prefill rank it reads from, for each pair of a TP grid.

- **The TP rule** (``TransferTopology.tp_ratio``, asked by the handshake before anything
  else): the larger TP must be a multiple of the smaller. Decode TP ``k`` times the prefill's:
  ``k`` decode ranks read slices of one prefill rank. Prefill TP ``g`` times the decode's: a
  decode rank gathers its KDA heads from ``g`` prefill ranks and its MLA latent rows
  (replicated) from the first. It is ``vllm``'s :class:`~k3layout.transfer.PdRule`
  (:data:`PD_RULE`), so :func:`~k3layout.plan_transfer` applies it to every ``vllm`` decode.
- **What else the NIXL connector refuses for a hybrid (MLA + KDA) model**
  (:func:`nixl_refusal`, in the order vLLM meets them): at each side's worker start-up a conv
  state that is not channel-major (``conv_layout='DS'``), and pipeline stages (the pull
  connector takes none with the hybrid allocator; the push connector none with state
  layers); at the handshake, after the TP rule, DCP sizes that differ between the sides (the
  prefill plans no DCP here, so a DCP decode), and, with prefix caching on at the decode,
  blocks whose kernel-block count differs between the sides (vLLM raises the block with the
  TP, so every TP pair but an equal one). :func:`~k3layout.plan_transfer` plans those
  transfers (the byte copies do not depend on the connector); ask :func:`nixl_refusal`
  whether vLLM's NIXL connector serves one.
"""

from __future__ import annotations

from ..._args import expect_args
from ...deployment import Deployment
from ...errors import Refusal
from ...model import HybridModel
from ...transfer.connectors import PdRule
from ...transfer.pairing import tp_multiple_refusal
from .engine import plan_vllm
from .layout import VllmPlan
from .releases import VLLM_RELEASES_TEXT

__all__ = ["PD_RULE", "check_nixl", "nixl_refusal", "nixl_tp_refusal"]

TP_CHECK = "TransferTopology.tp_ratio"
"""The vLLM function that applies the TP rule."""
START_CHECK = "NixlBaseConnectorWorker.__init__"
"""Where a worker refuses at start-up (conv layout, pipeline stages)."""
HANDSHAKE_CHECK = "NixlBaseConnectorWorker._validate_remote_agent_handshake"
"""Where the decode refuses a prefill's handshake (DCP sizes, kernel-block counts)."""
CONNECTOR = f"{VLLM_RELEASES_TEXT}'s NIXL connector"  # the releases share its rules


def nixl_tp_refusal(prefill_tp: int, decode_tp: int) -> Refusal | None:
    """vLLM's TP rule: the larger TP a multiple of the smaller, or a refusal naming the TP
    that does not divide the other, as vLLM's check words it (decode TP 3, prefill TP 2:
    the decode's 3 is not divisible by the prefill's 2).

    >>> nixl_tp_refusal(8, 2) is None, nixl_tp_refusal(2, 3).facts["decode_tp"]
    (True, 3)
    """
    invalid = tp_multiple_refusal(prefill_tp, decode_tp, gathers=True)
    if invalid is None or invalid.code != "tp_not_multiple":
        return invalid
    if decode_tp >= prefill_tp:
        why = (
            f"decode attn_tp={decode_tp} is not divisible by prefill attn_tp={prefill_tp}: "
            f"{CONNECTOR} ({TP_CHECK}) has the decode TP, the larger, read whole slices of "
            "one prefill rank"
        )
    else:
        why = (
            f"prefill attn_tp={prefill_tp} is not divisible by decode attn_tp={decode_tp}: "
            f"{CONNECTOR} ({TP_CHECK}) has each decode rank, the fewer, gather whole prefill "
            "ranks"
        )
    return Refusal(
        "tp_not_multiple",
        why,
        facts={"prefill_tp": prefill_tp, "decode_tp": decode_tp},
        hint=f"use decode attn_tp in {_served_decode_tps(prefill_tp, decode_tp)} (it or "
        f"{prefill_tp} a multiple of the other)",
    )


def _served_decode_tps(prefill_tp: int, decode_tp: int) -> list[int]:
    """The decode TPs nearest ``decode_tp`` that pair with ``prefill_tp``: the prefill TP's
    divisors below it and its multiples either side of ``decode_tp``."""
    below = decode_tp // prefill_tp * prefill_tp
    multiples = {m for m in (below, below + prefill_tp) if m > 0}
    divisors = {d for d in range(1, min(prefill_tp, decode_tp) + 1) if prefill_tp % d == 0}
    return sorted(multiples | {max(divisors)} if decode_tp < prefill_tp else multiples)


PD_RULE = PdRule(
    engine="vllm",
    release=VLLM_RELEASES_TEXT,
    connector="NIXL",
    gathers_state=True,  # compute_tp_mapping: a decode rank reads every prefill rank
    tp_refusal=nixl_tp_refusal,
)
"""vLLM's P/D rule, the transfer plan's for ``engine="vllm"`` decodes."""


def nixl_refusal(model: HybridModel, prefill: Deployment, decode: Deployment) -> Refusal | None:
    """Why vLLM's NIXL connector (0.33 and 0.34 alike) does not serve a ``prefill`` ->
    ``decode`` transfer of ``model``, or ``None`` where it does: the first refusal vLLM meets
    (module docstring). Each refusal's message names the vLLM check that refuses; its facts
    hold the values the check compared.

    The start-up and handshake rules beyond the TP rule are those of a hybrid model (KDA
    layers); a model without KDA layers is checked against the TP rule alone. Refuses, as
    :func:`~k3layout.plan` does, a side vLLM cannot plan.

    >>> from k3layout import Deployment, preset
    >>> k3 = preset("kimi-k3")
    >>> nixl_refusal(k3, Deployment(pp=8), Deployment(attn_tp=8, dcp=8)).facts["field"]
    'conv_layout'
    >>> ds = dict(conv_layout="DS", prefix_caching=False)
    >>> nixl_refusal(k3, Deployment(attn_tp=8, **ds), Deployment(attn_tp=2, **ds)) is None
    True
    """
    expect_args(
        ("model", model, HybridModel),
        ("prefill", prefill, Deployment),
        ("decode", decode, Deployment),
    )
    sides = (("prefill", plan_vllm(model, prefill)), ("decode", plan_vllm(model, decode)))
    hybrid = bool(model.kda_layer_ids)
    if hybrid:
        for side, planned in sides:
            refusal = _start_refusal(side, planned.deployment)
            if refusal is not None:
                return refusal
    refusal = nixl_tp_refusal(prefill.attn_tp, decode.attn_tp)
    if refusal is not None or not hybrid:
        return refusal
    if decode.dcp != prefill.dcp:
        return Refusal(
            "dcp_unsupported",
            f"decode dcp={decode.dcp} and prefill dcp={prefill.dcp}: {CONNECTOR} "
            f"({HANDSHAKE_CHECK}) moves a hybrid MLA + KDA cache only between equal DCP sizes",
            facts={
                "prefill_dcp": prefill.dcp,
                "decode_dcp": decode.dcp,
            },
            hint=f"plan the decode with dcp={prefill.dcp}",
        )
    (_, prefill_plan), (_, decode_plan) = sides
    if (decode_plan.packed or prefill_plan.packed) and (
        decode_plan.block_tokens != prefill_plan.block_tokens
    ):
        return _packed_block_refusal(prefill_plan, decode_plan)
    ours, theirs = _kernel_blocks(decode_plan), _kernel_blocks(prefill_plan)
    if decode.prefix_caching and ours != theirs:
        return Refusal(
            "block_unsupported",
            f"decode blocks of {ours} kernel blocks ({decode_plan.block_tokens:,} tokens at "
            f"attn_tp={decode.attn_tp}) and prefill blocks of {theirs} "
            f"({prefill_plan.block_tokens:,} at attn_tp={prefill.attn_tp}): with prefix caching "
            f"on at the decode, {CONNECTOR} "
            f"({HANDSHAKE_CHECK}) moves a hybrid model's state only between blocks of as many "
            "kernel blocks",
            facts={
                "decode_kernel_blocks": ours,
                "prefill_kernel_blocks": theirs,
                "decode_block_tokens": decode_plan.block_tokens,
                "prefill_block_tokens": prefill_plan.block_tokens,
            },
            hint="plan the decode with prefix_caching=False, or both sides at one attn_tp",
        )
    return None


def check_nixl(model: HybridModel, prefill: Deployment, decode: Deployment) -> None:
    """Raise :func:`nixl_refusal`'s refusal, if any."""
    refusal = nixl_refusal(model, prefill, decode)
    if refusal is not None:
        raise refusal


def _packed_block_refusal(prefill: VllmPlan, decode: VllmPlan) -> Refusal:
    """A packed layout (an indexed hybrid) moves between equal blocks only: each side's block
    follows its TP, so a pair of different TPs needs one ``block_tokens`` on both sides.
    vLLM refuses blocks that do not divide one another (``kv_connector/utils.py``), and a
    decode block a multiple of the prefill's for its tail ring, whose page does not scale
    with the block (the hybrid MLA block-length check)."""
    least = max(prefill.block_tokens, decode.block_tokens)
    return Refusal(
        "block_unsupported",
        f"prefill blocks of {prefill.block_tokens:,} tokens (attn_tp="
        f"{prefill.deployment.attn_tp}) and decode blocks of {decode.block_tokens:,} "
        f"(attn_tp={decode.deployment.attn_tp}): {CONNECTOR} moves a packed cache (latent, "
        "pooled keys, tail ring) only between blocks of one size",
        facts={
            "prefill_block_tokens": prefill.block_tokens,
            "decode_block_tokens": decode.block_tokens,
            "field": "block_tokens",
        },
        hint=f"start both sides with block_tokens={least} (--block-size {least})",
    )


def _kernel_blocks(planned: object) -> int:
    """Kernel blocks per block: what vLLM's worker calls physical blocks per logical one."""
    block: int = getattr(planned, "block_tokens")  # noqa: B009 - a VllmPlan
    kernel: int = getattr(planned, "kernel_block_tokens")  # noqa: B009
    return block // kernel


def _start_refusal(side: str, deployment: Deployment) -> Refusal | None:
    """What a hybrid model's NIXL worker refuses at ``side``'s start-up: a conv state that is
    not channel-major, then pipeline stages."""
    if deployment.conv_layout_run != "DS":
        return Refusal(
            "layout_unsupported",
            f"{side} conv_layout={deployment.conv_layout_run}: {CONNECTOR} ({START_CHECK}) "
            "reads each rank's q, k and v conv channels as separate runs, which only the "
            "channel-major layout (DS) lays out contiguously",
            facts={
                "side": side,
                "field": "conv_layout",
                "conv_layout": deployment.conv_layout_run,
            },
            hint="run both sides with conv_layout='DS' (VLLM_SSM_CONV_STATE_LAYOUT=DS)",
        )
    if deployment.pp > 1:
        return Refusal(
            "engine_setting",
            f"{side} pp={deployment.pp}: {CONNECTOR} ({START_CHECK}) takes no pipeline stages "
            "with the hybrid allocator (its push connector none with KDA state)",
            facts={
                "side": side,
                "field": "pp",
                "pp": deployment.pp,
            },
            hint=f"plan the {side} with pp=1 (attention TP or DP instead)",
        )
    return None
