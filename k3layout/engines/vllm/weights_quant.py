"""How vLLM 0.33 declares a quantized linear layer's and routed experts' tensors, one rank's.

What ``create_weights`` of each quantization method registers (the tensors a checkpoint loads
into; ``process_weights_after_loading`` repacks are not modelled), per rank, checked by
``tests/conformance/test_conformance_weights_vllm.py`` against vLLM's own layers built on
``meta``:

- **bf16** (no ``quantization_config``): ``weight`` ``[out, in]`` in the model dtype.
- **fp8 block** (``quant_method: fp8`` with ``weight_block_size [bn, bk]``): ``weight``
  ``float8_e4m3fn`` and ``weight_scale_inv`` fp32 ``[ceil(out / bn), ceil(in / bk)]`` (of the
  rank's whole output, merged or not). ``validate_fp8_block_shape`` refuses a row-parallel
  shard whose input is not a multiple of ``bk`` and a column-parallel single shard whose
  output is not a multiple of ``bn``; a merged layer with a misaligned part skips the check
  (``allow_fp8_block_shape_mismatch``). Experts: ``w13 [E, 2I, H]``, ``w2 [E, H, I]`` fp8
  with scales ``[E, 2 ceil(I / bn), ceil(H / bk)]`` and ``[E, ceil(H / bn), ceil(I / bk)]``;
  a shard ``I`` off the block grid is refined to ``gcd(bn, bk, I, H)`` blocks when that is
  at least 32 (``refine_fp8_moe_block_shape``), else refused (``validate_fp8_block_shape_moe``).
- **compressed-tensors int4** (pack-quantized, groups of ``g``): routed experts
  ``w13_weight_packed`` int32 ``[E, 2I, H / 8]``, ``w2_weight_packed`` int32 ``[E, H, I / 8]``,
  ``w13_weight_scale`` / ``w2_weight_scale`` in the model dtype ``[E, 2I, H / g]`` /
  ``[E, H, I / g]``, ``w13_weight_shape`` / ``w2_weight_shape`` ``[E, 2]``. k3layout lays out
  no int4 linear layer: every one must be in the config's ``ignore`` list (as Kimi-K2-Thinking's
  is), else the weights are refused.
- **mxfp4**: routed experts only (vLLM's MXFP4 linear method is the unquantized one):
  ``w13_weight`` / ``w2_weight`` uint8 ``[E, 2I, H / 2]`` / ``[E, H, I / 2]`` and uint8 scales
  ``[E, 2I, H / 32]`` / ``[E, H, I / 32]``. vLLM rounds ``I`` and ``H`` up to its MXFP4 kernel's
  tile (64 to 256, by the backend it picks for the GPU); k3layout lays out the shards every
  backend takes unpadded (``I`` a multiple of 128, ``H`` of 256) and refuses the others.
- **NVFP4** (ModelOpt, groups of ``g``): ``weight`` uint8 ``[out, in / 2]``, ``weight_scale``
  ``float8_e4m3fn`` ``[out, in / g]``, ``weight_scale_2`` and ``input_scale`` fp32, one per
  merged part; an input not a multiple of 16 is refused. Experts add ``w13_weight_scale_2``
  ``[E, 2]``, ``w2_weight_scale_2 [E]``, ``w13_input_scale [E, 2]``, ``w2_input_scale [E]``.
  vLLM leaves the vision encoder unquantized (its ``vision_tower`` name) and quantizes the LM
  head unless excluded.

``Quantization.ignore`` is matched as each method matches it against vLLM's module names
(after the checkpoint-to-vLLM name mapping of the model class): fp8 exactly (a fused layer is
ignored when all its checkpoint parts are), compressed-tensors exactly or by ``re:`` regular
expression, ModelOpt exactly, by substring or by wildcard; parts of one fused layer that
disagree are refused, as vLLM refuses them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Final, Literal

from ...errors import Refusal
from ...model.architecture import Quantization
from ...weights import WeightDtype, WeightTensor

Split = Literal["col", "row", "rep"]

FUSED_PARTS: Final[Mapping[str, tuple[str, ...]]] = {
    "gate_up_proj": ("gate_proj", "up_proj"),
    "in_proj_qkvgfab": ("q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj"),
    "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa"),
    "fused_qkv_a_g_proj": ("q_a_proj", "kv_a_proj_with_mqa", "g_proj"),
}
"""The checkpoint parts of vLLM's fused Kimi layers (``KimiLinearModel.packed_modules_mapping``),
by which a fused layer is matched against an ignore list."""

K3_NAME_MAP: Final[tuple[tuple[str, str], ...]] = (
    ("language_model.layers.", "language_model.model.layers."),
    ("mm_projector.proj.0", "mm_projector.linear_1"),
    ("mm_projector.proj.2", "mm_projector.linear_2"),
)
"""``KimiK3ForConditionalGeneration.hf_to_vllm_mapper``: checkpoint prefixes to vLLM's module
names, applied to the ignore list before matching."""

MXFP4_ALIGN: Final = (128, 256)
"""The ``(intermediate, hidden)`` multiples every MXFP4 MoE backend of vLLM 0.33 takes
unpadded (``mxfp4_round_up_hidden_size_and_intermediate_size``: 64 to 256 by backend)."""

FP8_MIN_REFINED_BLOCK: Final = 32
"""The least block ``refine_fp8_moe_block_shape`` refines fp8 expert scales to."""


@dataclass(frozen=True)
class QuantContext:
    """What decides a layer's tensors beyond its own shape: the checkpoint's quantization, the
    model dtype, the attention TP (vLLM's TP group) and the ignore list in vLLM's names."""

    quantization: Quantization | None
    dtype: WeightDtype
    attn_tp: int
    ignore: tuple[str, ...]


def vllm_ignore(quantization: Quantization | None, multimodal: bool) -> tuple[str, ...]:
    """The ignore list in vLLM's module names (the K3 class's name mapping applied)."""
    if quantization is None:
        return ()
    if not multimodal:
        return quantization.ignore
    mapped = []
    for entry in quantization.ignore:
        name = entry
        for old, new in K3_NAME_MAP:
            if old in name and new not in name:
                name = name.replace(old, new)
        mapped.append(name)
    return tuple(mapped)


@dataclass(frozen=True)
class Linear:
    """One linear layer of a rank: its tensor name within the group (``self_attn.o_proj``),
    its vLLM module name (for the ignore list), the rank's output parts and input, how TP
    splits it and whether vLLM passes it the quantization config at all."""

    name: str
    module: str
    parts: tuple[int, ...]
    cols: int
    split: Split
    quantized: bool = True
    lm_head: bool = False

    @property
    def rows(self) -> int:
        """The rank's output rows (every part)."""
        return sum(self.parts)


def _matches(method: str, name: str, ignore: Sequence[str]) -> bool:
    if method == "compressed-tensors":
        return any(
            re.match(entry[3:], name) is not None if entry.startswith("re:") else entry == name
            for entry in ignore
        )
    return name in ignore


def is_ignored(ctx: QuantContext, module: str) -> bool:
    """Whether vLLM leaves ``module`` unquantized by the config's ignore list; refuses
    (``quantization_unsupported``) a fused layer whose parts disagree."""
    quantization = ctx.quantization
    if quantization is None or not ctx.ignore:
        return False
    method = quantization.quant_method
    leaf = module.rsplit(".", 1)[-1]
    if leaf in FUSED_PARTS and method != "compressed-tensors" and module in ctx.ignore:
        matched = True
    elif leaf in FUSED_PARTS:
        shards = [
            _matches(method, module[: -len(leaf)] + part, ctx.ignore) for part in FUSED_PARTS[leaf]
        ]
        if any(shards) and not all(shards):
            raise Refusal(
                "quantization_unsupported",
                f"module {module}: the ignore list leaves some of its checkpoint parts "
                f"({', '.join(FUSED_PARTS[leaf])}) unquantized and not others; vLLM "
                "requires one scheme for a fused layer",
                facts={"module": module, "field": "quantization_config"},
                hint="ignore every part of the fused layer, or none",
            )
        matched = all(shards)
    else:
        matched = _matches(method, module, ctx.ignore)
    if matched or method != "modelopt":
        return matched
    bare = module.removeprefix("language_model.")
    return any(
        entry in module or (module.startswith("language_model.") and entry in bare)
        for entry in ctx.ignore
    ) or any(fnmatch(module, entry) for entry in ctx.ignore)


def _refuse(why: str, facts: dict[str, int | str], hint: str) -> Refusal:
    return Refusal(
        "quantization_unsupported",
        why,
        facts={**facts, "field": "quantization_config"},
        hint=hint,
    )


def _check_fp8_linear(layer: Linear, block: tuple[int, int], tp: int) -> None:
    """``validate_fp8_block_shape`` on the rank's shard."""
    block_n, block_k = block
    if tp == 1 or len(layer.parts) > 1:
        return  # nothing is split, or a merged layer (checked part by part only when aligned)
    if layer.split == "row" and layer.cols % block_k:
        raise _refuse(
            f"module {layer.module}: its input shard of {layer.cols} is not a multiple of "
            f"the fp8 block's {block_k} columns (vLLM refuses it: weight "
            "input_size_per_partition not divisible by block_k)",
            {"module": layer.module, "shard": layer.cols, "block": block_k},
            "use a TP size whose shard is a multiple of the block, or ignore the module",
        )
    if layer.split == "col" and layer.rows % block_n:
        raise _refuse(
            f"module {layer.module}: its output shard of {layer.rows} is not a multiple of "
            f"the fp8 block's {block_n} rows (vLLM refuses it: weight "
            "output_partition_size not divisible by block_n)",
            {"module": layer.module, "shard": layer.rows, "block": block_n},
            "use a TP size whose shard is a multiple of the block, or ignore the module",
        )


def linear_tensors(layer: Linear, ctx: QuantContext) -> tuple[WeightTensor, ...]:
    """The tensors one rank holds of ``layer`` (named ``<name>.weight`` and its scales)."""
    rows, cols, name = layer.rows, layer.cols, layer.name
    quantization = ctx.quantization
    plain = (WeightTensor(name=f"{name}.weight", shape=(rows, cols), dtype=ctx.dtype),)
    if quantization is None or not layer.quantized:
        return plain
    method = quantization.method
    if layer.lm_head and method != "nvfp4":
        return plain  # fp8, compressed-tensors and mxfp4 leave the LM head as it is
    if quantization.quant_method == "mxfp4" or is_ignored(ctx, layer.module):
        return plain  # vLLM's MXFP4 linear method is the unquantized one
    tp = 1 if layer.split == "rep" else ctx.attn_tp
    if method == "fp8_block":
        assert quantization.weight_block is not None
        block_n, block_k = quantization.weight_block
        _check_fp8_linear(layer, (block_n, block_k), tp)
        return (
            WeightTensor(name=f"{name}.weight", shape=(rows, cols), dtype="float8_e4m3fn"),
            WeightTensor(
                name=f"{name}.weight_scale_inv",
                shape=(-(-rows // block_n), -(-cols // block_k)),
                dtype="float32",
            ),
        )
    if method == "nvfp4":
        if cols % 16:
            raise _refuse(
                f"module {layer.module}: its input shard of {cols} is not a multiple of 16 "
                "(vLLM's NVFP4 linear layer refuses it)",
                {"module": layer.module, "shard": cols, "block": 16},
                "use a TP size whose shard is a multiple of 16, or exclude the module",
            )
        group = quantization.group_size or 16
        parts = len(layer.parts)
        return (
            WeightTensor(name=f"{name}.weight", shape=(rows, cols // 2), dtype="uint8"),
            WeightTensor(name=f"{name}.weight_scale_2", shape=(parts,), dtype="float32"),
            WeightTensor(
                name=f"{name}.weight_scale", shape=(rows, cols // group), dtype="float8_e4m3fn"
            ),
            WeightTensor(name=f"{name}.input_scale", shape=(parts,), dtype="float32"),
        )
    raise _refuse(
        f"module {layer.module}: k3layout lays out compressed-tensors 4-bit weights for routed "
        "experts only, and the config's ignore list does not leave this linear layer "
        "unquantized",
        {"module": layer.module},
        "add the module to quantization_config.ignore (as Kimi-K2-Thinking's config does)",
    )


@dataclass(frozen=True)
class Experts:
    """One MoE layer's routed experts on a rank: ``local`` experts of ``intermediate`` (the
    rank's shard) by ``hidden`` (the experts' hidden width), ``moe_tp`` ranks sharing each
    expert's intermediate (1 under expert parallelism)."""

    module: str
    local: int
    intermediate: int
    hidden: int
    moe_tp: int


def _fp8_expert_block(experts: Experts, ctx: QuantContext, block: tuple[int, int]) -> int | None:
    """The refined fp8 scale block (``None``: the checkpoint's), or a refusal."""
    block_n, block_k = block
    ispp = experts.intermediate
    off_grid = ispp % block_n != 0 or (experts.moe_tp > 1 and ispp % block_k != 0)
    refined = math.gcd(block_n, block_k, ispp, experts.hidden) if off_grid else 0
    needs = ispp % block_n != 0 or (ctx.attn_tp > 1 and ispp % block_k != 0)
    if refined >= FP8_MIN_REFINED_BLOCK:
        return refined if needs else None
    if needs:
        raise _refuse(
            f"module {experts.module}: each expert's intermediate shard of {ispp} is not a "
            f"multiple of the fp8 block ({block_n} x {block_k}) and no block of 32 or more "
            "divides it and the hidden size (vLLM refuses it)",
            {"module": experts.module, "shard": ispp, "block": block_n},
            "use expert parallelism (whole experts per rank) or a TP size whose shard is a "
            "multiple of the block",
        )
    return None


def expert_tensors(experts: Experts, ctx: QuantContext) -> tuple[WeightTensor, ...]:
    """The tensors of ``experts`` (named as vLLM's ``routed_experts`` parameters)."""
    e, i, h = experts.local, experts.intermediate, experts.hidden
    quantization = ctx.quantization
    if quantization is None or (
        quantization.quant_method != "mxfp4" and is_ignored(ctx, experts.module)
    ):
        return (
            WeightTensor(name="w13_weight", shape=(e, 2 * i, h), dtype=ctx.dtype),
            WeightTensor(name="w2_weight", shape=(e, h, i), dtype=ctx.dtype),
        )
    method = quantization.method
    if method == "fp8_block":
        assert quantization.weight_block is not None
        refined = _fp8_expert_block(experts, ctx, quantization.weight_block)
        bn, bk = (refined, refined) if refined else quantization.weight_block
        return (
            WeightTensor(name="w13_weight", shape=(e, 2 * i, h), dtype="float8_e4m3fn"),
            WeightTensor(name="w2_weight", shape=(e, h, i), dtype="float8_e4m3fn"),
            WeightTensor(
                name="w13_weight_scale_inv",
                shape=(e, 2 * -(-i // bn), -(-h // bk)),
                dtype="float32",
            ),
            WeightTensor(
                name="w2_weight_scale_inv", shape=(e, -(-h // bn), -(-i // bk)), dtype="float32"
            ),
        )
    group = quantization.group_size or 32
    if method == "int4_w4a16":
        return (
            WeightTensor(name="w13_weight_packed", shape=(e, 2 * i, h // 8), dtype="int32"),
            WeightTensor(name="w2_weight_packed", shape=(e, h, i // 8), dtype="int32"),
            WeightTensor(name="w13_weight_scale", shape=(e, 2 * i, h // group), dtype=ctx.dtype),
            WeightTensor(name="w2_weight_scale", shape=(e, h, i // group), dtype=ctx.dtype),
            WeightTensor(name="w2_weight_shape", shape=(e, 2), dtype=ctx.dtype),
            WeightTensor(name="w13_weight_shape", shape=(e, 2), dtype=ctx.dtype),
        )
    if method == "mxfp4" and quantization.quant_method != "mxfp4":
        raise _refuse(
            f"module {experts.module}: compressed-tensors MXFP4 experts are not laid out by "
            "k3layout (vLLM's quant_method mxfp4 checkpoints are)",
            {"module": experts.module},
            "plan a checkpoint with quant_method mxfp4",
        )
    if method == "mxfp4":
        align_i, align_h = MXFP4_ALIGN
        if i % align_i or h % align_h:
            raise _refuse(
                f"module {experts.module}: MXFP4 experts of intermediate shard {i} and hidden "
                f"{h}: vLLM pads them to its kernel's tile, which depends on the backend it "
                f"picks for the GPU (k3layout lays out shards of a multiple of {align_i} by a "
                f"multiple of {align_h}, which no backend pads)",
                {"module": experts.module, "shard": i, "block": align_i},
                "use a TP size or expert parallelism whose shard is a multiple of 128",
            )
        return (
            WeightTensor(name="w13_weight", shape=(e, 2 * i, h // 2), dtype="uint8"),
            WeightTensor(name="w13_weight_scale", shape=(e, 2 * i, h // 32), dtype="uint8"),
            WeightTensor(name="w2_weight", shape=(e, h, i // 2), dtype="uint8"),
            WeightTensor(name="w2_weight_scale", shape=(e, h, i // 32), dtype="uint8"),
        )
    group = quantization.group_size or 16
    return (
        WeightTensor(name="w13_weight", shape=(e, 2 * i, h // 2), dtype="uint8"),
        WeightTensor(name="w2_weight", shape=(e, h, i // 2), dtype="uint8"),
        WeightTensor(name="w13_weight_scale", shape=(e, 2 * i, h // group), dtype="float8_e4m3fn"),
        WeightTensor(name="w2_weight_scale", shape=(e, h, i // group), dtype="float8_e4m3fn"),
        WeightTensor(name="w13_weight_scale_2", shape=(e, 2), dtype="float32"),
        WeightTensor(name="w2_weight_scale_2", shape=(e,), dtype="float32"),
        WeightTensor(name="w13_input_scale", shape=(e, 2), dtype="float32"),
        WeightTensor(name="w2_input_scale", shape=(e,), dtype="float32"),
    )
