"""`--cuda-graphs` on `flashmap generate` and `flashmap bench`, on the built-in tiny random target (CPU: the
static target and the round's bookkeeping run eagerly). The reference is the same command without the flag
(at T = 0 plain greedy text, test_generate_cli.py) and the Python API's own refusal of a tree or a batch."""
import pytest

from flashmap_ext import cli
from flashmap_ext.speculate import CUDA_GRAPHS_SHAPES
from support.cli_runs import BASE, run_cli


def one_line_error(argv, capsys) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (code, err)
    return err


@pytest.mark.parametrize("drafter", [[], ["--drafter", "random"], ["--drafter", "random", "--lookup"]])
def test_generate_with_cuda_graphs_prints_the_plain_text(drafter, capsys):
    plain_out, _ = run_cli(BASE, capsys)
    out, err = run_cli(BASE + drafter + ["--cuda-graphs"], capsys)
    assert out == plain_out and "24 tokens" in err and "γ = " in err


@pytest.mark.parametrize("extra, flag", [(["--drafter", "random-eagle3", "--tree", "3,4,8"], "--tree"),
                                         (["--drafter", "random", "--auto"], "--auto")])
def test_generate_refuses_a_tree_before_any_load(extra, flag, monkeypatch, capsys):
    from flashmap_ext.commands import generate

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the arguments were checked")
    monkeypatch.setattr(generate, "load_target", no_load)
    err = one_line_error(BASE + extra + ["--cuda-graphs"], capsys)
    assert f"--cuda-graphs: {CUDA_GRAPHS_SHAPES}: drop {flag}" in err, err


@pytest.mark.parametrize("extra, needle", [(["--batch-size", "2"], "drop --batch-size"),
                                           (["--shapes"], "drop --shapes"), (["--auto"], "drop --auto"),
                                           (["--eagle3", "random-eagle3"], "give --eagle3-tree none")])
def test_bench_refuses_tree_and_batch_rows_before_any_load(extra, needle, monkeypatch, capsys, tmp_path):
    import flashmap_ext.bench.run as bench_run

    def no_run(cfg):
        raise AssertionError("the bench ran before the arguments were checked")
    monkeypatch.setattr(bench_run, "run", no_run)
    err = one_line_error(["bench", "--target", "tiny-random", "--cuda-graphs", "--out", str(tmp_path / "b"), *extra],
                         capsys)
    assert f"--cuda-graphs: {CUDA_GRAPHS_SHAPES}" in err and needle in err, err


def test_bench_passes_cuda_graphs_to_its_rows(monkeypatch, tmp_path):
    """The flag reaches BenchConfig, whose chain rows call generate(..., cuda_graphs=True) (bench/run.py
    decode); the EAGLE-3 chain row alone is allowed with --eagle3-tree none."""
    import flashmap_ext.bench.run as bench_run
    from flashmap_ext.bench.metrics import Method
    from flashmap_ext.request import GenerateOutput, GenerateStats
    seen = []
    monkeypatch.setattr(bench_run, "run", lambda cfg: seen.append(cfg) or {})
    monkeypatch.setattr("flashmap_ext.bench.report.markdown", lambda results: "")
    monkeypatch.setattr("flashmap_ext.bench.machine.set_threads", lambda threads: 1)  # the test's threads stay
    argv = ["bench", "--target", "tiny-random", "--out", str(tmp_path / "b"), "--eagle3", "random-eagle3",
            "--eagle3-tree", "none"]
    assert cli.main(argv + ["--cuda-graphs"]) == 0 and cli.main(argv) == 0
    assert [cfg.cuda_graphs for cfg in seen] == [True, False] and seen[0].eagle3_tree is None
    calls = []
    monkeypatch.setattr(bench_run, "generate", lambda *a, **kw: calls.append(kw) or GenerateOutput([], GenerateStats()))
    bench_run.decode(None, Method("FlashMap-1", object()), [1, 2], seen[0], ())
    assert calls[0]["cuda_graphs"] is True and calls[0]["tree"] is None
