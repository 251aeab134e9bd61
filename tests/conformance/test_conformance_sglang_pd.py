"""The planner's SGLang prefill-to-decode transfers against SGLang 0.5.23's own, run on CPU.

For each deployment pair, SGLang's own rank mapping, bootstrap, KV-writer election and state
slice code (``sglang_pd.py``, the Mooncake backend) says, for every decode rank, which prefill
ranks it pairs with, which of them write the MLA latent, and the byte blocks of each KDA
state tensor each of them writes into the decode rank's slot of each layer. The planner
(``plan_transfer`` with ``engine="sglang"`` on both sides) must answer the same:

* (a) pairing: the producers of every consumer rank (those sending state, those sending the
  latent), and the module layers each of them sends;
* (b) state blocks: for each (producer, consumer) pair, tensor (``conv``; the planner's
  ``recurrent`` is SGLang's ``temporal``) and layer, the ``(src, dst, length)`` byte copies
  within one layer's slot item, compared after merging runs adjacent on both sides, and the
  item sizes on both sides;
* (c) refusals: the planner refuses (``tp_not_multiple``, ``model_mismatch``) exactly the
  deployments SGLang fails (a decode rank's failed bootstrap, a prefill rank never
  contacted, a decode pipeline it asserts against), and plans every other one, with
  ``transfer_violations`` empty;
* the latent: whole SGLang pages for a prompt of whole pages (bytes per consumer, bytes per
  token), and under decode DCP the exact (prompt position, local row) of every token a rank
  receives.

Grid: prefill TP x decode TP over ``TP_SIZES`` (all divide K3's 96 KDA heads), fp8 and bf16
latent; prefill PP with decode PP 1 or equal; decode DCP (Blackwell on the planner side, where
SGLang runs K3's DCP decode); prefill attention DP. Kimi-K3's own 93-layer pattern on both
sides, so stage splits and layer sets are compared too. One harness call per (case, decode
stage), cached and shared by every check.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from sglang_pd import require_sglang

require_sglang()

from sglang_pd import TP_SIZES, dcp_token_plan, deployment_outcome  # noqa: E402

from k3layout import (  # noqa: E402
    Deployment,
    Refusal,
    TransferPlan,
    plan_transfer,
    preset,
    transfer_violations,
)

Json = dict[str, Any]
Block = tuple[int, int, int]  # (src offset, dst offset, length) within one layer's item

K3 = preset("kimi-k3")
NUM_LAYERS = len(K3.module_layers)
KDA_LAYERS = tuple(i for i, layer in enumerate(K3.module_layers) if layer.kind == "kda")
HEADS = 96
SGLANG_FIELD = {"conv": "conv", "recurrent": "temporal"}
"""The planner's slot parts by SGLang's state tensor names."""
SGLANG_KV_DTYPE = {"fp8": "fp8_e4m3", "bf16": "bf16"}
PAGE = 64
"""The harness's page (Blackwell's ``trtllm_mla`` page; Hopper's is 1 token)."""
PROMPT_PAGES = 64
"""Prompt of the non-DCP cases: a whole number of pages, so SGLang's whole-page copies are
exactly the prompt's rows."""

logging.getLogger("sglang").setLevel(logging.CRITICAL)  # each 404 of a failing pairing


@dataclass(frozen=True)
class Case:
    """One prefill -> decode deployment pair (attention-TP sizes; ``prefill_dp`` attention-DP
    groups on the prefill, ``decode_dp`` on the decode, which SGLang's mapping ignores)."""

    prefill_tp: int
    decode_tp: int
    kv: str = "fp8"
    prefill_pp: int = 1
    decode_pp: int = 1
    dcp: int = 1
    prefill_dp: int = 1
    decode_dp: int = 1
    page: int = PAGE
    gpu: str = "h200"
    prompt_pages: int = PROMPT_PAGES
    tags: tuple[str, ...] = field(default=(), compare=False)

    @property
    def prompt_tokens(self) -> int:
        return self.prompt_pages * self.page

    @property
    def id(self) -> str:
        parts = [f"{self.kv}-P{self.prefill_tp}-D{self.decode_tp}"]
        if self.prefill_pp > 1 or self.decode_pp > 1:
            parts.append(f"pp{self.prefill_pp}to{self.decode_pp}")
        if self.dcp > 1:
            parts.append(f"dcp{self.dcp}")
        if self.prefill_dp > 1 or self.decode_dp > 1:
            parts.append(f"dp{self.prefill_dp}to{self.decode_dp}")
        if self.page != PAGE:
            parts.append(f"page{self.page}-{self.prompt_tokens}tok")
        return "-".join(parts)


def _divides(a: int, b: int) -> bool:
    return b % a == 0 or a % b == 0


GRID = [Case(p, d, kv) for kv in SGLANG_KV_DTYPE for p in TP_SIZES for d in TP_SIZES]
PP_TP = ((1, 1), (1, 4), (2, 8), (4, 4), (4, 2), (8, 2), (16, 1), (3, 6), (6, 3), (2, 3), (8, 3))
PP = [
    Case(p, d, prefill_pp=s, decode_pp=t)
    for s in (2, 3, 4)
    for t in (1, s)
    for p, d in PP_TP
    if _divides(p, d) or t == 1
] + [
    # decode pipelines SGLang asserts against: neither 1 nor the prefill's
    Case(p, d, prefill_pp=s, decode_pp=t)
    for s, t in ((1, 2), (2, 4), (4, 2), (3, 2), (2, 3))
    for p, d in ((2, 4), (4, 2), (4, 4))
]
DCP = [
    Case(p, d, dcp=c, gpu="b200", prompt_pages=2 * c + 1)
    for d in (2, 3, 4, 6, 8, 12, 16)
    for c in range(2, d + 1)
    if d % c == 0
    for p in (1, 2, 4, 8, 16)
    if _divides(p, d)
] + [
    Case(p, d, kv="bf16", dcp=c, gpu="b200", prompt_pages=2 * c + 1)
    for p, d, c in ((2, 8, 8), (8, 4, 2), (1, 16, 4))
]
DP = [
    Case(p, d, prefill_dp=a, decode_dp=b)
    for p, d in ((2, 8), (8, 2), (4, 4), (2, 3))
    for a, b in ((2, 1), (4, 2), (2, 4))
]
HOPPER_PAGE = [
    # SGLang's Hopper page (1 token): any prompt is whole pages
    Case(p, d, kv, page=1, prompt_pages=1000)
    for kv in SGLANG_KV_DTYPE
    for p, d in ((1, 8), (8, 2), (4, 4), (16, 1))
]
CASES = GRID + PP + DCP + DP + HOPPER_PAGE
PLANNED = [c for c in CASES if c.decode_pp in (1, c.prefill_pp)]  # not the asserted ones


def _ids(cases: list[Case]) -> list[str]:
    return [c.id for c in cases]


# --------------------------------------------------------------------------------------------
# Both sides, once per case
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SglangSide:
    """SGLang's answer for every decode rank (``stage * decode_tp + tp_rank``), and its reason
    for failing the deployment, if it does."""

    ranks: dict[int, Json]
    refused: str | None
    refused_at: str | None


@functools.cache
def sglang(case: Case) -> SglangSide:
    ranks: dict[int, Json] = {}
    refused: str | None = None
    refused_at: str | None = None
    for stage in range(case.decode_pp):
        dep = deployment_outcome(
            prefill_tp=case.prefill_tp,
            decode_tp=case.decode_tp,
            prefill_pp=case.prefill_pp,
            decode_pp=case.decode_pp,
            decode_pp_rank=stage,
            decode_dcp=case.dcp,
            prefill_dp=case.prefill_dp,
            kv_dtype=SGLANG_KV_DTYPE[case.kv],
            page_size=case.page,
            num_hidden_layers=NUM_LAYERS,
            kda_layers=KDA_LAYERS,
        )
        for d, result in enumerate(dep["ranks"]):
            ranks[stage * case.decode_tp + d] = result
        if "refused" in dep and refused is None:
            refused, refused_at = dep["refused"], dep["refused_at"]
    return SglangSide(ranks, refused, refused_at)


@functools.cache
def planner(case: Case) -> TransferPlan | Refusal:
    def side(tp: int, pp: int, dp: int, dcp: int = 1) -> Deployment:
        return Deployment(
            engine="sglang",
            gpu=case.gpu,
            attn_tp=tp,
            pp=pp,
            attn_dp=dp,
            dcp=dcp,
            kv_dtype=case.kv,
        )

    try:
        return plan_transfer(
            K3,
            side(case.prefill_tp, case.prefill_pp, case.prefill_dp),
            side(case.decode_tp, case.decode_pp, case.decode_dp, case.dcp),
            prompt_tokens=case.prompt_tokens,
        )
    except Refusal as refusal:
        return refusal


def both(case: Case) -> tuple[SglangSide, TransferPlan] | None:
    """Both answers where SGLang serves the deployment (the planner must plan it); ``None``
    where SGLang fails it (the planner must refuse it: ``test_refusals`` says with what)."""
    sg, pl = sglang(case), planner(case)
    if sg.refused is not None:
        assert isinstance(pl, Refusal), (
            f"SGLang fails {case.id} ({sg.refused_at}: {sg.refused}); the planner plans it"
        )
        return None
    assert isinstance(pl, TransferPlan), f"SGLang serves {case.id}; the planner refuses: {pl}"
    return sg, pl


def _producer(case: Case, entry: Json) -> int:
    return int(entry["prefill_pp_rank"]) * case.prefill_tp + int(entry["prefill_tp_rank"])


def _sglang_blocks(entry: Json, tensor: str) -> dict[int, list[Block]]:
    """SGLang's blocks of ``tensor`` from one source, by module layer."""
    t = entry.get(tensor)
    if not t:
        return {}
    if "per_layer" in t:
        return {
            int(k): [(int(s), int(d), int(n)) for s, d, n in v] for k, v in t["per_layer"].items()
        }
    blocks: list[Block] = [(int(s), int(d), int(n)) for s, d, n in t["blocks"]]
    return {int(layer): blocks for layer in t["layers"]}


def _planner_blocks(
    plan: TransferPlan, producer: int, consumer: int, part: str
) -> dict[int, list[Block]]:
    """The planner's copies of ``part`` from ``producer`` to ``consumer``, by module layer."""
    out: dict[int, list[Block]] = defaultdict(list)
    for pair in plan.pairs_to(consumer):
        if pair.producer != producer:
            continue
        for segment in pair.segments:
            if segment.field == part:
                for layer in segment.layers:
                    out[layer].extend(segment.copies())
    return dict(out)


def merged(blocks: list[Block]) -> list[Block]:
    """``blocks`` sorted, each run of blocks adjacent on both sides merged into one: two block
    lists copy the same bytes to the same places exactly when their merged forms are equal
    (a byte copied twice stays two blocks)."""
    out: list[Block] = []
    for src, dst, length in sorted(blocks):
        if out:
            s, d, n = out[-1]
            if src == s + n and dst == d + n:
                out[-1] = (s, d, n + length)
                continue
        out.append((src, dst, length))
    return out


def _by_layer(blocks: dict[int, list[Block]]) -> dict[int, list[Block]]:
    return {layer: merged(b) for layer, b in blocks.items()}


def _state_sources(result: Json) -> list[Json]:
    return [
        e
        for e in result["state"]["by_source"]
        if e["writes_state"] and any(e.get(t) for t in SGLANG_FIELD.values())
    ]


def _region_bytes(regions: tuple[Any, ...], part: str) -> int:
    sizes = {int(r.size_bytes) for r in regions if r.field == part}
    assert len(sizes) == 1, (part, sizes)
    return sizes.pop()


# --------------------------------------------------------------------------------------------
# (c) refusals, and the planner's own checks
# --------------------------------------------------------------------------------------------


def _expected_code(reason: str) -> str:
    """The planner's refusal code for SGLang's failure ``reason``."""
    if "Decode pp size" in reason:
        return "model_mismatch"
    if "Could not fetch bootstrap info" in reason or "KVPoll.Bootstrapping" in reason:
        return "tp_not_multiple"
    raise AssertionError(f"an SGLang failure this test does not map: {reason}")


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_refusals(case: Case) -> None:
    """The planner refuses exactly where SGLang's deployment fails, with the matching code."""
    sg, pl = sglang(case), planner(case)
    if sg.refused is None:
        assert isinstance(pl, TransferPlan), (
            f"SGLang serves {case.id}; the planner refuses: {getattr(pl, 'code', '')} {pl}"
        )
        return
    assert isinstance(pl, Refusal), f"SGLang fails {case.id} ({sg.refused}); the planner plans"
    assert pl.code == _expected_code(sg.refused), (sg.refused, pl.code, str(pl))
    # SGLang's own rule, checked on SGLang's side too: one TP divides the other, the decode
    # pipeline is one stage or the prefill's
    tp_ok = _divides(case.prefill_tp, case.decode_tp)
    assert not (tp_ok and case.decode_pp in (1, case.prefill_pp)), sg.refused


def test_grid_is_sglang_rule() -> None:
    """Over the TP grid SGLang serves a pairing exactly when one TP divides the other (every
    size divides K3's heads, so no pool refuses)."""
    assert all(HEADS % t == 0 for t in TP_SIZES)
    for case in GRID:
        assert (sglang(case).refused is None) == _divides(case.prefill_tp, case.decode_tp), case


@pytest.mark.parametrize("case", PLANNED, ids=_ids(PLANNED))
def test_transfer_violations(case: Case) -> None:
    """Every plan the planner makes passes its own checks."""
    pl = planner(case)
    if isinstance(pl, Refusal):
        return  # test_refusals says whether it should
    assert transfer_violations(pl) == []


# --------------------------------------------------------------------------------------------
# (a) pairing
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", PLANNED, ids=_ids(PLANNED))
def test_pairing(case: Case) -> None:
    """Each decode rank's producers: those SGLang bootstraps with (all real senders for K3),
    those sending state, the one(s) writing the latent, and the layers each sends."""
    found = both(case)
    if found is None:
        return
    sg, pl = found
    assert len(sg.ranks) == pl.num_consumers
    for consumer, result in sg.ranks.items():
        pairs = pl.pairs_to(consumer)
        peers = {
            int(p["prefill_pp_rank"]) * case.prefill_tp + int(p["prefill_tp_rank"])
            for p in result["peers"]
        }
        assert not any(p["is_dummy"] for p in result["peers"])
        assert {pair.producer for pair in pairs} == peers, consumer
        state = {_producer(case, e) for e in _state_sources(result)}
        ours = {pair.producer for pair in pairs if any(s.kind == "slot" for s in pair.segments)}
        assert ours == state, ("state producers", consumer)
        # who writes the latent, and of which MLA layers
        theirs_kv = {
            _producer(case, e): sorted(e["kv_layers"])
            for e in result["state"]["by_source"]
            if e["writes_kv"] and e["kv_layers"]
        }
        ours_kv: dict[int, list[int]] = {}
        for pair in pairs:
            layers = sorted(
                layer for s in pair.segments if s.field == "latent" for layer in s.layers
            )
            if layers:
                ours_kv[pair.producer] = layers
        assert ours_kv == theirs_kv, ("latent writers and layers", consumer)
        assert sorted(result["kv"]["layers"]) == sorted(
            layer for layers in ours_kv.values() for layer in layers
        ), consumer
        if case.prefill_dp > 1:
            assert 0 <= result["mapping"]["prefill_dp_rank"] < case.prefill_dp


@pytest.mark.parametrize("case", DP, ids=_ids(DP))
def test_attention_dp_keeps_mapping(case: Case) -> None:
    """Attention DP changes neither side's pairing within the replica serving the request:
    SGLang's mapping reads attention-TP sizes only, the planner plans within one replica."""
    plain = replace(case, prefill_dp=1, decode_dp=1)
    sg, base = sglang(case), sglang(plain)
    assert (sg.refused is None) == (base.refused is None), (sg.refused, base.refused)
    for consumer, result in sg.ranks.items():
        assert result.get("peers") == base.ranks[consumer].get("peers")
        if "peers" in result:
            assert result["state"] == base.ranks[consumer]["state"]
    pl, pb = planner(case), planner(plain)
    if isinstance(pl, TransferPlan) and isinstance(pb, TransferPlan):
        assert pl.pairs == pb.pairs
    else:
        assert type(pl) is type(pb)


# --------------------------------------------------------------------------------------------
# (b) state blocks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", PLANNED, ids=_ids(PLANNED))
def test_state_blocks(case: Case) -> None:
    """Per (producer, consumer) pair, tensor and layer: the same bytes copied to the same
    places, within items of the same sizes."""
    found = both(case)
    if found is None:
        return
    sg, pl = found
    for consumer, result in sg.ranks.items():
        state = result["state"]
        assert state["dst_bytes_written"] == state["dst_item_bytes"], consumer
        assert "out_of_item" not in state, consumer
        consumer_regions = pl.consumer_regions(consumer)
        for entry in _state_sources(result):
            producer = _producer(case, entry)
            producer_regions = pl.producer_regions(producer)
            if "nixl_same_blocks" in entry:
                assert entry["nixl_same_blocks"], (producer, consumer)
            for part, tensor in SGLANG_FIELD.items():
                where = (part, producer, consumer)
                assert _region_bytes(consumer_regions, part) == state["dst_item_bytes"][tensor]
                assert _region_bytes(producer_regions, part) == entry["src_item_bytes"][tensor]
                theirs = _by_layer(_sglang_blocks(entry, tensor))
                ours = _by_layer(_planner_blocks(pl, producer, consumer, part))
                assert sorted(ours) == sorted(theirs), ("layers", where)
                for layer, blocks in theirs.items():
                    assert ours[layer] == blocks, (*where, layer)


# --------------------------------------------------------------------------------------------
# The MLA latent
# --------------------------------------------------------------------------------------------


def _row_bytes(case: Case) -> int:
    return 576 * (1 if case.kv == "fp8" else 2)


@pytest.mark.parametrize(
    "case", [c for c in PLANNED if c.dcp == 1], ids=_ids([c for c in PLANNED if c.dcp == 1])
)
def test_latent_pages(case: Case) -> None:
    """Without DCP SGLang copies whole pages of each MLA layer from the one writer: for a
    prompt of whole pages, the planner's latent bytes per consumer are SGLang's pages x page
    bytes, its bytes per token SGLang's page bytes / page, and each layer's copy the prompt's
    rows in order."""
    found = both(case)
    if found is None:
        return
    sg, pl = found
    row = _row_bytes(case)
    for consumer, result in sg.ranks.items():
        kv = result["kv"]
        assert not kv["dcp_relayout"]
        per_token = _region_bytes(pl.consumer_regions(consumer), "latent") // case.prompt_tokens
        assert kv["page_bytes"] == case.page * row == case.page * per_token, consumer
        pages = math.ceil(case.prompt_tokens / case.page)
        theirs = pages * kv["page_bytes"] * len(kv["layers"])
        ours = sum(
            s.total_bytes for p in pl.pairs_to(consumer) for s in p.segments if s.field == "latent"
        )
        assert ours == theirs, consumer
        for pair in pl.pairs_to(consumer):
            copies: dict[int, list[Block]] = defaultdict(list)
            for s in pair.segments:
                if s.field == "latent":
                    for layer in s.layers:
                        copies[layer].extend(s.copies())
            for layer, blocks in copies.items():
                assert merged(blocks) == [(0, 0, case.prompt_tokens * row)], (pair.producer, layer)


DCP_PLANNED = [c for c in PLANNED if c.dcp > 1]


@pytest.mark.parametrize("case", DCP_PLANNED, ids=_ids(DCP_PLANNED))
def test_latent_dcp_rows(case: Case) -> None:
    """Under decode DCP SGLang relays the latent token by token: DCP rank ``q`` (``tp_rank %
    dcp``) receives the tokens at positions ``= q mod dcp``, at local row ``pos // dcp``. The
    planner's copies, expanded to rows, are exactly those (prompt position, row) pairs, in
    every MLA layer, from the writer SGLang elects."""
    found = both(case)
    if found is None:
        return
    sg, pl = found
    row = _row_bytes(case)
    for consumer, result in sg.ranks.items():
        kv = result["kv"]
        assert kv["dcp_relayout"], consumer
        q = (consumer % case.decode_tp) % case.dcp
        theirs = dcp_token_plan(
            dcp_size=case.dcp, dcp_rank=q, page_size=case.page, num_pages=case.prompt_pages
        )
        first = [tuple(x) for x in kv["dcp_tokens"]["first"]]
        assert first == theirs[: len(first)], consumer  # the same SGLang path as the case's
        for pair in pl.pairs_to(consumer):
            per_layer: dict[int, list[tuple[int, int]]] = defaultdict(list)
            for s in pair.segments:
                if s.field != "latent":
                    continue
                for layer in s.layers:
                    for src, dst, length in s.copies():
                        assert src % row == dst % row == length % row == 0
                        per_layer[layer].extend(
                            (src // row + k, dst // row + k) for k in range(length // row)
                        )
            for layer, rows in per_layer.items():
                assert sorted(rows) == sorted(theirs), (pair.producer, consumer, layer)


@pytest.mark.parametrize("interleave", [2, 64])
def test_dcp_interleave(interleave: int) -> None:
    """SGLang 0.5.23's CUDA PD relayout deals tokens one by one (``build_dcp_token_transfer_
    plan`` has no interleave); a planner DCP interleave other than 1 is refused, or planned
    as SGLang relays it."""
    case = Case(2, 8, dcp=4, gpu="b200", prompt_pages=9)
    row = _row_bytes(case)
    try:
        pl = plan_transfer(
            K3,
            Deployment(engine="sglang", gpu="b200", attn_tp=2),
            Deployment(engine="sglang", gpu="b200", attn_tp=8, dcp=4, dcp_interleave=interleave),
            prompt_tokens=case.prompt_tokens,
        )
    except Refusal:
        return
    first_mla = min(set(range(NUM_LAYERS)) - set(KDA_LAYERS))
    for consumer in range(case.decode_tp):
        theirs = dcp_token_plan(
            dcp_size=4, dcp_rank=consumer % 4, page_size=case.page, num_pages=case.prompt_pages
        )
        ours = sorted(
            (src // row + k, dst // row + k)
            for pair in pl.pairs_to(consumer)
            for s in pair.segments
            if s.field == "latent" and first_mla in s.layers
            for src, dst, length in s.copies()
            for k in range(length // row)
        )
        assert ours == sorted(theirs), (
            f"dcp_interleave={interleave}, consumer {consumer}: the planner's first rows "
            f"{ours[:4]}, SGLang's {sorted(theirs)[:4]}"
        )
