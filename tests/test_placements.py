"""The split algebra: TP shards, replication, DCP interleave, PP stage ranges."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from k3layout import Interleave, Replicate, Shard, pp_stage_bounds


def test_shard_gives_rank_r_its_slice_of_96_heads_over_8() -> None:
    assert [Shard().local_size_and_offset(96, 8, r) for r in range(8)] == [
        (12, 12 * r) for r in range(8)
    ]


def test_replicate_gives_every_rank_everything() -> None:
    assert {Replicate().local_size_and_offset(576, 8, r) for r in range(8)} == {(576, 0)}


def test_k3_over_8_stages_splits_as_vllm_does() -> None:
    # 93 // 8 = 11 each; the 5 left over go to stages 6, 5, 4, 3, 2 (not the last)
    sizes = [end - start for start, end in pp_stage_bounds(93, 8)]
    assert sizes == [11, 11, 12, 12, 12, 12, 12, 11]


def test_an_explicit_partition_overrides_the_split() -> None:
    assert pp_stage_bounds(27, 3, (5, 10, 12)) == ((0, 5), (5, 15), (15, 27))


@given(st.integers(1, 200), st.data())
def test_stage_ranges_are_contiguous_and_cover_every_layer(
    layers: int, data: st.DataObject
) -> None:
    pp = data.draw(st.integers(1, layers))
    bounds = pp_stage_bounds(layers, pp)
    assert bounds[0][0] == 0 and bounds[-1][1] == layers
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [end - start for start, end in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert sizes[-1] == min(sizes)  # the last stage never takes a remainder layer


@given(st.integers(1, 16), st.sampled_from((1, 2, 4, 8, 16)), st.integers(0, 2000))
def test_interleave_placement_is_a_bijection(ranks: int, interleave: int, tokens: int) -> None:
    placement = Interleave(num_ranks=ranks, interleave=interleave)
    seen: dict[int, list[int]] = {r: [] for r in range(ranks)}
    for token in range(tokens):
        rank = placement.rank_of(token)
        local = placement.local_position(token)
        assert placement.global_token(rank, local) == token
        seen[rank].append(local)
    for rank, locals_ in seen.items():
        assert locals_ == list(range(len(locals_)))  # dense, in order
        assert placement.local_count(tokens, rank) == len(locals_)


@given(st.integers(1, 8), st.sampled_from((1, 2, 4)), st.integers(0, 300), st.integers(0, 300))
def test_runs_cover_exactly_a_ranks_tokens_in_a_range(
    ranks: int, interleave: int, start: int, length: int
) -> None:
    placement = Interleave(num_ranks=ranks, interleave=interleave)
    stop = start + length
    for rank in range(ranks):
        runs = placement.runs(start, stop, rank)
        covered = [run.start + i for run in runs for i in range(run.length)]
        assert covered == [t for t in range(start, stop) if placement.rank_of(t) == rank]
        for run in runs:
            assert run.length <= interleave
            assert run.local_start == placement.local_position(run.start)
