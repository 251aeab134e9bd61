"""The one refusal type: a configuration the planner cannot serve, with the facts of why.

Every rule the planner enforces raises :class:`Refusal`, and so does every bad input to the
public API and the command line: a record built from bad field values (pydantic's validation
of a :class:`~k3layout.HybridModel` or :class:`~k3layout.Deployment`, ``load_plan``), an
argument of the wrong type, a size beyond the planner's bounds (``size_limit``). It is a
``ValueError``, so ``except ValueError`` at an engine's startup catches it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, TypeAlias, TypedDict

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
    # an engine declared under the k3layout.engines entry points that does not load
    "engine_plugin",
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


CheckName: TypeAlias = Literal[
    "validate",
    "check_aliasing",
    "check_pools",
    "check_kv_cache_config",
    "check_kv_caches",
    "plane_order",
]
"""The checks of live engine state against a plan whose refusals carry :class:`CheckFacts`:
the adapter's ``validate`` (either registered dict), the ride's ``check_aliasing`` and
``plane_order`` (matched on addresses), SGLang's
``check_pools`` and vLLM's bridge (``check_kv_cache_config``, ``check_kv_caches``; the startup
plugin runs these two)."""


class CheckFacts(TypedDict):
    """The one facts schema of every refusal a check raises (:data:`CheckName`): the same keys,
    always present, with the same types, so that engine code can log or branch on them without
    parsing a message. ``None`` where a key does not apply (a refusal of the whole stage names
    no layer).

    - ``check``: the check that refused (:data:`CheckName`);
    - ``field``: what differs (``names``, ``groups``, ``type``, ``count``, ``dtype``,
      ``shape``, ``strides``, ``offset_bytes``, ``storage``, ``overlap``, ``plane_order``,
      ``layer_order``, ``layers``, ``planes``, ``plane``, ``layout``, ``size_bytes``,
      ``block_stride_bytes``, ``parts``);
    - ``stage``: the pipeline stage checked;
    - ``layer``: the **module layer index** (``model.layers.40`` is 40; a draft's layers
      continue the numbering), never a position in a group;
    - ``layer_name``: the name the engine registered or bound it under;
    - ``group``: the plan's **group name** (``linear_attention_1``), never an index;
    - ``position``: the layer's position in its group (``j``: it sits on plane ``j``);
    - ``plane``: the plane the plan puts it on; ``part``: the part (``conv``, ``latent``,
      ``kv_buffer``, ...); ``block``: the block whose page was compared;
    - ``expected``, ``actual``: the plan's value and the engine's, as numbers, strings or
      tuples (a shape is a tuple of ints, a dtype a string, an offset an int in bytes from
      the start of the backing).

    Optional keys, each with one type (:data:`CHECK_FACT_EXTRAS`): ``found_plane`` (where
    the bytes are), ``order`` (planes in another order: the plan's planes as the backing holds
    them, first to last; ``expected`` is the plan's own order), ``moved`` (the layers a
    reordering moves), ``missing`` / ``extra`` / ``repeated`` (layer names),
    ``misplaced_by``, ``num_misplaced``, ``outside_image``, ``other_layer`` (the layer or
    pool tensor whose bytes it shares).

    Refusals of the arguments themselves (a plan that is not one, a stage out of range) carry
    the inputs' facts instead: ``field`` (the argument), ``expected`` and ``got``.
    """

    check: CheckName
    field: str
    stage: int
    layer: int | None
    layer_name: str | None
    group: str | None
    position: int | None
    plane: int | None
    part: str | None
    block: int | None
    expected: Fact
    actual: Fact


CHECK_FACT_KEYS: Final[tuple[str, ...]] = tuple(CheckFacts.__annotations__)
"""The keys every check's refusal carries, in :class:`CheckFacts`' order."""

_OPTIONAL_INT = (int, type(None))
_OPTIONAL_STR = (str, type(None))
CHECK_FACT_TYPES: Final[Mapping[str, tuple[type, ...]]] = {
    "check": (str,),
    "field": (str,),
    "stage": (int,),
    "layer": _OPTIONAL_INT,
    "layer_name": _OPTIONAL_STR,
    "group": _OPTIONAL_STR,
    "position": _OPTIONAL_INT,
    "plane": _OPTIONAL_INT,
    "part": _OPTIONAL_STR,
    "block": _OPTIONAL_INT,
    "expected": (int, str, bool, tuple, type(None)),
    "actual": (int, str, bool, tuple, type(None)),
}
"""The type of each key of :class:`CheckFacts`."""

CHECK_FACT_EXTRAS: Final[Mapping[str, tuple[type, ...]]] = {
    "found_plane": _OPTIONAL_INT,
    "order": (tuple,),
    "moved": (tuple,),
    "missing": (tuple,),
    "extra": (tuple,),
    "repeated": (tuple,),
    "misplaced_by": (str,),
    "num_misplaced": (int,),
    "outside_image": (tuple,),
    "other_layer": _OPTIONAL_STR,
}
"""The optional keys a check's refusal may add, and the type of each."""


def check_facts_violations(facts: Mapping[str, object]) -> list[str]:
    """What keeps ``facts`` from :class:`CheckFacts`' schema: a key missing, a key the schema
    does not name, a value of another type (``[]`` when it holds).

    >>> check_facts_violations({"check": "validate"})[:1]
    ['missing key field']
    """
    problems = [f"missing key {key}" for key in CHECK_FACT_KEYS if key not in facts]
    for key, value in facts.items():
        types = CHECK_FACT_TYPES.get(key) or CHECK_FACT_EXTRAS.get(key)
        if types is None:
            problems.append(f"key {key} is not in the schema")
        elif (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            problems.append(f"{key}={value!r} is a {type(value).__name__}, not {types}")
        elif isinstance(value, tuple) and len({type(v) for v in value}) > 1:
            problems.append(f"{key}={value!r} mixes types")
    return problems


def check_refusal(
    code: RefusalCode,
    message: str,
    *,
    check: CheckName,
    field: str,
    stage: int,
    expected: Fact,
    actual: Fact,
    hint: str,
    layer: int | None = None,
    layer_name: str | None = None,
    group: str | None = None,
    position: int | None = None,
    plane: int | None = None,
    part: str | None = None,
    block: int | None = None,
    extra_facts: Mapping[str, Fact] | None = None,
    **extras: Fact,
) -> Refusal:
    """A check's refusal with its facts in :class:`CheckFacts`' schema (``extra_facts``
    and ``extras``: keys of :data:`CHECK_FACT_EXTRAS`)."""
    facts: dict[str, Fact] = {
        "check": check,
        "field": field,
        "stage": stage,
        "layer": layer,
        "layer_name": layer_name,
        "group": group,
        "position": position,
        "plane": plane,
        "part": part,
        "block": block,
        "expected": expected,
        "actual": actual,
        **(extra_facts or {}),
        **extras,
    }
    return Refusal(code, message, facts=facts, hint=hint)
