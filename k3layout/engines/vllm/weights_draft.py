"""The draft's own weights on vLLM 0.33's last pipeline stage (what it shares is not here).

- **DSpark** (``K3DSparkForCausalLM``, ``dspark_mla.py``), built by ``load_dspark_model``
  with the target's TP and without quantization (its own config has none): per draft layer an
  MLA without output gate (its q and kv latents replicated), a TP-split ``KimiMLP`` and two
  norms; once, the replicated ``context_proj`` (``hidden x target_hidden x num_target_layers``)
  and ``context_kv_proj`` (every layer's ``kv_lora_rank + qk_rope_head_dim`` latent), the
  ``context_norm`` and ``final_norm``, the Markov head (``markov_w1`` ``[vocab, rank]``,
  ``markov_w2`` ``[vocab padded to 64, rank]``, both whole), and the fp32 rotary cos/sin cache
  of its first layer ``[max_position_embeddings, qk_rope_head_dim]`` (default rope). The
  embedding and LM head are the target's.
- **MTP** (``KimiK3MTP``, ``mtp.py``), ``num_nextn_predict_layers`` modules numbered after the
  target's layers: ``enorm``, ``hnorm``, the unquantized ``eh_proj [hidden, 2 x hidden]``,
  ``shared_head.norm`` and a full decoder layer (``mtp_block``, in the target's quantization,
  without attention residual). Embedding and heads are the target's, except at ``pp > 1``
  where it keeps an embedding of its own.
"""

from __future__ import annotations

from ...cache.mla import MLALayer
from ...deployment import Deployment
from ...errors import Refusal
from ...model import HybridModel
from ...weights import WeightGroup, WeightTensor
from ...weights.records import WeightKind
from .weights_layers import mla_tensors, mlp_tensors, split
from .weights_quant import QuantContext
from .weights_stack import grouped, layer_groups, padded_vocab

DSPARK_PREFIX = "model."
MTP_PREFIX = "model.layers."


def draft_groups(
    model: HybridModel, deployment: Deployment, ctx: QuantContext
) -> list[WeightGroup]:
    """The draft's own groups on the last stage (none without a drafter)."""
    if model.drafter == "dspark":
        return _dspark(model, ctx)
    if model.drafter == "mtp":
        return _mtp(model, deployment, ctx)
    return []


def _dspark(model: HybridModel, ctx: QuantContext) -> list[WeightGroup]:
    arch = model.architecture
    assert arch is not None
    draft = arch.draft
    if draft is None or draft.target_hidden_size is None:
        raise Refusal(
            "weights_unknown",
            f"model {model.name}: its DSpark draft's config does not give the dimensions its "
            "weights need (target_hidden_size, markov_rank, target_layer_ids, "
            "intermediate_size)",
            facts={"model": model.name, "field": "draft"},
            hint="load the draft from a config.json that gives them (load_config(..., draft=))",
        )
    plain = QuantContext(None, ctx.dtype, ctx.attn_tp, ())
    hidden, dtype = draft.hidden_size, ctx.dtype
    found: list[tuple[WeightKind, int, tuple[WeightTensor, ...]]] = []
    latents = 0
    for k, layer in enumerate(model.draft_layers):
        if not isinstance(layer, MLALayer):
            raise Refusal(
                "weights_unknown",
                f"model {model.name}: DSpark draft layer {k} is {layer.kind}, not MLA",
                facts={"model": model.name, "layer": k},
                hint="plan K3's DSpark draft (MLA layers)",
            )
        module = f"{DSPARK_PREFIX}layers.{k}"
        tensors = mla_tensors(layer, hidden, False, module, plain)
        if k == 0:
            rope = WeightTensor(
                name="self_attn.rotary_emb.cos_sin_cache",
                shape=(draft.max_position_embeddings, layer.qk_rope_head_dim),
                dtype="float32",
            )
            tensors = (*tensors, rope)
        tensors += mlp_tensors(
            "mlp", hidden, draft.intermediate_size, module, plain, replicated=False
        )
        tensors += (
            WeightTensor(name="input_layernorm.weight", shape=(hidden,), dtype=dtype),
            WeightTensor(name="post_attention_layernorm.weight", shape=(hidden,), dtype=dtype),
        )
        found.append(("draft", k, tensors))
        latents += layer.kv_lora_rank + layer.qk_rope_head_dim
    own = (
        WeightTensor(
            name=f"{DSPARK_PREFIX}context_proj.weight",
            shape=(hidden, draft.target_hidden_size * draft.num_target_layers),
            dtype=dtype,
        ),
        WeightTensor(name=f"{DSPARK_PREFIX}context_norm.weight", shape=(hidden,), dtype=dtype),
        WeightTensor(
            name=f"{DSPARK_PREFIX}context_kv_proj.weight", shape=(latents, hidden), dtype=dtype
        ),
        WeightTensor(name=f"{DSPARK_PREFIX}final_norm.weight", shape=(hidden,), dtype=dtype),
        WeightTensor(
            name=f"{DSPARK_PREFIX}markov_head.markov_w1.weight",
            shape=(draft.vocab_size, draft.markov_rank),
            dtype=dtype,
        ),
        WeightTensor(
            name=f"{DSPARK_PREFIX}markov_head.markov_w2.weight",
            shape=(padded_vocab(draft.vocab_size), draft.markov_rank),
            dtype=dtype,
        ),
    )
    return [WeightGroup(kind="draft", tensors=own), *grouped(found)]


def _mtp(model: HybridModel, deployment: Deployment, ctx: QuantContext) -> list[WeightGroup]:
    arch = model.architecture
    assert arch is not None
    hidden, dtype = arch.hidden_size, ctx.dtype
    first = model.num_layers
    ids = range(first, first + len(model.draft_layers))
    found: list[tuple[WeightKind, int, tuple[WeightTensor, ...]]] = []
    head = (
        WeightTensor(name="enorm.weight", shape=(hidden,), dtype=dtype),
        WeightTensor(name="hnorm.weight", shape=(hidden,), dtype=dtype),
        WeightTensor(name="eh_proj.weight", shape=(hidden, 2 * hidden), dtype=dtype),
        WeightTensor(name="shared_head.norm.weight", shape=(hidden,), dtype=dtype),
    )
    for layer in ids:
        found.append(("mtp", layer, head))
    blocks = layer_groups(model, deployment, layer_ids=ids, ctx=ctx, prefix=MTP_PREFIX, mtp=True)
    found += [("mtp", layer, tensors) for _, layer, tensors in blocks]
    merged: dict[int, tuple[WeightTensor, ...]] = {}
    for _, layer, tensors in found:
        merged[layer] = merged.get(layer, ()) + tensors
    groups = grouped(("mtp", layer, tensors) for layer, tensors in merged.items())
    if deployment.pp > 1:  # maybe_share_target_embed shares it only on one stage
        vocab = split(padded_vocab(arch.vocab_size), deployment.attn_tp, "vocab_size")
        embedding = WeightTensor(
            name="model.embed_tokens.weight", shape=(vocab, hidden), dtype=dtype
        )
        groups.insert(0, WeightGroup(kind="mtp", tensors=(embedding,)))
    return groups
