"""`flashmap train snapshot` (train/snapshot.py): a mid-run checkpoint becomes a drafter dir with the export's config and
per-tensor dtypes (expected values: the checkpoint's tensors cast by torch, independently)."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashmap_ext import cli
from flashmap_ext.train import snapshot as snap


def run_dir(tmp_path, step_tensors):
    run = tmp_path / "flow"
    (run / "drafter").mkdir(parents=True)
    (run / "drafter" / "config.json").write_text(json.dumps({"model_type": "flashmap", "block_size": 8}))
    save_file({"w": torch.zeros(2, 3, dtype=torch.bfloat16), "d2t": torch.zeros(4, dtype=torch.int64)},
              str(run / "drafter" / "model.safetensors"))
    step = run / "checkpoints" / "step-00009000"
    step.mkdir(parents=True)
    save_file(step_tensors, str(step / "model.safetensors"))
    return run


def test_snapshot_takes_the_steps_weights_in_the_exports_dtypes(tmp_path):
    w = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    run = run_dir(tmp_path, {"w": w, "d2t": torch.arange(4)})
    out = snap.snapshot(run, 9000, tmp_path / "out")
    got = load_file(str(out / "model.safetensors"))
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], w.to(torch.bfloat16))
    assert got["d2t"].tolist() == [0, 1, 2, 3]
    assert json.loads((out / "config.json").read_text())["block_size"] == 8


def test_snapshot_refuses_a_missing_step_and_other_tensors(tmp_path):
    run = run_dir(tmp_path, {"w": torch.zeros(2, 3), "extra": torch.zeros(1), "d2t": torch.arange(4)})
    with pytest.raises(FileNotFoundError, match=r"step-00001000.*steps saved: 9000\)$"):
        snap.snapshot(run, 1000, tmp_path / "o")
    with pytest.raises(ValueError, match="different tensors"):
        snap.snapshot(run, 9000, tmp_path / "o")


def test_cli_writes_the_snapshot_and_names_a_missing_step(tmp_path, capsys):
    w = torch.randn(2, 3, generator=torch.Generator().manual_seed(1))
    run = run_dir(tmp_path, {"w": w, "d2t": torch.arange(4)})
    assert cli.main(["train", "snapshot", str(run), "9000", str(tmp_path / "snap")]) == 0
    assert torch.equal(load_file(str(tmp_path / "snap" / "model.safetensors"))["w"], w.to(torch.bfloat16))
    capsys.readouterr()
    assert cli.main(["train", "snapshot", str(run), "10", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashmap train snapshot: error: ") and "step-00000010" in err and err.count("\n") == 1


def test_cli_refuses_a_negative_step_naming_step(tmp_path, capsys):
    run = run_dir(tmp_path, {"w": torch.zeros(2, 3), "d2t": torch.arange(4)})
    assert cli.main(["train", "snapshot", str(run), "-5", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == "flashmap train snapshot: error: STEP must be >= 0, got -5\n"
    assert not (tmp_path / "o").exists()


def test_a_run_without_export_needs_a_template_and_takes_its_config_and_dtypes(tmp_path):
    w = torch.randn(2, 3, generator=torch.Generator().manual_seed(2))
    run = run_dir(tmp_path, {"w": w, "d2t": torch.arange(4)})
    template = tmp_path / "warm"
    (run / "drafter").rename(template)
    with pytest.raises(FileNotFoundError, match="--template"):
        snap.snapshot(run, 9000, tmp_path / "o")
    out = snap.snapshot(run, 9000, tmp_path / "o", template=template)
    got = load_file(str(out / "model.safetensors"))
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], w.to(torch.bfloat16))
    assert json.loads((out / "config.json").read_text())["model_type"] == "flashmap"


def test_a_template_of_other_shapes_a_missing_template_and_a_used_out_are_refused(tmp_path):
    run = run_dir(tmp_path, {"w": torch.zeros(2, 3), "d2t": torch.arange(4)})
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "config.json").write_text("{}")
    save_file({"w": torch.zeros(4, 3, dtype=torch.bfloat16), "d2t": torch.zeros(4, dtype=torch.int64)},
              str(wide / "model.safetensors"))
    with pytest.raises(ValueError, match=r"--template .*differ in shape.*w: \(2, 3\) against \(4, 3\)"):
        snap.snapshot(run, 9000, tmp_path / "o1", template=wide)
    with pytest.raises(FileNotFoundError, match=r"missing \(--template\)"):
        snap.snapshot(run, 9000, tmp_path / "o2", template=tmp_path / "nowhere")
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        snap.snapshot(run, 9000, used)
    assert (used / "keep.txt").read_text() == "x"


def test_a_template_made_with_other_flags_than_the_run_is_refused(tmp_path):
    """--tau-gated-input changes what the weights compute, not their tensors: the run's record decides."""
    run = run_dir(tmp_path, {"w": torch.zeros(2, 3), "d2t": torch.arange(4)})
    (run / "run.json").write_text(json.dumps({"stage": "flow", "args": {"tau_gated_input": True, "width": None,
                                                                         "block_size": 8}}))
    template = tmp_path / "warm"
    (run / "drafter").rename(template)
    cfg = json.loads((template / "config.json").read_text())
    (template / "config.json").write_text(json.dumps({**cfg, "tau_gated_input": False}))
    with pytest.raises(ValueError, match=r"its tau_gated_input is False, the run was trained with True"):
        snap.snapshot(run, 9000, tmp_path / "o", template=template)
    assert not (tmp_path / "o").exists()
    (template / "config.json").write_text(json.dumps({**cfg, "tau_gated_input": True}))
    assert snap.snapshot(run, 9000, tmp_path / "o", template=template).is_dir()


def test_cli_names_an_out_that_is_a_file(tmp_path, capsys):
    """`train snapshot RUN STEP README.md` said only "[Errno 20] Not a directory"."""
    run = run_dir(tmp_path, {"w": torch.zeros(2, 3), "d2t": torch.arange(4)})
    (tmp_path / "notes.md").write_text("x")
    assert cli.main(["train", "snapshot", str(run), "9000", str(tmp_path / "notes.md")]) == 2
    err = capsys.readouterr().err
    assert f"OUT {tmp_path / 'notes.md'}: a file is there (expected a folder)" in err and err.count("\n") == 1
