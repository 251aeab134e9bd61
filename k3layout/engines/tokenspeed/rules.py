"""What tokenspeed refuses before it lays out a Kimi-K3 cache, each refusal with tokenspeed's
own words beside the planner's (the same at #1152's head and ``main``: every refusal ``main``
adds comes out of the layout, :func:`.recipe.pack`):

- an attention cache dtype its MLA config does not take (``fp8_ds_mla``);
- a model its K3 recipe does not group: no KDA or no MLA layer, a 93-layer model that is not
  69 KDA + 24 MLA, a KDA count that does not split into 3 state groups, a draft that is not
  MLA;
- KDA heads, or the draft's query heads, that the attention TP does not divide (the draft's
  are not the recipe's refusal, which lays such a cache out, but the draft attention's when
  the model loads, ``deepseek_v3.py``, before the cache is planned);
- what tokenspeed has no flag for: pipeline stages, decode context parallel, vLLM's and
  SGLang's settings.
"""

from __future__ import annotations

from ...cache import GQALayer, KDALayer, MLALayer
from ...deployment import Deployment
from ...errors import Refusal
from ...layouts.seams import SGLANG_SETTINGS, VLLM_SETTINGS, refuse_settings
from ...model import HybridModel
from .recipe import STATE_GROUPS
from .releases import NEWEST, TokenspeedRevision, revision_of

KV_CACHE_DTYPES = ("fp8", "bf16")
"""The planner's cache dtypes tokenspeed serves: ``--kv-cache-dtype`` ``fp8`` / ``fp8_e4m3`` /
``mxfp8`` store fp8 latent rows, ``auto`` / ``bfloat16`` bf16 ones."""

_K3_LAYERS, _K3_KDA, _K3_MLA = 93, 69, 24
"""tokenspeed's recipe holds a 93-layer model to Kimi-K3's own split."""


def _refuse(
    revision: TokenspeedRevision, code: str, ours: str, theirs: str, hint: str, **facts: object
) -> Refusal:
    return Refusal(
        code,  # type: ignore[arg-type]  # the callers pass RefusalCode literals
        f"{ours} (tokenspeed: {theirs})",
        facts={"engine": "tokenspeed", "revision": revision.title, **facts},  # type: ignore[dict-item]
        hint=hint,
    )


def check_settings(deployment: Deployment) -> None:
    """Refuse the settings tokenspeed has no flag for."""
    refuse_settings(deployment, SGLANG_SETTINGS, "SGLang")
    # tokenspeed lays out 128-token MLA pages in one parent arena and picks its own kernels.
    refuse_settings(deployment, VLLM_SETTINGS, "vLLM")
    if deployment.dcp > 1:
        raise Refusal(
            "dcp_unsupported",
            f"engine=tokenspeed has no decode context parallel (dcp={deployment.dcp})",
            facts={"engine": "tokenspeed", "dcp": deployment.dcp},
            hint="use dcp=1, or engine=vllm for a DCP decode",
        )
    if deployment.pp > 1:
        raise Refusal(
            "engine_setting",
            f"pp={deployment.pp}: tokenspeed ({revision_of(deployment).title}) has no "
            "pipeline parallelism; "
            "its server takes no pipeline size",
            facts={"engine": "tokenspeed", "field": "pp", "pp": deployment.pp},
            hint="use pp=1 for engine=tokenspeed, or engine=vllm or engine=sglang for stages",
        )
    for name in ("kv_dtype", "draft_kv_dtype"):
        dtype = getattr(deployment, name)
        if dtype is not None and dtype not in KV_CACHE_DTYPES:
            raise _refuse(
                revision_of(deployment),
                "dtype_unsupported",
                f"{name}={dtype!r} is not a tokenspeed cache dtype (it takes "
                f"{', '.join(KV_CACHE_DTYPES)})",
                f"Unsupported kv_cache_dtype: {dtype!r}",
                f"use {name} in {list(KV_CACHE_DTYPES)}, or engine=vllm",
                field=name,
            )


def check_model(model: HybridModel, attn_tp: int, revision: TokenspeedRevision = NEWEST) -> None:
    """Refuse what tokenspeed's K3 recipe does not group or shard (see the module), in the
    words of ``revision`` (the default: the newest)."""
    if model.indexer is not None:
        raise _refuse(
            revision,
            "layout_unsupported",
            f"model {model.name} ({model.model_type}): its MLA layers keep a pooled DSA "
            "indexer and a tail ring, and tokenspeed has no cache recipe for that hybrid",
            "no recipe family for it (mha, mla, dsa, msa, qwen_gdn, inkling, kimi_k3, "
            "deepseek_v4) and no model class Glm5NextForConditionalGeneration",
            "use engine=vllm",
            model=model.name,
            model_type=model.model_type,
        )
    kda = model.kda_layer_ids
    state = set(kda)
    mla = [i for i in range(model.num_layers) if i not in state]
    if not kda or not mla:
        raise _refuse(
            revision,
            "layout_unsupported",
            f"model {model.name}: tokenspeed's Kimi-K3 recipe needs both KDA and MLA layers, "
            f"got {len(kda)} and {len(mla)}",
            "Kimi-K3 cache requires both KDA and full-attention layers, got "
            f"{len(kda)} and {len(mla)}",
            "plan a hybrid MLA + KDA model, or use engine=vllm",
            model=model.name,
        )
    if model.num_layers == _K3_LAYERS and (len(kda), len(mla)) != (_K3_KDA, _K3_MLA):
        raise _refuse(
            revision,
            "layout_unsupported",
            f"model {model.name}: a 93-layer model must be Kimi-K3's 69 KDA + 24 MLA, got "
            f"{len(kda)} and {len(mla)}",
            f"93-layer Kimi-K3 requires 69 KDA and 24 MLA layers, got {len(kda)} and {len(mla)}",
            "check the config's kda_layers",
            model=model.name,
        )
    if len(kda) % STATE_GROUPS:
        raise _refuse(
            revision,
            "layout_unsupported",
            f"model {model.name}: {len(kda)} KDA layers do not split into {STATE_GROUPS} "
            "state groups",
            "Kimi-K3 cache requires the KDA layer count to divide into "
            f"{STATE_GROUPS} state groups, got {len(kda)}",
            "tokenspeed's K3 recipe serves Kimi-K3; use engine=vllm or engine=sglang for this "
            "model",
            model=model.name,
            kda_layers=len(kda),
        )
    targets = [layer for layer in model.layers if not isinstance(layer, KDALayer)]
    for layer in (*targets, *model.draft_layers):
        if not isinstance(layer, MLALayer):
            what = "draft" if isinstance(layer, GQALayer) else "attention"
            raise Refusal(
                "draft_unsupported" if what == "draft" else "layout_unsupported",
                f"model {model.name}: tokenspeed's Kimi-K3 recipe pages MLA latent rows only; "
                f"a {layer.kind.upper()} {what} layer has none",
                facts={"engine": "tokenspeed", "model": model.name, "kind": layer.kind},
                hint="give an MLA draft (K3's DSpark), or use engine=sglang for a dense draft",
            )
    for layer in model.kda_layers:
        if layer.num_heads % attn_tp:
            raise _refuse(
                revision,
                "heads_not_divisible",
                f"KDA num_heads={layer.num_heads} must be divisible by attn_tp={attn_tp}",
                f"KDA num_heads={layer.num_heads} must be divisible by tp_size={attn_tp}",
                "pick an attention TP that divides the KDA heads",
                kind="KDA",
                num_heads=layer.num_heads,
                attn_tp=attn_tp,
            )
    for draft in model.draft_layers:
        if draft.num_heads % attn_tp:
            raise _refuse(
                revision,
                "heads_not_divisible",
                f"the draft's MLA num_heads={draft.num_heads} must be divisible by "
                f"attn_tp={attn_tp}",
                f"num_heads={draft.num_heads} must be divisible by attn_tp_size={attn_tp}.",
                "pick an attention TP that divides the draft's query heads",
                kind="MLA",
                num_heads=draft.num_heads,
                attn_tp=attn_tp,
            )


def check_tokenspeed(model: HybridModel, deployment: Deployment) -> HybridModel:
    """Refuse what tokenspeed does not run (see the module), in the order tokenspeed meets
    it: settings and cache dtype, then the recipe's groups and shards."""
    check_settings(deployment)
    check_model(model, deployment.attn_tp, revision_of(deployment))
    return model
