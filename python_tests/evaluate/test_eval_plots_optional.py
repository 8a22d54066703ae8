"""`flashmap eval` and `flashmap eval curve` without matplotlib (a plain `pip install .`, no `[bench]` extra):
the tables are written, the plot is skipped with one line saying why, and the command succeeds."""
import json
import sys

from flashmap_ext import cli
from flashmap_ext.evaluate.report import write_reports
from python_tests.evaluate.test_eval_curve import fixture


def _without_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError


def test_eval_reports_skip_the_plot(tmp_path, monkeypatch, capsys):
    _without_matplotlib(monkeypatch)
    acc = {"anchors": 10, "slot_accuracy": [0.5, 0.25], "gamma": 1.625}
    report = {"meta": {"command": "test", "target": "tiny", "dtype": "fp32", "cpu": "cpu", "bf16_hw": False,
                       "torch_threads": 1, "date": "2026-12-01", "heldout": "mem"},
              "heldout": {"math": {"sequences": 1, "answer_tokens": 11}}, "target_greedy_agreement": 0.5,
              "results": {"A": {"math": acc, "all": acc}}}
    paths = write_reports(report, tmp_path)
    assert [p.name for p in paths] == ["eval.json", "eval.md"] and not (tmp_path / "eval.png").exists()
    assert json.loads(paths[0].read_text())["results"]["A"]["all"]["gamma"] == 1.625
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "eval.png skipped" in err[0] and "pip install '.[bench]'" in err[0]


def test_eval_curve_skips_the_plot_and_succeeds(tmp_path, monkeypatch, capsys):
    path = fixture(tmp_path)
    _without_matplotlib(monkeypatch)
    assert cli.main(["eval", "curve", str(path), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "curve.md").read_text().startswith("| drafter |")
    assert not (tmp_path / "out" / "curve.png").exists()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "curve.png skipped" in err[0] and "'.[bench]'" in err[0]
    assert err[1].endswith("curve.md")  # the files written, the plot not among them


def test_help_says_the_plot_needs_the_bench_extra(capsys):
    for argv in (["eval", "--help"], ["eval", "curve", "--help"]):
        try:
            cli.build_parser().parse_args(argv)
        except SystemExit:
            pass
        assert "pip install '.[bench]'" in " ".join(capsys.readouterr().out.split())
