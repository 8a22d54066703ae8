"""`flashmap eval` on a tiny random target: held-out answers with nothing to score are refused or reported as
such (never NaN, eval.json stays strict JSON), and answers another model wrote are pointed out on stderr."""
import json

import pytest
import torch

from flashmap_ext import cli
from flashmap_ext.target import load_target

LONG = "The answer is forty-two, since six times seven is forty-two."


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    target, _ = load_target("tiny-random", "fp32", "cpu")
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("fm")
    FlashMapDrafter.for_target(target, n_layers=1, width=32, heads=2, block_size=4).save_pretrained(folder)
    return folder


def heldout(path, answers: dict, **fields) -> str:
    """A held-out jsonl: one record per domain, its answer `answers[domain]`, plus `fields` on every record."""
    with open(path, "w") as f:
        for i, (domain, answer) in enumerate(answers.items()):
            messages = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"id": f"r{i}", "domain": domain, "messages": messages, **fields}) + "\n")
    return str(path)


def run_eval(drafter_dir, data, out, *extra):
    return cli.main(["eval", "--target", "tiny-random", "--heldout", data, "--drafter", f"fm={drafter_dir}",
                     "--dtype", "fp32", "--threads", "1", "--out", str(out), *extra])


def strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"eval.json holds {name}: not strict JSON")
    return json.loads(text, parse_constant=refuse)


def test_eval_refuses_in_one_line_when_no_anchor_is_left(drafter_dir, tmp_path, capsys):
    """--max-length cut off every answer: "γ nan" for every drafter, exit 0 and bare NaN in eval.json."""
    data = heldout(tmp_path / "h.jsonl", {"math": LONG, "code": LONG}, target="tiny-random")
    assert run_eval(drafter_dir, data, tmp_path / "out", "--max-length", "16") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("flashmap eval: error: --max-length: no anchor left to score")
    assert not (tmp_path / "out" / "eval.json").exists()


def test_a_domain_without_anchors_says_so_and_eval_json_stays_strict(drafter_dir, tmp_path, capsys):
    data = heldout(tmp_path / "h.jsonl", {"math": LONG, "chat": "ok"}, target="tiny-random")
    assert run_eval(drafter_dir, data, tmp_path / "out") == 0
    report = strict_json((tmp_path / "out" / "eval.json").read_text())
    chat, math = report["results"]["fm"]["chat"], report["results"]["fm"]["math"]
    assert chat["anchors"] == 0 and chat["gamma"] is None and chat["slot_accuracy"] == [None] * 4
    # the default --slots 8 above the drafter's 4 draft tokens: eval.json records the 4 slots scored, not 8
    assert report["meta"]["slots"] == 4 and report["drafters"]["fm"]["slots"] == 4
    assert math["anchors"] > 0 and 1.0 <= math["gamma"] <= 5.0
    row = next(line for line in (tmp_path / "out" / "eval.md").read_text().splitlines() if "| chat |" in line)
    assert "no anchors" in row and "nan" not in row
    assert "warning" not in capsys.readouterr().err  # the records name this target as their answering model


@pytest.mark.parametrize("fields, says", [
    ({"target": "qwen2.5-coder-0.5b-instruct"},
     "answers were written by qwen2.5-coder-0.5b-instruct, a name in neither --target tiny-random nor its config"),
    ({}, "name no answering model and the target's greedy agrees with them at only 0."),
])
def test_eval_warns_when_another_model_answered_the_heldout_set(drafter_dir, tmp_path, capsys, fields, says):
    """Scoring qwen2.5-coder-0.5b-instruct's answers on tiny-random only said "greedy agrees at 0.0000"."""
    data = heldout(tmp_path / "h.jsonl", {"math": LONG}, **fields)
    assert run_eval(drafter_dir, data, tmp_path / "out") == 0  # a warning, not a refusal
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and says in warnings[0], warnings
    if fields:  # a named model is pointed out before anything is scored
        assert err.index(warnings[0]) < err.index("eval fm: γ"), err


def test_the_answering_model_counts_as_the_target_when_named_in_the_spec_or_the_config():
    """The records' model name, case-insensitively, in --target or the loaded config's _name_or_path: no warning
    (a local copy of the model can live at any path); in neither: named in the warning."""
    from types import SimpleNamespace

    from flashmap_ext.evaluate.heldout import HeldoutSequence
    from flashmap_ext.evaluate.run import answering_models_unlike

    def target(name_or_path):
        return SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(_name_or_path=name_or_path)))
    seqs = [HeldoutSequence("math", "r0", [1, 2], [0, 1], answered_by="qwen2.5-coder-0.5b-instruct"),
            HeldoutSequence("code", "r1", [1, 2], [0, 1], answered_by=None)]
    for spec, path in (("Qwen/Qwen2.5-Coder-0.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct"),
                       ("qwen2.5-coder-0.5b", "/cache/models/qwen2.5-coder-0.5b-instruct/hf"),
                       ("/models/mine", "/models/QWEN2.5-CODER-0.5B-INSTRUCT")):
        assert answering_models_unlike(seqs, spec, target(path)) == [], spec
    assert answering_models_unlike(seqs, "tiny-random", target("")) == ["qwen2.5-coder-0.5b-instruct"]


def test_eval_checks_out_before_the_target_loads(tmp_path, capsys, monkeypatch):
    """`eval --out FILE` evaluated every drafter, then said only "[Errno 17] File exists"."""
    import flashmap_ext.target as target_pkg
    monkeypatch.setattr(target_pkg, "load_target", lambda *a, **k: pytest.fail("the target loaded before --out"))
    data = heldout(tmp_path / "h.jsonl", {"math": LONG}, target="tiny-random")
    (tmp_path / "file").write_text("x")
    assert run_eval("random", data, tmp_path / "file") == 2
    err = capsys.readouterr().err
    assert err == f"flashmap eval: error: --out {tmp_path / 'file'}: a file is there (expected a folder)\n", err


def test_eval_echoes_each_drafter_spec_as_given(drafter_dir, tmp_path, capsys):
    from flashmap_ext.drafters.dflash import DFlashDrafter
    target, _ = load_target("tiny-random", "fp32", "cpu")
    DFlashDrafter.for_target(target, mask_token_id=0, num_hidden_layers=1, block_size=4,
                             target_layer_ids=[0, 1]).save_pretrained(tmp_path / "df")
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    FlashMapDrafter.for_target(target, n_layers=1, width=32, heads=2, block_size=4,
                               tau_gated_input=True).save_pretrained(tmp_path / "gated")
    data = heldout(tmp_path / "h.jsonl", {"math": LONG}, target="tiny-random")

    def run(*specs):
        argv = ["eval", "--target", "tiny-random", "--heldout", data, "--dtype", "fp32", "--threads", "1",
                "--out", str(tmp_path / "out")]
        return cli.main([*argv, *(x for s in specs for x in ("--drafter", s))])
    assert run(f"fm={drafter_dir}:1x1") == 0
    assert json.loads((tmp_path / "out" / "eval.json").read_text())["drafters"]["fm"]["spec"] == f"{drafter_dir}:1x1"
    capsys.readouterr()
    for spec, says in ((f"fm={drafter_dir}:3x4", "STEPS must be 1 or 2"),
                       (f"df={tmp_path / 'df'}:1x4", "STEPS (and DRAWS) apply to FlashMap drafters only, not a "
                                                     "DFlashDrafter"),
                       (f"g={tmp_path / 'gated'}:1x4", "4 noise draws of a tau_gated_input drafter at 1 step are "
                                                       "one block repeated (its one-step draft ignores the noise): "
                                                       "use 1 draw, or 2 steps")):  # as `generate --draws` says
        assert run(spec) == 2
        err = capsys.readouterr().err
        assert err == f"flashmap eval: error: --drafter {spec}: {says}\n", err


def test_eval_dtype_auto_is_the_machines_choice(drafter_dir, tmp_path, monkeypatch):
    from flashmap_ext.bench import machine
    monkeypatch.setattr(machine, "auto_dtype", lambda: "fp32")
    data = heldout(tmp_path / "h.jsonl", {"math": LONG}, target="tiny-random")
    argv = ["eval", "--target", "tiny-random", "--heldout", data, "--drafter", f"fm={drafter_dir}", "--dtype", "auto",
            "--threads", "1", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    assert json.loads((tmp_path / "out" / "eval.json").read_text())["meta"]["dtype"] == "fp32"
