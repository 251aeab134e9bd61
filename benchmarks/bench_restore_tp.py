"""A stored prefix moved across TP (Kimi-K3, attention TP 4 -> TP 8) against a plain torch copy of
the same bytes (same run).

Run by hand: ``python benchmarks/bench_restore_tp.py``. Each of the 4 prefill ranks stores a
prefix of two of its blocks (5,888 tokens: the KV of 24 MLA layers and the boundary state of
69 KDA layers); :func:`~k3layout.torch.restore_across_tp` moves it into the blocks of the 8
decode ranks, as the transfer plan says (1,100,537,856 B in all: every consumer takes every
latent row and its half of each KDA layer's heads). The baseline is ``dst.copy_(src)`` of one
contiguous buffer of the bytes the plan moves. The two take turns in every round
(``timing.interleaved_seconds``); the ratio is the median over rounds of restore / plain.

Target (issue 11): at most 1.5x the plain copy's time. Exits 1 if the ratio is over it or if a
consumer's regions, read back from its cache, differ from the plan's copies.
"""

from __future__ import annotations

import statistics
import sys

import torch
from timing import interleaved_seconds

from k3layout import Deployment, VllmPlan, plan_transfer, plan_vllm, preset
from k3layout.torch import (
    Allocation,
    BlockTables,
    LiveLayout,
    Tier,
    allocate,
    apply_segments,
    block_tables,
    restore_across_tp,
    store_prefix,
    tier_regions,
    validate,
)
from k3layout.transfer import TransferPlan

# one block on both sides (TP 4's own, 2,944 tokens), so that the prefix ends on both grids
PREFILL, DECODE = Deployment(attn_tp=4, block_tokens=2944), Deployment(attn_tp=8, block_tokens=2944)
TARGET = 1.5  # restore_across_tp / plain copy, at most
ROUNDS = 9


def random_cache(p: VllmPlan, num_blocks: int, seed: int) -> Allocation:
    """A rank's cache with random pages, plane ``j`` shifted by ``j`` (no two pages alike)."""
    cache = allocate(p, num_blocks, fill=None)
    gen = torch.Generator().manual_seed(seed)
    pages = torch.randint(0, 256, cache.planes[0].shape, generator=gen, dtype=torch.uint8)
    for j, plane in enumerate(cache.planes):
        torch.add(pages, j, out=plane)
    return cache


def main() -> int:
    model = preset("kimi-k3")
    p_plan, d_plan = plan_vllm(model, PREFILL), plan_vllm(model, DECODE)
    tokens = 2 * p_plan.block_tokens
    transfer = plan_transfer(model, PREFILL, DECODE, prompt_tokens=tokens)
    p_tables = block_tables(p_plan, tokens, range(8))
    d_tables = block_tables(d_plan, tokens, range(7, -1, -1))  # other ids, reversed
    tiers = []
    for rank in range(PREFILL.attn_tp):
        cache = random_cache(p_plan, 8, seed=rank)
        live = validate(p_plan, cache.registered)
        tiers.append(store_prefix(live, cache.registered, p_tables, tokens))
        del cache  # the tier is all the transfer reads
    consumers: list[tuple[LiveLayout, Allocation, BlockTables]] = []
    for rank in range(DECODE.attn_tp):
        cache = random_cache(d_plan, 8, seed=100 + rank)
        consumers.append((validate(d_plan, cache.registered), cache, d_tables))
    targets = [(live, cache.registered, tables) for live, cache, tables in consumers]

    moved = transfer.total_bytes
    plain_source = torch.full((moved,), 7, dtype=torch.uint8)  # real pages, not the zero page
    plain_target = torch.empty_like(plain_source)
    runs = interleaved_seconds(
        {
            "restore": lambda: restore_across_tp(transfer, tiers, targets),
            "plain": lambda: plain_target.copy_(plain_source),
        },
        repeats=ROUNDS,
    )
    exact = all_exact(transfer, tiers, consumers, tokens)

    ratio = statistics.median(r / p for r, p in zip(runs["restore"], runs["plain"], strict=True))
    print(
        f"K3 TP{PREFILL.attn_tp} -> TP{DECODE.attn_tp}, prefix {tokens:,} tokens: "
        f"{moved:,} B moved ({moved / 2**20:.0f} MiB) in {transfer.num_copies} segment copies, "
        f"{torch.get_num_threads()} torch threads, {ROUNDS} rounds"
    )
    print("{:>30} {:>11} {:>11} {:>8}".format("", "median", "fastest", "GiB/s"))
    for label, name in (
        ("restore_across_tp", "restore"),
        ("plain torch copy, same bytes", "plain"),
    ):
        median = statistics.median(runs[name])
        rate = moved / median / 2**30
        print(f"{label:>30} {median * 1e3:8.1f} ms {min(runs[name]) * 1e3:8.1f} ms {rate:8.2f}")
    verdict = "ok" if ratio <= TARGET else "OVER"
    print(f"restore_across_tp: {ratio:.2f}x the plain copy's time (target <= {TARGET}x): {verdict}")
    print(f"every consumer's regions byte-exact: {exact}")
    return 0 if exact and ratio <= TARGET else 1


def all_exact(
    transfer: TransferPlan,
    tiers: list[Tier],
    consumers: list[tuple[LiveLayout, Allocation, BlockTables]],
    tokens: int,
) -> bool:
    """Whether each consumer's cache, stored and read back as regions, holds the plan's copies
    (``apply_segments`` on the producers' regions: the reference)."""
    sources = [tier_regions(t, transfer.producer_regions(r)) for r, t in enumerate(tiers)]
    expected = apply_segments(transfer, sources)
    for rank, (live, cache, tables) in enumerate(consumers):
        tier = store_prefix(live, cache.registered, tables, tokens)
        got = tier_regions(tier, transfer.consumer_regions(rank))
        if any(not torch.equal(got[key], want) for key, want in expected[rank].items()):
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
