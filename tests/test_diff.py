"""diff(a, b): every field and derived number two plans differ in, by its path into the plan."""

from __future__ import annotations

from typing import Any

import pytest

from k3layout import Deployment, Refusal, load_plan, plan, preset
from k3layout.layouts.diff import SHOWN, Difference, PlanDiff, diff

K3 = preset("kimi-k3")
K3_DSPARK = preset("kimi-k3-dspark")


def _at(found: PlanDiff, path: str) -> Difference:
    (only,) = [difference for difference in found.differences if difference.path == path]
    return only


def test_equal_plans_differ_in_nothing_and_read_as_equal() -> None:
    driver: Any = plan(K3_DSPARK, Deployment(attn_tp=8, spec_tokens=2))
    worker = load_plan(driver.model_dump_json())  # what a worker sends back, re-planned
    for other in (driver, worker):
        found = diff(driver, other)
        assert found.differences == () and not found and len(found) == 0
        assert str(found) == "plans equal"


def test_a_deployment_field_is_named_with_both_values_and_what_follows_from_it() -> None:
    left: Any = plan(K3, Deployment(attn_tp=8))
    right: Any = plan(K3, Deployment(attn_tp=4))
    found = diff(left, right)
    assert str(_at(found, "deployment.attn_tp")) == "deployment.attn_tp: 8 != 4"
    # the stored decisions and derived numbers that follow, each with its two values
    for name in ("block_tokens", "page_bytes", "block_bytes"):
        assert (_at(found, name).left, _at(found, name).right) == (
            getattr(left, name),
            getattr(right, name),
        )
    # a KDA layer's state is head-sharded: S(tp) = 3*H*D/tp * (K-1) * 2 + H/tp * D * D * 4
    state = _at(found, "sizes.state_bytes")
    assert (state.left, state.right) == (
        3 * 96 * 128 // 8 * 3 * 2 + 96 // 8 * 128 * 128 * 4,
        3 * 96 * 128 // 4 * 3 * 2 + 96 // 4 * 128 * 128 * 4,
    )
    # the same model and the same groups: nothing of theirs is named
    assert not [p for p in found.paths if p.startswith(("model.", "groups", "deployment.kv"))]
    assert [p for p in found.paths if p.startswith("deployment.")] == ["deployment.attn_tp"]


def test_layers_and_planes_only_one_plan_has_are_named_absent_on_the_other() -> None:
    found = diff(
        plan(K3, Deployment(attn_tp=8, spec_tokens=2)),
        plan(K3_DSPARK, Deployment(attn_tp=8, spec_tokens=2)),
    )
    draft = _at(found, "model.draft_layers[0].kind")
    assert (draft.left, draft.right, draft.absent) == (None, "mla", "left")
    assert str(draft) == "model.draft_layers[0].kind: (absent) != 'mla'"
    # the attention group gains the 5 draft layers, module layers 93..97, as planes 24..28
    assert [_at(found, f"groups[3].layers[{24 + k}]").right for k in range(5)] == [
        93,
        94,
        95,
        96,
        97,
    ]
    num_planes = _at(found, "num_planes")
    assert (num_planes.left, num_planes.right) == (24, 24 + 5)
    assert _at(found, "stages[0].planes").right == 29  # the report's stage, merged in


def test_plans_of_two_engines_name_the_fields_each_has_alone() -> None:
    vllm: Any = plan(K3, Deployment(attn_tp=8))
    tokenspeed: Any = plan(K3, Deployment(engine="tokenspeed", attn_tp=8))
    found = diff(vllm, tokenspeed)
    assert (_at(found, "engine").left, _at(found, "engine").right) == ("vllm", "tokenspeed")
    assert _at(found, "deployment.engine").right == "tokenspeed"
    block = _at(found, "block_tokens")
    assert (block.left, block.absent) == (vllm.block_tokens, "right")
    parent = _at(found, "parent_bytes")
    assert (parent.right, parent.absent) == (tokenspeed.parent_bytes, "left")
    # the same planes hold the same pages: 24 of them, 884,736 B each (12 latent pages of 128
    # tokens at 576 B, fp8) in both
    assert "num_planes" not in found.paths
    assert _at(found, "page_bytes").left == _at(found, "plane_bytes").right == 12 * 128 * 576


def test_the_diff_runs_both_ways_with_the_sides_swapped() -> None:
    a: Any = plan(K3, Deployment(attn_tp=8))
    b: Any = plan(K3_DSPARK, Deployment(engine="tokenspeed", attn_tp=4, kv_dtype="bf16"))
    forward, backward = diff(a, b), diff(b, a)
    swapped = {
        (d.path, d.right, d.left, {"left": "right", "right": "left", None: None}[d.absent])
        for d in forward.differences
    }
    assert swapped == {(d.path, d.left, d.right, d.absent) for d in backward.differences}
    assert len(set(forward.paths)) == len(forward)  # each path once


def test_the_log_line_is_short_and_counts_what_it_leaves_out() -> None:
    found = diff(plan(K3, Deployment(attn_tp=8)), plan(K3, Deployment(attn_tp=4)))
    text = str(found)
    assert text.startswith(f"{len(found)} differences: deployment.attn_tp: 8 != 4; ")
    assert text.endswith(f"... and {len(found) - SHOWN} more")
    assert text.count(" != ") == SHOWN
    one = PlanDiff(differences=(Difference(path="deployment.pp", left=1, right=2),))
    assert str(one) == "1 difference: deployment.pp: 1 != 2"


def test_a_number_is_not_a_flag_and_an_empty_list_shows_as_one() -> None:
    assert str(Difference(path="x", left=(), right=None, absent="right")) == "x: [] != (absent)"
    assert hash(Difference(path="x", left=1, right=True)) is not None  # a frozen record
    with pytest.raises(Refusal) as caught:
        Difference(path="x", left=[1], right=2)
    assert caught.value.code == "invalid_argument"


def test_what_is_not_a_plan_is_refused_naming_the_argument() -> None:
    left: Any = plan(K3, Deployment(attn_tp=8))
    for args, field in (((left.model_dump(), left), "left"), ((left, K3), "right")):
        with pytest.raises(Refusal) as caught:
            diff(*args)
        assert caught.value.code == "invalid_argument"
        assert caught.value.facts["field"] == field


def test_a_layer_of_another_kind_is_named_by_its_module_index() -> None:
    # Kimi-Linear's last layer (26) is MLA; Kimi-K3's layer 26 is KDA (MLA: every 4th from 3)
    found = diff(
        plan(preset("kimi-linear-48b"), Deployment(attn_tp=8)), plan(K3, Deployment(attn_tp=8))
    )
    assert str(_at(found, "model.layers[26].kind")) == "model.layers[26].kind: 'mla' != 'kda'"
    assert _at(found, "model.layers[26].conv_kernel").absent == "left"  # a KDA field
    assert _at(found, "model.layers[27].kind").absent == "left"  # Kimi-Linear has 27 layers
