"""scripts/snapshot_drafter.py: a mid-run checkpoint becomes a drafter dir with the export's config and
per-tensor dtypes (expected values: the checkpoint's tensors cast by torch, independently)."""
import importlib.util
import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("snapshot_drafter", ROOT / "scripts" / "snapshot_drafter.py")
snap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(snap)


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
    with pytest.raises(SystemExit, match="step-00001000"):
        snap.snapshot(run, 1000, tmp_path / "o")
    with pytest.raises(SystemExit, match="different tensors"):
        snap.snapshot(run, 9000, tmp_path / "o")
