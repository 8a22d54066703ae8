"""`flashmap bench compare` (bench/compare.py): paired Δγ of two bench rows from results.json, turns merged per
prompt."""
from __future__ import annotations

import json

import numpy as np
import pytest

from flashmap_ext import cli
from flashmap_ext.bench import compare as bench_delta


def compare(argv: list[str]) -> int:
    return cli.main(["bench", "compare", *argv])


def rec(method, dataset, prompt_id, accepted):
    return {"method": method, "dataset": dataset, "prompt_id": prompt_id, "accepted": accepted}


def results():
    rows = [rec("A", "gsm8k", "g1#1", [3, 0, 2]), rec("B", "gsm8k", "g1#1", [1, 1, 1, 0]),
            rec("A", "gsm8k", "g2#1", [0, 0]), rec("B", "gsm8k", "g2#1", [1]),
            rec("A", "mtbench", "m1#1", [4]), rec("A", "mtbench", "m1#2", [1, 1]),
            rec("B", "mtbench", "m1#1", [2, 0]), rec("B", "mtbench", "m1#2", [0]),
            rec("A", "mtbench", "m2#1", [2, 2]), rec("B", "mtbench", "m2#1", [0, 0, 1]),
            rec("AR", "gsm8k", "g1#1", [])]
    return {"methods": ["AR", "A", "B"], "records": rows, "shuffle": {},
            "config": {"temperature": 0.0, "max_new_tokens": 16, "n": 2}, "meta": {"dtype": "fp32"}}


def test_pooled_delta_by_hand_and_turns_merged(monkeypatch):
    from flashmap_ext.bench import interval
    seen = {}
    real = interval.delta_interval
    monkeypatch.setattr(interval, "delta_interval",
                        lambda counts, strata: (seen.setdefault(tuple(strata), counts), real(counts, strata))[1])
    out = bench_delta.pair_delta(results(), "A", "B")
    # by hand: gsm8k A: accepted 5, rounds 5; B: accepted 4, rounds 5 → γ 2.0 vs 1.8
    assert out["gsm8k"]["gamma_a"] == pytest.approx(2.0) and out["gsm8k"]["gamma_b"] == pytest.approx(1.8)
    # mtbench A: accepted 4+2+4 = 10 over 1+2+2 = 5 rounds → 3.0; B: 2+0+1 = 3 over 2+1+3 = 6 → 1.5
    assert out["mtbench"]["delta"] == pytest.approx(1.5) and out["mtbench"]["prompts"] == 2  # m1's two turns: one
    assert out["all datasets"]["delta"] == pytest.approx((15 + 10) / 10 - (7 + 11) / 11)
    # the bootstrap gets one row [A acc, A rounds, B acc, B rounds] per prompt, stratified by dataset
    strata = ("gsm8k", "gsm8k", "mtbench", "mtbench")
    assert seen[strata] == [[5, 3, 3, 4], [0, 2, 1, 1], [6, 3, 2, 3], [4, 2, 1, 3]]
    lo, hi = out["all datasets"]["interval"]
    assert lo <= out["all datasets"]["delta"] <= hi and np.isfinite([lo, hi]).all()


def test_unknown_row_and_bad_pair_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="no row 'FlashMap-2'"):
        bench_delta.pair_delta(results(), "FlashMap-2", "B")
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results()))
    assert compare([str(path), "--pair", "A"]) == 2
    assert capsys.readouterr().err == "flashmap bench compare: error: --pair 'A': expected A,B (two bench row names)\n"
    assert compare([str(path), "--pair", "A,B", "--out", str(tmp_path / "d.json")]) == 0
    assert json.loads((tmp_path / "d.json").read_text())["A - B"]["gsm8k"]["prompts"] == 2


def split_by_dataset(res):
    return [{**res, "records": [r for r in res["records"] if r["dataset"] == d]} for d in ("gsm8k", "mtbench")]


def test_two_runs_of_one_dataset_each_pool_to_the_single_run(tmp_path):
    """One set per core, then pooled: the same Δγ (and interval seed) as the one run holding both."""
    files = []
    for i, part in enumerate(split_by_dataset(results())):
        files.append(tmp_path / f"r{i}.json")
        files[-1].write_text(json.dumps(part))
    assert compare([*map(str, files), "--pair", "A,B", "--out", str(tmp_path / "pooled.json")]) == 0
    one = tmp_path / "one.json"
    one.write_text(json.dumps(results()))
    assert compare([str(one), "--pair", "A,B", "--out", str(tmp_path / "single.json")]) == 0
    assert json.loads((tmp_path / "pooled.json").read_text()) == json.loads((tmp_path / "single.json").read_text())


def test_runs_of_one_drafter_each_pool_to_the_single_run(tmp_path):
    """One drafter per core over the same prompts: AR (in both) is kept once, Δγ equals the single run's."""
    res = results()
    a = {**res, "records": [r for r in res["records"] if r["method"] in ("A", "AR")]}
    b = {**res, "records": [r for r in res["records"] if r["method"] in ("B", "AR")]}
    pooled = bench_delta.merge([a, b], ["a.json", "b.json"])
    assert sorted(map(str, pooled["records"])) == sorted(map(str, res["records"]))
    assert bench_delta.pair_delta(pooled, "A", "B") == bench_delta.pair_delta(res, "A", "B")


@pytest.mark.parametrize("change, needle", [({"temperature": 1.0}, "temperature 1.0 differs"),
                                            ({"target": "tiny-random"}, "target tiny-random differs"),
                                            ({"n": 8}, r"n, spread \(8, False\) differ from a.json's \(2, False\)"),
                                            ({"spread": True}, r"n, spread \(2, True\) differ from a.json's"),
                                            (None, "A on gsm8k is in a.json too")])
def test_runs_that_do_not_pool_are_refused(change, needle):
    a, b = split_by_dataset(results())
    if change is None:
        b = a
    else:
        if {"n", "spread"} & change.keys():  # compared among the runs of one dataset: the other holds B on gsm8k
            a, b = ({**a, "records": [r for r in a["records"] if (r["method"] == "B") == keep]}
                    for keep in (False, True))
        b = {**b, "config": {**b["config"], **change}}
    with pytest.raises(ValueError, match=needle):
        bench_delta.merge([a, b], ["a.json", "b.json"])


def test_runs_of_other_datasets_pool_at_other_prompt_counts():
    """A two-turn set run at half the prompts (as many answers) pools with the others' runs."""
    a, b = split_by_dataset(results())
    b = {**b, "config": {**b["config"], "n": 1}}
    pooled = bench_delta.merge([a, b], ["a.json", "b.json"])
    assert bench_delta.pair_delta(pooled, "A", "B") == bench_delta.pair_delta(results(), "A", "B")


def test_what_is_not_a_results_file_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(results()))
    (tmp_path / "notes.md").write_text("# not json\n")
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    for bad, needle in ((tmp_path, "a folder"), (tmp_path / "notes.md", "notes.md: not a `flashmap bench`"),
                        (tmp_path / "other.json", "other.json: not a `flashmap bench`")):
        capsys.readouterr()
        assert compare([str(good), str(bad), "--pair", "A,B"]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err


def test_rows_of_one_name_from_two_checkpoints_are_refused():
    """Two runs, one set each, whose "FlashMap-1" rows come from different --drafter checkpoints: pooled, the
    row's Δγ would mix two drafters; the same checkpoint (and rows of other drafters) still pools."""
    res = results()
    res["records"] = [{**r, "method": {"A": "FlashMap-1", "B": "DFlash"}.get(r["method"], r["method"])}
                      for r in res["records"]]
    res["methods"] = ["AR", "FlashMap-1", "DFlash"]
    a, b = split_by_dataset(res)
    a, b = ({**p, "config": {**p["config"], "drafter": d, "dflash": "runs/dflash"}} for p, d in
            ((a, "runs/flow-4-layers"), (b, "runs/flow-2-layers")))
    with pytest.raises(ValueError, match="b.json: its 'FlashMap-1' rows come from --drafter runs/flow-2-layers, "
                                         "a.json's from runs/flow-4-layers"):
        bench_delta.merge([a, b], ["a.json", "b.json"])
    b = {**b, "config": {**b["config"], "drafter": "runs/flow-4-layers"}}
    assert bench_delta.pair_delta(bench_delta.merge([a, b], ["a.json", "b.json"]), "FlashMap-1", "DFlash") \
        == bench_delta.pair_delta(res, "FlashMap-1", "DFlash")


def test_rows_table_pools_each_row_by_hand(tmp_path, capsys):
    """--rows: pooled γ per set and over all sets (counts summed by hand), the projected speedup and lossless
    check of each part kept under its row; without --pair only that table."""
    a, b = split_by_dataset(results())
    a["datasets"] = {"gsm8k": {"A": {"identical": "yes"}, "B": {"identical": "yes"}}}
    b["datasets"] = {"mtbench": {"A": {"identical": "yes"}, "B": {"identical": "no (1 of 2)"}}}
    a["projected_h200"], b["projected_h200"] = {"A": {"gsm8k": 1.5}}, {"A": {"mtbench": 2.25}}
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for f, part in zip(files, (a, b)):
        f.write_text(json.dumps(part))
    assert compare([*map(str, files), "--rows"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("| row | gsm8k | mtbench | all datasets | projected H200 speedup gsm8k / mtbench | "
                        "identical to AR |")
    # A: gsm8k 5 accepted / 5 rounds; mtbench 10 / 5; all 15 / 10.  B: 4 / 5; 3 / 6; 7 / 11
    assert lines[2] == "| A | 2.000 | 3.000 | 2.500 | 1.50× / 2.25× | yes |"
    assert lines[3] == f"| B | 1.800 | 1.500 | {18 / 11:.3f} | – / – | no (1 of 2), yes |"
    assert len(lines) == 4
    assert compare([*map(str, files), "--rows", "--pair", "A,B"]) == 0
    assert "| A − B | gsm8k | 2.000 | 1.800 | +0.200 |" in capsys.readouterr().out


def test_rows_table_of_rows_on_different_sets_has_no_all_datasets_gamma(tmp_path, capsys):
    """--rows where B ran on gsm8k only and A on gsm8k and mtbench: side by side, their "all datasets" γ would be
    means over different prompts, so that column reads n/a and a footnote names the sets; the per-set cells and a
    row without γ (HF greedy) are as before."""
    res = results()
    res["records"] = [r for r in res["records"] if not (r["method"] == "B" and r["dataset"] == "mtbench")]
    res["records"].append(rec("HF greedy", "gsm8k", "g1#1", []))
    res["methods"].append("HF greedy")
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    assert compare([str(path), "--rows"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == ["| A | 2.000 | 3.000 | n/a | – / – | – |", "| B | 1.800 | – | n/a | – / – | – |",
                         "| HF greedy | – | – | – | – / – | – |", "",
                         "all datasets n/a: the rows were measured on different dataset sets (A on gsm8k, mtbench; "
                         "B on gsm8k), so their pooled γ would average different prompts; compare them per dataset"]


def test_rows_table_matches_what_bench_measured():
    """On the committed comparison runs, each row's γ per set equals the γ `flashmap bench` wrote at run time."""
    from pathlib import Path

    from flashmap_ext.bench.row_table import row_gammas
    files = sorted(Path(__file__).parents[2].glob("docs/bench/compare/T0/*/results.json"))
    assert files, "docs/bench/compare/T0 has no results"
    parts = [json.loads(f.read_text()) for f in files]
    pooled = bench_delta.merge(parts, [str(f) for f in files])
    checked = 0
    for part in parts:
        for dataset, rows in part["datasets"].items():
            for method, row in rows.items():
                if method != "AR":
                    assert row_gammas(pooled, method)[dataset] == pytest.approx(row["gamma"], rel=1e-12)
                    checked += 1
    assert checked == 27


def test_shuffle_rows_of_every_run_are_kept_and_a_missing_file_is_named(tmp_path, capsys, monkeypatch):
    """Two runs of one set, one drafter each, each with its shuffle row: pooled, only the last file's row was
    printed (the section was keyed by dataset alone). A missing file was Python's bare "[Errno 2]"."""
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    row = {"shared": 2.0, "per_slot": 1.5, "delta": 0.5, "interval": [0.1, 0.9], "prompts": 2}
    res = results()
    a = {**res, "records": [r for r in res["records"] if r["method"] in ("A", "AR")],
         "shuffle": {"gsm8k": {"A": row}}}
    b = {**res, "records": [r for r in res["records"] if r["method"] == "B"],
         "shuffle": {"gsm8k": {"B": {**row, "shared": 1.75}}}}
    assert bench_delta.merge([a, b], ["a", "b"])["shuffle"] == {"gsm8k": {"A": row, "B": {**row, "shared": 1.75}}}
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for f, part in zip(files, (a, b)):
        f.write_text(json.dumps(part))
    assert compare([*map(str, files), "--pair", "A,B"]) == 0
    out = capsys.readouterr().out
    assert "| A shared − per-slot noise | gsm8k | 2.000 |" in out and "| B shared − per-slot noise | gsm8k | 1.750 |" in out
    assert compare([str(files[0]), str(tmp_path / "nope.json"), "--pair", "A,B"]) == 2
    err = capsys.readouterr().err
    assert "nope.json: no such file" in err and err.count("\n") == 1, err


def test_rows_without_gamma_or_shared_prompts_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """A peer row (no drafting rounds) in --pair, and two rows over different sets, were a ZeroDivisionError."""
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    res = results()
    res["methods"].append("HF greedy")
    res["records"] += [rec("HF greedy", "gsm8k", "g1#1", []), rec("C", "mtbench", "m1#1", [1])]
    res["records"] = [r for r in res["records"] if not (r["method"] == "A" and r["dataset"] == "mtbench")]
    res["methods"].append("C")
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    assert compare([str(path), "--pair", "A,HF greedy"]) == 2
    err = capsys.readouterr().err
    assert err == ("flashmap bench compare: error: --pair A,HF greedy: row 'HF greedy' has no γ (no drafting rounds: AR and "
                   "the peer rows such as HF greedy and prompt lookup draft nothing)\n")
    assert compare([str(path), "--pair", "A,C"]) == 2  # A only on gsm8k, C only on mtbench
    err = capsys.readouterr().err
    assert err == ("flashmap bench compare: error: --pair A,C: rows 'A' and 'C' share no (dataset, prompt) with rounds in "
                   "both, so there is nothing to pair\n")


def test_runs_of_one_dataset_name_from_two_prompt_files_are_refused():
    a, b = split_by_dataset(results())
    b = {**a, "records": [r for r in a["records"] if r["method"] == "B"],
         "config": {**a["config"], "datasets": ["gsm8k=/tmp/p2.jsonl"]}}
    a = {**a, "records": [r for r in a["records"] if r["method"] != "B"],
         "config": {**a["config"], "datasets": ["gsm8k=/tmp/p1.jsonl"]}}
    with pytest.raises(ValueError, match="b.json: dataset gsm8k=/tmp/p2.jsonl differs from a.json's "
                                         "gsm8k=/tmp/p1.jsonl: only runs of the same prompts pool"):
        bench_delta.merge([a, b], ["a.json", "b.json"])
    b["config"]["datasets"] = ["gsm8k=/tmp/p1.jsonl"]
    assert bench_delta.pair_delta(bench_delta.merge([a, b], ["a.json", "b.json"]), "A", "B")["gsm8k"]["prompts"] == 2


def test_out_that_cannot_be_a_json_file_is_refused_before_any_output(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results()))
    for out, err in ((tmp_path, f"--out {tmp_path}: a folder; --out is a JSON file path (e.g. {tmp_path}/delta.json)"),
                     (tmp_path / "no" / "d.json",
                      f"--out {tmp_path}/no/d.json: no folder {tmp_path}/no; --out is a JSON file path in an existing "
                      "folder")):
        assert compare([str(path), "--pair", "A,B", "--out", str(out)]) == 2
        assert capsys.readouterr() == ("", f"flashmap bench compare: error: {err}\n")


def test_missing_default_pair_row_names_the_default_not_the_option(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results()))
    assert compare([str(path)]) == 2
    assert capsys.readouterr().err == ("flashmap bench compare: error: no row 'FlashMap-2' for the default pair "
                                       "FlashMap-2,FlashMap-1 (rows: AR, A, B): give --pair A,B, or --rows for "
                                       "every row's γ\n")


def test_ar_and_a_row_paired_with_itself_are_refused(tmp_path, capsys, monkeypatch):
    """AR's records count its one-token steps as rounds of 0 accepted; --pair A,AR printed a Δγ against 1."""
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    res = results()
    res["records"][-1] = rec("AR", "gsm8k", "g1#1", [0, 0, 0, 0])
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    assert compare([str(path), "--pair", "A,AR"]) == 2
    assert capsys.readouterr().err == ("flashmap bench compare: error: --pair A,AR: row 'AR' has no γ (no drafting rounds: "
                                       "AR and the peer rows such as HF greedy and prompt lookup draft nothing)\n")
    assert compare([str(path), "--pair", "B,B"]) == 2
    assert capsys.readouterr().err == ("flashmap bench compare: error: --pair B,B: a row paired with itself (Δγ is 0 by "
                                       "construction): name two rows\n")


def test_by_category_splits_a_set_by_hand_and_needs_categories(tmp_path, capsys):
    res = results()
    cats = {"m1": "writing", "m2": "math"}
    for r in res["records"]:
        r["category"] = cats.get(r["prompt_id"].split("#")[0], "")
    out = bench_delta.pair_delta(res, "A", "B", by_category=True)
    # by hand: m1 (writing, two turns merged) A: accepted 4+2 = 6 over 3 rounds → 3.0; B: 2 over 3 → 5/3
    assert out["mtbench / writing"]["delta"] == pytest.approx(3.0 - 5 / 3)
    assert out["mtbench / writing"]["prompts"] == 1 and out["mtbench / writing"]["interval"] is None
    # m2 (math) A: 4 over 2 → 3.0; B: 1 over 3 → 4/3; gsm8k has no category: no extra entry
    assert out["mtbench / math"]["gamma_b"] == pytest.approx(4 / 3)
    assert [k for k in out if "/" in k] == ["mtbench / writing", "mtbench / math"]
    plain = bench_delta.pair_delta(res, "A", "B")
    assert {k: out[k] for k in plain} == plain  # the dataset rows are unchanged by the split
    with pytest.raises(ValueError, match="--by-category: no record"):
        bench_delta.pair_delta(results(), "A", "B", by_category=True)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    assert compare([str(path), "--pair", "A,B", "--by-category"]) == 0
    assert "| A − B | mtbench / writing | 3.000 | 1.667 | +1.333 | — (one prompt) | 1 |" in capsys.readouterr().out
    assert compare([str(path), "--rows", "--by-category"]) == 2
    assert "--by-category splits the --pair and --gamma tables" in capsys.readouterr().err


def test_partial_files_are_named_above_the_table(tmp_path, capsys):
    """compare read an interrupted bench's results.json as if complete: its header gave the --n asked for."""
    res = results()
    res["partial"] = {"datasets_left": [], "shuffle_test": "off",
                      "in_progress": {"dataset": "mtbench", "prompts_done": 2, "prompts": 5}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    assert compare([str(path), "--pair", "A,B"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"**partial**: {path} (mtbench: 2 of 5 prompts; still to run: none)"


def test_gamma_interval_matches_a_float64_bootstrap_loop_and_constant_rows(tmp_path, capsys):
    """A row's own γ: pooled by hand, its interval equal to a direct percentile bootstrap of the pooled ratio
    (prompts drawn with replacement within each dataset, numpy PCG64 seeded 0, 10,000 resamples)."""
    res = results()
    out = bench_delta.gamma_table(res, "A")
    assert out["gsm8k"]["gamma"] == pytest.approx(2.0) and out["mtbench"]["gamma"] == pytest.approx(3.0)
    # the reference: per prompt [accepted, rounds] of A (turns merged), strata in np.unique order
    counts = {"gsm8k": np.array([[5.0, 3], [0, 2]]), "mtbench": np.array([[6.0, 3], [4, 2]])}
    rng, sums = np.random.default_rng(0), np.zeros((10_000, 2))
    for name in sorted(counts):
        rows = counts[name]
        for i, draw in enumerate(rng.integers(0, len(rows), size=(10_000, len(rows)))):
            sums[i] += rows[draw].sum(axis=0)
    gamma = (sums[:, 0] + sums[:, 1]) / sums[:, 1]
    assert out["all datasets"]["interval"] == pytest.approx(list(np.quantile(gamma, [0.025, 0.975])), abs=1e-12)
    # every prompt of a row with the same γ: the interval is that γ
    flat = {**res, "records": [rec("C", "gsm8k", f"g{i}#1", [1, 1]) for i in range(4)], "methods": ["C"]}
    assert bench_delta.gamma_table(flat, "C")["gsm8k"]["interval"] == pytest.approx([2.0, 2.0])
    with pytest.raises(ValueError, match="--gamma: no drafter row 'AR'"):
        bench_delta.gamma_table(res, "AR")
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    assert compare([str(path), "--gamma", "B"]) == 0
    assert "| B | gsm8k | 1.800 |" in capsys.readouterr().out
