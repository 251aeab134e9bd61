"""The reference kernels: KDA recurrent == chunked, split runs == whole runs, absorbed == naive MLA.

The split-run properties are what a checkpointed and restored state rests on: a KDA run over
``[0, T)`` ends where ``[0, t)`` then ``[t, T)`` from the carried state ends, and the short conv
resumes from its ``W - 1`` token cache. Tolerances are fla's (relative RMS < 5e-3 in fp32) and
near round-off in fp64.
"""

from __future__ import annotations

import doctest
import math
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from k3layout import Refusal
from k3layout.torch import kernels
from k3layout.torch.kernels import conv as conv_module
from k3layout.torch.kernels import kda as kda_module
from k3layout.torch.kernels import (
    kda_chunked,
    kda_recurrent,
    mla_decode,
    mla_naive,
    short_conv,
    short_conv_step,
)
from k3layout.torch.kernels import mla as mla_module

F64 = torch.float64
F32 = torch.float32
FLA_FP32_TOLERANCE = 5e-3  # fla's relative-RMS bound between its chunked and recurrent KDA
FP64_TOLERANCE = 1e-10  # fp64 round-off over these sizes sits near 1e-14; 1e-10 leaves margin


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative RMS error, fla's measure; 0 when both are empty or zero."""
    scale = expected.pow(2).mean().sqrt().item() if expected.numel() else 0.0
    error = (actual - expected).pow(2).mean().sqrt().item() if expected.numel() else 0.0
    return error / scale if scale else error


def refused(action: object, *args: object, **kwargs: object) -> Refusal:
    """The refusal ``action(*args, **kwargs)`` raises (and nothing else)."""
    if not callable(action):
        raise TypeError(action)
    with pytest.raises(Refusal) as refusal:
        action(*args, **kwargs)
    assert refusal.value.hint, "every kernel refusal says what would work"
    return refusal.value


# ---------------------------------------------------------------------------- KDA


@dataclass(frozen=True)
class KdaCase:
    """One KDA input, fla layout, with the options a kernel call takes."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    initial_state: torch.Tensor | None
    l2norm: bool
    chunk_size: int

    def upto(self, stop: int) -> tuple[torch.Tensor, ...]:
        return tuple(x[:, :stop] for x in (self.q, self.k, self.v, self.g, self.beta))

    def after(self, start: int) -> tuple[torch.Tensor, ...]:
        return tuple(x[:, start:] for x in (self.q, self.k, self.v, self.g, self.beta))


@st.composite
def kda_cases(draw: st.DrawFn, dtype: torch.dtype = F64, max_tokens: int = 40) -> KdaCase:
    """Small shapes, any chunk size, with and without a carried state and in-kernel L2 norm."""
    batch, tokens = draw(st.integers(1, 2)), draw(st.integers(0, max_tokens))
    heads, key_dim, value_dim = (
        draw(st.integers(1, 3)),
        draw(st.integers(1, 8)),
        draw(st.integers(1, 8)),
    )
    l2norm, with_state = draw(st.booleans()), draw(st.booleans())
    decay = draw(st.sampled_from((0.05, 1.0, 8.0)))  # weak to strong forgetting
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype)

    # Without the in-kernel norm keep |k| near 1, as the layer's own L2 norm would.
    k = randn(batch, tokens, heads, key_dim) * (1.0 if l2norm else key_dim**-0.5)
    return KdaCase(
        q=randn(batch, tokens, heads, key_dim),
        k=k,
        v=randn(batch, tokens, heads, value_dim),
        g=-decay * torch.nn.functional.softplus(randn(batch, tokens, heads, key_dim)),
        beta=torch.sigmoid(randn(batch, tokens, heads)),
        initial_state=randn(batch, heads, key_dim, value_dim) if with_state else None,
        l2norm=l2norm,
        chunk_size=draw(st.integers(1, 16)),
    )


def run_kda(
    kernel: str, case: KdaCase, inputs: tuple[torch.Tensor, ...], state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v, g, beta = inputs
    if kernel == "recurrent":
        return kda_recurrent(
            q, k, v, g, beta, initial_state=state, use_qk_l2norm_in_kernel=case.l2norm
        )
    return kda_chunked(
        q,
        k,
        v,
        g,
        beta,
        initial_state=state,
        use_qk_l2norm_in_kernel=case.l2norm,
        chunk_size=case.chunk_size,
    )


@settings(max_examples=100)
@given(case=kda_cases(F64))
def test_chunked_kda_equals_the_recurrence_in_fp64(case: KdaCase) -> None:
    whole = case.upto(case.q.shape[1])
    o_rec, s_rec = run_kda("recurrent", case, whole, case.initial_state)
    o_chunk, s_chunk = run_kda("chunked", case, whole, case.initial_state)
    assert o_chunk.shape == o_rec.shape == case.v.shape
    assert o_chunk.dtype == s_chunk.dtype == F64
    assert rel_rms(o_chunk, o_rec) < FP64_TOLERANCE
    assert rel_rms(s_chunk, s_rec) < FP64_TOLERANCE


@settings(max_examples=60)
@given(case=kda_cases(F32))
def test_chunked_kda_equals_the_recurrence_in_fp32_within_flas_tolerance(case: KdaCase) -> None:
    whole = case.upto(case.q.shape[1])
    o_rec, s_rec = run_kda("recurrent", case, whole, case.initial_state)
    o_chunk, s_chunk = run_kda("chunked", case, whole, case.initial_state)
    assert o_chunk.dtype == s_chunk.dtype == F32
    assert rel_rms(o_chunk, o_rec) < FLA_FP32_TOLERANCE
    assert rel_rms(s_chunk, s_rec) < FLA_FP32_TOLERANCE


@settings(max_examples=60)
@given(case=kda_cases(F64), cut=st.floats(0, 1), kernel=st.sampled_from(("recurrent", "chunked")))
def test_a_run_split_anywhere_resumes_from_its_carried_state(
    case: KdaCase, cut: float, kernel: str
) -> None:
    tokens = case.q.shape[1]
    split = round(cut * tokens)
    o_whole, s_whole = run_kda(kernel, case, case.upto(tokens), case.initial_state)
    o_head, s_head = run_kda(kernel, case, case.upto(split), case.initial_state)
    o_tail, s_tail = run_kda(kernel, case, case.after(split), s_head)
    assert rel_rms(torch.cat([o_head, o_tail], dim=1), o_whole) < FP64_TOLERANCE
    assert rel_rms(s_tail, s_whole) < FP64_TOLERANCE


@settings(max_examples=30)
@given(case=kda_cases(F64), num_chunks=st.integers(0, 3))
def test_a_split_on_the_chunk_grid_resumes_bit_for_bit(case: KdaCase, num_chunks: int) -> None:
    # Boundaries land on the chunk grid (vLLM's 1536-token blocks are 24 chunks of 64), where
    # a resumed run repeats the cold run's arithmetic exactly: outputs and state are identical.
    split = min(num_chunks * case.chunk_size, case.q.shape[1])
    for kernel in ("recurrent", "chunked"):
        o_whole, s_whole = run_kda(kernel, case, case.upto(case.q.shape[1]), case.initial_state)
        o_head, s_head = run_kda(kernel, case, case.upto(split), case.initial_state)
        o_tail, s_tail = run_kda(kernel, case, case.after(split), s_head)
        assert torch.equal(torch.cat([o_head, o_tail], dim=1), o_whole), kernel
        assert torch.equal(s_tail, s_whole), kernel


@pytest.mark.parametrize("dtype", [F32, F64])
def test_fla_default_chunk_with_a_ragged_tail_and_full_size_heads(dtype: torch.dtype) -> None:
    # 200 tokens = 3 chunks of 64 + 8; K = V = 128 as in K3's heads
    gen = torch.Generator().manual_seed(13)
    shape = (1, 200, 2, 128)
    q, k, v = (torch.randn(shape, generator=gen, dtype=dtype) for _ in range(3))
    g = -torch.nn.functional.softplus(torch.randn(shape, generator=gen, dtype=dtype))
    beta = torch.sigmoid(torch.randn(shape[:3], generator=gen, dtype=dtype))
    start = torch.randn(1, 2, 128, 128, generator=gen, dtype=dtype)
    options: dict[str, Any] = {"initial_state": start, "use_qk_l2norm_in_kernel": True}
    o_rec, s_rec = kda_recurrent(q, k, v, g, beta, **options)
    o_chunk, s_chunk = kda_chunked(q, k, v, g, beta, **options)  # chunk_size defaults to 64
    tolerance = FP64_TOLERANCE if dtype == F64 else FLA_FP32_TOLERANCE
    assert rel_rms(o_chunk, o_rec) < tolerance
    assert rel_rms(s_chunk, s_rec) < tolerance


def test_the_scalar_recurrence_by_hand() -> None:
    # K = V = 1, one head, scale 1: each step is S' = e^g S, u = v - S' k, S = S' + beta k u,
    # o = S q. Starting from S0 = 2 with (q, k, v, g, beta) per step:
    steps = [(1.0, 0.5, 3.0, -0.1, 0.5), (2.0, -1.0, 1.0, -0.7, 0.25), (0.5, 2.0, -2.0, 0.0, 1.0)]
    state, expected = 2.0, []
    for q_t, k_t, v_t, g_t, b_t in steps:
        decayed = math.exp(g_t) * state
        state = decayed + b_t * k_t * (v_t - decayed * k_t)
        expected.append(state * q_t)
    # step 1 worked: S' = 2e^-0.1 = 1.80967; u = 3 - 0.90484 = 2.09516; S = 1.80967 + 0.52379
    assert expected[0] == pytest.approx(2.0 * math.exp(-0.1) + 0.25 * (3 - math.exp(-0.1)))

    def column(i: int) -> torch.Tensor:
        return torch.tensor([s[i] for s in steps], dtype=F64).view(1, 3, 1, 1)

    q, k, v, g = column(0), column(1), column(2), column(3)
    beta = column(4).view(1, 3, 1)
    start = torch.full((1, 1, 1, 1), 2.0, dtype=F64)
    for o, final in (
        kda_recurrent(q, k, v, g, beta, scale=1.0, initial_state=start),
        kda_chunked(q, k, v, g, beta, scale=1.0, initial_state=start, chunk_size=2),
    ):
        assert o.flatten().tolist() == pytest.approx(expected, rel=1e-12)
        assert final.item() == pytest.approx(state, rel=1e-12)


def test_a_second_write_under_the_same_key_replaces_the_first() -> None:
    # The delta rule with beta = 1 and no decay: writing v2 under a unit key k already holding
    # v1 leaves S^T k = v2 (an additive rule would give v1 + v2). Read with q = k, scale 1.
    key = torch.tensor([0.6, 0.8], dtype=F64)  # unit norm
    k = key.view(1, 1, 1, 2).expand(1, 2, 1, 2)
    v = torch.tensor([[1.0, 2.0, 3.0], [-4.0, 0.5, 7.0]], dtype=F64).view(1, 2, 1, 3)
    beta = torch.ones(1, 2, 1, dtype=F64)
    for o, state in (
        kda_recurrent(k, k, v, torch.zeros_like(k), beta, scale=1.0),
        kda_chunked(k, k, v, torch.zeros_like(k), beta, scale=1.0),
    ):
        assert torch.allclose(o[0, :, 0], v[0, :, 0], atol=1e-12)  # each read returns its write
        assert torch.allclose(state[0, 0].T @ key, v[0, 1, 0], atol=1e-12)


def test_without_writes_the_state_only_decays_per_key_channel() -> None:
    gen = torch.Generator().manual_seed(3)
    batch, tokens, heads, key_dim, value_dim = 2, 9, 2, 3, 4
    q = torch.randn(batch, tokens, heads, key_dim, generator=gen, dtype=F64)
    g = -torch.rand(batch, tokens, heads, key_dim, generator=gen, dtype=F64)
    start = torch.randn(batch, heads, key_dim, value_dim, generator=gen, dtype=F64)
    v = torch.randn(batch, tokens, heads, value_dim, generator=gen, dtype=F64)
    beta = torch.zeros(batch, tokens, heads, dtype=F64)  # beta = 0: nothing is written
    # S_T = diag(exp(sum_t g_t)) S_0, row by row (a row of S belongs to one key channel)
    expected = torch.exp(g.sum(dim=1)).unsqueeze(-1) * start
    for kernel in (kda_recurrent, kda_chunked):
        o, final = kernel(q, q, v, g, beta, initial_state=start)
        assert torch.allclose(final, expected, atol=1e-12)
        # o_t = S_t^T (K**-0.5 q_t) with S_t = diag(exp(G_t)) S_0
        decayed = torch.exp(g.cumsum(dim=1)).unsqueeze(-1) * start.unsqueeze(1)
        reads = torch.einsum("bthk,bthkv->bthv", q * key_dim**-0.5, decayed)
        assert torch.allclose(o, reads, atol=1e-12)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_a_decay_of_minus_a_huge_number_is_a_full_reset_in_both_forms(dtype: torch.dtype) -> None:
    # g = -1e30 at token 3 (and -max at token 4) wipes the state: exp(g) is exactly 0. The
    # chunked form must not turn the chunk's running sum of g into -inf - -inf = NaN.
    gen = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, 1, 7, 2, 3, generator=gen, dtype=dtype)
    v = torch.randn(1, 7, 2, 2, generator=gen, dtype=dtype)
    g = -torch.rand(1, 7, 2, 3, generator=gen, dtype=dtype)
    g[:, 3], g[:, 4] = -1e30, torch.finfo(dtype).min
    beta = torch.rand(1, 7, 2, generator=gen, dtype=dtype)
    start = torch.randn(1, 2, 3, 2, generator=gen, dtype=dtype)
    o_rec, s_rec = kda_recurrent(q, k, v, g, beta, initial_state=start)
    o_chunk, s_chunk = kda_chunked(q, k, v, g, beta, initial_state=start, chunk_size=7)
    assert bool(torch.isfinite(o_chunk).all()) and bool(torch.isfinite(s_chunk).all())
    assert rel_rms(o_chunk, o_rec) < (FP64_TOLERANCE if dtype == F64 else FLA_FP32_TOLERANCE)
    assert rel_rms(s_chunk, s_rec) < (FP64_TOLERANCE if dtype == F64 else FLA_FP32_TOLERANCE)
    # token 4's decay wipes the state before its write: as if the run started there from zero
    o_wiped, s_wiped = kda_recurrent(
        *(x[:, 4:] for x in (q, k, v, g, beta)), initial_state=torch.zeros_like(start)
    )
    assert torch.allclose(o_rec[:, 4:], o_wiped, atol=1e-6)
    assert torch.allclose(s_rec, s_wiped, atol=1e-6)


def test_default_scale_is_inverse_root_key_dim_and_l2norm_is_flas() -> None:
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 1, 6, 2, 5, generator=gen, dtype=F64)
    v = torch.randn(1, 6, 2, 3, generator=gen, dtype=F64)
    g = -torch.rand(1, 6, 2, 5, generator=gen, dtype=F64)
    beta = torch.rand(1, 6, 2, generator=gen, dtype=F64)

    def norm(x: torch.Tensor) -> torch.Tensor:  # fla l2norm_fwd: x / sqrt(sum x^2 + 1e-6)
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    for kernel in (kda_recurrent, kda_chunked):
        default, _ = kernel(q, k, v, g, beta)
        explicit, _ = kernel(q, k, v, g, beta, scale=5**-0.5)
        assert torch.equal(default, explicit)
        in_kernel, s_in = kernel(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        outside, s_out = kernel(norm(q), norm(k), v, g, beta)
        assert torch.allclose(in_kernel, outside, atol=1e-12)
        assert torch.allclose(s_in, s_out, atol=1e-12)


def test_zero_tokens_return_the_initial_state() -> None:
    start = torch.randn(1, 2, 3, 4, dtype=F32)
    empty_qk = torch.zeros(1, 0, 2, 3, dtype=F32)
    for kernel in (kda_recurrent, kda_chunked):
        o, final = kernel(
            empty_qk, empty_qk, torch.zeros(1, 0, 2, 4, dtype=F32), empty_qk,
            torch.zeros(1, 0, 2, dtype=F32), initial_state=start,
        )  # fmt: skip
        assert o.shape == (1, 0, 2, 4)
        assert torch.equal(final, start)


def kda_arguments(dtype: torch.dtype = F32) -> dict[str, Any]:
    """B=1, T=5, H=2, K=3, V=4."""
    return {
        "q": torch.randn(1, 5, 2, 3, dtype=dtype),
        "k": torch.randn(1, 5, 2, 3, dtype=dtype),
        "v": torch.randn(1, 5, 2, 4, dtype=dtype),
        "g": -torch.rand(1, 5, 2, 3, dtype=dtype),
        "beta": torch.rand(1, 5, 2, dtype=dtype),
        "initial_state": torch.zeros(1, 2, 3, 4, dtype=dtype),
    }


@pytest.mark.parametrize(
    ("argument", "bad_shape", "expected"),
    [
        ("k", (1, 5, 2, 4), (1, 5, 2, 3)),  # [B, T, H, K] of q
        ("v", (1, 5, 3, 4), (1, 5, 2, 4)),  # [B, T, H] of q, its own V
        ("g", (1, 5, 2), (1, 5, 2, 3)),
        ("beta", (1, 5, 2, 1), (1, 5, 2)),
        ("initial_state", (1, 2, 4, 3), (1, 2, 3, 4)),  # [B, H, K, V]: K and V swapped
    ],
)
def test_kda_refuses_a_shape_that_does_not_match_q(
    argument: str, bad_shape: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    for kernel in (kda_recurrent, kda_chunked):
        arguments = kda_arguments()
        arguments[argument] = torch.zeros(bad_shape)
        refusal = refused(kernel, **arguments)
        assert refusal.code == "tensor_mismatch"
        assert refusal.facts["argument"] == argument
        assert refusal.facts["kernel"] == kernel.__name__
        if len(bad_shape) == len(expected):
            assert refusal.facts["shape"] == bad_shape
            assert refusal.facts["expected"] == expected


def test_kda_refuses_rank_dtype_type_and_empty_axes() -> None:
    arguments = kda_arguments()
    arguments["v"] = torch.zeros(1, 5, 2)
    refusal = refused(kda_chunked, **arguments)
    assert (refusal.code, refusal.facts["argument"]) == ("tensor_mismatch", "v")
    assert refusal.facts["expected"] == ("B", "T", "H", "V")

    refusal = refused(kda_recurrent, **kda_arguments(torch.float16))
    assert refusal.facts == {
        "kernel": "kda_recurrent",
        "argument": "q",
        "dtype": "torch.float16",
        "expected": ("torch.float32", "torch.float64"),
    }

    arguments = kda_arguments()
    arguments["initial_state"] = arguments["initial_state"].double()  # fp64 state, fp32 inputs
    refusal = refused(kda_chunked, **arguments)
    assert refusal.facts["argument"] == "initial_state"
    assert refusal.facts["expected"] == ("torch.float32",)

    refusal = refused(kda_recurrent, *[[1.0]] * 5)
    assert refusal.facts == {"kernel": "kda_recurrent", "argument": "q", "type": "list"}

    arguments = {name: t[:, :, :0] for name, t in kda_arguments().items() if name != "beta"}
    refusal = refused(kda_chunked, beta=torch.zeros(1, 5, 0), **arguments)
    assert refusal.facts["argument"] == "q"
    assert refusal.facts["shape"] == (1, 5, 0, 3)


def test_kda_refuses_a_decay_that_is_not_a_log_decay() -> None:
    for bad in (0.25, math.nan, -math.inf):
        arguments = kda_arguments()
        arguments["g"][0, 3, 1, 2] = bad
        refusal = refused(kda_chunked, **arguments)
        assert refusal.code == "invalid_argument"
        assert refusal.facts["argument"] == "g"
        assert refusal.facts["index"] == (0, 3, 1, 2)


@pytest.mark.parametrize("chunk_size", [0, -64, 2.0, True, "64"])
def test_chunk_size_must_be_a_positive_integer(chunk_size: object) -> None:
    refusal = refused(kda_chunked, **kda_arguments(), chunk_size=chunk_size)
    assert refusal.code == "invalid_argument"
    assert refusal.facts == {"kernel": "kda_chunked", "chunk_size": repr(chunk_size)}


@pytest.mark.parametrize("scale", [math.nan, math.inf, "0.5", True])
def test_scale_must_be_a_finite_number(scale: object) -> None:
    refusal = refused(kda_recurrent, **kda_arguments(), scale=scale)
    assert refusal.code == "invalid_argument"
    assert refusal.facts == {"kernel": "kda_recurrent", "scale": repr(scale)}


@settings(max_examples=60)
@given(
    argument=st.sampled_from(("q", "k", "v", "g", "beta", "initial_state")),
    shape=st.lists(st.integers(0, 6), min_size=0, max_size=5).map(tuple),
    chunked=st.booleans(),
)
def test_any_misshapen_kda_argument_is_a_refusal_naming_it(
    argument: str, shape: tuple[int, ...], chunked: bool
) -> None:
    arguments = kda_arguments()
    arguments[argument] = torch.zeros(shape)
    kernel = kda_chunked if chunked else kda_recurrent
    try:
        kernel(**arguments)
    except Refusal as refusal:
        assert refusal.code == "tensor_mismatch"
        # q's shape sets the others', so a misshapen q may surface as a k that does not match it
        assert refusal.facts["argument"] in ({"q", "k"} if argument == "q" else {argument})
    else:
        assert shape == tuple(kda_arguments()[argument].shape), "a wrong shape was accepted"


# ---------------------------------------------------------------------------- short conv


@st.composite
def conv_cases(
    draw: st.DrawFn, min_tokens: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(x [B, T, D], weight [D, W], bias or None, cache or None)`` in fp64, W = 1..4."""
    batch, tokens, channels = (
        draw(st.integers(1, 2)),
        draw(st.integers(min_tokens, 12)),
        draw(st.integers(1, 6)),
    )
    width = draw(st.integers(1, 4))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(batch, tokens, channels, generator=gen, dtype=F64)
    weight = torch.randn(channels, width, generator=gen, dtype=F64)
    bias = torch.randn(channels, generator=gen, dtype=F64) if draw(st.booleans()) else None
    cache = (
        torch.randn(batch, channels, width - 1, generator=gen, dtype=F64)
        if draw(st.booleans())
        else None
    )
    return x, weight, bias, cache


@settings(max_examples=60)
@given(case=conv_cases(min_tokens=1))  # torch's conv1d refuses an empty sequence
def test_short_conv_is_a_causal_depthwise_conv1d_then_silu(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
) -> None:
    x, weight, bias, cache = case
    batch, _, channels = x.shape
    width = weight.shape[1]
    history = cache if cache is not None else torch.zeros(batch, channels, width - 1, dtype=F64)
    # torch's own grouped conv over [cache | x] (channels first), no padding: one output a token
    full = torch.cat([history, x.transpose(1, 2)], dim=2)
    reference = torch.nn.functional.conv1d(full, weight.unsqueeze(1), bias, groups=channels)
    y, new_cache = short_conv(x, weight, bias, cache)
    assert torch.allclose(y, torch.nn.functional.silu(reference.transpose(1, 2)), atol=1e-12)
    bare, _ = short_conv(x, weight, bias, cache, activation=None)
    assert torch.allclose(bare, reference.transpose(1, 2), atol=1e-12)
    # the cache is the last W - 1 inputs, channel-major [B, D, W - 1]
    assert new_cache.shape == (batch, channels, width - 1)
    assert torch.equal(new_cache, full[:, :, full.shape[2] - (width - 1) :])


@settings(max_examples=60)
@given(case=conv_cases(), cut=st.floats(0, 1))
def test_short_conv_over_a_prefix_then_the_rest_from_its_cache_matches_the_whole_run(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None], cut: float
) -> None:
    x, weight, bias, cache = case
    split = round(cut * x.shape[1])  # any split, including ones shorter than W - 1
    for activation in ("silu", None):
        y_whole, cache_whole = short_conv(x, weight, bias, cache, activation=activation)
        y_head, cache_head = short_conv(x[:, :split], weight, bias, cache, activation=activation)
        y_tail, cache_tail = short_conv(
            x[:, split:], weight, bias, cache_head, activation=activation
        )
        y_split = torch.cat([y_head, y_tail], dim=1)
        assert torch.equal(cache_tail, cache_whole)  # the cache holds inputs: exact
        if activation is None:  # taps are added in one order whatever the split: exact
            assert torch.equal(y_split, y_whole)
        else:  # torch's SiLU takes a vector or a scalar path by position: within an ulp or so
            assert torch.allclose(y_split, y_whole, rtol=1e-14, atol=1e-300)


@settings(max_examples=40)
@given(case=conv_cases())
def test_decode_steps_reproduce_the_sequence_form(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
) -> None:
    x, weight, bias, cache = case
    y_sequence, cache_sequence = short_conv(x, weight, bias, cache)
    state = cache if cache is not None else torch.zeros(x.shape[0], x.shape[2], weight.shape[1] - 1)
    state = state.to(F64)
    for t in range(x.shape[1]):
        y_t, state = short_conv_step(x[:, t], state, weight, bias)
        assert torch.allclose(y_t, y_sequence[:, t], atol=1e-12)
    assert torch.equal(state, cache_sequence)


def test_short_conv_by_hand() -> None:
    # One channel, W = 3, weight [1, -1, 2], bias 0.5, cache [3, 4], x [1, 0, 2]:
    # pre-activation y_t = 0.5 + 1*x_{t-2} - 1*x_{t-1} + 2*x_t over [3, 4 | 1, 0, 2]
    pre = [0.5 + 3 - 4 + 2 * 1, 0.5 + 4 - 1 + 2 * 0, 0.5 + 1 - 0 + 2 * 2]  # 1.5, 3.5, 5.5
    x = torch.tensor([1.0, 0.0, 2.0], dtype=F64).view(1, 3, 1)
    weight = torch.tensor([[1.0, -1.0, 2.0]], dtype=F64)
    bias = torch.tensor([0.5], dtype=F64)
    cache = torch.tensor([3.0, 4.0], dtype=F64).view(1, 1, 2)
    y, new_cache = short_conv(x, weight, bias, cache)
    silu = [p / (1 + math.exp(-p)) for p in pre]
    assert y.flatten().tolist() == pytest.approx(silu, rel=1e-12)
    assert new_cache.flatten().tolist() == [0.0, 2.0]  # the last W - 1 = 2 inputs


def test_short_conv_refusals_name_the_argument() -> None:
    x = torch.randn(2, 5, 3)
    weight = torch.randn(3, 4)
    refusal = refused(short_conv, x, torch.randn(4, 4))
    assert refusal.facts == {
        "kernel": "short_conv",
        "argument": "weight",
        "shape": (4, 4),
        "expected": (3, 4),
    }
    refusal = refused(short_conv, x, weight, cache=torch.zeros(2, 3, 4))
    assert (refusal.facts["argument"], refusal.facts["expected"]) == ("cache", (2, 3, 3))
    refusal = refused(short_conv, x, weight, bias=torch.zeros(3, dtype=F64))
    assert (refusal.facts["argument"], refusal.facts["dtype"]) == ("bias", "torch.float64")
    refusal = refused(short_conv_step, x[:, 0], None, weight)
    assert refusal.facts == {
        "kernel": "short_conv_step",
        "argument": "cache",
        "expected": (2, 3, 3),
    }
    refusal = refused(short_conv, x, weight, activation="gelu")
    assert (refusal.code, refusal.facts["activation"]) == ("invalid_argument", "'gelu'")
    assert all(r.code == "tensor_mismatch" for r in [refused(short_conv, x[0], weight)])


# ---------------------------------------------------------------------------- MLA


@dataclass(frozen=True)
class MlaCase:
    """Dense latents per request, the same rows scattered into a paged cache, and the weights."""

    q_nope: torch.Tensor
    q_pe: torch.Tensor
    c_kv: torch.Tensor
    k_pe: torch.Tensor
    seq_lens: torch.Tensor
    kv_cache: torch.Tensor
    block_table: torch.Tensor
    w_uk: torch.Tensor
    w_uv: torch.Tensor

    def decode(self, **overrides: torch.Tensor) -> torch.Tensor:
        fields: dict[str, Any] = {
            "q_nope": self.q_nope,
            "q_pe": self.q_pe,
            "kv_cache": self.kv_cache,
            "block_table": self.block_table,
            "seq_lens": self.seq_lens,
        }
        fields.update(overrides)
        return mla_decode(**fields, w_uk=self.w_uk, w_uv=self.w_uv)

    def naive(self) -> torch.Tensor:
        return mla_naive(
            self.q_nope, self.q_pe, self.c_kv, self.k_pe, self.seq_lens, w_uk=self.w_uk,
            w_uv=self.w_uv,
        )  # fmt: skip


@st.composite
def mla_cases(draw: st.DrawFn, dtype: torch.dtype = F64) -> MlaCase:
    """Blocks drawn without replacement from a larger cache, so every table is scattered."""
    batch, queries, heads = (
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3)),
    )
    nope_dim, rope_dim = draw(st.integers(1, 6)), draw(st.integers(0, 4))  # R = 0: NoPE-only
    latent_dim, value_dim = draw(st.integers(1, 8)), draw(st.integers(1, 5))
    block_tokens = draw(st.integers(1, 5))
    lens = draw(st.lists(st.integers(queries, 14), min_size=batch, max_size=batch))
    max_blocks = max(-(-n // block_tokens) for n in lens) + draw(st.integers(0, 2))
    num_blocks = batch * max_blocks + draw(st.integers(0, 4))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype)

    longest = max(lens)
    c_kv, k_pe = randn(batch, longest, latent_dim), randn(batch, longest, rope_dim)
    table = torch.randperm(num_blocks, generator=gen)[: batch * max_blocks].view(batch, max_blocks)
    # Rows no request reaches hold NaN: the kernel must never read them.
    kv_cache = torch.full((num_blocks, block_tokens, latent_dim + rope_dim), math.nan, dtype=dtype)
    for b, length in enumerate(lens):
        for t in range(length):  # token t of request b -> row t % bt of block table[b, t // bt]
            kv_cache[table[b, t // block_tokens], t % block_tokens] = torch.cat(
                [c_kv[b, t], k_pe[b, t]]
            )
        c_kv[b, length:] = 0.0
        k_pe[b, length:] = 0.0
        table[b, -(-length // block_tokens) :] = -1  # past a request's pages: padding
    return MlaCase(
        q_nope=randn(batch, queries, heads, nope_dim),
        q_pe=randn(batch, queries, heads, rope_dim),
        c_kv=c_kv,
        k_pe=k_pe,
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        kv_cache=kv_cache,
        block_table=table.to(torch.int32),
        w_uk=randn(heads, nope_dim, latent_dim),
        w_uv=randn(heads, value_dim, latent_dim),
    )


@settings(max_examples=100)
@given(case=mla_cases(F64))
def test_absorbed_decode_through_a_scattered_block_table_equals_naive_mla(case: MlaCase) -> None:
    absorbed = case.decode()
    batch, queries, heads, _ = case.q_nope.shape
    assert absorbed.shape == (batch, queries, heads, case.w_uv.shape[1])
    assert bool(torch.isfinite(absorbed).all()), "a row outside the block table leaked in"
    assert rel_rms(absorbed, case.naive()) < FP64_TOLERANCE


@settings(max_examples=30)
@given(case=mla_cases(F32))
def test_absorbed_decode_equals_naive_mla_in_fp32(case: MlaCase) -> None:
    assert rel_rms(case.decode(), case.naive()) < 1e-4


@settings(max_examples=30)
@given(case=mla_cases(F64))
def test_query_i_of_s_sees_exactly_the_tokens_up_to_its_own_position(case: MlaCase) -> None:
    # Bottom-right causal: query i of S is token seq_len - S + i, the same as a one-query decode
    # of a request whose seq_len ends at that token.
    queries = case.q_nope.shape[1]
    together = case.decode()
    for i in range(queries):
        alone = case.decode(
            q_nope=case.q_nope[:, i : i + 1],
            q_pe=case.q_pe[:, i : i + 1],
            seq_lens=case.seq_lens - (queries - 1 - i),
        )
        assert torch.allclose(alone[:, 0], together[:, i], atol=1e-12)


def test_equal_scores_average_the_latents() -> None:
    # q = 0 makes every score 0: softmax is uniform over the 3 tokens, so the output is
    # w_uv (c0 + c1 + c2) / 3. Tokens sit in blocks 4 (t = 0, 1) and 1 (t = 2) of 2-token blocks.
    latents = torch.tensor([[1.0, 2.0], [3.0, -1.0], [2.0, 5.0]], dtype=F64)
    cache = torch.zeros(5, 2, 2 + 1, dtype=F64)
    cache[4, 0, :2], cache[4, 1, :2], cache[1, 0, :2] = latents
    w_uv = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]], dtype=F64)  # H=1, Vd=2, L=2
    out = mla_decode(
        torch.zeros(1, 1, 1, 3, dtype=F64), torch.zeros(1, 1, 1, 1, dtype=F64), cache,
        torch.tensor([[4, 1]]), torch.tensor([3]), w_uk=torch.ones(1, 3, 2, dtype=F64),
        w_uv=w_uv,
    )  # fmt: skip
    mean = latents.mean(dim=0)  # (2, 2)
    assert out.flatten().tolist() == pytest.approx([mean[0].item(), mean.sum().item()])


@settings(max_examples=10)
@given(case=mla_cases(F64))
def test_the_default_scale_is_inverse_root_of_the_uncompressed_query_head(case: MlaCase) -> None:
    # The score is taken over the decompressed head, nope + rope = P + R elements (K3: 128 + 64)
    head_dim = case.q_nope.shape[-1] + case.q_pe.shape[-1]
    explicit = {"w_uk": case.w_uk, "w_uv": case.w_uv, "scale": head_dim**-0.5}
    decode_args = (case.q_nope, case.q_pe, case.kv_cache, case.block_table, case.seq_lens)
    naive_args = (case.q_nope, case.q_pe, case.c_kv, case.k_pe, case.seq_lens)
    assert torch.equal(case.decode(), mla_decode(*decode_args, **explicit))
    assert torch.equal(case.naive(), mla_naive(*naive_args, **explicit))


def test_a_bf16_cache_is_read_in_the_query_dtype() -> None:
    gen = torch.Generator().manual_seed(11)
    cache = torch.randn(4, 3, 6, generator=gen).to(torch.bfloat16)
    q_nope, q_pe = torch.randn(2, 1, 1, 2, 2, generator=gen, dtype=F64)
    weights: dict[str, Any] = {
        "w_uk": torch.randn(2, 2, 4, dtype=F64),
        "w_uv": torch.randn(2, 3, 4, dtype=F64),
    }
    table, lens = torch.tensor([[3, 0]]), torch.tensor([5])
    from_bf16 = mla_decode(q_nope, q_pe, cache, table, lens, **weights)
    upcast = mla_decode(q_nope, q_pe, cache.to(F64), table, lens, **weights)
    assert from_bf16.dtype == F64
    assert torch.equal(from_bf16, upcast)


def mla_arguments() -> dict[str, Any]:
    """B=2, S=1, H=2, P=3, R=2, L=4, Vd=3; 6 blocks of 4 tokens, tables of 2 blocks."""
    return {
        "q_nope": torch.randn(2, 1, 2, 3),
        "q_pe": torch.randn(2, 1, 2, 2),
        "kv_cache": torch.randn(6, 4, 4 + 2),
        "block_table": torch.tensor([[5, 2], [0, -1]], dtype=torch.int32),
        "seq_lens": torch.tensor([7, 3], dtype=torch.int32),
        "w_uk": torch.randn(2, 3, 4),
        "w_uv": torch.randn(2, 3, 4),
    }


def test_mla_decode_refuses_a_cache_row_that_is_not_latent_plus_rope() -> None:
    arguments = mla_arguments()
    arguments["kv_cache"] = torch.randn(6, 4, 576)  # K3's 512 + 64 row, but L=4, R=2 here
    refusal = refused(mla_decode, **arguments)
    assert refusal.code == "tensor_mismatch"
    assert refusal.facts == {
        "kernel": "mla_decode",
        "argument": "kv_cache",
        "shape": (6, 4, 576),
        "expected": (6, 4, 4 + 2),
    }


def test_mla_decode_refuses_a_block_outside_the_cache() -> None:
    arguments = mla_arguments()
    arguments["block_table"] = torch.tensor([[5, 6], [0, -1]], dtype=torch.int32)
    refusal = refused(mla_decode, **arguments)
    assert refusal.code == "invalid_argument"
    assert refusal.facts == {
        "kernel": "mla_decode",
        "argument": "block_table",
        "request": 0,
        "column": 1,
        "block_id": 6,
        "num_blocks": 6,
    }


def test_mla_decode_refuses_lengths_the_table_cannot_hold_or_shorter_than_the_queries() -> None:
    arguments = mla_arguments()
    arguments["seq_lens"] = torch.tensor([7, 9], dtype=torch.int32)  # 9 tokens need 3 blocks of 4
    refusal = refused(mla_decode, **arguments)
    assert refusal.facts["argument"] == "seq_lens"
    assert (refusal.facts["request"], refusal.facts["capacity_tokens"]) == (1, 2 * 4)

    arguments = mla_arguments()
    arguments["seq_lens"] = torch.tensor([7, 0], dtype=torch.int32)
    refusal = refused(mla_decode, **arguments)
    assert (refusal.facts["seq_len"], refusal.facts["num_query_tokens"]) == (0, 1)

    arguments = mla_arguments()
    arguments["block_table"] = arguments["block_table"].float()
    refusal = refused(mla_decode, **arguments)
    assert (refusal.code, refusal.facts["argument"]) == ("tensor_mismatch", "block_table")


def test_mla_naive_refuses_lengths_past_its_latent_rows() -> None:
    arguments = mla_arguments()
    refusal = refused(
        mla_naive, arguments["q_nope"], arguments["q_pe"], torch.randn(2, 5, 4),
        torch.randn(2, 5, 2), torch.tensor([7, 3]), w_uk=arguments["w_uk"],
        w_uv=arguments["w_uv"],
    )  # fmt: skip
    assert refusal.facts == {
        "kernel": "mla_naive",
        "argument": "kv_lens",
        "kv_lens": (7, 3),
        "kv_tokens": 5,
    }


MLA_PARTNERS = {
    # q_nope sets B, S, H and P for the others; q_pe sets R for the cache rows
    "q_nope": ("q_pe", "w_uk", "w_uv", "block_table", "seq_lens"),
    "q_pe": ("kv_cache",),
    # the cache's block count bounds the table's ids, its block size the lengths' pages
    "kv_cache": ("block_table", "seq_lens"),
    "block_table": ("seq_lens",),
    # w_uk sets L for w_uv and for the cache rows (L + R)
    "w_uk": ("w_uv", "kv_cache"),
    "w_uv": (),
}
"""Where a misshapen argument may surface: itself, or the argument checked against it."""


@settings(max_examples=60)
@given(
    argument=st.sampled_from(tuple(MLA_PARTNERS)),
    shape=st.lists(st.integers(0, 7), min_size=0, max_size=4).map(tuple),
)
def test_any_misshapen_mla_argument_is_a_refusal_naming_it(
    argument: str, shape: tuple[int, ...]
) -> None:
    arguments = mla_arguments()
    original = arguments[argument]
    arguments[argument] = torch.zeros(shape, dtype=original.dtype)
    try:
        out = mla_decode(**arguments)
    except Refusal as refusal:
        assert refusal.code in {"tensor_mismatch", "invalid_argument"}
        assert refusal.facts["argument"] in {argument, *MLA_PARTNERS[argument]}
    else:  # some other shapes are servable (more table columns, a bigger cache, another Vd)
        assert out.shape == (2, 1, 2, arguments["w_uv"].shape[1])
        assert argument in {"kv_cache", "block_table", "w_uv"} or shape == tuple(original.shape)


# ---------------------------------------------------------------------------- the package


def test_the_worked_examples_in_the_docstrings_hold() -> None:
    for module in (kda_module, conv_module, mla_module):
        failures, attempted = doctest.testmod(module)
        assert attempted > 0, module.__name__
        assert failures == 0, module.__name__


def test_kernels_export_what_the_issue_names() -> None:
    assert set(kernels.__all__) >= {"kda_recurrent", "kda_chunked", "mla_decode"}
    assert {"short_conv", "short_conv_step", "mla_naive"} <= set(kernels.__all__)


def test_the_adapter_without_torch_says_how_to_install_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # what an interpreter without torch sees
        "import k3layout\n"
        "try:\n"
        "    import k3layout.torch\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install k3layout[torch]" in run.stdout
