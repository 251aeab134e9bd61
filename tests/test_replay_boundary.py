"""Which prefix a tier can restore in vLLM 0.33's ``align`` mode: the one replay boundary vLLM
keeps per prompt (``tests/conformance`` compares it with vLLM's own function)."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st

from k3layout import Refusal
from k3layout.engines.vllm import rules
from k3layout.engines.vllm.rules import (
    recommended_max_num_batched_tokens,
    replay_boundary,
    restored_prefix,
)


def test_the_rules_doctests_pass() -> None:
    failures, attempted = doctest.testmod(rules)
    assert failures == 0 and attempted >= 4


def test_seed_000s_probe_restored_one_block_less_than_the_last_boundary() -> None:
    # 9,415 tokens at TP 8 fp8 (block 1,536): 9,216 without the drop, 7,680 with it; seed
    # 000's probe restored 7,680 of each prompt (96 x 7,680 = 737,280 tier tokens)
    assert restored_prefix(9415, 1536, 1536) == 9216
    assert restored_prefix(9415, 1536, 1536, drop_trailing_block=True) == 7680
    assert 96 * restored_prefix(9415, 1536, 1536, drop_trailing_block=True) == 737_280


def test_a_boundary_off_the_chunk_grid_restores_nothing() -> None:
    # chunk 3,072 (two blocks): 9,216 is on it, 7,680 is not
    assert restored_prefix(9415, 1536, 3072) == 9216
    assert restored_prefix(9415, 1536, 3072, drop_trailing_block=True) == 0


@given(st.integers(1, 1 << 24), st.integers(1, 1 << 14), st.booleans())
def test_the_boundary_is_a_block_multiple_before_the_last_token(
    prompt: int, block: int, drop: bool
) -> None:
    boundary = replay_boundary(prompt, block, drop_trailing_block=drop)
    assert boundary % block == 0 and 0 <= boundary < prompt
    assert prompt - boundary <= (2 * block if drop else block)
    if drop:
        assert boundary <= replay_boundary(prompt, block)


def test_the_recommended_batch_is_whole_blocks_at_the_90th_percentile() -> None:
    mix = [1000] * 5 + [9415] * 4 + [30_000]
    assert recommended_max_num_batched_tokens(mix, 1536) == 20 * 1536  # 30,000 -> 30,720
    assert recommended_max_num_batched_tokens([9415] * 10, 1536) == 9216 + 1536
    assert recommended_max_num_batched_tokens([10], 1536) == 1536


@pytest.mark.parametrize(
    "call",
    [
        lambda: replay_boundary(0, 1536),
        lambda: replay_boundary(10, 0),
        lambda: restored_prefix(10, 16, 0),
        lambda: recommended_max_num_batched_tokens([], 1536),
        lambda: recommended_max_num_batched_tokens([0, 5], 1536),
        lambda: recommended_max_num_batched_tokens(["9415"], 1536),  # type: ignore[list-item]
        lambda: replay_boundary("9415", 1536),  # type: ignore[arg-type]
        lambda: replay_boundary(9415, 1536, drop_trailing_block="yes"),  # type: ignore[arg-type]
    ],
)
def test_bad_lengths_are_refused(call: object) -> None:
    with pytest.raises(Refusal) as refused:
        call()  # type: ignore[operator]
    assert refused.value.code == "invalid_argument"
