"""`flashmap eval verdict` (evaluate/verdict.py): held-out γ and its interval from `flashmap eval`'s run-length
histograms."""
from __future__ import annotations

import json

import numpy as np

from flashmap_ext import cli
from flashmap_ext.evaluate import verdict as verdict_mod


def judge(run, kind: str) -> int:
    return cli.main(["eval", "verdict", str(run), kind, "ckpt", "--history", "docs/bench/long-run/history.json"])


def entry(runs: list[int]) -> dict:
    """An eval entry for these per-anchor accepted-run lengths (0..8)."""
    hist = np.bincount(runs, minlength=9) / len(runs)
    return {"anchors": len(runs), "run_histogram": hist.tolist()}


def piece_run(tmp_path, monkeypatch, kind: str, piece: dict, committed: dict, record: dict, history: dict):
    """A run directory as recipes/long_run.sh leaves it (eval.json, KIND.piece.json) and a history.json; cwd there."""
    run = tmp_path / "run"
    (run / f"eval-{kind}").mkdir(parents=True)
    meta = {"date": "2026-12-02", "dtype": "bf16", "cpu": "x", "bf16_hw": True}
    (run / f"eval-{kind}" / "eval.json").write_text(
        json.dumps({"meta": meta, "results": {"piece": piece, "committed": committed}}))
    (run / f"{kind}.piece.json").write_text(json.dumps({"kind": kind, **record}))
    (tmp_path / "docs" / "bench" / "long-run").mkdir(parents=True)
    (tmp_path / "docs" / "bench" / "long-run" / "history.json").write_text(json.dumps({kind: history}))
    monkeypatch.chdir(tmp_path)
    return run


def test_gamma_and_variance_match_the_explicit_sample():
    runs = [0, 0, 1, 3, 0, 8, 2, 0, 1, 0, 0, 5]
    gamma, var = verdict_mod.gamma_and_var(entry(runs))
    assert abs(gamma - (1 + np.mean(runs))) < 1e-12
    assert abs(var - np.var(runs) / len(runs)) < 1e-12


def test_verdict_words_and_the_curve_line(tmp_path, monkeypatch):
    low, high = [0] * 80 + [1] * 20, [0] * 40 + [1] * 30 + [2] * 30
    assert verdict_mod.verdict({"all": entry(high)}, {"all": entry(low)})["verdict"] == "beats"
    assert verdict_mod.verdict({"all": entry(low)}, {"all": entry(high)})["verdict"] == "worse"
    assert verdict_mod.verdict({"all": entry(low)}, {"all": entry(low[:-1] + [0])})["verdict"] == "ties"

    result = {d: {**entry(high), "slot_accuracy": [0.6] + [0.3] * 7} for d in ("math", "code", "chat", "all")}
    base = {d: {**entry(low), "slot_accuracy": [0.2] * 8} for d in ("math", "code", "chat", "all")}
    run = piece_run(tmp_path, monkeypatch, "dflash", result, base, {"piece_steps": 500, "wall_s": 1800},
                    {"steps": 3000, "core_hours": 1.0})
    assert judge(run, "dflash") == 0
    line = json.loads((run / "curve-dflash.jsonl").read_text())
    assert (line["cumulative_steps"], line["core_hours"], line["verdict"]) == (3500, 1.5, "beats")
    assert line["slot1"]["all"] == 0.6


def test_a_fresh_student_counts_only_its_own_steps(tmp_path, monkeypatch):
    """The map distilled from a new teacher ("warm_start": false) starts at zero, not at the committed map's."""
    result = {d: {**entry([1] * 10), "slot_accuracy": [0.5] * 8} for d in ("math", "code", "chat", "all")}
    run = piece_run(tmp_path, monkeypatch, "map", result, result,
                    {"piece_steps": 1600, "wall_s": 3600, "warm_start": False}, {"steps": 1200, "core_hours": 0.45})
    assert judge(run, "map") == 0
    line = json.loads((run / "curve-map.jsonl").read_text())
    assert (line["cumulative_steps"], line["core_hours"], line["verdict"]) == (1600, 1.0, "ties")


def test_a_piece_on_a_shared_core_counts_its_cpu_time_not_its_wall_time(tmp_path, monkeypatch):
    """cpu_s (user + sys of the training) is the budget when recorded; wall time stands in only for old pieces."""
    result = {d: {**entry([1] * 10), "slot_accuracy": [0.5] * 8} for d in ("math", "code", "chat", "all")}
    run = piece_run(tmp_path, monkeypatch, "flow", result, result,
                    {"piece_steps": 1000, "wall_s": 3600, "cpu_s": 1800}, {"steps": 7000, "core_hours": 1.25})
    assert judge(run, "flow") == 0
    line = json.loads((run / "curve-flow.jsonl").read_text())
    assert (line["cumulative_steps"], line["core_hours"], line["piece_wall_s"]) == (8000, 1.75, 3600)


def test_a_dflash2_piece_continues_the_dflash_history_and_counts_epochs(tmp_path, monkeypatch):
    """DFlash2 warm-started from the committed DFlash ("history_kind": "dflash") adds to DFlash's steps and
    hours; epochs = steps x batch / sequences (4,000 x 2 / 16,000 = 0.5)."""
    result = {d: {**entry([1] * 10), "slot_accuracy": [0.5] * 8} for d in ("math", "code", "chat", "all")}
    record = {"piece_steps": 4000, "wall_s": 3600, "cpu_s": 3600, "history_kind": "dflash", "batch_size": 2,
              "sequences": 16000}
    run = piece_run(tmp_path, monkeypatch, "dflash2", result, result, record, {})
    (tmp_path / "docs/bench/long-run/history.json").write_text(json.dumps({"dflash": {"steps": 33000,
                                                                                       "core_hours": 5.5}}))
    assert judge(run, "dflash2") == 0
    line = json.loads((run / "curve-dflash2.jsonl").read_text())
    assert (line["cumulative_steps"], line["core_hours"], line["piece_epochs"]) == (37000, 6.5, 0.5)


def test_a_piece_continuing_an_uncommitted_piece_adds_to_that_piece_s_totals(tmp_path, monkeypatch):
    """A piece warm-started from an uncommitted piece that beat (recipes/long_run.sh FROM=) carries that piece's
    cumulative steps and hours as "past"; the committed history (here 1,000 steps) is not added again."""
    result = {d: {**entry([1] * 10), "slot_accuracy": [0.5] * 8} for d in ("math", "code", "chat", "all")}
    record = {"piece_steps": 5000, "wall_s": 1800, "cpu_s": 1800,
              "past": {"steps": 43600, "core_hours": 5.25}}
    run = piece_run(tmp_path, monkeypatch, "flow", result, result, record, {"steps": 1000, "core_hours": 0.1})
    assert judge(run, "flow") == 0
    line = json.loads((run / "curve-flow.jsonl").read_text())
    assert (line["cumulative_steps"], line["core_hours"]) == (48600, 5.75)
