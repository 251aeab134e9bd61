"""The prefill-to-decode transfer plan of one request: every (producer, consumer) pair's segments.

A prefill (pipeline stages x attention TP, attention-DP allowed) hands a request's cache to a
decode (attention TP x DCP, pipeline stages allowed) of the same model. For every module layer
a consumer rank holds, the producer is the prefill stage holding that layer, on the TP rank of
the consumer's head group (:mod:`~k3layout.transfer.pairing`):

- MLA layers (PAGE): latent rows, replicated on every TP rank; the consumer receives the rows of
  the tokens its DCP rank owns, as strided runs (:func:`~.segments.token_segments`).
- KDA layers (SLOT): conv and recurrent state (and ReplaySSM's k/u/g records), head-sharded;
  the consumer receives its TP share (:meth:`~.segments.FieldLayout.segment`). The ReplaySSM
  cursor is written whole, once, by the producer of the stage's first KDA layer.

Rows are placed by module layer: a segment names its module layers on both sides, so the
state of KDA layer 40 lands in layer 40's slot wherever the two sides cut their stages. One
segment covers every layer of one cache spec that one producer stage sends a consumer (the
copies are the same in each), so a PP8 x TP1 -> TP8 x DCP8 transfer of K3 has 3 segments per
pair, not one per layer and part.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pydantic import NonNegativeInt, PositiveInt, model_validator

from .._args import expect_args
from .._derivation import SelfChecked, check_derivation, is_deriving
from .._frozen import Frozen, trusted, trusted_filler, trusted_maker
from .._validation import describe
from ..cache import CachePart, LayerCacheSpec
from ..constants import MAX_PROMPT_TOKENS
from ..deployment import Deployment
from ..errors import Refusal
from ..layouts import Stage, plan, project_stages
from ..limits import check_bound
from ..model import HybridModel
from ..placements import Interleave
from ..registry import facts_of
from ..sizes import RankSizes, rank_sizes
from .connectors import gathers_state, tp_pair_refusal
from .pairing import (
    coords_of,
    dcp_rank_of,
    producers_of,
    rank_of,
)
from .regions import Region, layer_slot_parts, rank_regions
from .segments import (
    RegionKind,
    Segment,
    derive_part_segment,
    derive_token_segments,
    planned_segment,
    segment_fields,
)

MATCHED_FIELDS: tuple[str, ...] = (
    "kv_dtype",
    "spec_tokens",
    "conv_layout",
    "replayssm",
    "replayssm_cache_len",
)
"""Deployment fields both sides must share: the latent row (``kv_dtype``), the conv rows and
record length (``spec_tokens``), the conv state's layout the engines run (``conv_layout``, as
:attr:`~k3layout.Deployment.conv_layout_run` resolves it), and whether and how long ReplaySSM
records are kept."""


class RankPair(Frozen):
    """What producer rank ``producer`` writes to consumer rank ``consumer``."""

    producer: NonNegativeInt
    consumer: NonNegativeInt
    segments: tuple[Segment, ...]

    @property
    def total_bytes(self) -> int:
        """Bytes moved from producer to consumer."""
        return sum(segment.total_bytes for segment in self.segments)

    @property
    def num_copies(self) -> int:
        """Contiguous copies once every strided segment is expanded."""
        return sum(segment.num_copies for segment in self.segments)

    def kind_bytes(self, kind: RegionKind) -> int:
        """Bytes moved into ``page`` or ``slot`` regions."""
        return sum(s.total_bytes for s in self.segments if s.kind == kind)


class TransferPlan(SelfChecked):
    """Every copy that moves one ``prompt_tokens`` request from ``prefill`` to ``decode``.

    Producer ranks are numbered ``stage * prefill.attn_tp + tp_rank`` and consumer ranks
    ``stage * decode.attn_tp + tp_rank`` (within the attention-DP replica that serves the
    request); ``pairs`` are sorted by (producer, consumer) and hold only pairs that copy.

    A transfer plan built by hand (or loaded, or ``model_copy``'d) is planned again with
    :func:`plan_transfer` from its own model, deployments, prompt and layout: it refuses what
    :func:`plan_transfer` refuses, and pairs or segments the transfer would not give
    (``plan_mismatch``, naming the first that differs).
    """

    model: HybridModel
    prefill: Deployment
    decode: Deployment
    prompt_tokens: PositiveInt
    pairs: tuple[RankPair, ...]

    @model_validator(mode="after")
    def _is_its_own_derivation(self) -> TransferPlan:
        # Built outside plan_transfer: plan it again from every stored input, then compare.
        if not is_deriving():
            inputs: dict[str, Any] = {
                name: getattr(self, name) for name in type(self).model_fields if name != "pairs"
            }
            check_derivation(
                f"transfer plan of {self.model.name}",
                self,
                plan_transfer(**inputs),
                hint="build the transfer with k3layout.plan_transfer",
            )
        return self

    @property
    def num_producers(self) -> int:
        """Prefill ranks of one attention-DP replica: ``pp * attn_tp``."""
        return self.prefill.pp * self.prefill.attn_tp

    @property
    def num_consumers(self) -> int:
        """Decode ranks of one attention-DP replica: ``pp * attn_tp``."""
        return self.decode.pp * self.decode.attn_tp

    @cached_property
    def producer_stages(self) -> tuple[Stage, ...]:
        """The prefill's pipeline stages (module layers each holds; drafts on the last)."""
        return project_stages(self.model, self.prefill, ())

    @cached_property
    def consumer_stages(self) -> tuple[Stage, ...]:
        """The decode's pipeline stages."""
        return project_stages(self.model, self.decode, ())

    def producer_coords(self, rank: int) -> tuple[int, int]:
        """``(stage, tp_rank)`` of producer ``rank``."""
        _check_rank("producer", rank, self.num_producers)
        return coords_of(rank, self.prefill.attn_tp)

    def consumer_coords(self, rank: int) -> tuple[int, int]:
        """``(stage, tp_rank)`` of consumer ``rank``."""
        _check_rank("consumer", rank, self.num_consumers)
        return coords_of(rank, self.decode.attn_tp)

    @property
    def dcp_placement(self) -> Interleave:
        """Which decode DCP rank owns each token."""
        return self.decode.dcp_placement

    def producer_regions(self, rank: int) -> tuple[Region, ...]:
        """The regions producer ``rank`` holds for the request (all its stage's layers)."""
        stage, tp_rank = self.producer_coords(rank)
        return rank_regions(
            self.prefill,
            self.prefill_sizes,
            layers=self.producer_stages[stage].layers,
            tp_rank=tp_rank,
            prompt_tokens=self.prompt_tokens,
            rings=keeps_rings(self.model, self.prefill),
        )

    def consumer_regions(self, rank: int) -> tuple[Region, ...]:
        """The regions consumer ``rank`` holds for the request (latent: its DCP rank's rows)."""
        stage, tp_rank = self.consumer_coords(rank)
        return rank_regions(
            self.decode,
            self.decode_sizes,
            layers=self.consumer_stages[stage].layers,
            tp_rank=tp_rank,
            prompt_tokens=self.prompt_tokens,
            rings=keeps_rings(self.model, self.decode),
        )

    @cached_property
    def prefill_sizes(self) -> RankSizes:
        """The prefill's per-rank cache specs (derived once per plan)."""
        return rank_sizes(self.model, self.prefill)

    @cached_property
    def decode_sizes(self) -> RankSizes:
        """The decode's per-rank cache specs (derived once per plan)."""
        return rank_sizes(self.model, self.decode)

    @property
    def num_pairs(self) -> int:
        """(producer, consumer) pairs that copy something."""
        return len(self.pairs)

    @property
    def num_segments(self) -> int:
        """Segments over all pairs (a strided segment counts once)."""
        return sum(len(pair.segments) for pair in self.pairs)

    @property
    def num_copies(self) -> int:
        """Contiguous copies over all pairs."""
        return sum(pair.num_copies for pair in self.pairs)

    @property
    def total_bytes(self) -> int:
        """Bytes the whole transfer moves."""
        return sum(pair.total_bytes for pair in self.pairs)

    def pairs_to(self, consumer: int) -> tuple[RankPair, ...]:
        """The pairs that write consumer rank ``consumer``."""
        _check_rank("consumer", consumer, self.num_consumers)
        return tuple(pair for pair in self.pairs if pair.consumer == consumer)

    def pairs_from(self, producer: int) -> tuple[RankPair, ...]:
        """The pairs producer rank ``producer`` writes."""
        _check_rank("producer", producer, self.num_producers)
        return tuple(pair for pair in self.pairs if pair.producer == producer)

    @property
    def bytes_per_consumer(self) -> tuple[int, ...]:
        """Bytes each consumer rank receives, by consumer rank."""
        totals = [0] * self.num_consumers
        for pair in self.pairs:
            totals[pair.consumer] += pair.total_bytes
        return tuple(totals)

    @property
    def bytes_per_producer(self) -> tuple[int, ...]:
        """Bytes each producer rank sends, by producer rank."""
        totals = [0] * self.num_producers
        for pair in self.pairs:
            totals[pair.producer] += pair.total_bytes
        return tuple(totals)


def check_same_model(prefill_model: HybridModel, decode_model: HybridModel) -> None:
    """Refuse (``model_mismatch``) two models whose caches differ: layer kinds or geometries
    in module order, or draft layers. Names alone may differ (a preset and its config.json)."""
    expect_args(
        ("prefill_model", prefill_model, HybridModel), ("decode_model", decode_model, HybridModel)
    )
    ours, theirs = prefill_model.module_layers, decode_model.module_layers
    if ours == theirs:
        return
    common = min(len(ours), len(theirs))
    differ = next((i for i in range(common) if ours[i] != theirs[i]), common)
    raise Refusal(
        "model_mismatch",
        f"prefill model {prefill_model.name} ({len(ours)} module layers) and decode model "
        f"{decode_model.name} ({len(theirs)} module layers) differ from module layer {differ}",
        facts={
            "prefill_model": prefill_model.name,
            "decode_model": decode_model.name,
            "prefill_layers": len(ours),
            "decode_layers": len(theirs),
            "first_difference": differ,
        },
        hint="serve the same checkpoint (and draft) on both sides",
    )


def check_matching_deployments(prefill: Deployment, decode: Deployment) -> None:
    """Refuse (``model_mismatch``) deployments whose cache rows differ in a
    :data:`MATCHED_FIELDS` field, naming both values."""
    expect_args(("prefill", prefill, Deployment), ("decode", decode, Deployment))
    for field in MATCHED_FIELDS:
        # a field an engine may fix (the conv layout) is compared as the engines run it
        ran = f"{field}_run"
        ours = getattr(prefill, ran, getattr(prefill, field))
        theirs = getattr(decode, ran, getattr(decode, field))
        if ours != theirs:
            raise Refusal(
                "model_mismatch",
                f"prefill {field}={ours} and decode {field}={theirs} differ: the cache rows "
                "they hold do not match",
                facts={"field": field, "prefill": ours, "decode": theirs},
                hint=f"start both sides with the same {field}",
            )


def _check_pipelines(prefill: Deployment, decode: Deployment, matches: bool) -> None:
    """Refuse (``model_mismatch``) a decode pipeline the decode engine cannot pair: where its
    stages must mirror the prefill's (``matches``), the decode PP is 1 or the prefill's."""
    if matches and decode.pp not in (1, prefill.pp):
        raise Refusal(
            "model_mismatch",
            f"decode pp={decode.pp} with prefill pp={prefill.pp}: engine={decode.engine} pairs "
            "a decode pipeline only with an equal prefill one, or a decode of one stage with "
            "any",
            facts={"field": "pp", "prefill": prefill.pp, "decode": decode.pp},
            hint=f"use decode pp=1 or pp={prefill.pp}",
        )


def _check_inputs(prefill: Deployment, decode: Deployment, prompt_tokens: int) -> None:
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise Refusal(
            "invalid_argument",
            f"prompt_tokens={describe(prompt_tokens)} must be an integer >= 1 (a transfer moves "
            "one request)",
            facts={
                "prompt_tokens": prompt_tokens
                if isinstance(prompt_tokens, int | float) and abs(prompt_tokens) < 2**63
                else describe(prompt_tokens),
            },
            hint="pass the request's number of prompt tokens",
        )
    check_bound("prompt_tokens", prompt_tokens, MAX_PROMPT_TOKENS, why="a request's tokens")
    if prefill.dcp > 1:
        raise Refusal(
            "dcp_unsupported",
            f"prefill dcp={prefill.dcp}: the transfer reads every latent row from each "
            "prefill TP rank, and a DCP prefill holds only its own",
            facts={"side": "prefill", "dcp": prefill.dcp},
            hint="plan the prefill with dcp=1 (DCP is a decode setting)",
        )


def plan_transfer(
    model: HybridModel,
    prefill: Deployment,
    decode: Deployment,
    *,
    prompt_tokens: int,
    decode_model: HybridModel | None = None,
) -> TransferPlan:
    """Plan the transfer of one ``prompt_tokens`` request from ``prefill`` to ``decode``.

    Both deployments must be plannable for ``model`` (:func:`~k3layout.plan`'s refusals) and
    share :data:`MATCHED_FIELDS`; ``decode_model``, when the decode names its own, must have
    the same layers (``model_mismatch``). The decode pulls, so its engine's P/D rule decides
    which TP pairs pair (``tp_not_multiple``, with the engine's reason): the one it
    registered (:func:`~k3layout.transfer.pd_rule_of`), else its facts (a decode TP a
    multiple of the prefill's, or, where the engine gathers, either). ``prompt_tokens`` has
    no default: the bytes moved follow it.

    >>> from k3layout import Deployment, preset
    >>> p = plan_transfer(preset("kimi-k3"), Deployment(pp=8), Deployment(attn_tp=8, dcp=8),
    ...                   prompt_tokens=4096)
    >>> p.num_pairs, p.bytes_per_consumer[0] == 69 * 814_080 + 24 * 512 * 576
    (64, True)
    """
    expect_args(
        ("model", model, HybridModel),
        ("prefill", prefill, Deployment),
        ("decode", decode, Deployment),
        ("decode_model", decode_model, (HybridModel, type(None))),
    )
    _check_inputs(prefill, decode, prompt_tokens)
    if decode_model is not None:
        check_same_model(model, decode_model)
    check_matching_deployments(prefill, decode)
    prefill_plan = plan(model, prefill)
    decode_plan = plan(model, decode)
    rings = _check_rings(prefill_plan, decode_plan)
    model = prefill_plan.model  # what the engine builds (no draft without spec tokens)
    # the decode pulls: its engine's rank mapping decides who feeds whom
    facts = facts_of(decode.engine)
    gathers = gathers_state(decode.engine)
    refusal = tp_pair_refusal(decode.engine, prefill.attn_tp, decode.attn_tp)
    if refusal is not None:
        raise refusal
    _check_pipelines(prefill, decode, facts.decode_pp_matches_prefill)
    producer_stage: dict[int, int] = {}  # module layer -> the prefill stage holding it
    for held in prefill_plan.stages:
        producer_stage.update(dict.fromkeys(held.layers, held.index))
    sizes = decode_plan.sizes
    cursor = sizes.cursor
    tp_p, tp_d = prefill.attn_tp, decode.attn_tp
    num_consumers = decode.pp * tp_d
    pairs: list[tuple[int, RankPair]] = []  # by (producer, consumer), as one sort key
    # A layer's segments differ from another layer of its spec only in the layers they name:
    # each consumer TP rank's segments of each spec are built (and checked) once, at the
    # first layer that needs them, then named for every run of layers that one producer
    # stage sends of that spec.
    built: list[dict[tuple[int, int], tuple[dict[str, Any], ...]]] = [{} for _ in range(tp_d)]
    part_rows: dict[int, tuple[tuple[CachePart, int, int], ...]] = {}  # by spec, for every rank
    name_run, make_pair = trusted_filler(Segment, "layers"), trusted_maker(RankPair)
    # Each consumer TP rank's producers, in its head group by construction (part_segment
    # refuses a share outside the producer's, and transfer_violations checks every pair);
    # the first also sends the replicated rows (the others' copies would write them again).
    sources = tuple(
        (tp_rank, source, source == found[0])
        for tp_rank in range(tp_d)
        for found in (producers_of(tp_rank, tp_p, tp_d, gathers),)
        for source in found
    )
    for stage in decode_plan.stages:
        runs = _layer_runs(stage.layers, producer_stage, sizes.layer_specs)
        first_state = next(
            (
                layer
                for layer in stage.layers
                if sizes.specs[sizes.layer_specs[layer]].paging == "slot"
            ),
            None,
        )
        cursor_stage = None if first_state is None else producer_stage[first_state]
        for tp_rank, source, writes_rows in sources:
            templates = built[tp_rank]
            consumer = rank_of(stage.index, tp_rank, tp_d)
            for producer_stage_index, stage_runs in runs.items():
                segments: list[Segment] = []
                for index, layers in stage_runs:
                    if not writes_rows and sizes.specs[index].paging == "token":
                        continue
                    first = templates.get((index, source))
                    if first is None:
                        first = templates[(index, source)] = _spec_segments(
                            sizes,
                            index,
                            layers[0],
                            ((tp_p, source), (tp_d, tp_rank)),
                            prompt_tokens=prompt_tokens,
                            dcp_rank=dcp_rank_of(tp_rank, decode.dcp),
                            part_rows=part_rows,
                            gather=gathers,
                        )
                    # Built above from validated fields for the run's first layer: nothing
                    # to re-validate in naming the run.
                    segments += name_run(first, layers)
                    ring = sizes.ring
                    if rings and ring is not None and sizes.specs[index].pooled:
                        # The tail ring, replicated: whole, from the first producer only.
                        segments += name_run(
                            tuple(
                                derive_part_segment(
                                    part,
                                    layers[0],
                                    (tp_p, source),
                                    (tp_d, tp_rank),
                                    segment_fields,
                                )
                                for part in ring.parts
                            ),
                            layers,
                        )
                if cursor is not None and writes_rows and producer_stage_index == cursor_stage:
                    segments.append(
                        derive_part_segment(
                            cursor.parts[0],
                            None,
                            (tp_p, source),
                            (tp_d, tp_rank),
                            planned_segment,
                        )
                    )
                if not segments:  # a DCP rank that owns none of a short prompt's tokens
                    continue
                producer = rank_of(producer_stage_index, source, tp_p)
                pair = {"producer": producer, "consumer": consumer, "segments": tuple(segments)}
                pairs.append((producer * num_consumers + consumer, make_pair(pair)))
    pairs.sort(key=_sort_key)
    # Inputs checked above and pairs derived from them: the transfer is its own derivation,
    # nothing to re-validate or re-plan.
    return trusted(
        TransferPlan,
        model=model,
        prefill=prefill,
        decode=decode,
        prompt_tokens=prompt_tokens,
        pairs=tuple(pair for _, pair in pairs),
    )


def keeps_rings(model: HybridModel, deployment: Deployment) -> bool:
    """Whether ``deployment``'s engine keeps an indexed layer's tail ring (vLLM's packed
    layout gives the rings a group of their own; SGLang keeps none by default)."""
    return bool(plan(model, deployment).groups_of("ring"))


def _check_rings(prefill: Any, decode: Any) -> bool:
    """Whether the request's tail rings move (both sides keep them); refuses
    (``model_mismatch``) a pair where one side keeps them and the other does not, and
    (``dcp_unsupported``) pooled keys dealt by DCP, whose entries span DCP ranks."""
    sides = [bool(side.groups_of("ring")) for side in (prefill, decode)]
    if sides[0] != sides[1]:
        keeps = "prefill" if sides[0] else "decode"
        raise Refusal(
            "model_mismatch",
            f"the {keeps} engine keeps the indexed layers' tail rings and the other does not: "
            "the request's rings have nowhere to go",
            facts={"prefill_rings": sides[0], "decode_rings": sides[1]},
            hint="run both sides on one engine",
        )
    pooled = any(spec.pooled for spec in decode.sizes.specs)
    if pooled and (prefill.deployment.dcp > 1 or decode.deployment.dcp > 1):
        raise Refusal(
            "dcp_unsupported",
            "a pooled key cache dealt by DCP: its entries span the DCP ranks' tokens, which "
            "the transfer's row copies do not describe",
            facts={"prefill_dcp": prefill.deployment.dcp, "decode_dcp": decode.deployment.dcp},
            hint="plan the transfer with dcp=1 on both sides",
        )
    return sides[0]


def _sort_key(keyed: tuple[int, RankPair]) -> int:
    return keyed[0]


def _layer_runs(
    layers: tuple[int, ...], producer_stage: dict[int, int], layer_specs: tuple[int, ...]
) -> dict[int, list[tuple[int, tuple[int, ...]]]]:
    """A decode stage's ``layers`` by producer stage, then by cache spec index: each producer
    stage's runs ``(spec index, layers)``, layers in module order, runs in the order of their
    first layer. One segment of each part names each run."""
    runs: dict[tuple[int, int], list[int]] = {}
    for layer in layers:
        runs.setdefault((producer_stage[layer], layer_specs[layer]), []).append(layer)
    by_stage: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    for (stage, index), run in runs.items():
        by_stage.setdefault(stage, []).append((index, tuple(run)))
    return by_stage


def _check_rank(side: str, rank: int, size: int) -> None:
    if not 0 <= rank < size:
        raise Refusal(
            "invalid_argument",
            f"{side} rank={rank} is not one of the plan's {size} {side} ranks",
            facts={"rank": rank, "num_ranks": size},
            hint=f"use 0 <= rank < {size}",
        )


def _spec_segments(
    sizes: RankSizes,
    index: int,
    layer: int,
    ranks: tuple[tuple[int, int], tuple[int, int]],
    *,
    prompt_tokens: int,
    dcp_rank: int,
    part_rows: dict[int, tuple[tuple[CachePart, int, int], ...]],
    gather: bool = False,
) -> tuple[dict[str, Any], ...]:
    """The fields of the segments of module ``layer`` (of spec ``sizes.specs[index]``) from
    producer ``ranks[0]`` to consumer ``ranks[1]`` (each ``(tp, tp_rank)``); ``part_rows``
    keeps each attention spec's row bytes for every consumer rank."""
    src, dst = ranks
    spec = sizes.specs[index]
    if spec.paging == "slot":
        return tuple(
            derive_part_segment(part, layer, src, dst, segment_fields, gather=gather)
            for part in layer_slot_parts(sizes, layer)
        )
    rows = part_rows.get(index)
    if rows is None:
        rows = part_rows[index] = _part_rows(spec, src[0], dst[0])
    return _row_segments(spec, layer, prompt_tokens, src, dst, rows=rows, dcp_rank=dcp_rank)


def _part_rows(
    spec: LayerCacheSpec, src_tp: int, dst_tp: int
) -> tuple[tuple[CachePart, int, int], ...]:
    """Each part of an attention spec with its row bytes on a producer and a consumer rank."""
    return tuple((part, part.local_bytes(src_tp), part.local_bytes(dst_tp)) for part in spec.parts)


def _row_segments(
    spec: LayerCacheSpec,
    layer: int,
    prompt_tokens: int,
    src: tuple[int, int],
    dst: tuple[int, int],
    *,
    rows: tuple[tuple[CachePart, int, int], ...],
    dcp_rank: int = 0,
) -> tuple[dict[str, Any], ...]:
    """The fields of the segments of the rows of every part of an attention layer that the
    consumer's DCP rank owns (``rows``: :func:`_part_rows` of ``spec``).

    A replicated row (MLA latent) is copied whole; a row whose heads the two TPs split
    differently (GQA's K and V) would need a copy per token per head slice, which a segment
    does not express with DCP, and is refused there."""
    segments: list[dict[str, Any]] = []
    tokens = spec.dcp or Interleave(num_ranks=1)
    for part, src_row, dst_row in rows:
        if part.tokens_per_row > 1:  # pooled entries (DCP refused): every entry, whole
            entries = -(-prompt_tokens // part.tokens_per_row)
            segments.extend(
                derive_token_segments(
                    layer,
                    part.name,
                    dst_row,
                    entries,
                    Interleave(num_ranks=1),
                    rank=0,
                    make=segment_fields,
                )
            )
            continue
        if src_row == dst_row:
            segments.extend(
                derive_token_segments(
                    layer,
                    part.name,
                    dst_row,
                    prompt_tokens,
                    tokens,
                    rank=dcp_rank,
                    make=segment_fields,
                )
            )
            continue
        if tokens.num_ranks > 1:
            raise Refusal(
                "dcp_unsupported",
                f"{spec.kind} layer {layer}: part {part.name} rows are split by heads "
                f"differently at prefill tp={src[0]} and decode tp={dst[0]}; with "
                f"dcp={tokens.num_ranks} a token's row is not one strided copy",
                facts={
                    "layer": layer,
                    "part": part.name,
                    "prefill_tp": src[0],
                    "decode_tp": dst[0],
                    "dcp": tokens.num_ranks,
                },
                hint="use dcp=1, or equal attention TP on both sides",
            )
        head = derive_part_segment(part, layer, src, dst, planned_segment)  # one token's share
        segments.append(
            segment_fields(
                part.name,
                (layer,),
                "page",
                src_offset_bytes=head.src_offset_bytes,
                dst_offset_bytes=0,
                length_bytes=dst_row,
                num_copies=prompt_tokens,
                src_stride_bytes=src_row,
                dst_stride_bytes=dst_row,
            )
        )
    return tuple(segments)
