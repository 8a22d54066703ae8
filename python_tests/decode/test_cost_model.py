"""The cost model (cost_model.py), its calibration cache (bench/calibrate.py) and `AutoDrafter`.

Expected values are worked by hand from the formulas in cost_model's docstring (fake cost tables), or are
plain greedy decoding / the target's exact joint law (loop_helpers) for the auto shapes.
"""
import math

import pytest
import torch
from test_block_trees import SlotOracle

from conftest import tiny_qwen3
from drafter_doubles import greedy_continuation
from flashmap_ext import Target, generate
from flashmap_ext.cost_model import (
    H200_QWEN3_8B,
    AcceptanceProfile,
    CostTable,
    best_shape,
    expected_gamma_two,
    projected_speedup,
)
from flashmap_ext.drafters.auto import AutoDrafter
from loop_helpers import V_SMALL, assert_matches_joint, prompt_of


def table(per_token: float, draft: float = 0.0) -> CostTable:
    """verify(w) = 1 + per_token · (w − 1) seconds."""
    return CostTable({w: 1.0 + per_token * (w - 1) for w in (1, 2, 3, 5, 9, 17, 33)}, draft_s=draft)


def test_interpolation_and_extrapolation():
    t = CostTable({1: 1.0, 3: 2.0, 5: 6.0})
    assert t.verify(2) == 1.5 and t.verify(4) == 4.0 and t.verify(7) == 10.0 and t.verify(3) == 2.0
    with pytest.raises(ValueError, match="width 1"):
        CostTable({2: 1.0})


def test_expected_gamma_formulas():
    prof = AcceptanceProfile([0.8, 0.5], weight=1.0)
    assert prof.expected_gamma(2) == pytest.approx(1 + 0.8 + 0.4)
    prof.record(proposed=2, accepted=0)   # slot 0 rejected, slot 1 carries no information
    assert prof.tried == [1] and prof.rate(0) == pytest.approx(0.8 / 2) and prof.rate(1) == 0.5
    other = AcceptanceProfile(0.5, weight=1.0)
    assert expected_gamma_two(prof, 1, other, 2) == pytest.approx(1 + (1 - 0.6 * 0.5) + 0.25)


def test_unexplored_slots_inherit_the_slot_before():
    prof = AcceptanceProfile(0.5, weight=2.0)
    for _ in range(8):
        prof.record(proposed=1, accepted=1)   # only ever a 1-token chain, always accepted
    assert prof.rate(0) == pytest.approx(9 / 10) and prof.rate(3) == prof.rate(0)
    assert best_shape(table(0.05), prof, 8).drafter > 1  # so the chain grows past what was tried


def test_free_width_picks_the_widest_and_expensive_width_picks_plain_or_a_chain():
    prof = AcceptanceProfile(0.7)
    free = best_shape(table(0.0), prof, 16)
    assert free.drafter == 16  # width free: every extra slot adds expected tokens at no cost
    costly = best_shape(table(1.0), prof, 16)
    assert (costly.lookup, costly.drafter) == (0, 0)  # a token of width costs a full forward: plain decoding
    mid = best_shape(table(0.1, draft=0.05), prof, 16)
    assert 0 < mid.drafter < 16


@pytest.mark.parametrize("acc", [0.3, 0.6, 0.9])
def test_chosen_k_is_monotone_in_the_width_cost(acc):
    prof = AcceptanceProfile(acc)
    ks = [best_shape(table(c, draft=0.02), prof, 16).drafter for c in (0.0, 0.01, 0.03, 0.1, 0.3, 1.0)]
    assert ks == sorted(ks, reverse=True), ks
    # a dearer draft call may be amortised over more slots, but once drafting stops paying it stays off
    shapes = [best_shape(table(0.05, draft=d), prof, 16) for d in (0.0, 0.1, 0.5, 2.0, 20.0)]
    drafting = [s.drafter > 0 for s in shapes]
    assert drafting == sorted(drafting, reverse=True) and not drafting[-1], drafting
    rates = [s.rate for s in shapes]
    assert rates == sorted(rates, reverse=True)


def test_two_branch_only_when_the_wider_verify_pays():
    lookup, drafter = AcceptanceProfile(0.6), AcceptanceProfile(0.6)
    wide = best_shape(table(0.0), drafter, 4, lookup, 4)
    assert wide.lookup == 4 and wide.drafter == 4
    narrow = best_shape(table(0.3), drafter, 4, lookup, 4)
    assert narrow.lookup == 0 or narrow.drafter == 0


def test_h200_projection_is_bandwidth_bound():
    t = H200_QWEN3_8B.table()
    assert t.verify(17) == pytest.approx(t.verify(1))  # 17 tokens ≪ the ridge point: width is free
    assert 8.19e9 * 2 / 4.3e12 < t.verify(1) < 8.19e9 * 2 / 4.3e12 + 1e-4
    assert projected_speedup(1.0, 0, t, draft_calls=0) == pytest.approx(1.0)
    s = projected_speedup(3.0, 15, t)
    assert s == pytest.approx(3.0 * t.verify(1) / (t.draft_s + t.verify(16)))
    assert 2.0 < s < 3.0


# --- calibration cache ---------------------------------------------------------------------------------
def test_calibration_is_cached_per_fingerprint(tmp_path, monkeypatch):
    from flashmap_ext.bench import calibrate as cost_calibrate
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path))
    target = Target(tiny_qwen3())
    calls = []
    real = cost_calibrate.calibrate
    monkeypatch.setattr(cost_calibrate, "calibrate", lambda *a, **k: calls.append(1) or real(*a, repeats=1, **k))
    first = cost_calibrate.load_or_calibrate(target)
    again = cost_calibrate.load_or_calibrate(target)
    assert len(calls) == 1 and first.verify_s == again.verify_s and set(first.verify_s) == set(cost_calibrate.WIDTHS)
    cost_calibrate.load_or_calibrate(Target(tiny_qwen3(dtype=torch.bfloat16)))  # another dtype: measured again
    assert len(calls) == 2 and len(list((tmp_path / "costs").iterdir())) == 2


# --- AutoDrafter -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


@pytest.mark.parametrize("per_token", [0.0, 0.05, 1.0])
@pytest.mark.parametrize("inner", [None, "oracle", "wrong"])
def test_auto_is_greedy_and_follows_the_costs(model, inner, per_token):
    drafter = {None: None, "oracle": SlotOracle(model), "wrong": SlotOracle(model, rank=None)}[inner]
    auto = AutoDrafter(drafter, table(per_token, draft=0.01), explore_every=4)
    prompt = prompt_of(17) * 2  # repeats: the n-gram lookup has matches
    for _ in range(2):  # the profile learns across calls
        out = generate(model, auto, prompt, 20, tree=auto.tree_spec())
        assert out.tokens == greedy_continuation(model, prompt, 20).tolist()
    if per_token == 1.0:   # width costs a forward per token: no drafting at all
        assert set(auto.choices) == {(0, 0)} and not auto.drafter_enabled
    if per_token == 0.0 and inner == "oracle":
        assert max(k for _, k in auto.choices) == SlotOracle(model).num_draft_tokens
        assert auto.drafter_profile.tried == auto.drafter_profile.accepted != []
    if inner == "wrong" and per_token == 0.05:
        assert auto.drafter_profile.accepted[0] == 0 and auto.drafter_profile.tried[0] > 0


def test_auto_sampling_matches_target_joint_distribution():
    small = tiny_qwen3(vocab_size=V_SMALL, num_layers=3, seed=3)
    filters = dict(temperature=0.9, top_k=6, top_p=0.95)
    from test_speculate import random_flashmap
    auto = AutoDrafter(random_flashmap(small, 3, (0, 1)), table(0.0, draft=0.01), lookup_prior=0.9,
                       drafter_prior=0.9, num_lookup_tokens=3)
    target, prompt = Target(small), [1, 2, 1, 2, 3]

    def run(seed):
        out = generate(target, auto, prompt, 4, seed=seed, tree=auto.tree_spec(), **filters)
        return out.tokens, sum(out.stats.accepted)
    assert_matches_joint(small, prompt, run, 800, filters)
    assert any(l and k for l, k in auto.choices)  # two-branch rounds were taken


def test_auto_explains_itself():
    auto = AutoDrafter(SlotOracle(tiny_qwen3()), table(1.0, draft=0.5))
    assert "no drafter shape can pay" in auto.explain() and "verify 1/2/9/17 tokens 1000/2000/9000/17000 ms" in auto.explain()
    assert math.isfinite(auto.table.plain_s())

