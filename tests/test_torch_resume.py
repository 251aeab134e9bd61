"""Cold vs resumed, end to end: a tiny K3-shaped model run on the allocated layout. A prefix
checkpointed at a boundary, packed to the tier and restored into other blocks (or moved to
another TP by the transfer plan) resumes to the cold run's outputs; planes published in name
order do not, and validation refuses that layout before anything runs."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch

from k3layout import ConvLayout, Deployment, Refusal, VllmPlan, plan_transfer, plan_vllm
from k3layout.offload import NamingEngine, name_order
from k3layout.torch import (
    BlockTables,
    PageUnits,
    block_tables,
    boundary_blocks,
    pack_units,
    parts_of,
    plane_view,
    restore_across_tp,
    restore_prefix,
    restore_units,
    store_prefix,
    validate,
)
from k3layout.torch.tiny_model import Rank, TinyK3, TinyK3Config, run, tp_ranks

NUM_BLOCKS = 16
NAN_BYTES = 0xFF  # every bf16, fp32 and fp8 element of a fresh cache reads as NaN
FLA_FP32_TOLERANCE = 5e-3  # fla's relative-RMS bound between two KDA computations in fp32
FP64_TOLERANCE = 1e-12  # relative: TP changes only the order of the all-reduce's sums


def prompt(config: TinyK3Config, block: int) -> torch.Tensor:
    """Three blocks and a ragged tail of token ids."""
    gen = torch.Generator().manual_seed(7)
    return torch.randint(0, config.vocab_size, (3 * block + 40,), generator=gen)


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()


class Setting:
    """The tiny model in ``dtype`` on a ``vllm`` plan, a prompt and a boundary of 2 blocks
    (the conv layout is the deployment's)."""

    def __init__(
        self,
        dtype: torch.dtype,
        deployment: Deployment,
        config: TinyK3Config | None = None,
    ) -> None:
        self.config = config or TinyK3Config()
        self.model = TinyK3.build(self.config, dtype)
        self.plan = plan_vllm(self.config.model(), deployment)
        self.tokens = prompt(self.config, self.plan.block_tokens)
        self.boundary = 2 * self.plan.block_tokens

    def ranks(
        self, plan: VllmPlan | None = None, fill: int = 0, naming: NamingEngine = "vllm"
    ) -> tuple[Rank, ...]:
        return tp_ranks(plan or self.plan, NUM_BLOCKS, fill=fill, naming=naming)

    def cold(self, plan: VllmPlan | None = None) -> torch.Tensor:
        plan = plan or self.plan
        tables = block_tables(plan, len(self.tokens), range(NUM_BLOCKS))
        return run(self.model, self.ranks(plan), tables, self.tokens)

    def prefix(
        self, naming: NamingEngine = "vllm"
    ) -> tuple[tuple[Rank, ...], torch.Tensor, BlockTables]:
        """A first request over the prefix only: its ranks, logits and tables."""
        ranks = self.ranks(naming=naming)
        tables = block_tables(self.plan, self.boundary, range(NUM_BLOCKS))
        logits = run(self.model, ranks, tables, self.tokens[: self.boundary])
        return ranks, logits, tables


@pytest.mark.parametrize(
    ("dtype", "kv_dtype", "conv_layout"),
    [
        (torch.float64, "bf16", "SD"),
        (torch.float64, "fp8", "DS"),
        (torch.float32, "bf16", "DS"),
        (torch.float32, "fp8", "SD"),
    ],
)
def test_a_prefix_restored_into_other_blocks_resumes_to_the_cold_outputs_bit_for_bit(
    dtype: torch.dtype, kv_dtype: str, conv_layout: ConvLayout
) -> None:
    deployment = Deployment.model_validate({"kv_dtype": kv_dtype, "conv_layout": conv_layout})
    setting = Setting(dtype, deployment)
    assert setting.plan.deployment.conv_layout == conv_layout
    cold = setting.cold()
    ranks, prefix_logits, tables = setting.prefix()
    assert torch.equal(prefix_logits, cold[: setting.boundary])
    (rank,) = ranks
    tier = store_prefix(rank.layout, rank.registered, tables, setting.boundary)
    # a fresh cache of NaN bytes, the request in other blocks: only restored bytes are read
    resumed_ranks = setting.ranks(fill=NAN_BYTES)
    other = block_tables(setting.plan, len(setting.tokens), range(NUM_BLOCKS - 1, -1, -1))
    assert set(other.table("linear_attention_0")).isdisjoint(tables.table("linear_attention_0"))
    (target,) = resumed_ranks
    restore_prefix(tier, target.layout, target.registered, other)
    resumed = run(setting.model, resumed_ranks, other, setting.tokens, start=setting.boundary)
    # the same operations on the same bytes: identical, in fp64 and fp32 alike
    assert torch.equal(resumed, cold[setting.boundary :])
    # ...and the comparison can fail: without the restore the run is another run
    fresh = setting.ranks()
    unrestored = run(setting.model, fresh, other, setting.tokens, start=setting.boundary)
    assert (unrestored - cold[setting.boundary :]).abs().max() > 0.1


@pytest.mark.parametrize(
    ("dtype", "tp_p", "tp_d", "conv_layout"),
    [
        (torch.float64, 1, 2, "SD"),
        (torch.float64, 2, 4, "SD"),
        (torch.float32, 1, 2, "SD"),
        (torch.float32, 2, 4, "SD"),
        (torch.float64, 2, 4, "DS"),  # channel-major conv: each rank's q, k, v shares moved
    ],
)
def test_a_prefix_moved_across_tp_by_the_transfer_plan_resumes_to_the_cold_outputs(
    dtype: torch.dtype, tp_p: int, tp_d: int, conv_layout: ConvLayout
) -> None:
    prefill = Deployment(attn_tp=tp_p, kv_dtype="bf16", conv_layout=conv_layout)
    setting = Setting(dtype, prefill)
    decode = Deployment(attn_tp=tp_d, kv_dtype="bf16", conv_layout=conv_layout)
    d_plan = plan_vllm(setting.config.model(), decode)
    assert d_plan.block_tokens == setting.plan.block_tokens  # tiny dims: 128 on both sides
    ranks, _, tables = setting.prefix()
    tiers = [store_prefix(r.layout, r.registered, tables, setting.boundary) for r in ranks]
    transfer = plan_transfer(
        setting.config.model(), prefill, decode, prompt_tokens=setting.boundary
    )
    assert transfer.decode.conv_layout == conv_layout
    resumed_ranks = setting.ranks(d_plan, fill=NAN_BYTES)
    other = block_tables(d_plan, len(setting.tokens), range(NUM_BLOCKS - 1, -1, -1))
    restore_across_tp(transfer, tiers, [(r.layout, r.registered, other) for r in resumed_ranks])
    resumed = run(setting.model, resumed_ranks, other, setting.tokens, start=setting.boundary)
    cold_p = setting.cold()[setting.boundary :]
    cold_d = setting.cold(d_plan)[setting.boundary :]
    if dtype == torch.float64:
        # the state and latents round to fp32 / bf16 in the layout, far above fp64's round-off:
        # resumed at TP_d is the cold TP_d run, and the cold TP_p run up to the sums' order
        assert torch.equal(resumed, cold_d)
        assert (resumed - cold_p).abs().max() <= FP64_TOLERANCE * cold_p.abs().max()
    else:
        assert rel_rms(resumed, cold_d) < FLA_FP32_TOLERANCE
        assert rel_rms(resumed, cold_p) < FLA_FP32_TOLERANCE


def test_planes_published_in_name_order_resume_wrong_and_validation_refuses_them() -> None:
    """The seed's first boot on a tiny K3 + draft: 8 layers, KDA groups (0, 2, 5) and (1, 4, 6)
    ride attention layers 3, 7 and the first draft layer; in name order the two draft layers
    come first, so the leading three planes are draft 0, draft 1 and layer 3."""
    # one speculative token: vLLM builds the draft (and its planes) only with one
    setting = Setting(torch.float64, Deployment(spec_tokens=1), TinyK3Config(num_draft_layers=2))
    cold = setting.cold()[setting.boundary :]
    (rank,), _, tables = setting.prefix(naming="atom")  # the seed's engine: ATOM's names
    order = name_order(rank.layout.published)
    assert order[:3] == (
        "draft.layers.0.self_attn.attn",
        "draft.layers.1.self_attn.attn",
        "model.layers.3.self_attn.attn",
    )
    with pytest.raises(Refusal) as refused:
        validate(setting.plan, rank.registered, published=order)
    assert refused.value.code == "aliasing"
    facts = refused.value.facts
    # KDA layer 0 of group 0 rides layer 3's plane, published third (plane 2) instead of first
    assert (facts["group"], facts["position"], facts["found_plane"], facts["plane"]) == (
        "linear_attention_0",
        0,
        2,
        0,
    )

    def planes(target: Rank) -> tuple[torch.Tensor, ...]:
        """What an engine publishing by name would take as the PAGE planes (unchecked)."""
        page = setting.plan.page_bytes
        return tuple(
            plane_view(parts_of(target.registered[name])[0], NUM_BLOCKS, page) for name in order
        )

    n = setting.boundary
    image = pack_units(PageUnits(planes(rank)[:3], boundary_blocks(rank.layout, tables, n)))
    kv = pack_units(PageUnits(planes(rank), tables.table("full_attention")[:2]))
    (target,) = resumed_ranks = setting.ranks(naming="atom")
    other = block_tables(setting.plan, len(setting.tokens), range(NUM_BLOCKS - 1, -1, -1))
    restore_units(image, PageUnits(planes(target)[:3], boundary_blocks(target.layout, other, n)))
    restore_units(kv, PageUnits(planes(target), other.table("full_attention")[:2]))
    wrong = run(setting.model, resumed_ranks, other, setting.tokens, start=n)
    assert torch.isfinite(wrong).all()  # no NaN to give it away: just other answers
    assert (wrong - cold).abs().max() > 0.1
    # published as the ride does (aliased first), the same prefix resumes exactly
    tier = store_prefix(rank.layout, rank.registered, tables, n)
    (fixed,) = fixed_ranks = setting.ranks(fill=NAN_BYTES, naming="atom")
    restore_prefix(tier, fixed.layout, fixed.registered, other)
    assert torch.equal(run(setting.model, fixed_ranks, other, setting.tokens, start=n), cold)


def test_the_tiny_model_is_drawn_from_its_seed_and_shared_by_fp32_and_fp64() -> None:
    config = TinyK3Config(seed=3)
    assert TinyK3Config.model_validate_json(config.model_dump_json()) == config
    fp64, again = TinyK3.build(config), TinyK3.build(config)
    fp32 = TinyK3.build(config, torch.float32)
    assert fp64.weights.keys() == fp32.weights.keys()
    for key, weight in fp64.weights.items():
        assert torch.equal(weight, again.weights[key])
        assert torch.equal(weight.to(torch.float32), fp32.weights[key])
    model = config.model()
    # Kimi's pattern at 8 layers: MLA at 3 and 7 (every 4th, and the last)
    assert model.attention_layer_ids == (3, 7)
    assert len(model.kda_layer_ids) == 6


def test_a_run_needs_every_tp_rank_and_a_start_on_the_block_grid() -> None:
    setting = Setting(torch.float64, Deployment(attn_tp=2))
    ranks = setting.ranks()
    tables = block_tables(setting.plan, len(setting.tokens), range(NUM_BLOCKS))
    with pytest.raises(Refusal) as refused:
        run(setting.model, ranks[:1], tables, setting.tokens)
    assert refused.value.code == "invalid_argument"
    assert refused.value.facts == {"attn_tp": 2, "num_ranks": 1, "start": 0, "block_tokens": 128}
    with pytest.raises(Refusal) as refused:
        run(setting.model, ranks, tables, setting.tokens, start=100)
    assert refused.value.facts["start"] == 100


def test_a_run_refuses_token_ids_a_dtype_or_a_model_it_cannot_run() -> None:
    setting = Setting(torch.float64, Deployment())
    ranks = setting.ranks()
    tables = block_tables(setting.plan, len(setting.tokens), range(NUM_BLOCKS))
    with pytest.raises(Refusal) as refused:
        run(setting.model, ranks, tables, setting.tokens + setting.config.vocab_size)
    assert refused.value.code == "invalid_argument"
    shape = (3 * 128 + 40,)  # three blocks and a tail
    assert refused.value.facts == {"shape": shape, "dtype": "torch.int64", "vocab_size": 64}
    with pytest.raises(Refusal) as refused:
        run(TinyK3.build(TinyK3Config(num_layers=12)), ranks, tables, setting.tokens)
    assert refused.value.code == "model_mismatch"
    with pytest.raises(Refusal) as refused:
        TinyK3.build(setting.config, torch.bfloat16)
    assert (refused.value.code, refused.value.facts) == (
        "invalid_argument",
        {"dtype": "torch.bfloat16"},
    )
