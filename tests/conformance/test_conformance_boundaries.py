"""The replay boundary (the one prefix whose KDA state vLLM 0.33 keeps per prompt in
``align`` mode) against vLLM's own ``get_mamba_prefill_checkpoint_position``. The scheduler
run that shows this is the only state kept, whatever ``max_num_batched_tokens`` and the KDA
prefill kernel, is described in ``docs/concepts.md``."""

from __future__ import annotations

import pytest
from vllm_required import require_vllm

require_vllm()

from vllm.v1.kv_cache_interface import get_mamba_prefill_checkpoint_position  # noqa: E402

from k3layout.engines.vllm.rules import replay_boundary  # noqa: E402

PROMPTS = sorted({1, 2, 15, 16, 17, *range(1000, 40_000, 997), 9215, 9216, 9217, 9415, 1 << 20})


@pytest.mark.parametrize("block", [16, 256, 768, 1536, 2944, 5888, 11392])
@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("lookahead", [0, 1, 2, 3])
def test_the_replay_boundary_is_vllms_checkpoint_position(
    block: int, drop: bool, lookahead: int
) -> None:
    for prompt in PROMPTS:
        ours = replay_boundary(
            prompt, block, drop_trailing_block=drop, hash_lookahead_tokens=lookahead
        )
        assert ours == get_mamba_prefill_checkpoint_position(prompt, block, drop, lookahead), prompt
