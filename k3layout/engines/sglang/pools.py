"""The tensors SGLang 0.5.23 allocates for a plan's pools on one rank, as data.

A token pool of ``num_tokens`` tokens holds one ``kv_buffer`` per MLA layer of the stage,
``[num_tokens + page, 1, 576]`` (fp8 stored as ``uint8``, SGLang's ``store_dtype``), and for
a pooled indexer (DSA) one ``index_k`` per layer, ``[num_tokens // page + 1, page / index_kpool
* 132]`` ``uint8`` (its ``IndexKeyCache``: a row of pooled keys per page, a padding page); a state
pool of ``num_slots`` slots holds ``conv[0]`` ``[L_kda, num_slots + 1, K-1, q|k|v]`` bf16 and
``temporal`` ``[L_kda, num_slots + 1, H/tp, K, V]`` fp32 over the stage's KDA layers. All are
contiguous. :func:`~k3layout.engines.sglang.check_pools` compares live tensors with these.
"""

from __future__ import annotations

from pydantic import NonNegativeInt, PositiveInt

from ..._args import expect_args, expect_positive
from ..._frozen import Frozen
from .layout import SglangPlan

__all__ = ["STORE_DTYPES", "PoolTensor", "pool_tensors"]

STORE_DTYPES: dict[str, str] = {"float8_e4m3fn": "uint8", "bfloat16": "bfloat16"}
"""The dtype a pool stores an element dtype as (fp8 as raw bytes)."""


class PoolTensor(Frozen):
    """One tensor of a pool: its SGLang name, the module layers it serves (one for a
    ``kv_buffer``, every KDA layer of the stage for ``conv[0]`` / ``temporal``), its dtype as
    torch names it, shape and (contiguous) element strides."""

    name: str
    layers: tuple[NonNegativeInt, ...]
    dtype: str
    shape: tuple[PositiveInt, ...]
    strides: tuple[NonNegativeInt, ...]

    @property
    def numel(self) -> int:
        """Elements of the tensor."""
        total = 1
        for size in self.shape:
            total *= size
        return total


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _tensor(name: str, layers: tuple[int, ...], dtype: str, shape: tuple[int, ...]) -> PoolTensor:
    strides = _contiguous(shape)
    return PoolTensor(name=name, layers=layers, dtype=dtype, shape=shape, strides=strides)


def pool_tensors(
    plan: SglangPlan, num_tokens: int, num_slots: int, stage: int = 0
) -> tuple[PoolTensor, ...]:
    """Every tensor a rank of ``stage`` allocates for a token pool of ``num_tokens`` tokens
    and a state pool of ``num_slots`` slots (SGLang's ``size`` of each pool), in SGLang's
    order: the ``kv_buffer`` of each MLA layer, then ``conv[0]`` and ``temporal``.

    >>> from k3layout import Deployment, plan, preset
    >>> p = plan(preset("kimi-k3"), Deployment(engine="sglang", attn_tp=8))
    >>> tensors = pool_tensors(p, 64, 11)
    >>> [(t.name, t.dtype, t.shape) for t in tensors[:1]]
    [('kv_buffer[0]', 'uint8', (65, 1, 576))]
    >>> [(t.name, t.dtype, t.shape) for t in tensors[-2:]]
    [('conv[0]', 'bfloat16', (69, 12, 3, 4608)), ('temporal', 'float32', (69, 12, 12, 128, 128))]
    """
    expect_args(("plan", plan, SglangPlan))
    expect_positive("num_tokens", num_tokens)
    expect_positive("num_slots", num_slots)
    tp = plan.deployment.attn_tp
    tensors = []
    mla = plan.stage(stage).groups_of("attention")
    for group in mla:
        if group.name != "full_attention":
            continue  # the draft runner's own pool: its tensors were not read off SGLang
        for position, layer in enumerate(group.layers):
            spec = plan.sizes.spec_of(layer)
            row = spec.bytes_per_token(tp)  # a pooled part keeps a tensor of its own
            part = spec.parts[0]
            dtype = STORE_DTYPES.get(part.dtype, part.dtype)
            elements = row // (1 if dtype == "uint8" else part.elem_bytes)
            tensors.append(
                _tensor(
                    f"kv_buffer[{position}]",
                    (layer,),
                    dtype,
                    (num_tokens + plan.page_tokens, 1, elements),
                )
            )
            pages = (num_tokens + plan.page_tokens + 1) // plan.page_tokens
            tensors.extend(
                _tensor(
                    f"index_k[{position}]",
                    (layer,),
                    "uint8",
                    (pages, plan.page_tokens // pooled.tokens_per_row * pooled.local_bytes(tp)),
                )
                for pooled in spec.parts
                if pooled.tokens_per_row > 1
            )
    kda = tuple(layer for group in plan.groups_of("kda", stage) for layer in group.layers)
    if kda:
        spec = plan.sizes.spec_of(kda[0])
        for part, name in ((spec.part("conv"), "conv[0]"), (spec.part("recurrent"), "temporal")):
            shape = (len(kda), num_slots + 1, *part.engine_shape(tp))
            tensors.append(_tensor(name, kda, part.dtype, shape))
    return tuple(tensors)
