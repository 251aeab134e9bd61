"""MLA decode over a paged latent cache (absorbed), and the naive MLA it must equal.

The cache keeps one latent row per token: ``c_kv`` (``kv_lora_rank`` = L elements) then the
rotary key ``k_pe`` (R elements), ``cache [num_blocks, block_tokens, L + R]`` (K3: 512 + 64 =
576). Per head ``h`` the up-projections are ``w_uk [H, P, L]`` (key, P = ``qk_nope_head_dim``)
and ``w_uv [H, Vd, L]`` (value): the naive form decompresses ``k_nope = w_uk[h] c`` and
``v = w_uv[h] c`` for every token; the absorbed form (FlashMLA, vLLM's MLA decode) folds
``w_uk`` into the query instead and ``w_uv`` into the output::

    score_t = scale * ((q_nope w_uk[h]) . c_t + q_pe . k_pe_t)
    out     = w_uv[h] (sum_t softmax(score)_t c_t)

Queries are ``[B, S, H, .]``: ``S`` query tokens per request (1 for plain decode, ``s + 1``
with ``s`` speculative tokens, the whole prompt for a prefill) that are the *last* ``S`` of the
request's ``seq_len`` tokens; query ``i`` sees keys ``0 .. seq_len - S + i`` (FlashMLA's causal
convention, bottom-right aligned). Scale defaults to ``(P + R) ** -0.5``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...errors import Refusal
from . import _checks

_LATENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""Cache dtypes the decode reads (rows are up-cast to the query dtype before any arithmetic)."""


class _Heads(NamedTuple):
    """The sizes the query side fixes (B, S, H, R, L) and the attention scale."""

    batch: int
    queries: int
    heads: int
    rope_dim: int
    latent_dim: int
    scale: float


def mla_decode(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Absorbed MLA over ``kv_cache [num_blocks, block_tokens, L + R]``; returns ``[B, S, H, Vd]``.

    Token ``t`` of request ``b`` sits in row ``t % block_tokens`` of block
    ``block_table[b, t // block_tokens]``; only the first ``ceil(seq_lens[b] / block_tokens)``
    entries of a row of ``block_table`` are read, so padding past them may hold anything.
    A request with one cached token attends only to it, so the output is ``w_uv c``:

    >>> import torch
    >>> f64 = dict(dtype=torch.float64)
    >>> cache = torch.zeros(3, 2, 2 + 1, **f64)   # 3 blocks of 2 tokens, L=2, R=1
    >>> cache[2, 0] = torch.tensor([1.0, -1.0, 0.5])  # the request's token 0, in block 2
    >>> w_uv = torch.tensor([[[1.0, 2.0]]], **f64)  # H=1, Vd=1, L=2
    >>> out = mla_decode(torch.ones(1, 1, 1, 4, **f64), torch.ones(1, 1, 1, 1, **f64), cache,
    ...                  torch.tensor([[2, 0]]), torch.tensor([1]),
    ...                  w_uk=torch.ones(1, 4, 2, **f64), w_uv=w_uv)
    >>> out.tolist()  # w_uv . c = 1 * 1 + 2 * (-1)
    [[[[-1.0]]]]
    """
    kernel = "mla_decode"
    heads = _heads(kernel, q_nope=q_nope, q_pe=q_pe, w_uk=w_uk, w_uv=w_uv, scale=scale)
    kv_cache = _checks.tensor(kernel, "kv_cache", kv_cache)
    num_blocks, block_tokens, _ = _checks.axes(
        kernel, "kv_cache", kv_cache, ("num_blocks", "block_tokens", "L + R")
    )
    _checks.shape(
        kernel,
        "kv_cache",
        kv_cache,
        (num_blocks, block_tokens, heads.latent_dim + heads.rope_dim),
        "[num_blocks, block_tokens, kv_lora_rank + rope_dim]",
    )
    _checks.dtype(kernel, "kv_cache", kv_cache, _LATENT_DTYPES)
    _checks.device(kernel, "kv_cache", kv_cache, q_nope.device)
    lens = _seq_lens(kernel, seq_lens, heads, q_nope.device)
    table = _block_table(kernel, block_table, heads.batch, q_nope.device)
    _check_pages(kernel, table, lens, num_blocks, block_tokens)
    positions = torch.arange(max(lens), device=q_nope.device)
    columns = table[:, positions // block_tokens]  # [B, T_max]; in range by the check above
    present = positions < torch.tensor(lens, device=q_nope.device).unsqueeze(1)
    blocks = torch.where(present, columns, torch.zeros_like(columns))
    rows = kv_cache[blocks, positions % block_tokens].to(q_nope.dtype)  # [B, T_max, L + R]
    rows = rows.masked_fill(~present.unsqueeze(-1), 0.0)  # stale rows (even NaN) never leak
    latent, k_pe = rows[..., : heads.latent_dim], rows[..., heads.latent_dim :]
    q_latent = torch.einsum("bshp,hpl->bshl", q_nope, w_uk)  # absorb w_uk into the query
    scores = torch.einsum("bshl,btl->bhst", q_latent, latent)
    scores = (scores + torch.einsum("bshr,btr->bhst", q_pe, k_pe)) * heads.scale
    visible = _visible(lens, heads.queries, q_nope.device)  # [B, S, T_max]
    weights = torch.softmax(scores.masked_fill(~visible.unsqueeze(1), float("-inf")), dim=-1)
    context = torch.einsum("bhst,btl->bshl", weights, latent)
    return torch.einsum("bshl,hvl->bshv", context, w_uv)  # absorb w_uv into the output


def mla_naive(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    c_kv: torch.Tensor,
    k_pe: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Non-absorbed MLA over dense ``c_kv [B, T, L]`` and ``k_pe [B, T, R]``: ``[B, S, H, Vd]``.

    Decompresses keys and values per head and runs standard scaled dot-product attention
    (``torch.nn.functional.scaled_dot_product_attention``) with the same causal convention as
    :func:`mla_decode`; request ``b`` uses its first ``kv_lens[b]`` latent rows. This is the
    reference :func:`mla_decode` is checked against, so it shares no code path with it.

    >>> import torch
    >>> f64 = dict(dtype=torch.float64)
    >>> out = mla_naive(torch.ones(1, 1, 1, 4, **f64), torch.ones(1, 1, 1, 1, **f64),
    ...                 torch.tensor([[[1.0, -1.0]]], **f64), torch.tensor([[[0.5]]], **f64),
    ...                 torch.tensor([1]), w_uk=torch.ones(1, 4, 2, **f64),
    ...                 w_uv=torch.tensor([[[1.0, 2.0]]], **f64))
    >>> out.tolist()
    [[[[-1.0]]]]
    """
    kernel = "mla_naive"
    heads = _heads(kernel, q_nope=q_nope, q_pe=q_pe, w_uk=w_uk, w_uv=w_uv, scale=scale)
    c_kv = _checks.tensor(kernel, "c_kv", c_kv)
    kv_tokens = _checks.axes(kernel, "c_kv", c_kv, ("B", "T", "L"))[1]
    _checks.like(
        kernel,
        "c_kv",
        c_kv,
        (heads.batch, kv_tokens, heads.latent_dim),
        "[B, T, L]",
        reference=q_nope,
    )
    k_pe = _checks.like(
        kernel,
        "k_pe",
        k_pe,
        (heads.batch, kv_tokens, heads.rope_dim),
        "[B, T, R]",
        reference=q_nope,
    )
    lens = _seq_lens(kernel, kv_lens, heads, q_nope.device, name="kv_lens")
    longest = max(lens)
    if longest > kv_tokens:
        raise Refusal(
            "invalid_argument",
            f"{kernel} argument kv_lens: kv_lens={lens} exceed the T={kv_tokens} latent rows given",
            facts={
                "kernel": kernel,
                "argument": "kv_lens",
                "kv_lens": tuple(lens),
                "kv_tokens": kv_tokens,
            },
            hint=f"pass c_kv and k_pe with at least {longest} rows",
        )
    stale = (
        torch.arange(kv_tokens, device=q_nope.device)
        >= torch.tensor(lens, device=q_nope.device).unsqueeze(1)
    ).unsqueeze(-1)
    c_kv, k_pe = c_kv.masked_fill(stale, 0.0), k_pe.masked_fill(stale, 0.0)
    k_nope = torch.einsum("btl,hpl->bhtp", c_kv, w_uk)  # decompress every key, per head
    value = torch.einsum("btl,hvl->bhtv", c_kv, w_uv)  # and every value
    key = torch.cat([k_nope, k_pe.unsqueeze(1).expand(-1, heads.heads, -1, -1)], dim=-1)
    query = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)  # [B, H, S, P + R]
    visible = torch.zeros(
        heads.batch, heads.queries, kv_tokens, dtype=torch.bool, device=q_nope.device
    )
    visible[:, :, :longest] = _visible(lens, heads.queries, q_nope.device)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=visible.unsqueeze(1), scale=heads.scale
    )
    return out.transpose(1, 2).contiguous()


def _heads(
    kernel: str, *, q_nope: object, q_pe: object, w_uk: object, w_uv: object, scale: object
) -> _Heads:
    """Check the query side: ``q_nope [B, S, H, P]``, ``q_pe [B, S, H, R]``, the weights."""
    q_nope = _checks.tensor(kernel, "q_nope", q_nope)
    batch, queries, heads, nope_dim = _checks.axes(kernel, "q_nope", q_nope, ("B", "S", "H", "P"))
    _checks.dtype(kernel, "q_nope", q_nope, _checks.FLOAT_DTYPES)
    q_pe = _checks.tensor(kernel, "q_pe", q_pe)
    rope_dim = _checks.axes(kernel, "q_pe", q_pe, ("B", "S", "H", "R"), may_be_empty=("R",))[3]
    _checks.like(
        kernel, "q_pe", q_pe, (batch, queries, heads, rope_dim), "[B, S, H, R]", reference=q_nope
    )
    w_uk = _checks.tensor(kernel, "w_uk", w_uk)
    latent_dim = _checks.axes(kernel, "w_uk", w_uk, ("H", "P", "L"))[2]
    _checks.like(kernel, "w_uk", w_uk, (heads, nope_dim, latent_dim), "[H, P, L]", reference=q_nope)
    w_uv = _checks.tensor(kernel, "w_uv", w_uv)
    value_dim = _checks.axes(kernel, "w_uv", w_uv, ("H", "Vd", "L"))[1]
    _checks.like(
        kernel, "w_uv", w_uv, (heads, value_dim, latent_dim), "[H, Vd, L]", reference=q_nope
    )
    step = _checks.scale(kernel, scale, (nope_dim + rope_dim) ** -0.5)
    return _Heads(batch, queries, heads, rope_dim, latent_dim, step)


def _seq_lens(
    kernel: str, value: object, heads: _Heads, device: torch.device, name: str = "seq_lens"
) -> list[int]:
    """``[B]`` integer lengths, each covering the request's ``S`` query tokens."""
    lens_tensor = _checks.tensor(kernel, name, value)
    _checks.shape(kernel, name, lens_tensor, (heads.batch,), "[B]")
    _checks.dtype(kernel, name, lens_tensor, _checks.INDEX_DTYPES)
    _checks.device(kernel, name, lens_tensor, device)
    lens = [int(n) for n in lens_tensor.tolist()]
    for request, length in enumerate(lens):
        if length < heads.queries:
            raise Refusal(
                "invalid_argument",
                f"{kernel} argument {name}: request {request} has {name}={length} tokens, fewer "
                f"than its S={heads.queries} query tokens",
                facts={
                    "kernel": kernel,
                    "argument": name,
                    "request": request,
                    "seq_len": length,
                    "num_query_tokens": heads.queries,
                },
                hint="a query token is itself in the cache: seq_len counts it",
            )
    return lens


def _block_table(kernel: str, value: object, batch: int, device: torch.device) -> torch.Tensor:
    table = _checks.tensor(kernel, "block_table", value)
    max_blocks = _checks.axes(kernel, "block_table", table, ("B", "max_blocks"))[1]
    _checks.shape(kernel, "block_table", table, (batch, max_blocks), "[B, max_blocks]")
    _checks.dtype(kernel, "block_table", table, _checks.INDEX_DTYPES)
    _checks.device(kernel, "block_table", table, device)
    return table.long()


def _check_pages(
    kernel: str,
    table: torch.Tensor,
    lens: list[int],
    num_blocks: int,
    block_tokens: int,
) -> None:
    """Every request's pages fit its table row and name a block of the cache."""
    max_blocks = table.shape[1]
    for request, length in enumerate(lens):
        needed = -(-length // block_tokens)
        if needed > max_blocks:
            raise Refusal(
                "invalid_argument",
                f"{kernel} argument seq_lens: request {request} has seq_len={length}, which needs "
                f"{needed} blocks of {block_tokens} tokens; its block_table row has {max_blocks}",
                facts={
                    "kernel": kernel,
                    "argument": "seq_lens",
                    "request": request,
                    "seq_len": length,
                    "capacity_tokens": max_blocks * block_tokens,
                },
                hint=f"widen block_table to {needed} columns",
            )
        used = [int(b) for b in table[request, :needed].tolist()]
        for column, block in enumerate(used):
            if not 0 <= block < num_blocks:
                raise Refusal(
                    "invalid_argument",
                    f"{kernel} argument block_table: request {request} column {column} names "
                    f"block {block}, outside the cache's num_blocks={num_blocks}",
                    facts={
                        "kernel": kernel,
                        "argument": "block_table",
                        "request": request,
                        "column": column,
                        "block_id": block,
                        "num_blocks": num_blocks,
                    },
                    hint=f"use block ids in [0, {num_blocks})",
                )


def _visible(lens: list[int], queries: int, device: torch.device) -> torch.Tensor:
    """``[B, S, max(lens)]``: query ``i`` of request ``b`` sees keys ``t <= lens[b] - S + i``."""
    keys = torch.arange(max(lens), device=device)
    last = (
        torch.tensor(lens, device=device).unsqueeze(1)
        - queries
        + torch.arange(queries, device=device)
    )
    return keys.view(1, 1, -1) <= last.unsqueeze(-1)
