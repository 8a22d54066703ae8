"""`--init-from`: a training stage starts from a committed drafter's weights (long runs in pieces)."""
from __future__ import annotations

import pytest
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


def test_dflash2_starts_from_a_dflash_checkpoint_computing_what_it_computes(tmp_path):
    """DFlash2 = DFlash + identity-initialised convolutions + a selector: warm-started from a DFlash checkpoint
    its unary logits are the DFlash drafter's own (the reference: DFlash's forward), every shared tensor is
    copied, and a checkpoint of another family is still refused."""
    from conftest import tiny_qwen3
    from flashmap_ext.drafters.dflash import DFlashDrafter
    from flashmap_ext.drafters.dflash2 import DFlash2Drafter
    from flashmap_ext.target import Target
    target, taps_ids = tiny_qwen3(), [0, 2]
    kw = dict(mask_token_id=110, num_hidden_layers=2, block_size=5, target_layer_ids=taps_ids)
    torch.manual_seed(0)
    source = DFlashDrafter.for_target(target, **kw).eval()
    source.save_pretrained(tmp_path / "dflash")
    torch.manual_seed(1)
    student = DFlash2Drafter.for_target(target, selector_rank=4, selector_top_k=3, **kw).eval()
    selector = {k: v.clone() for k, v in student.state_dict().items() if "candidate_selector" in k}
    runner.warm_start(student, str(tmp_path / "dflash"), target)
    ids = torch.randint(0, 110, (1, 24), generator=torch.Generator().manual_seed(3))
    taps = Target(target).forward(ids, Target(target).new_cache(), tap_layer_ids=taps_ids).taps
    anchors = torch.tensor([[2, 9, 15]])
    with torch.no_grad():
        want, got = source.forward_train(taps, ids, anchors), student.forward_train(taps, ids, anchors)
    assert (want - got).abs().max().item() <= 1e-5
    for key, value in source.state_dict().items():
        assert torch.equal(student.state_dict()[key], value), key
    for key, value in selector.items():  # the added modules keep their initialisation
        assert torch.equal(student.state_dict()[key], value), key
    torch.manual_seed(2)
    other = DFlashDrafter.for_target(target, **{**kw, "num_hidden_layers": 1}).eval()
    other.save_pretrained(tmp_path / "dflash-1")
    with pytest.raises(ValueError, match="--init-from .*not the shape"):
        runner.warm_start(student, str(tmp_path / "dflash-1"), target)
    for change in ({"mask_token_id": 109}, {"block_size": 4}):  # no shape changes, but another function
        torch.manual_seed(1)
        other = DFlash2Drafter.for_target(target, selector_rank=4, selector_top_k=3, **{**kw, **change}).eval()
        name = next(iter(change))
        with pytest.raises(ValueError, match=f"--init-from .*config differs.*{name}=.*pass the flags"):
            runner.warm_start(other, str(tmp_path / "dflash"), target)
