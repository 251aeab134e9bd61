"""What vLLM 0.33 binds to each layer, as data: the view of the rank's one backing that every
layer's ``kv_cache`` is.

vLLM allocates ONE int8 backing per rank (``allocate_kv_cache``) and binds a view of it to
every layer (``map_kv_caches_to_kernel_blocks``):

- a KDA layer: one raw int8 page view ``[num_blocks, 1, 1, state_bytes]`` (the layer slices
  its conv and recurrent states out of it by its ``MambaSpec``'s shapes and dtypes);
- an MLA layer: its pages in the backend's kernel blocks, ``[num_blocks * r, 1, kernel,
  row]`` in the cache dtype (fp8 as raw ``uint8``), ``r = block / kernel`` (``LBNHC``), or
  ``[num_blocks, 1, block, row]`` with the stage's whole block as stride (``BLHNC``, where
  vLLM binds only unsplit blocks).

K3 at TP 1, fp8: KDA ``[272, 1, 1, 6512640]`` and MLA ``[48416, 1, 64, 576]`` for 272
blocks. Pure Python: the engine bridge checks live tensors against these, the adapter cuts
them from its own backing.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from pydantic import NonNegativeInt, PositiveInt

from ..._args import expect_args, expect_int
from ..._frozen import Frozen
from ...cache import RING_PARTS
from ...errors import Refusal
from ...names import LayerNames, engine_layer_names
from .layout import VllmPlan
from .packed import PACKED_CACHES
from .sparse import INDEXER_KERNEL_ENTRIES

BoundDtype: TypeAlias = Literal["int8", "uint8", "bfloat16", "float16", "float32"]
"""The torch dtype (``torch.<name>``) of a bound view."""

_BOUND_BYTES: dict[BoundDtype, int] = {
    "int8": 1,
    "uint8": 1,
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
}

_BOUND_DTYPES: dict[str, BoundDtype] = {
    "float8_e4m3fn": "uint8",  # vLLM keeps an fp8 cache as raw bytes
    "uint8": "uint8",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
}


class BoundView(Frozen):
    """The view vLLM binds to one layer: ``shape`` and ``strides`` in elements of ``dtype``,
    starting ``offset_bytes`` into the rank's backing; ``entries_per_block`` leading entries
    make one block (an MLA block split into kernel blocks), so block ``b``'s page starts at
    ``offset_bytes + b * entries_per_block * strides[0] * element bytes``."""

    name: str
    module_layer: NonNegativeInt
    kind: Literal["attention", "kda", "ring"]
    dtype: BoundDtype
    shape: tuple[PositiveInt, ...]
    strides: tuple[NonNegativeInt, ...]
    offset_bytes: NonNegativeInt
    entries_per_block: PositiveInt

    @property
    def elem_bytes(self) -> int:
        """Bytes per element."""
        return _BOUND_BYTES[self.dtype]

    @property
    def block_stride_bytes(self) -> int:
        """Bytes from one block's page to the next."""
        return self.entries_per_block * self.strides[0] * self.elem_bytes

    def page_offset_bytes(self, block: int) -> int:
        """Where the view's page of ``block`` starts in the backing."""
        return self.offset_bytes + expect_int("block", block) * self.block_stride_bytes


def vllm_bound_views(
    plan: VllmPlan, num_blocks: int, stage: int = 0, names: LayerNames | None = None
) -> tuple[BoundView, ...]:
    """The views vLLM 0.33 binds on a rank of ``stage`` holding ``num_blocks`` blocks, one per
    layer, in module order (names: vLLM's, :func:`~k3layout.offload.naming_rule`).

    >>> from k3layout import Deployment, plan, preset
    >>> views = vllm_bound_views(plan(preset("kimi-k3"), Deployment()), 272)
    >>> [(v.name, v.shape) for v in views[2:4]]  # doctest: +NORMALIZE_WHITESPACE
    [('language_model.model.layers.2.self_attn', (272, 1, 1, 6512640)),
     ('language_model.model.layers.3.self_attn', (48416, 1, 64, 576))]
    """
    expect_args(("plan", plan, VllmPlan))
    if expect_int("num_blocks", num_blocks) < 1:
        raise Refusal(
            "invalid_argument",
            f"num_blocks={num_blocks} must be >= 1",
            facts={"num_blocks": num_blocks},
            hint="bind at least one block",
        )
    names = names or engine_layer_names(plan.model, "vllm")
    if plan.packed:
        return packed_views(plan, num_blocks, stage, names)
    block_stride = plan.block_stride_bytes(stage)
    state = plan.sizes.state_bytes if plan.sizes.state is not None else 0
    kernel = plan.kernel_block_tokens
    tp = plan.deployment.attn_tp
    views: list[BoundView] = []
    for layer in plan.stage(stage).layers:
        spec = plan.sizes.spec_of(layer)
        offset = plan.page_offset_bytes(layer, 0, num_blocks, stage)
        if spec.paging == "slot":
            shape: tuple[int, ...] = (num_blocks, 1, 1, state)
            views.append(
                BoundView(
                    name=names.name(layer),
                    module_layer=layer,
                    kind="kda",
                    dtype="int8",
                    shape=shape,
                    strides=(block_stride, state, state, 1),
                    offset_bytes=offset,
                    entries_per_block=1,
                )
            )
            continue
        dtype = _BOUND_DTYPES[spec.parts[0].dtype]
        elem = _BOUND_BYTES[dtype]
        row = spec.bytes_per_token(tp) // elem
        per_block = plan.block_tokens // kernel
        if per_block > 1:  # kernel blocks: LBNHC only (vLLM binds no split BLHNC block)
            stride = plan.page_bytes // per_block // elem
            shape, strides = (num_blocks * per_block, 1, kernel, row), (stride, row, row, 1)
        else:
            shape = (num_blocks, 1, kernel, row)
            # vLLM's axis of one heads: a row apart layer-outermost, a page block-outermost
            heads = plan.page_bytes // elem if plan.kv_cache_layout == "BLHNC" else row
            strides = (block_stride // elem, heads, row, 1)
        views.append(
            BoundView(
                name=names.name(layer),
                module_layer=layer,
                kind="attention",
                dtype=dtype,
                shape=shape,
                strides=strides,
                offset_bytes=offset,
                entries_per_block=per_block,
            )
        )
    return tuple(views)


def packed_views(
    plan: VllmPlan, num_blocks: int, stage: int, names: LayerNames
) -> tuple[BoundView, ...]:
    """The views vLLM 0.33 (its V2 model runner) binds to a packed plan's caches, every one a
    window of the block-outermost backing whose blocks are the stage's block stride ``S``
    apart (``utils.map_kv_cache_to_kernel_blocks``):

    - a KDA layer: its real page, ``int8 [N, 1, 1, S_kda]``;
    - an indexed layer's latent, ``[N, 1, B, row]`` in the cache dtype (whole blocks: the
      sparse backends take any multiple of their kernel block);
    - its pooled keys, ``uint8 [N, 1, B / kpool, 132]``, split into the indexer's kernel pages
      (``64 * kpool`` tokens, else ``32 * kpool``) when the block is not one: ``[(N - 1) * S /
      P + n, 1, r, 132]`` with ``r`` entries (``P`` bytes) a page, ``n`` pages a block;
    - its tail ring, ``bf16 [N, 2, ring, 128]`` (keys, then gate scores).
    """
    tp = plan.deployment.attn_tp
    stride = plan.stage_block_bytes(stage)
    block = plan.block_tokens
    views: list[BoundView] = []
    for layer in plan.stage(stage).layers:
        spec = plan.sizes.spec_of(layer)
        base = names.name(layer)
        if spec.paging == "slot":
            state = spec.payload_bytes(tp)
            at = plan.byte_range(layer, spec.parts[0].name, 0, num_blocks, stage).offset_bytes
            shape = (num_blocks, 1, 1, state)
            strides = (stride, state, state, 1)
            views.append(_view(base, layer, "kda", "int8", shape, strides=strides, offset=at))
            continue
        for suffix, part_name in PACKED_CACHES:
            at = plan.byte_range(layer, part_name, 0, num_blocks, stage).offset_bytes
            name = f"{base}{suffix}"
            if part_name in RING_PARTS:  # keys and gate scores as two heads of bf16 rows
                ring = plan.sizes.ring
                assert ring is not None
                rows, width = ring.part(part_name).shape
                shape = (num_blocks, len(RING_PARTS), rows, width)
                strides = (stride // 2, rows * width, width, 1)
                views.append(
                    _view(name, layer, "ring", "bfloat16", shape, strides=strides, offset=at)
                )
                continue
            part = spec.part(part_name)
            dtype = _BOUND_DTYPES[part.dtype]
            elem = _BOUND_BYTES[dtype]
            row = part.local_bytes(tp) // elem
            rows = block // part.tokens_per_row
            kernel = _kernel_rows(part.tokens_per_row, rows)
            if kernel == rows:
                shape, strides = (num_blocks, 1, rows, row), (stride // elem, rows * row, row, 1)
                views.append(
                    _view(name, layer, "attention", dtype, shape, strides=strides, offset=at)
                )
                continue
            page = kernel * row * elem  # one kernel page of the pooled keys
            per_block = stride // page
            shape = ((num_blocks - 1) * per_block + rows // kernel, 1, kernel, row)
            strides = (page // elem, rows * row, row, 1)
            views.append(
                _view(
                    name,
                    layer,
                    "attention",
                    dtype,
                    shape,
                    strides=strides,
                    offset=at,
                    per_block=per_block,
                )
            )
    return tuple(views)


def _kernel_rows(tokens_per_row: int, rows: int) -> int:
    """Rows of one kernel page of a part: the whole block for a per-token part or for pooled
    keys whose block is one indexer page (32 or 64 entries); else the indexer's largest page
    dividing the block (vLLM's ``select_common_block_size`` over its kernel sizes)."""
    if tokens_per_row == 1 or rows in INDEXER_KERNEL_ENTRIES:
        return rows
    return next((n for n in sorted(INDEXER_KERNEL_ENTRIES, reverse=True) if rows % n == 0), rows)


def _view(
    name: str,
    layer: int,
    kind: Literal["attention", "kda", "ring"],
    dtype: BoundDtype,
    shape: tuple[int, ...],
    *,
    strides: tuple[int, ...],
    offset: int,
    per_block: int = 1,
) -> BoundView:
    return BoundView(
        name=name,
        module_layer=layer,
        kind=kind,
        dtype=dtype,
        shape=shape,
        strides=strides,
        offset_bytes=offset,
        entries_per_block=per_block,
    )
