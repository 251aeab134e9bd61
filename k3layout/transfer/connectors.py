"""The prefill-to-decode rule an engine registers: which TP pairs its connector serves.

The decode pulls, so the decode engine's rule decides. An engine package holds its
:class:`PdRule` as ``PD_RULE`` in its ``pd`` module, where it has one (found by name, as
:mod:`k3layout.testing` finds an engine's ``strategies``, so planning alone never loads it);
the transfer plan asks :func:`pd_rule_of` for the decode's engine and, where it has none,
falls back on the engine's facts (``gathers_state``, ``pd_refusal_note``). The core names no
engine.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from ..errors import Refusal
from ..registry import canonical_name, facts_of
from .pairing import tp_multiple_refusal

__all__ = ["PD_MODULE", "PdRule", "gathers_state", "pd_rule_of", "tp_pair_refusal"]

PD_MODULE = "pd"
"""The module of an engine package that holds its P/D rule as ``PD_RULE``."""


@dataclass(frozen=True)
class PdRule:
    """One engine's prefill-to-decode TP rule.

    - ``engine``: the engine's registered name;
    - ``release``: the release the rule was read from and run against (``"vLLM 0.33.0"``);
    - ``connector``: the connector whose code decides (``"NIXL"``);
    - ``gathers_state``: whether a decode rank gathers its KDA heads from several prefill
      ranks (prefill TP a multiple of decode TP), the first of which sends the latent rows;
    - ``tp_refusal``: ``(prefill_tp, decode_tp) -> Refusal | None``, the engine's own refusal
      of a TP pair, with its reason and what would work.
    """

    engine: str
    release: str
    connector: str
    gathers_state: bool
    tp_refusal: Callable[[int, int], Refusal | None]

    @property
    def label(self) -> str:
        """``"vLLM 0.33.0 NIXL"``: the release and connector whose rule decides."""
        return f"{self.release} {self.connector}"


def pd_rule_of(engine: object) -> PdRule | None:
    """The P/D rule of engine ``engine`` (its package's ``pd.PD_RULE``), or ``None`` where it
    has none (refuses a name no engine registered)."""
    return _rule_of(canonical_name(engine))


@cache
def _rule_of(name: str) -> PdRule | None:
    package = facts_of(name).package
    module = f"{package}.{PD_MODULE}"
    if not package or importlib.util.find_spec(module) is None:
        return None
    rule = getattr(importlib.import_module(module), "PD_RULE", None)
    if not isinstance(rule, PdRule):
        raise TypeError(f"{module}.PD_RULE is not a PdRule: {rule!r}")
    return rule


def gathers_state(engine: object) -> bool:
    """Whether a decode of ``engine`` gathers its KDA heads from several prefill ranks: its
    P/D rule's answer, else its facts'."""
    rule = pd_rule_of(engine)
    return rule.gathers_state if rule is not None else facts_of(engine).gathers_state


def tp_pair_refusal(engine: object, prefill_tp: int, decode_tp: int) -> Refusal | None:
    """Why a decode of ``engine`` at ``decode_tp`` cannot pull from a prefill at
    ``prefill_tp``, or ``None``: its P/D rule's refusal where it registered one, else
    :func:`~.pairing.tp_multiple_refusal` with its facts. TP sizes outside ``1..MAX_RANKS``
    are refused first, whatever the engine."""
    invalid = tp_multiple_refusal(prefill_tp, decode_tp, gathers=True)
    if invalid is not None and invalid.code != "tp_not_multiple":
        return invalid
    rule = pd_rule_of(engine)
    if rule is not None:
        return rule.tp_refusal(prefill_tp, decode_tp)
    facts = facts_of(engine)
    return tp_multiple_refusal(prefill_tp, decode_tp, facts.gathers_state, facts.pd_refusal_note)
