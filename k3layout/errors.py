"""The one refusal type: a configuration the planner cannot serve, with the facts of why.

Every rule the planner enforces raises :class:`Refusal`, and so does every bad input to the
public API and the command line: a record built from bad field values (pydantic's validation
of a :class:`~k3layout.HybridModel` or :class:`~k3layout.Deployment`, ``load_plan``), an
argument of the wrong type, a size beyond the planner's bounds (``size_limit``). It is a
``ValueError``, so ``except ValueError`` at an engine's startup catches it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypeAlias

RefusalCode: TypeAlias = Literal[
    # model x deployment
    "heads_not_divisible",
    "mixed_layer_specs",
    "dcp_not_dividing_tp",
    "dcp_interleave",
    "dcp_unsupported",
    "pp_too_deep",
    "pp_partition",
    "pp_unsupported",
    # engine layouts
    "padding_limit",
    "packing_search_exhausted",
    "budget_too_small",
    "page_size",
    # vLLM's own rules (k3layout.engines.vllm.rules) and settings of one engine only
    "block_unsupported",
    "layout_unsupported",
    "engine_setting",
    "version_unsupported",
    "kernel_unsupported",
    "spec_tokens",
    "stage_without_attention",
    "draft_unsupported",
    # offload (LMCache MP ride)
    "engine_mismatch",
    "model_not_ridable",
    "mamba_cache_mode",
    "prefix_caching_off",
    "load_failure_policy",
    "chunk_off_grid",
    "connector_unsupported",
    "aliasing",
    "layer_names",
    # prefill-to-decode transfer
    "tp_not_multiple",
    "head_group_mismatch",
    "chunked_dcp_stateful",
    "model_mismatch",
    # torch adapter
    "tensor_mismatch",
    # weights and the GPU's memory
    "weights_unknown",
    "quantization_unsupported",
    "weights_do_not_fit",
    "memory_exceeded",
    # records: a stored number that its own inputs do not give
    "plan_mismatch",
    # inputs
    "invalid_config",
    "unknown_model",
    "invalid_argument",
    "uneven_split",
    "dtype_unsupported",
    "size_limit",
]
"""Stable machine-readable refusal codes. New codes may be added; existing ones never change."""

Fact: TypeAlias = int | float | str | bool | tuple[int, ...] | tuple[str, ...] | None


class Refusal(ValueError):
    """A configuration the planner cannot serve.

    ``code`` is stable and machine-readable, ``facts`` holds the values on both sides of the
    rule that failed, ``hint`` says what would work. ``str(refusal)`` reads
    ``"<thing>: <rule> (<a>=<x>, <b>=<y>); <what would work>"``, the hint said once: a message
    that already ends with it (one refusal re-raised under another's words) is not given it
    again, and :meth:`to_dict` keeps the message and the hint apart.

    >>> r = Refusal("heads_not_divisible", "KDA num_heads=96 must be divisible by attn_tp=5",
    ...             facts={"num_heads": 96, "attn_tp": 5}, hint="attn_tp=4 or attn_tp=6 would")
    >>> r.code
    'heads_not_divisible'
    >>> str(r)
    'KDA num_heads=96 must be divisible by attn_tp=5; attn_tp=4 or attn_tp=6 would'

    """

    code: RefusalCode
    message: str
    facts: Mapping[str, Fact]
    hint: str | None

    def __init__(
        self,
        code: RefusalCode,
        message: str,
        *,
        facts: Mapping[str, Fact] | None = None,
        hint: str | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.facts = dict(facts or {})
        self.hint = hint
        said = not hint or message.endswith(hint)
        super().__init__(message if said else f"{message}; {hint}")

    def to_dict(self) -> dict[str, object]:
        """The refusal as JSON-ready data: ``code``, ``message`` (the rule that failed, without
        the hint), ``hint`` (what would work) and ``facts``; each said once."""
        return {
            "code": self.code,
            "message": self.message.removesuffix(f"; {self.hint}") if self.hint else self.message,
            "hint": self.hint,
            "facts": {k: list(v) if isinstance(v, tuple) else v for k, v in self.facts.items()},
        }

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments need an explicit reduce to survive pickling (multiprocessing).
        return (_rebuild, (self.code, self.message, dict(self.facts), self.hint))


def _rebuild(
    code: RefusalCode, message: str, facts: Mapping[str, Fact], hint: str | None
) -> Refusal:
    return Refusal(code, message, facts=facts, hint=hint)
