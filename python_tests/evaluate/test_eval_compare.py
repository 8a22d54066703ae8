"""`flashmap eval compare` (evaluate/compare.py): argument refusals before any model loads, pooled γ and the
paired Δγ against sums by hand."""
import pytest

from flashmap_ext import cli
from flashmap_ext.evaluate import compare


@pytest.mark.parametrize("argv, message", [
    (["--drafter", "A=x"], "--drafter: give two or more"),
    (["--drafter", "A", "--drafter", "B=random"], "--drafter 'A': expected NAME=DIR"),
    (["--drafter", "A=random", "--drafter", "B=random", "--pair", "A,C"],
     "--pair 'A,C': expected A,B with A and B among"),
    (["--drafter", "A=x", "--drafter", "B=y", "--per-domain", "1"], "--per-domain: must be >= 2 for compare"),
    (["--drafter", "a=random", "--drafter", "a=random:1"], "--drafter a=random:1: NAME a is already used"),
    (["--drafter", "A=random", "--drafter", "B=no/such/dir"], "--drafter no/such/dir"),
])
def test_bad_arguments_are_refused_in_one_line(argv, message, capsys):
    assert cli.main(["eval", "compare", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"flashmap eval compare: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize("out, says", [("no/x.json", "no folder {tmp}/no; --out is a JSON file path in an existing "
                                                      "folder"),
                                        ("", "a folder; --out is a JSON file path (e.g. {tmp}/delta.json)")])
def test_out_is_checked_before_the_target_loads_as_bench_compare_does(out, says, tmp_path, capsys, monkeypatch):
    """`eval compare --out missing/x.json` printed the whole table, then failed with "[Errno 2] No such file"."""
    import flashmap_ext.target as target_pkg
    monkeypatch.setattr(target_pkg, "load_target", lambda *a, **k: pytest.fail("the target loaded before --out"))
    path = str(tmp_path / out) if out else str(tmp_path)
    argv = ["eval", "compare", "--drafter", "A=random", "--drafter", "B=random", "--out", path]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"flashmap eval compare: error: --out {path}: {says.format(tmp=tmp_path)}\n", err


def test_compare_warns_when_another_model_answered_the_heldout_set(tmp_path, capsys):
    import json
    with open(tmp_path / "h.jsonl", "w") as f:
        for i, domain in enumerate(("math", "math")):
            messages = [{"role": "user", "content": f"question {i}"},
                        {"role": "assistant", "content": "The answer is forty-two, since six times seven is 42."}]
            f.write(json.dumps({"id": f"r{i}", "domain": domain, "messages": messages,
                                "target": "qwen2.5-coder-0.5b-instruct"}) + "\n")
    argv = ["eval", "compare", "--target", "tiny-random", "--heldout", str(tmp_path / "h.jsonl"), "--dtype", "fp32",
            "--per-domain", "2", "--drafter", "A=random", "--drafter", "B=random", "--out", str(tmp_path / "p.json")]
    assert cli.main(argv) == 0  # a warning, not a refusal
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["flashmap eval compare: warning: the --heldout answers were written by "
                        "qwen2.5-coder-0.5b-instruct, a name in neither --target tiny-random nor its config: the scores "
                        "measure drafting another model's answers; answer the held-out prompts with this target "
                        "(flashmap data generate --split heldout --target tiny-random)"], warnings
    assert (tmp_path / "p.json").exists()


def test_pooled_gamma_and_paired_delta_by_hand():
    # sequences: [Σ leading run, anchors]; γ = 1 + Σ run / Σ anchors
    counts = {"A": [[3, 2], [1, 2], [0, 0], [4, 4], [0, 0]], "B": [[1, 2], [1, 2], [0, 0], [2, 4], [0, 0]]}
    assert compare.gamma(counts["A"]) == pytest.approx(1 + 8 / 8)
    assert compare.gamma(counts["B"]) == pytest.approx(1 + 4 / 8)
    assert compare.gamma([]) != compare.gamma([])  # nan without anchors
    pairs = compare.paired_deltas(counts, ["math", "math", "code", "code", "chat"], [("A", "B")])
    lo, hi = pairs["A - B"]["interval"]
    assert pairs["A - B"]["delta"] == pytest.approx(0.5) and lo <= 0.5 <= hi


def test_each_domain_gets_its_own_gamma_and_paired_delta_by_hand():
    counts = {"A": [[3, 2], [1, 2], [4, 4], [2, 4], [5, 1]], "B": [[1, 2], [1, 2], [2, 4], [2, 4], [0, 1]]}
    table = compare.by_domain(counts, ["math", "math", "code", "code", "chat"], [("A", "B")])
    assert list(table) == ["math", "code", "chat"]
    assert table["math"]["gamma"] == {"A": pytest.approx(1 + 4 / 4), "B": pytest.approx(1 + 2 / 4)}
    assert table["code"]["gamma"] == {"A": pytest.approx(1 + 6 / 8), "B": pytest.approx(1 + 4 / 8)}
    assert table["chat"]["gamma"] == {"A": pytest.approx(6.0), "B": pytest.approx(1.0)}
    assert table["code"]["pairs"]["A - B"]["delta"] == pytest.approx(0.25)
    lo, hi = table["math"]["pairs"]["A - B"]["interval"]
    assert lo <= 0.5 <= hi
    assert table["chat"]["pairs"]["A - B"]["interval"] is None  # one sequence: nothing to resample
    lines = compare.domain_markdown(table)
    assert "| code | 1.7500 | 1.5000 |" in lines and "| A - B | code | +0.2500 |" in " ".join(lines)
    assert compare.by_domain(counts, ["math"] * 5, [("A", "B")]) == {}  # one domain: the pooled table says it


def test_one_scored_sequence_per_domain_gives_an_undefined_interval_in_words():
    """One sequence per domain printed the interval [+nan, +nan]: nothing to resample within a domain."""
    counts = {"A": [[3, 2], [4, 4], [0, 0]], "B": [[1, 2], [2, 4], [0, 0]]}
    pairs = compare.paired_deltas(counts, ["math", "code", "code"], [("A", "B")])
    assert pairs["A - B"] == {"delta": pytest.approx((7 - 3) / 6), "interval": None}
    meta = {"sequences": 3, "anchors": 6, "command": "c", "cpu": "cpu", "torch_threads": 1, "dtype": "fp32",
            "load_average": 0, "date": "d"}
    row = next(line for line in compare.markdown(counts, pairs, meta) if line.startswith("| A - B"))
    assert "undefined (one scored sequence per domain)" in row and "nan" not in row


def test_the_footer_counts_each_drafters_anchors_when_they_differ():
    """Drafters of another K are scored on other anchors: the footer names each one's count, the meta's
    "anchors" where it holds them (as `run` writes it), else summed from the per-sequence counts."""
    meta = {"sequences": 2, "command": "c", "cpu": "cpu", "torch_threads": 1, "dtype": "fp32", "load_average": 0,
            "date": "d"}
    same = {"A": [[3, 2], [4, 4]], "B": [[1, 2], [2, 4]]}
    other_k = {"A": [[3, 2], [4, 4]], "B": [[1, 1], [2, 3]]}
    for stored in ({}, {"anchors": {"A": 6, "B": 6}}):
        assert "2 held-out sequences, 6 anchors;" in compare.markdown(same, {}, {**meta, **stored})[-1]
    for stored in ({}, {"anchors": {"A": 6, "B": 4}}):
        assert ("2 held-out sequences, anchors A 6, B 4 (another K, other anchors);"
                in compare.markdown(other_k, {}, {**meta, **stored})[-1])
    # the stored counts are the ones shown (here unlike the per-sequence ones, to tell them apart)
    stored = {**meta, "anchors": {"A": 9, "B": 9}}
    assert "2 held-out sequences, 9 anchors;" in compare.markdown(other_k, {}, stored)[-1]


def test_eval_and_eval_compare_take_the_same_dtypes():
    """eval took fp32/bf16/fp16 but not auto; eval compare auto/fp32/bf16 but not fp16."""
    parser = cli.build_parser()
    for argv in (["eval"], ["eval", "compare", "--drafter", "A=x"]):
        assert parser.parse_args(argv).dtype == "auto"
        for dtype in ("auto", "fp32", "bf16", "fp16"):
            assert parser.parse_args([*argv, "--dtype", dtype]).dtype == dtype
