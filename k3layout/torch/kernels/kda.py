"""Kimi Delta Attention, the recurrent and the chunked (WY / UT) reference forms.

Tensor conventions are fla's (``chunk_kda`` / ``fused_recurrent_kda``): ``q, k [B, T, H, K]``,
``v [B, T, H, V]``, ``g [B, T, H, K]`` a per-key-channel log decay (``<= 0``), ``beta [B, T, H]``,
``initial_state [B, H, K, V]``; both kernels return ``(o [B, T, H, V], final_state [B, H, K, V])``.
All tensors share one dtype, fp32 or fp64, and one device.

Per head, with ``q_hat = scale * q`` (scale ``K**-0.5``; q and k optionally L2-normalised first)::

    S' = diag(exp(g_t)) S_{t-1}          decay each key channel
    u  = v_t - S'^T k_t                  what the state does not yet say about k_t
    S_t = S' + beta_t k_t u^T            delta-rule write
    o_t = S_t^T q_hat_t

The two forms agree (fla's tolerance: relative RMS < 5e-3 in fp32; ~1e-12 in fp64), and a run
over ``[0, T)`` ends in the same state as ``[0, t)`` then ``[t, T)`` from the carried state: the
property a checkpointed and restored KDA state rests on.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import torch

from ...errors import Refusal
from . import _checks

L2NORM_EPS: Final = 1e-6
"""``x * rsqrt(sum(x**2) + eps)``: fla's ``l2norm_fwd`` epsilon (``use_qk_l2norm_in_kernel``)."""

LOG_DECAY_FLOOR: Final = -1000.0
"""``g`` is floored here before use: ``exp`` of anything below about -745 is exactly 0 in fp64
(-104 in fp32), so the floor changes no result, while a chunk's running sum of ``g`` stays
finite (``-1e308 + -1e308`` would be ``-inf``, and ``-inf - -inf`` is NaN)."""

DEFAULT_CHUNK_TOKENS: Final = 64
"""fla's ``chunk_kda`` chunk size (``BT = 64``)."""


class _Inputs(NamedTuple):
    """Checked inputs, time-major per head: ``[B, H, T, .]``, q already scaled."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    state: torch.Tensor


def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA one token at a time: the definition the chunked form is checked against.

    Returns ``(o [B, T, H, V], final_state [B, H, K, V])``. One write of ``v`` under a unit key
    with ``beta = 1`` and no decay, read back with ``q = k`` and ``scale = 1``, returns ``v``:

    >>> import torch
    >>> q = k = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)  # B=T=H=1, K=2
    >>> v = torch.tensor([[[[3.0, -2.0]]]], dtype=torch.float64)    # V=2
    >>> o, state = kda_recurrent(q, k, v, torch.zeros_like(q), torch.ones(1, 1, 1,
    ...                          dtype=torch.float64), scale=1.0)
    >>> o.flatten().tolist(), state[0, 0].tolist()
    ([3.0, -2.0], [[3.0, -2.0], [0.0, 0.0]])
    """
    inputs = _prepare(
        "kda_recurrent",
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        scale=scale,
        initial_state=initial_state,
        l2norm=use_qk_l2norm_in_kernel,
    )
    state = inputs.state
    steps = []
    for t in range(inputs.q.shape[2]):
        k_t = inputs.k[:, :, t]  # [B, H, K]
        state = state * torch.exp(inputs.g[:, :, t]).unsqueeze(-1)
        u = inputs.v[:, :, t] - torch.einsum("bhk,bhkv->bhv", k_t, state)
        state = state + (inputs.beta[:, :, t, None] * k_t).unsqueeze(-1) * u.unsqueeze(-2)
        steps.append(torch.einsum("bhk,bhkv->bhv", inputs.q[:, :, t], state))
    o = torch.stack(steps, dim=1) if steps else _empty_output(inputs)
    return o, state


def kda_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA a chunk of ``chunk_size`` tokens at a time, in the WY / UT form fla's kernels use.

    Within a chunk (``G_t`` = cumulative ``g`` from the chunk start, ``S0`` the entering state)
    the writes ``W = beta * u`` solve the unit lower-triangular system
    ``(I + diag(beta) L) W = diag(beta) (V - exp(G) k S0)``, ``L[t, i] = k_t . exp(G_t - G_i) k_i``
    for ``i < t``. The UT transform ``A = (I + diag(beta) L)^-1 diag(beta)`` gives ``u = A V``
    and ``w = A exp(G) k``, so ``W = u - w S0``; then ``o = exp(G) q S0 + A_qk W`` with
    ``A_qk[t, i] = q_t . exp(G_t - G_i) k_i`` for ``i <= t``, and the chunk leaves
    ``S = exp(G_C) S0 + (exp(G_C - G) k)^T W``. Every exponent is a sum of ``g`` over tokens
    ``(i, t]`` (so at most 0), never ``exp(-G)``: strong decays underflow harmlessly instead of
    overflowing. The token count need not be a multiple of ``chunk_size``: the last chunk is
    shorter.

    A run split at any token gives the unsplit run's outputs and final state:

    >>> import torch
    >>> rng = torch.Generator().manual_seed(0)
    >>> B, T, H, K, V = 1, 10, 2, 4, 3
    >>> q, k = torch.randn(2, B, T, H, K, generator=rng, dtype=torch.float64)
    >>> v = torch.randn(B, T, H, V, generator=rng, dtype=torch.float64)
    >>> g = -torch.rand(B, T, H, K, generator=rng, dtype=torch.float64)
    >>> beta = torch.rand(B, T, H, generator=rng, dtype=torch.float64)
    >>> o, s = kda_chunked(q, k, v, g, beta, chunk_size=4)
    >>> o1, s1 = kda_chunked(q[:, :7], k[:, :7], v[:, :7], g[:, :7], beta[:, :7], chunk_size=4)
    >>> o2, s2 = kda_chunked(q[:, 7:], k[:, 7:], v[:, 7:], g[:, 7:], beta[:, 7:],
    ...                      initial_state=s1, chunk_size=4)
    >>> torch.allclose(torch.cat([o1, o2], dim=1), o, atol=1e-12), torch.allclose(s2, s, atol=1e-12)
    (True, True)
    """
    size = _checks.positive_int("kda_chunked", "chunk_size", chunk_size)
    inputs = _prepare(
        "kda_chunked",
        q=q,
        k=k,
        v=v,
        g=g,
        beta=beta,
        scale=scale,
        initial_state=initial_state,
        l2norm=use_qk_l2norm_in_kernel,
    )
    state = inputs.state
    pieces = []
    for start in range(0, inputs.q.shape[2], size):
        window = slice(start, start + size)
        o_chunk, state = _chunk(
            _Inputs(
                q=inputs.q[:, :, window],
                k=inputs.k[:, :, window],
                v=inputs.v[:, :, window],
                g=inputs.g[:, :, window],
                beta=inputs.beta[:, :, window],
                state=state,
            )
        )
        pieces.append(o_chunk)
    o = torch.cat(pieces, dim=2).transpose(1, 2) if pieces else _empty_output(inputs)
    return o.contiguous(), state


def _chunk(chunk: _Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: inputs ``[B, H, C, .]`` and the entering state; ``(o [B, H, C, V], state)``."""
    q, k, v, g, beta, state = chunk
    tokens = q.shape[2]
    cumulative = g.cumsum(dim=2)  # G_t, [B, H, C, K]; non-increasing in t since g <= 0
    # exp(G_t - G_i): at most 1 for i <= t. Above the diagonal the difference is clamped to 0
    # (so nothing overflows) and those entries are cut from A below.
    decay = (cumulative.unsqueeze(3) - cumulative.unsqueeze(2)).clamp_max_(0.0).exp_()
    decayed_keys = decay * k.unsqueeze(2)  # exp(G_t - G_i) k_i, [B, H, C(t), C(i), K]
    a_kk = (decayed_keys * k.unsqueeze(3)).sum(dim=-1).tril(-1)  # L, strictly lower
    a_qk = (decayed_keys * q.unsqueeze(3)).sum(dim=-1).tril()  # i <= t
    eye = torch.eye(tokens, dtype=q.dtype, device=q.device)
    system = eye + beta.unsqueeze(-1) * a_kk  # I + diag(beta) L, unit lower-triangular
    ut = torch.linalg.solve_triangular(
        system, torch.diag_embed(beta), upper=False, unitriangular=True
    )  # A = (I + diag(beta) L)^-1 diag(beta), the UT transform
    u = ut @ v
    from_start = torch.exp(cumulative)  # exp(G_t): decay since the chunk started, <= 1
    w = ut @ (from_start * k)
    writes = u - w @ state  # W = beta * u_t of the recurrence, [B, H, C, V]
    o = (from_start * q) @ state + a_qk @ writes
    last = cumulative[:, :, -1:]  # G_C, [B, H, 1, K]
    carried = torch.exp(last).transpose(-1, -2) * state
    state = carried + (torch.exp(last - cumulative) * k).transpose(-1, -2) @ writes
    return o, state


def _prepare(
    kernel: str,
    *,
    q: object,
    k: object,
    v: object,
    g: object,
    beta: object,
    scale: object,
    initial_state: object,
    l2norm: bool,
) -> _Inputs:
    """Check every argument against ``q``'s ``[B, T, H, K]``; return them ``[B, H, T, .]``."""
    q = _checks.tensor(kernel, "q", q)
    batch, tokens, heads, key_dim = _checks.axes(
        kernel, "q", q, ("B", "T", "H", "K"), may_be_empty=("T",)
    )
    _checks.dtype(kernel, "q", q, _checks.FLOAT_DTYPES)
    k = _checks.like(kernel, "k", k, tuple(q.shape), "[B, T, H, K]", reference=q)
    v = _checks.tensor(kernel, "v", v)
    value_dim = _checks.axes(kernel, "v", v, ("B", "T", "H", "V"), may_be_empty=("T",))[3]
    v = _checks.like(kernel, "v", v, (batch, tokens, heads, value_dim), "[B, T, H, V]", reference=q)
    g = _checks.like(kernel, "g", g, tuple(q.shape), "[B, T, H, K]", reference=q)
    beta = _checks.like(kernel, "beta", beta, (batch, tokens, heads), "[B, T, H]", reference=q)
    _check_decay(kernel, g)
    state_shape = (batch, heads, key_dim, value_dim)
    if initial_state is None:
        state = q.new_zeros(state_shape)
    else:
        state = _checks.like(
            kernel, "initial_state", initial_state, state_shape, "[B, H, K, V]", reference=q
        )
    step = _checks.scale(kernel, scale, key_dim**-0.5)
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    return _Inputs(
        q=(q * step).transpose(1, 2),
        k=k.transpose(1, 2),
        v=v.transpose(1, 2),
        g=g.clamp_min(LOG_DECAY_FLOOR).transpose(1, 2),
        beta=beta.transpose(1, 2),
        state=state,
    )


def _check_decay(kernel: str, g: torch.Tensor) -> None:
    """``g`` is a log decay: finite and ``<= 0`` (a gain would grow the state without bound)."""
    bad = ~torch.isfinite(g) | (g > 0)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        value = float(g[index])
        raise Refusal(
            "invalid_argument",
            f"{kernel} argument g: log decay g{list(index)}={value} must be finite and <= 0",
            facts={"kernel": kernel, "argument": "g", "index": index, "value": value},
            hint="pass g as a log decay, e.g. -softplus(...) or logsigmoid(...)",
        )


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def _empty_output(inputs: _Inputs) -> torch.Tensor:
    batch, heads, _, value_dim = inputs.v.shape
    return inputs.v.new_zeros((batch, 0, heads, value_dim))
