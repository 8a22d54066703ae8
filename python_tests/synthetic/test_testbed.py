"""The testbed's scoring and command line: a drafter that drafts the ideal drafts scores the exact ceilings; bad
options are refused in one line naming the flag."""
from __future__ import annotations

import pytest

from flashmap_ext.cli import main
from flashmap_ext.evaluate.heldout import anchors
from flashmap_ext.synthetic.ceilings import argmax, greedy_chain, marginals
from flashmap_ext.synthetic.language import Language, LanguageSpec, Parser
from flashmap_ext.synthetic.report import markdown
from flashmap_ext.synthetic.testbed import (
    ceiling_tallies,
    gamma_interval,
    heldout_sequences,
    paired_delta,
    score_drafts,
)

K = 4


@pytest.fixture(scope="module")
def world():
    lang = Language(LanguageSpec(body=24))
    seqs = heldout_sequences(lang, 6, seed=9)
    return lang, seqs, ceiling_tallies(lang, seqs, K, 3)


def ideal_drafts(lang, seqs, rule) -> dict:
    out = {}
    for i, s in enumerate(seqs):
        parser = Parser(lang, s.input_ids)
        for a in anchors(s, K, 3):
            out[i, a] = rule(parser, parser.states[a])
    return out


def test_ideal_drafts_score_the_ceilings(world):
    lang, seqs, ceilings = world
    greedy = score_drafts(lang, seqs, ideal_drafts(lang, seqs, lambda p, s: greedy_chain(p, s, K)), K)
    indep = score_drafts(lang, seqs, ideal_drafts(lang, seqs, lambda p, s: [argmax(m) for m in marginals(p, s, K)]), K)
    for kind in ("all", "bimodal", "forced"):
        assert greedy.gamma(kind, 0) == pytest.approx(1 + K)
        assert greedy.gamma(kind, 1) == pytest.approx(ceilings["joint_greedy"].gamma(kind, 1), rel=1e-12)
        for t in (0, 1):
            assert indep.gamma(kind, t) == pytest.approx(ceilings["independent_argmax"].gamma(kind, t), rel=1e-12)
    assert greedy.slot_rates("all", 0) == pytest.approx([1.0] * K)
    low, high = gamma_interval(indep, "all", 1)
    assert low <= indep.gamma("all", 1) <= high
    delta, (lo, hi) = paired_delta(greedy, indep, "all", 0)
    assert delta > 0 and lo <= delta <= hi


def test_a_drafter_pairs_with_a_ceiling_on_the_same_anchors(world):
    """measure() reports FlashMap-1 minus the ideal independent drafters as paired deltas (claim (i)): a
    drafter drafting exactly the per-slot argmax differs from that ceiling by 0, and from the joint by < 0."""
    lang, seqs, ceilings = world
    indep = score_drafts(lang, seqs, ideal_drafts(lang, seqs, lambda p, s: [argmax(m) for m in marginals(p, s, K)]), K)
    delta, (lo, hi) = paired_delta(indep, ceilings["independent_argmax"], "all", 1)
    assert (delta, lo, hi) == pytest.approx((0, 0, 0), abs=1e-12)
    delta, _ = paired_delta(indep, ceilings["joint_greedy"], "all", 0)
    assert delta < 0
    row = {f"{kind}/t{t}": {"gamma": 1.0, "interval": None} for kind in ("all", "bimodal", "forced", "free")
           for t in (0, 1)}
    row["slots_t1"] = [0.5] * K
    text = markdown({"prompts": 1, "anchors": 1, "options": {"block_size": K},
                     "target": {"model_entropy": 1.0, "true_entropy": 1.0}, "rows": {"x": row}, "ceilings": {},
                     "deltas": {"x - independent_sampled": {"all/t0": (0.5, None), "all/t1": (0.5, None),
                                                            "bimodal/t1": (0.5, None)}},
                     "shuffle": {}, "diversity": {}, "curves": {}, "parameters": {}})
    assert "| x - ideal independent, sampled per slot | +0.500 |" in text


@pytest.mark.parametrize("argv, flag", [
    (["--block-size", "9"], "--block-size"), (["--steps", "0"], "--steps"), (["--prompts", "-1"], "--prompts"),
    (["--bogus", "1"], "--bogus"), (["--data", "beam"], "--data"), (["--drafters", "map,dflash"], "--drafters"),
    (["--drafters", "flow,medusa"], "--drafters"), (["--mode-draws", "0"], "--mode-draws"),
    (["--trees", "0"], "--trees"), (["--trees", "16,x"], "--trees"), (["--trees", "16,16"], "--trees"),
    (["--trees", ""], "--trees")])
def test_bad_options_are_refused_naming_the_flag(argv, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        main(["testbed", "run", "--out", str(tmp_path), *argv])
    assert err.value.code == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and flag in message
    assert not any(tmp_path.iterdir())  # refused before any work


def test_trees_smaller_than_the_block_are_refused_before_any_work(capsys, tmp_path):
    """A tree of N nodes is at most N deep: N < K (--block-size) is refused in one line naming --trees."""
    assert main(["testbed", "run", "--out", str(tmp_path / "run"), "--block-size", "8", "--trees", "16,4"]) == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "--trees" in message and "got 4" in message
    assert not any(tmp_path.iterdir())


def test_the_flattening_rule_compares_the_last_doubling_of_steps():
    from flashmap_ext.synthetic.measure import flattened
    steps = [250, 500, 750, 1000, 1500, 2000]
    assert flattened(steps, [1.0, 2.0, 2.5, 2.90, 2.95, 2.91])  # 2000 vs 1000: +0.01
    assert not flattened(steps, [1.0, 2.0, 2.5, 2.85, 2.95, 2.90])  # +0.05, though the last step fell
    assert not flattened(steps, [1.0, 2.0, 2.5, 2.95, 2.90, 2.60])  # a fall counts too
    assert not flattened([300, 400], [2.0, 2.0])  # no doubling on the curve
    assert not flattened([], [])


def test_a_rerun_with_other_build_flags_is_refused_not_silently_reused(tmp_path):
    """A rerun on the same --out skips its finished stages: with another --steps it used to report the new value
    beside drafters trained with the old one."""
    from flashmap_ext.synthetic.pipeline import BUILD_OPTIONS, check_build_options
    opts = {"target_steps": 40, "train_sequences": 64, "data": "sampled", "block_size": 8, "steps": 40,
            "curve_points": 1, "seed": 0, "prompts": 6, "trees": (16, 32)}
    assert set(BUILD_OPTIONS) <= set(opts)
    check_build_options(tmp_path, opts)
    check_build_options(tmp_path, {**opts, "prompts": 40, "trees": ()})  # measurement flags may change
    with pytest.raises(ValueError, match=r"--train-sequences 64 \(asked: 128\), --steps 40 \(asked: 80\)"):
        check_build_options(tmp_path, {**opts, "steps": 80, "train_sequences": 128})
