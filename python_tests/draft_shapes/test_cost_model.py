"""The cost model (cost_model.py), its calibration cache (draft_shapes/calibrate.py) and `AutoDrafter`.

Expected values are worked by hand from the formulas in cost_model's docstring (fake cost tables), or are
plain greedy decoding / the target's exact joint law (loop_helpers) for the auto shapes.
"""
import json
import math
import os

import pytest
import torch
from test_block_trees import SlotOracle

from conftest import tiny_qwen3
from flashmap_ext import Target, generate
from flashmap_ext.draft_shapes.auto import AutoDrafter
from flashmap_ext.draft_shapes.cost_model import (
    H200_QWEN3_8B,
    AcceptanceProfile,
    CostTable,
    best_shape,
    expected_gamma_two,
    projected_speedup,
)
from flashmap_ext.draft_shapes.tree_plan import RankProfile, chain_plan, plan_tokens, reach_by_depth
from support.drafter_doubles import OracleDrafter, greedy_continuation
from support.loop_helpers import V_SMALL, assert_matches_joint, prompt_of


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
    from flashmap_ext.draft_shapes import calibrate as cost_calibrate
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path))
    target = Target(tiny_qwen3())
    calls = []
    real = cost_calibrate.calibrate
    monkeypatch.setattr(cost_calibrate, "calibrate", lambda *a, **k: calls.append(1) or real(*a, repeats=1, **k))
    first = cost_calibrate.load_or_calibrate(target)
    again = cost_calibrate.load_or_calibrate(target)
    assert len(calls) == 1 and first.verify_s == again.verify_s and set(first.verify_s) == set(cost_calibrate.WIDTHS)
    assert first.context == 64 and set(first.verify_context_s) == set(cost_calibrate.SLOPE_WIDTHS)  # and the slope
    assert first == again
    cost_calibrate.load_or_calibrate(Target(tiny_qwen3(dtype=torch.bfloat16)))  # another dtype: measured again
    assert len(calls) == 2 and len(list((tmp_path / "costs").iterdir())) == 2


def test_calibration_takes_a_plain_hf_model_and_refuses_anything_else_naming_target(tmp_path, monkeypatch):
    """load_or_calibrate(plain HF model) raised "AttributeError: 'Qwen3ForCausalLM' object has no attribute
    'new_cache'": it wraps it as `generate` does (the same cached table as its Target's), and names `target`
    for what is neither."""
    from flashmap_ext.draft_shapes import calibrate as cost_calibrate
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path))
    model = tiny_qwen3()
    real = cost_calibrate.calibrate
    monkeypatch.setattr(cost_calibrate, "calibrate", lambda *a, **k: real(*a, repeats=1, **k))
    assert cost_calibrate.load_or_calibrate(model) == cost_calibrate.load_or_calibrate(Target(model))
    assert len(list((tmp_path / "costs").iterdir())) == 1
    with pytest.raises(TypeError, match=r"^target: expected a Target or a Hugging Face causal LM, got"):
        cost_calibrate.load_or_calibrate("qwen")


def test_cached_table_records_its_load_and_a_busier_past_is_noted(tmp_path, monkeypatch, capsys):
    """A table measured on a busy machine was cached for good without a word, and only `bench
    --recalibrate` measured again. The file records the load average; a cached table measured at a much higher
    load than now prints one line; `refresh=True` measures again."""
    from flashmap_ext.draft_shapes import calibrate as cost_calibrate
    monkeypatch.setenv("FLASHMAP_CACHE", str(tmp_path))
    target = Target(tiny_qwen3())
    calls, load = [], [6.0]
    real = cost_calibrate.calibrate
    monkeypatch.setattr(cost_calibrate, "calibrate", lambda *a, **k: calls.append(1) or real(*a, repeats=1, **k))
    monkeypatch.setattr(os, "getloadavg", lambda: (load[0],) * 3)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    cost_calibrate.load_or_calibrate(target)
    (path,) = (tmp_path / "costs").iterdir()
    assert json.loads(path.read_text())["load_average"] == 6.0
    capsys.readouterr()
    for now, noted in ((6.0, False), (5.5, False), (0.5, True)):  # a note from one more busy core on
        load[0] = now
        cost_calibrate.load_or_calibrate(target)
        err = capsys.readouterr().err
        assert len(calls) == 1 and (err != "") == noted, (now, err)
    assert err.count("\n") == 1 and "measured at load average 6.0, now 0.5" in err and "refresh=True" in err
    cost_calibrate.load_or_calibrate(target, refresh=True)  # measured again, at load 0.5
    assert len(calls) == 2 and json.loads(path.read_text())["load_average"] == 0.5
    cost_calibrate.load_or_calibrate(target)
    assert len(calls) == 2 and capsys.readouterr().err == ""


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
    for _ in range(2):  # two requests (the profiles restart from the prior for the second)
        out = generate(model, auto, prompt, 20, tree=auto.tree_spec())
        assert out.tokens == greedy_continuation(model, prompt, 20).tolist()
    prof = auto.drafter_profile
    if per_token == 1.0:   # width costs a forward per token: no drafting at all
        assert set(auto.choices) == {(0, 0)} and not auto.drafter_enabled
    if per_token == 0.0 and inner == "oracle":  # width free: the widest tree the budget allows
        assert max(k for _, k in auto.choices) == auto.tree_nodes == 16
        assert prof.tried == [row[0] for row in prof.hits] != []  # the oracle's argmax is always the target's
    if inner == "wrong" and per_token == 0.05:
        assert all(h == 0 for row in prof.hits for h in row) and prof.tried[0] > 0


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
    assert any(k > 3 for _, k in auto.choices)    # and drafter trees (more nodes than the 3 slots)


def test_auto_explains_itself():
    auto = AutoDrafter(SlotOracle(tiny_qwen3()), table(1.0, draft=0.5))
    assert "no drafter shape can pay" in auto.explain() and "verify 1/2/9/17 tokens 1000/2000/9000/17000 ms" in auto.explain()
    assert math.isfinite(auto.table.plain_s())



# --- trees in the cost model (tree_plan.py) -------------------------------------------------------------
def test_rank_profile_rates_by_hand():
    prof = RankProfile(0.6, topk=3, weight=2.0, rank_decay=0.25)
    assert prof.rates(1)[0] == pytest.approx([0.6, 0.4 * 0.25, 0.4 * 0.0625])
    prof.record([1, None])      # depth 1: the target took rank 1; depth 2: none of the top 3
    first = [(0 + 0.6 * 2) / 3, (1 + 0.1 * 2) / 3, (0 + 0.025 * 2) / 3]
    assert prof.rates(2)[0] == pytest.approx(first)
    assert prof.rates(3)[1] == pytest.approx([p * 2 / 3 for p in first])   # slot 1: prior = slot 0's estimate
    assert prof.rates(3)[2] == pytest.approx(prof.rates(3)[1])             # unexplored: slot 1's estimate
    prof.decay(0.0)
    assert prof.rates(1) == RankProfile(0.6, topk=3, weight=2.0).rates(1)
    with pytest.raises(ValueError, match="topk"):
        RankProfile(0.5, topk=0)


def brute_force_best(rates, depth, b):
    """Every rank path of length <= depth with its probability; the b most likely (the reference)."""
    paths = {(): 1.0}
    for d in range(depth):
        paths |= {p + (r,): q * rates[d][r] for p, q in paths.items() if len(p) == d for r in range(len(rates[d]))}
    del paths[()]
    return sorted(paths.values(), reverse=True)[:b]


@pytest.mark.parametrize("b", [1, 3, 7, 12])
def test_plan_is_the_most_likely_prefix_closed_tree(b):
    prof = RankProfile(0.5, topk=3, weight=1.0)
    for ranks in ([0, 0, 1], [1, 0], [0, 2, 0, 0], [None], [0, 1, 0]):
        prof.record(ranks)
    nodes = prof.plan(4, b)
    assert [n.prob for n in nodes] == pytest.approx(brute_force_best(prof.rates(4), 4, b))
    assert all(n.parent < i and (n.parent < 0 or nodes[n.parent].depth == n.depth - 1) for i, n in enumerate(nodes))
    assert sum(reach_by_depth(nodes, 4)) == pytest.approx(sum(n.prob for n in nodes))


def test_plan_tokens_maps_ranks_and_drops_missing_tokens():
    nodes = chain_plan(2) + [chain_plan(1)[0]._replace(rank=1), chain_plan(3)[2]]
    ranked = [[10, 11], [20, -1], [30]]
    # nodes: (d1 r0), (d2 r0 under 0), (d1 r1), (d3 r0 under node 1)
    assert plan_tokens(nodes, ranked) == [[10], [10, 20], [11], [10, 20, 30]]
    assert plan_tokens([nodes[0], nodes[1]._replace(rank=1), chain_plan(3)[2]], ranked) == [[10]]


def tree_profile(rank0=0.6, rank1=0.25):
    """Slot 0 measured (a million rounds): c(0) ≈ rank0, c(1) ≈ rank1; later slots inherit it."""
    prof = RankProfile(rank0, topk=4, weight=1e6, rank_decay=0.5)
    prof.hits, prof.tried = [[rank0 * 1e6, rank1 * 1e6, 0.05e6, 0.0]], [1e6]   # slot 0 (later slots inherit)
    return prof


def test_free_width_picks_the_widest_tree_and_expensive_width_a_chain():
    prof = tree_profile()
    free = best_shape(table(0.0), prof, 8, max_nodes=24)
    assert free.drafter == 24 and len({n.depth for n in free.plan}) > 1 and any(n.rank for n in free.plan)
    costly = best_shape(table(0.12, draft=0.02), tree_profile(0.8, 0.05), 8, max_nodes=24)
    assert 0 < costly.drafter < 8 and all(n.rank == 0 for n in costly.plan)  # a chain
    assert (best_shape(table(1.0), prof, 8, max_nodes=24).drafter, best_shape(table(1.0), prof, 8).lookup) == (0, 0)


@pytest.mark.parametrize("rank1", [0.05, 0.25, 0.35])
def test_tree_budget_is_monotone_in_the_width_cost(rank1):
    prof, lookup = tree_profile(0.6, rank1), AcceptanceProfile(0.5)
    for lookups in (0, 4):
        shapes = [best_shape(table(c, draft=0.02), prof, 8, lookup, lookups, max_nodes=24)
                  for c in (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3, 1.0)]
        nodes = [s.nodes for s in shapes]
        assert nodes == sorted(nodes, reverse=True) and nodes[0] == 24 + lookups and nodes[-1] == 0, nodes


def test_two_branch_gamma_with_a_tree_by_hand():
    prof = RankProfile(0.5, topk=2, weight=1e9, rank_decay=0.5)   # c(0) = 0.5, c(1) = 0.25 everywhere
    lookup = AcceptanceProfile(0.4, weight=1e9)
    shape = best_shape(table(0.0), prof, 2, lookup, 1, max_nodes=3)
    # tree: r0 (.5), r1 (.25), r0→r0 (.25); lookup: depth 1 .4 → γ = 1 + [1 − .6·.25] + .25
    assert (shape.lookup, shape.drafter) == (1, 3) and shape.gamma == pytest.approx(1 + (1 - 0.6 * 0.25) + 0.25)


# --- AutoDrafter: per-request profiles, trees, chain-only drafters -----------------------------------------
def test_one_request_does_not_steer_the_next(model):
    costs, second = table(0.05, draft=0.01), prompt_of(23) * 2
    used = AutoDrafter(SlotOracle(model), costs)
    generate(model, used, prompt_of(17) * 2, 20, tree=used.tree_spec())  # learns: the oracle is always right
    fresh = AutoDrafter(SlotOracle(model), costs)
    for auto in (used, fresh):
        auto.choices.clear()
        out = generate(model, auto, second, 12, tree=auto.tree_spec())
        assert out.tokens == greedy_continuation(model, second, 12).tolist()
    assert used.choices == fresh.choices and used.drafter_profile.hits == fresh.drafter_profile.hits
    carried = AutoDrafter(SlotOracle(model), costs, carry=1.0)
    generate(model, carried, prompt_of(17) * 2, 20, tree=carried.tree_spec())
    before = carried.drafter_profile.tried[0]
    generate(model, carried, second, 12, tree=carried.tree_spec())
    assert carried.drafter_profile.tried[0] > before > 0   # carry = 1: counts accumulate across requests
    with pytest.raises(ValueError, match="carry"):
        AutoDrafter(None, costs, carry=1.5)


def test_auto_learns_ranks_and_drafts_trees(model):
    """The truth always at rank 1: a chain (rank 0) never gets a token, the learned tree takes whole blocks."""
    auto = AutoDrafter(SlotOracle(model, rank=1), table(0.05, draft=0.01), lookup_prior=0.0, explore_every=2)
    prompt = prompt_of(17)
    out = generate(model, auto, prompt, 30, tree=auto.tree_spec())
    assert out.tokens == greedy_continuation(model, prompt, 30).tolist()
    assert out.stats.accepted[-2] == SlotOracle(model).num_draft_tokens  # the rank-1 path, whole block
    first = auto.drafter_profile.rates(1)[0]
    assert first[1] > 0.5 > first[0]   # learned: rank 1 (prior 0.125) is right, rank 0 (prior 0.5) never is


def test_chain_only_drafters_get_chains(model):
    auto = AutoDrafter(OracleDrafter(model, K_CHAIN), table(0.0, draft=0.01), lookup_prior=0.0)
    assert not auto.ranked and auto.tree_nodes == K_CHAIN and auto.drafter_profile.topk == 1
    prompt = prompt_of(17)
    out = generate(model, auto, prompt, 20, tree=auto.tree_spec())
    assert out.tokens == greedy_continuation(model, prompt, 20).tolist()
    assert max(k for _, k in auto.choices) == K_CHAIN and max(out.stats.accepted) == K_CHAIN


K_CHAIN = 5


# --- context length: verify priced at each round's context ----------------------------------
def context_table(per_context: float) -> CostTable:
    """verify(w, n) = 1 + 0.05 · (w − 1) + per_context · w · n seconds (attention of w new tokens over n
    cached ones), calibrated at n = 0."""
    widths = (1, 2, 3, 5, 9, 17, 33)
    return CostTable({w: 1.0 + 0.05 * (w - 1) for w in widths}, draft_s=0.01, context=0,
                     verify_context_s={w: per_context * w for w in widths})


def test_verify_is_priced_at_the_context_length():
    t = context_table(1e-3)
    assert t.verify(9) == pytest.approx(1.4) and t.verify(9, context=0) == pytest.approx(1.4)
    assert t.verify(9, context=1000) == pytest.approx(1.4 + 9.0)
    assert t.verify(4, context=1000) == pytest.approx(1.15 + 4.0)  # interpolated in width, both terms
    assert t.plain_s(1000) == pytest.approx(2.0) and t.round_s(8, context=1000) == pytest.approx(0.01 + 10.4)
    assert CostTable.from_json(t.to_json()) == t
    with pytest.raises(ValueError, match="verify_context_s"):
        CostTable({1: 1.0}, verify_context_s={1: -1.0})


def test_a_long_context_turns_a_paying_chain_into_plain_decoding():
    """Short context: a chain pays (rate 2.19 / 1.14 s at b = 2 vs 1 / 1.01 s plain). At 5,000 tokens
    verify(1 + b) = 1 + 0.05·b + 5·(1 + b) s: every chain (γ ≤ 1 + b) loses to plain decoding (1 / 6 s)."""
    prof = AcceptanceProfile(0.7)
    t = context_table(1e-3)
    assert best_shape(t, prof, 8, context=10).drafter > 1
    long = best_shape(t, prof, 8, context=5000)
    assert (long.lookup, long.drafter) == (0, 0) and long.seconds == pytest.approx(6.0)
    assert best_shape(t, prof, 8).drafter == best_shape(t, prof, 8, context=0).drafter  # None: calibration context


def test_auto_prices_each_round_at_its_context(model):
    """AutoDrafter.choose reads the memory's context length: the same profile drafts after a short
    context and decodes plainly after a long one."""
    from flashmap_ext.draft_shapes.lookup import LookupMemory
    auto = AutoDrafter(SlotOracle(model), context_table(1e-2), explore_every=0)
    assert auto.drafter_enabled
    short, long = (LookupMemory(auto.new_memory(1, "cpu").inner, list(range(n))) for n in (4, 400))
    assert auto.choose(short, 0, auto.num_draft_tokens).drafter > 0
    assert auto.choose(long, 0, auto.num_draft_tokens).drafter == 0


def test_auto_plans_dflash2_trees_on_its_selector(model):
    """--auto on a DFlash2 drafter: trees follow its selector (a node's rank-r child is the r-th best candidate
    given the node's token, `SelectorRanks`), the output stays the greedy one, and a rank-0 chain is the
    selector's greedy path."""
    from test_block_trees import random_dflash2

    from flashmap_ext.draft_shapes.block_tree import SelectorRanks
    from flashmap_ext.draft_shapes.tree_plan import PlanNode
    d = random_dflash2(model)
    auto = AutoDrafter(d, table(0.0, draft=0.01), lookup_prior=0.0, explore_every=2)
    prompt = prompt_of(17)
    out = generate(model, auto, prompt, 24, tree=auto.tree_spec())
    assert out.tokens == greedy_continuation(model, prompt, 24).tolist()
    assert max(k for _, k in auto.choices) > d.num_draft_tokens  # trees were drafted
    ids = torch.tensor([prompt])
    t = Target(model)
    memory = d.new_memory(1)
    d.extend_memory(memory, ids[:, :16], t.forward(ids[:, :16], t.new_cache(), tap_layer_ids=d.target_layer_ids).taps)
    anchor, pos = ids[0, 16:17], torch.tensor([16])
    ranks = SelectorRanks(d, memory, anchor, pos, d.num_draft_tokens, 3)
    chain = ranks.plan_tokens(chain_plan(d.num_draft_tokens))[-1]
    assert chain == d.draft(memory, anchor, num_tokens=d.num_draft_tokens, position=pos)[0].tolist()
    assert ranks.ranks(chain) == [0] * d.num_draft_tokens
    second = ranks.plan_tokens([PlanNode(-1, 1, 0, 1.0), PlanNode(0, 2, 1, 1.0)])[-1]  # rank 1 under the best first token
    assert second == [chain[0], ranks.ranked(1, chain[0])[1]] and ranks.ranks(second) == [0, 1]
