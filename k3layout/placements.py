"""The split algebra: how one extent (heads, channels, tokens, layers) lands on ranks.

A handful of frozen placement values, each with one pure rule, in the manner of DTensor's
``Shard`` / ``Replicate``: TP shards heads, MLA latents are replicated, DCP interleaves tokens,
PP gives each stage a contiguous range of module layers.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Literal, TypeAlias

from pydantic import Field, PositiveInt

from ._args import expect, expect_args, expect_int
from ._frozen import Frozen
from ._validation import describe
from .constants import MAX_MODULE_LAYERS, MAX_RANKS
from .errors import Refusal
from .limits import check_bound


class Shard(Frozen):
    """Split dimension ``dim`` of an array evenly: rank ``r`` of ``n`` holds
    ``[r*E/n, (r+1)*E/n)`` of its extent ``E``, every other dimension whole (DTensor's
    ``Shard(dim)``).

    KDA heads (E = 96) over attention TP 8::

        rank    0        1         ...  7
        range   [0, 12)  [12, 24)  ...  [84, 96)

    An extent that ``n`` does not divide is refused (``uneven_split``): engines never pad heads.
    """

    kind: Literal["shard"] = "shard"
    dim: Annotated[int, Field(ge=0)] = 0

    def local_size_and_offset(self, extent: int, num_ranks: int, rank: int) -> tuple[int, int]:
        """``(size, offset)`` of ``rank``'s share of ``extent``."""
        expect_int("extent", extent)
        _check_rank(num_ranks, rank)
        if extent % num_ranks:
            raise Refusal(
                "uneven_split",
                f"extent {extent} cannot be sharded evenly over {num_ranks} ranks",
                facts={"extent": extent, "num_ranks": num_ranks},
                hint=f"use a rank count that divides {extent}",
            )
        size = extent // num_ranks
        return size, rank * size


class Replicate(Frozen):
    """Every rank holds the whole extent (MLA latents on TP ranks, the ReplaySSM cursor)."""

    kind: Literal["replicate"] = "replicate"

    def local_size_and_offset(self, extent: int, num_ranks: int, rank: int) -> tuple[int, int]:
        """``(extent, 0)`` on every rank."""
        expect_int("extent", extent)
        _check_rank(num_ranks, rank)
        return extent, 0


class ReplicaShard(Frozen):
    """Shard axis ``dim`` when it has at least as many entries as ranks; when it has fewer,
    each entry is replicated on ``n / E`` consecutive ranks (vLLM's GQA KV heads when the
    attention TP exceeds ``num_kv_heads``).

    8 KV heads over TP 16 (each head on two ranks)::

        rank    0       1       2       3       ...  15
        heads   [0, 1)  [0, 1)  [1, 2)  [1, 2)  ...  [7, 8)

    An extent that neither divides nor is divided by ``n`` is refused (``uneven_split``).
    """

    kind: Literal["replica_shard"] = "replica_shard"
    dim: Annotated[int, Field(ge=0)] = 0

    def local_size_and_offset(self, extent: int, num_ranks: int, rank: int) -> tuple[int, int]:
        """``(size, offset)`` of ``rank``'s share of ``extent``."""
        _check_rank(num_ranks, rank)
        if expect_int("extent", extent) >= num_ranks:
            return Shard(dim=self.dim).local_size_and_offset(extent, num_ranks, rank)
        if num_ranks % extent:
            raise Refusal(
                "uneven_split",
                f"extent {extent} can be neither sharded nor replicated evenly over "
                f"{num_ranks} ranks",
                facts={"extent": extent, "num_ranks": num_ranks},
                hint=f"use a rank count that divides {extent} or is a multiple of it",
            )
        return 1, rank // (num_ranks // extent)


class TokenRun(Frozen):
    """Consecutive tokens ``[start, start + length)`` that sit at ``local_start ..`` on a rank."""

    start: Annotated[int, Field(ge=0)]
    local_start: Annotated[int, Field(ge=0)]
    length: PositiveInt


class Interleave(Frozen):
    """Decode context parallel: tokens dealt to ``num_ranks`` ranks ``interleave`` at a time.

    Token ``o`` of a virtual block goes to rank ``(o // I) % n`` at local position
    ``(o // (n*I)) * I + o % I``. With n = 4, I = 2::

        token  0 1 2 3 4 5 6 7 8 9 ...
        rank   0 0 1 1 2 2 3 3 0 0 ...
        local  0 1 0 1 0 1 0 1 2 3 ...
    """

    kind: Literal["interleave"] = "interleave"
    num_ranks: PositiveInt
    interleave: PositiveInt = 1

    def rank_of(self, token: int) -> int:
        """The rank that owns ``token``."""
        _check_token("token", token)
        return (token // self.interleave) % self.num_ranks

    def local_position(self, token: int) -> int:
        """Where ``token`` sits among its rank's tokens."""
        _check_token("token", token)
        span = self.num_ranks * self.interleave
        return (token // span) * self.interleave + token % self.interleave

    def global_token(self, rank: int, local: int) -> int:
        """The inverse: the token at ``local`` on ``rank``."""
        _check_rank(self.num_ranks, rank)
        _check_token("local", local)
        span = self.num_ranks * self.interleave
        return (local // self.interleave) * span + rank * self.interleave + local % self.interleave

    def local_count(self, num_tokens: int, rank: int) -> int:
        """How many of tokens ``[0, num_tokens)`` ``rank`` holds."""
        _check_rank(self.num_ranks, rank)
        _check_token("num_tokens", num_tokens)
        span = self.num_ranks * self.interleave
        full, rest = divmod(num_tokens, span)
        return full * self.interleave + min(max(rest - rank * self.interleave, 0), self.interleave)

    def runs(self, start: int, stop: int, rank: int) -> tuple[TokenRun, ...]:
        """``rank``'s tokens in ``[start, stop)`` as runs of consecutive tokens (not one per
        token): each run is at most ``interleave`` long and contiguous on both sides."""
        _check_rank(self.num_ranks, rank)
        _check_token("start", start)
        _check_token("stop", stop)
        runs: list[TokenRun] = []
        span = self.num_ranks * self.interleave
        first_span = start // span
        for base in range(first_span * span, stop, span):
            lo = max(start, base + rank * self.interleave)
            hi = min(stop, base + (rank + 1) * self.interleave)
            if lo < hi:
                runs.append(TokenRun(start=lo, local_start=self.local_position(lo), length=hi - lo))
        return tuple(runs)


Placement: TypeAlias = Annotated[
    Shard | Replicate | ReplicaShard | Interleave, Field(discriminator="kind")
]


def pp_stage_bounds(
    num_layers: int,
    pp: int,
    partition: tuple[int, ...] | None = None,
    remainder_skips_last: bool = True,
) -> tuple[tuple[int, int], ...]:
    """``[start, end)`` module layers of each pipeline stage, split as vLLM splits them.

    Even split; the remainder goes one layer each to the stages before the last, counting
    back from the second-to-last (vLLM ``get_pp_indices``). K3 (93 layers) over 8 stages::

        stage   0     1      2      3      4      5      6      7
        layers  0-10  11-21  22-33  34-45  46-57  58-69  70-81  82-92

    With ``remainder_skips_last=False`` the count starts at the last stage (SGLang's
    ``get_pp_indices``: K3 over 2 stages is ``[0, 46)``, ``[46, 93)``). ``partition`` (layers
    per stage) overrides the split, as ``VLLM_PP_LAYER_PARTITION`` does.
    """
    if (
        type(num_layers) is int
        and type(pp) is int
        and (
            partition is None
            or (type(partition) is tuple and all(type(n) is int for n in partition))
        )
    ):  # exact integers (True is not 1 here): a plan's split, memoised by value
        return _cached_bounds(num_layers, pp, partition, remainder_skips_last is not False)
    return _split_stages(num_layers, pp, partition, remainder_skips_last is not False)


def _split_stages(
    num_layers: int, pp: int, partition: tuple[int, ...] | None, skip_last: bool = True
) -> tuple[tuple[int, int], ...]:
    expect_args(("num_layers", num_layers, int), ("pp", pp, int))
    expect("partition", partition, (tuple, list, type(None)))
    for name, value, low in (("num_layers", num_layers, 1), ("pp", pp, 1)):
        if value < low:
            raise Refusal(
                "invalid_argument",
                f"{name}={describe(value)} must be >= {low}",
                facts={"field": name},
                hint=f"pass {name} >= {low}",
            )
    check_bound("num_layers", num_layers, MAX_MODULE_LAYERS, why="module layers of a model")
    check_bound("pp", pp, MAX_RANKS, why="pipeline stages")
    if partition is not None:
        for size in partition:
            expect("partition[]", size, int)
    if pp > num_layers:
        raise Refusal(
            "pp_too_deep",
            f"pp={pp} stages for num_layers={num_layers}: a stage would hold no layer",
            facts={"pp": pp, "num_layers": num_layers},
            hint=f"use pp <= {num_layers}",
        )
    if partition is None:
        sizes = [num_layers // pp] * pp
        first = 2 if skip_last else 1
        for i in range(first, num_layers % pp + first):
            sizes[-i] += 1
    else:
        if len(partition) != pp or sum(partition) != num_layers or min(partition) < 1:
            raise Refusal(
                "pp_partition",
                f"pp_partition={list(partition)} must give each of pp={pp} stages at least one "
                f"layer and sum to num_layers={num_layers}",
                facts={"pp_partition": tuple(partition), "pp": pp, "num_layers": num_layers},
                hint="leave pp_partition unset for vLLM's even split",
            )
        sizes = list(partition)
    bounds: list[tuple[int, int]] = []
    start = 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return tuple(bounds)


_cached_bounds = lru_cache(maxsize=1024)(_split_stages)


def _check_token(name: str, value: int) -> None:
    if expect_int(name, value) < 0:
        raise Refusal(
            "invalid_argument",
            f"{name}={describe(value)} must be >= 0",
            facts={name: value},
            hint="token positions count from 0",
        )


def _check_rank(num_ranks: int, rank: int) -> None:
    if type(num_ranks) is int and type(rank) is int and 0 <= rank < num_ranks:
        return  # the common case, checked without building the refusal's arguments
    expect_args(("num_ranks", num_ranks, int), ("rank", rank, int))
    if num_ranks < 1 or not 0 <= rank < num_ranks:
        raise Refusal(
            "invalid_argument",
            f"rank={describe(rank)} is not a rank of num_ranks={describe(num_ranks)}",
            facts={"rank": rank, "num_ranks": num_ranks},
            hint=f"use 0 <= rank < {max(num_ranks, 1)}",
        )
