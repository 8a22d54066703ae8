"""`--init-from`: a training stage starts from a committed drafter's weights (long runs in pieces)."""
from __future__ import annotations

import torch
from safetensors.torch import load_file

from flashmap_ext.cli import main
from flashmap_ext.train import runner
from python_tests.train.test_train_cli import tiny_feature_cache


def _dflash(tmp_path, common, out, *extra):
    return ["train", "dflash", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny",
            "--batch-size", "2", "--steps", "1", "--mask-token-id", "0", "--out", str(tmp_path / out), *extra]


def test_init_from_copies_every_weight_and_refuses_another_drafter(tmp_path, monkeypatch, capsys):
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    assert main(_dflash(tmp_path, common, "a")) == 0
    assert main(["train", "flow", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny",
                 "--batch-size", "2", "--steps", "1", "--out", str(tmp_path / "flow")]) == 0
    seen = {}

    def no_training(model, *a, **kw):  # the weights the run would start from
        seen.update({k: v.detach().clone() for k, v in model.state_dict().items()})
        return {"step": 1, "loss": 0.0}
    monkeypatch.setattr(runner, "train", no_training)
    assert main(_dflash(tmp_path, common, "b", "--seed", "5", "--init-from", str(tmp_path / "a/drafter"))) == 0
    saved = load_file(str(tmp_path / "a/drafter/model.safetensors"))
    shared = [k for k in saved if k in seen]
    assert len(shared) >= len(saved) - 2 and shared  # released-format names match the module's
    for key in shared:
        torch.testing.assert_close(seen[key].float(), saved[key].float(), rtol=0, atol=0)
    capsys.readouterr()
    refusals = {"c": (["--init-from", str(tmp_path / "flow/drafter")],
                      "FlashMapDrafter checkpoint, this stage trains a DFlashDrafter"),
                "d": (["--layers", "2", "--init-from", str(tmp_path / "a/drafter")], "not the shape"),
                "e": (["--init-from", str(tmp_path / "missing")], "")}
    for out, (flags, fragment) in refusals.items():
        assert main(_dflash(tmp_path, common, out, *flags)) == 2
        err = capsys.readouterr().err
        assert "--init-from" in err and fragment in err and err.count("\n") == 1, err
