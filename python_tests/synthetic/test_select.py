"""Checkpoint selection on the validation curve (`flashmap testbed run --select best`)."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashmap_ext.synthetic.select import best_step, select_checkpoints


def test_best_step_is_the_highest_and_the_latest_of_ties():
    assert best_step({"steps": [250, 500, 750, 1000], "gamma_t1": [2.1, 2.6, 2.6, 2.2]}) == 750
    assert best_step({"steps": [250, 500, 750], "gamma_t1": [2.6, 2.6, 2.6]}) == 750
    assert best_step({"steps": [250, 500], "gamma_t1": [2.1, 2.0]}) == 250
    assert best_step({"steps": [250, 500], "gamma_t0": [1.0, 3.0], "gamma_t1": [9.0, 1.0]}, "gamma_t0") == 500
    with pytest.raises(ValueError, match="as many steps"):
        best_step({"steps": [1, 2], "gamma_t1": [1.0]})


def _run(tmp_path, name, steps):
    run = tmp_path / name
    weights = {s: {"w": torch.full((3,), float(s), dtype=torch.float32)} for s in steps}
    for s, t in weights.items():
        (run / "checkpoints" / f"step-{s:08d}").mkdir(parents=True)
        save_file(t, str(run / "checkpoints" / f"step-{s:08d}" / "model.safetensors"))
    (run / "drafter").mkdir()
    (run / "drafter" / "config.json").write_text(json.dumps({"kind": "test"}))
    save_file({"w": weights[steps[-1]]["w"].to(torch.bfloat16)}, str(run / "drafter" / "model.safetensors"))
    return run


def test_select_writes_the_best_checkpoint_and_keeps_runs_best_at_their_end(tmp_path):
    fell, rose, flat = _run(tmp_path, "map", [10, 20, 30]), _run(tmp_path, "flow", [10, 20]), tmp_path / "dflash"
    curves = {"map": {"steps": [10, 20, 30], "gamma_t1": [2.5, 2.6, 2.1]},
              "flow": {"steps": [10, 20], "gamma_t1": [2.0, 2.4]}}
    chosen, picked = select_checkpoints({"map": fell, "flow": rose, "dflash": flat}, curves)
    assert chosen == {"map": fell / "selected", "flow": rose, "dflash": flat}
    assert picked["map"] == {"step": 20, "last": 30, "gamma_t1": 2.6} and picked["flow"]["step"] == 20
    w = load_file(str(fell / "selected" / "drafter" / "model.safetensors"))["w"]
    assert w.dtype == torch.bfloat16 and torch.equal(w.float(), torch.full((3,), 20.0))
    assert json.loads((fell / "selected" / "drafter" / "config.json").read_text()) == {"kind": "test"}
