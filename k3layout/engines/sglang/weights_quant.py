"""How SGLang 0.5.23 lays out one quantized linear or MoE layer on a rank, and which of its
modules a checkpoint's ignore list leaves in the checkpoint dtype.

A linear is described by :class:`Linear` (its parameter name in the group, the module prefix
SGLang hands the quantization config, its global output shards and input, and the group it
splits over); :func:`linear_tensors` returns the rank's tensors under the checkpoint's
quantization, :func:`expert_tensors` those of a ``FusedMoE``. Per method (shapes per rank,
``o`` outputs, ``i`` inputs, ``E`` local experts, ``I`` the rank's expert intermediate,
``H`` the hidden size)::

    method        linear                                       FusedMoE
    bf16          weight [o, i]                                w13 [E, 2I, H], w2 [E, H, I]
    fp8 block     weight fp8 [o, i], weight_scale_inv f32      + w13/w2_weight_scale_inv f32
                  [ceil(o/bn), ceil(i/bk)]                     [E, 2 ceil(I/bn), ceil(H/bk)], ...
    int4 W4A16    weight_packed i32 [o, i/8], weight_scale     w13_weight_packed i32 [E, H/8, 2I],
    (ct, g)       bf16 [o, i/g], weight_shape i64 [2]          scales bf16 [E, H/g, 2I], shapes,
                                                               g_idx and sort indices i32
    mxfp4         (SGLang refuses a quantized linear)          w13 u8 [E, 2I, H/2], scales u8
                                                               [E, 2I, H/32], bias bf16 [E, 2I]...
    nvfp4         weight u8 [o, i/2], weight_scale fp8         w13 u8 [E, 2I, H/2], scales fp8
    (modelopt)    [o, i/16], weight_scale_2, input_scale       (twice: swizzled copy), f32
                  f32 [shards]                                 global scales and input scales

The ignore lists are matched as each SGLang config matches them (fp8's module-path match,
compressed-tensors' ``re:`` regexes and dotted suffixes, ModelOpt's globs), fused modules
through their checkpoint shards (all shards ignored or none, else SGLang refuses).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from math import ceil
from typing import Final, Literal

from ...errors import Refusal
from ...model.architecture import Quantization
from ...weights import WeightDtype, WeightTensor

Split = Literal["column", "row", "replicated"]

FALLBACK_FUSED: Final[Mapping[str, tuple[str, ...]]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""SGLang's fp8 fallback for fused modules a config's mapping does not name
(``quantization/utils.py`` ``_FALLBACK_FUSED_SHARDS``)."""

K3_FUSED: Final[Mapping[str, tuple[str, ...]]] = {
    "gate_up_proj": ("gate_proj", "up_proj"),
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "qkv_conv1d": ("q_conv1d", "k_conv1d", "v_conv1d"),
    "fused_qkvg_proj": ("q_proj", "k_proj", "v_proj", "g_proj"),
    "fused_qkvbfg_a_proj": ("q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj"),
    "fused_fg_b_proj": ("f_b_proj", "g_b_proj"),
}
"""Kimi-K3's fused modules and their checkpoint shards (its ``packed_modules_mapping``)."""

MODELOPT_FUSED_TAILS: Final = frozenset({"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"})
"""ModelOpt's exclusion tails also matched inside a fused module's last name."""


@dataclass(frozen=True)
class Linear:
    """One SGLang linear module: ``name`` (its parameters' prefix in the group), ``prefix``
    (the module path SGLang gives the quantization config), the global ``outputs`` of its
    merged shards, ``input`` and how it splits over ``ranks``."""

    name: str
    prefix: str
    outputs: tuple[int, ...]
    input: int
    split: Split
    ranks: int

    def local(self) -> tuple[tuple[int, ...], int]:
        """The rank's output shards and input."""
        if self.split == "column":
            return tuple(out // self.ranks for out in self.outputs), self.input
        if self.split == "row":
            return self.outputs, self.input // self.ranks
        return self.outputs, self.input


def _path_match(ignored: str, prefix: str) -> bool:
    ignored, prefix = ignored.rstrip("."), prefix.rstrip(".")
    return ignored == prefix or prefix.startswith(ignored + ".") or f".{ignored}." in f".{prefix}."


def _ct_match(name: str, targets: tuple[str, ...]) -> bool:
    for target in targets:
        if target.startswith("re:"):
            if re.match(target[3:], name):
                return True
        elif target == name or name.endswith("." + target):
            return True
    return False


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern.replace(".", r"\.").replace("*", ".*"))


def _k3_mapped(name: str) -> str:
    """Kimi-K3's ``hf_to_sglang_mapper`` applied to one ignore entry."""
    name = name.replace("block_sparse_moe", "mlp", 1)
    if name.startswith("language_model.layers."):
        name = "language_model.model.layers." + name.removeprefix("language_model.layers.")
    return name


@dataclass(frozen=True)
class QuantScheme:
    """A checkpoint's quantization as SGLang reads it for one model class."""

    quantization: Quantization
    k3: bool  # Kimi-K3's class: its fused mapping and name mapper

    @property
    def method(self) -> str:
        return self.quantization.method

    def _ignore(self) -> tuple[str, ...]:
        names = self.quantization.ignore
        if self.quantization.quant_method == "fp8":  # Fp8Config.from_config's two spellings
            names = tuple(
                v
                for n in names
                for v in (n.removeprefix("model."), "model." + n.removeprefix("model."))
            )
        if self.k3:
            names = tuple(dict.fromkeys(_k3_mapped(n) for n in names))
        if self.quantization.quant_method == "modelopt":
            names = tuple(
                dict.fromkeys(v for n in names for v in (n, n.removeprefix("language_model.")) if v)
            )
        return names

    def _fused(self) -> Mapping[str, tuple[str, ...]]:
        return K3_FUSED if self.k3 else {}

    def skipped(self, prefix: str, moe: bool = False) -> bool:
        """Whether SGLang leaves the module at ``prefix`` unquantized (refuses, as SGLang
        does, a fused module whose checkpoint shards are ignored only in part)."""
        method = self.quantization.quant_method
        ignore = self._ignore()
        proj = prefix.rsplit(".", 1)[-1]
        fused = self._fused()
        if method == "compressed-tensors":
            if proj in fused and prefix not in ignore:
                return self._shards(prefix, proj, fused[proj], lambda n: _ct_match(n, ignore))
            return _ct_match(prefix, ignore)
        mapping = fused if proj in fused else FALLBACK_FUSED
        if method == "modelopt":
            excluded = any(self._excluded(prefix, pattern) for pattern in ignore)
            return excluded or (not moe and self._fp8_skipped(prefix, ignore, mapping, moe))
        return self._fp8_skipped(prefix, ignore, mapping, moe)

    def _fp8_skipped(
        self,
        prefix: str,
        ignore: tuple[str, ...],
        fused: Mapping[str, tuple[str, ...]],
        moe: bool,
    ) -> bool:
        proj = prefix.rsplit(".", 1)[-1]
        if not moe and proj in fused:
            return self._shards(
                prefix, proj, fused[proj], lambda n: any(_path_match(i, n) for i in ignore)
            )
        skipped = any(_path_match(i, prefix) for i in ignore)
        if "experts" in prefix:
            skipped = skipped or any(prefix in i for i in ignore if "experts" in i)
        return skipped

    @staticmethod
    def _excluded(prefix: str, pattern: str) -> bool:
        compiled = _glob(pattern)
        names = [prefix, prefix.removeprefix("language_model.")]
        if any(compiled.fullmatch(n) for n in names):
            return True
        if any(compiled.fullmatch(part) for n in names for part in n.split(".")):
            return True
        tail = pattern.rsplit(".", 1)[-1]
        return tail in MODELOPT_FUSED_TAILS and tail in prefix.rsplit(".", 1)[-1]

    @staticmethod
    def _shards(prefix: str, proj: str, shards: tuple[str, ...], match: object) -> bool:
        assert callable(match)
        found = {bool(match(prefix.replace(proj, shard))) for shard in shards}
        if len(found) > 1:
            raise Refusal(
                "quantization_unsupported",
                f"module {prefix}: the ignore list names some of its checkpoint shards "
                f"{list(shards)} but not all; SGLang 0.5.23 requires one precision per fused "
                "module",
                facts={"module": prefix, "shards": shards},
                hint="ignore every shard of the fused module, or none",
            )
        return found.pop()


def _refuse_block(module: str, what: str, size: int, block: int, axis: str) -> Refusal:
    return Refusal(
        "quantization_unsupported",
        f"module {module}: fp8 block quantization needs the rank's {what} ({size}) to be a "
        f"multiple of the block's {axis} ({block}); SGLang 0.5.23 refuses this shard",
        facts={"module": module, what: size, f"block_{axis}": block},
        hint="use a TP size whose shard covers whole blocks, or list the module in the "
        "checkpoint's ignored_layers",
    )


def linear_tensors(
    linear: Linear, scheme: QuantScheme | None, dtype: WeightDtype
) -> tuple[WeightTensor, ...]:
    """The rank's tensors of ``linear`` (``scheme`` None: not quantizable, or no
    quantization)."""
    outputs, inp = linear.local()
    out = sum(outputs)
    name = linear.name
    if scheme is None or scheme.skipped(linear.prefix):
        return (WeightTensor(name=f"{name}.weight", shape=(out, inp), dtype=dtype),)
    q = scheme.quantization
    if q.method == "fp8_block":
        assert q.weight_block is not None
        bn, bk = q.weight_block
        if linear.ranks > 1 and linear.split == "row" and inp % bk:
            raise _refuse_block(linear.prefix, "input", inp, bk, "k")
        if (linear.ranks > 1 and linear.split == "column") or len(outputs) > 1:
            for part in outputs:
                if part % bn:
                    raise _refuse_block(linear.prefix, "output", part, bn, "n")
        return (
            WeightTensor(name=f"{name}.weight", shape=(out, inp), dtype="float8_e4m3fn"),
            WeightTensor(
                name=f"{name}.weight_scale_inv",
                shape=(ceil(out / bn), ceil(inp / bk)),
                dtype="float32",
            ),
        )
    if q.method == "int4_w4a16":
        group = q.group_size or 1
        return (
            WeightTensor(name=f"{name}.weight_packed", shape=(out, inp // 8), dtype="int32"),
            WeightTensor(name=f"{name}.weight_scale", shape=(out, inp // group), dtype=dtype),
            WeightTensor(name=f"{name}.weight_shape", shape=(2,), dtype="int64"),
        )
    if q.method == "nvfp4":
        group = q.group_size or 16
        if inp % 16:
            raise Refusal(
                "quantization_unsupported",
                f"module {linear.prefix}: NVFP4 needs the rank's input ({inp}) to be a "
                "multiple of 16; SGLang 0.5.23 refuses it",
                facts={"module": linear.prefix, "input": inp},
                hint="use another TP size, or exclude the module (exclude_modules)",
            )
        shards = (len(outputs),)
        return (
            WeightTensor(name=f"{name}.weight", shape=(out, inp // 2), dtype="uint8"),
            WeightTensor(name=f"{name}.input_scale", shape=shards, dtype="float32"),
            WeightTensor(name=f"{name}.weight_scale_2", shape=shards, dtype="float32"),
            WeightTensor(
                name=f"{name}.weight_scale", shape=(out, inp // group), dtype="float8_e4m3fn"
            ),
        )
    raise Refusal(
        "quantization_unsupported",
        f"module {linear.prefix}: SGLang 0.5.23 has no {q.quant_method} MXFP4 method for a "
        "linear layer (only for MoE experts)",
        facts={"module": linear.prefix, "quant_method": q.quant_method},
        hint="list every non-expert linear in the checkpoint's ignore list",
    )


def expert_tensors(
    prefix: str,
    scheme: QuantScheme | None,
    dtype: WeightDtype,
    *,
    num_local: int,
    num_experts: int,
    hidden: int,
    intermediate: int,
    moe_tp: int,
) -> tuple[WeightTensor, ...]:
    """A ``FusedMoE``'s tensors on a rank: ``num_local`` of ``num_experts`` experts of
    ``intermediate`` (the rank's share) over ``hidden``."""
    e, h, i = num_local, hidden, intermediate
    method = None if scheme is None else scheme.method
    if method not in (None, "mxfp4") and scheme is not None and scheme.skipped(prefix, moe=True):
        method = None
    if method is None:
        return (
            WeightTensor(name="experts.w13_weight", shape=(e, 2 * i, h), dtype=dtype),
            WeightTensor(name="experts.w2_weight", shape=(e, h, i), dtype=dtype),
        )
    assert scheme is not None
    q = scheme.quantization
    if method == "fp8_block":
        assert q.weight_block is not None
        bn, bk = q.weight_block
        if i % bn:
            raise _refuse_block(prefix, "expert intermediate", i, bn, "n")
        if moe_tp > 1 and i % bk:
            raise _refuse_block(prefix, "expert intermediate", i, bk, "k")
        return (
            WeightTensor(name="experts.w13_weight", shape=(e, 2 * i, h), dtype="float8_e4m3fn"),
            WeightTensor(name="experts.w2_weight", shape=(e, h, i), dtype="float8_e4m3fn"),
            WeightTensor(
                name="experts.w13_weight_scale_inv",
                shape=(e, 2 * ceil(i / bn), ceil(h / bk)),
                dtype="float32",
            ),
            WeightTensor(
                name="experts.w2_weight_scale_inv",
                shape=(e, ceil(h / bn), ceil(i / bk)),
                dtype="float32",
            ),
        )
    if method == "int4_w4a16":
        g = q.group_size or 1
        return (
            WeightTensor(name="experts.w13_weight_packed", shape=(e, h // 8, 2 * i), dtype="int32"),
            WeightTensor(name="experts.w2_weight_packed", shape=(e, i // 8, h), dtype="int32"),
            WeightTensor(name="experts.w13_weight_scale", shape=(e, h // g, 2 * i), dtype=dtype),
            WeightTensor(name="experts.w2_weight_scale", shape=(e, i // g, h), dtype=dtype),
            WeightTensor(name="experts.w2_weight_shape", shape=(e, 2), dtype=dtype),
            WeightTensor(name="experts.w13_weight_shape", shape=(e, 2), dtype=dtype),
            WeightTensor(name="experts.w13_weight_g_idx", shape=(e, h), dtype="int32"),
            WeightTensor(name="experts.w2_weight_g_idx", shape=(e, i), dtype="int32"),
            WeightTensor(name="experts.w13_g_idx_sort_indices", shape=(e, h), dtype="int32"),
            WeightTensor(name="experts.w2_g_idx_sort_indices", shape=(e, i), dtype="int32"),
        )
    if method == "mxfp4":
        return (
            WeightTensor(name="experts.w13_weight", shape=(e, 2 * i, h // 2), dtype="uint8"),
            WeightTensor(name="experts.w13_weight_scale", shape=(e, 2 * i, h // 32), dtype="uint8"),
            WeightTensor(name="experts.w13_weight_bias", shape=(e, 2 * i), dtype="bfloat16"),
            WeightTensor(name="experts.w2_weight", shape=(e, h, i // 2), dtype="uint8"),
            WeightTensor(name="experts.w2_weight_scale", shape=(e, h, i // 32), dtype="uint8"),
            WeightTensor(name="experts.w2_weight_bias", shape=(e, h), dtype="bfloat16"),
        )
    g = q.group_size or 16  # nvfp4
    return (
        WeightTensor(name="experts.w13_weight", shape=(e, 2 * i, h // 2), dtype="uint8"),
        WeightTensor(name="experts.w2_weight", shape=(e, h, i // 2), dtype="uint8"),
        WeightTensor(
            name="experts.w13_weight_scale", shape=(e, 2 * i, h // g), dtype="float8_e4m3fn"
        ),
        WeightTensor(
            name="experts.w13_blockscale_swizzled", shape=(e, 2 * i, h // g), dtype="float8_e4m3fn"
        ),
        WeightTensor(name="experts.w2_weight_scale", shape=(e, h, i // g), dtype="float8_e4m3fn"),
        WeightTensor(
            name="experts.w2_blockscale_swizzled", shape=(e, h, i // g), dtype="float8_e4m3fn"
        ),
        WeightTensor(name="experts.w13_weight_scale_2", shape=(e, 2), dtype="float32"),
        WeightTensor(name="experts.w2_weight_scale_2", shape=(e,), dtype="float32"),
        WeightTensor(name="experts.w13_input_scale", shape=(num_experts, 2), dtype="float32"),
        WeightTensor(name="experts.w2_input_scale", shape=(num_experts,), dtype="float32"),
    )


def attention_scales(scheme: QuantScheme | None) -> tuple[WeightTensor, ...]:
    """The fp32 K / V scales an MLA layer's two attention modules hold (fp8's and
    ModelOpt's KV-cache methods; compressed-tensors without a kv_cache_scheme holds none)."""
    if scheme is None or scheme.quantization.quant_method not in ("fp8", "modelopt"):
        return ()
    return tuple(
        WeightTensor(name=f"self_attn.{attn}.{kv}_scale", shape=(), dtype="float32")
        for attn in ("attn_mqa", "attn_mha")
        for kv in ("k", "v")
    )
