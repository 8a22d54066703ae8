"""`flashmap eval ablation` (evaluate/ablation.py): the Markdown table of an ablation run's arms from their JSON
files."""
import json
import os

import pytest

from flashmap_ext import cli
from flashmap_ext.evaluate import ablation as table


def write_arm(run, arm, kind, flags, gammas, slot1, mtime):
    d = run / arm
    (d / "eval").mkdir(parents=True)
    (d / "arm.json").write_text(json.dumps({"arm": arm, "kind": kind, "flags": flags, "steps": 600,
                                            "train_seconds": 1200, "subset": "x"}))
    res = {dom: {"anchors": 10, "slot_accuracy": [s, s / 2, s / 4, s / 8], "gamma": g}
           for dom, g, s in zip(("math", "code", "chat", "all"), gammas, slot1)}
    (d / "eval" / "eval.json").write_text(json.dumps({"results": {arm: {**res, "draft_vocab_coverage": 0.93}}}))
    os.utime(d / "eval" / "eval.json", (mtime, mtime))


def test_rows_in_run_order_with_delta_gamma_against_the_baseline(tmp_path, capsys):
    write_arm(tmp_path, "dflash", "dflash", "", (1.4, 1.3, 1.5, 1.35), (0.3, 0.2, 0.3, 0.26), 2000)
    write_arm(tmp_path, "flow", "flow", "", (1.3, 1.2, 1.25, 1.25), (0.25, 0.16, 0.2, 0.2), 1000)
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "arm.json").write_text("{}")  # no eval yet: left out
    assert cli.main(["eval", "ablation", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| flow |") and lines[3].startswith("| dflash |")
    assert "| 0.250 / 0.160 / 0.200 | .200 .100 .050 .025 | 1.300 / 1.200 / 1.250 / 1.250 | +0.000 |" in lines[2]
    assert "| +0.100 | 0.930 |" in lines[3] and "| 20.0 |" in lines[3]


def test_no_finished_arm_and_unknown_baseline(tmp_path, capsys):
    assert cli.main(["eval", "ablation", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"flashmap eval ablation: error: {tmp_path}: no finished arm (arm.json + eval/eval.json)\n"
    write_arm(tmp_path, "flow", "flow", "--block-size 5", (1.3, 1.2, 1.25, 1.25), (0.25, 0.16, 0.2, 0.2), 1000)
    with pytest.raises(ValueError, match="--baseline 'dflash'"):
        table.markdown(table.load_arms(tmp_path), "dflash")
    assert "`flow --block-size 5`" in table.markdown(table.load_arms(tmp_path))
