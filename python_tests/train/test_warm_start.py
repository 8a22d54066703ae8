"""`--init-from`: a training stage starts from a committed drafter's weights (long runs in pieces)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from flashmap_ext.cli import main
from flashmap_ext.drafters.common.vocab import DraftVocab
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
                "d": (["--layers", "2", "--init-from", str(tmp_path / "a/drafter")],
                      "its config differs from this run's (num_hidden_layers=1 (this run: 2)"),
                "d2": (["--intermediate-size", "8", "--init-from", str(tmp_path / "a/drafter")], "config differs"),
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
    with pytest.raises(ValueError, match="--init-from .*config differs.*num_hidden_layers=1"):
        runner.warm_start(student, str(tmp_path / "dflash-1"), target)
    for change in ({"mask_token_id": 109}, {"block_size": 4}):  # no shape changes, but another function
        torch.manual_seed(1)
        other = DFlash2Drafter.for_target(target, selector_rank=4, selector_top_k=3, **{**kw, **change}).eval()
        name = next(iter(change))
        with pytest.raises(ValueError, match=f"--init-from .*config differs.*{name}=.*pass the flags"):
            runner.warm_start(other, str(tmp_path / "dflash"), target)


def _deeper_pair(kind, target, taps_ids):
    """(a random drafter of `kind` with 2 layers, the same with 5): the flow model with random adaLN gates,
    so that every layer of the source changes its output."""
    from flashmap_ext.drafters.dflash import DFlashDrafter
    from flashmap_ext.drafters.dflash2 import DFlash2Drafter
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    if kind == "flow":
        kw = dict(width=32, heads=2, block_size=4, target_layer_ids=taps_ids)
        make = lambda n: FlashMapDrafter.for_target(target, n_layers=n, init="random", **kw)  # noqa: E731
    else:
        cls, extra = (DFlashDrafter, {}) if kind == "dflash" else (DFlash2Drafter, dict(selector_rank=4,
                                                                                       selector_top_k=3))
        kw = dict(mask_token_id=110, block_size=5, target_layer_ids=taps_ids, **extra)
        make = lambda n: cls.for_target(target, num_hidden_layers=n, **kw)  # noqa: E731
    torch.manual_seed(0)
    source = make(2).eval()
    torch.manual_seed(1)
    return source, make(5).eval()


def _train_logits(drafter, taps, ids, anchors):
    if not hasattr(drafter, "slot_pos"):  # DFlash, DFlash2; the flow model takes noise and clocks
        return drafter.forward_train(taps, ids, anchors)
    g = torch.Generator().manual_seed(4)
    a, k = anchors.shape[1], drafter.num_draft_tokens
    z = torch.randn(1, a, k, drafter.config.d_target, generator=g)
    return drafter.forward_train(taps, ids, anchors, z, torch.rand(1, a, generator=g), torch.rand(1, a, generator=g))


@pytest.mark.parametrize("kind", ["flow", "dflash", "dflash2"])
def test_add_layers_starts_a_deeper_drafter_computing_the_checkpoints_function(tmp_path, kind):
    """--add-layers: the 2-layer checkpoint's weights fill the first two of five layers and the three added
    ones pass their input on, so the deeper drafter's training logits are the checkpoint's own (the
    reference: the checkpoint's forward); the added layers keep trainable random weights; with the added
    layers' residual outputs left random the logits differ (the check can fail)."""
    from conftest import tiny_qwen3
    from flashmap_ext.target import Target
    target, taps_ids = tiny_qwen3(), [0, 2]
    source, deeper = _deeper_pair(kind, target, taps_ids)
    source.save_pretrained(tmp_path / "src")
    with pytest.raises(ValueError, match="--init-from .*config differs.*or --add-layers"):
        runner.warm_start(deeper, str(tmp_path / "src"), target)
    runner.warm_start(deeper, str(tmp_path / "src"), target, add_layers=True)
    ids = torch.randint(0, 110, (1, 24), generator=torch.Generator().manual_seed(3))
    taps = Target(target).forward(ids, Target(target).new_cache(), tap_layer_ids=taps_ids).taps
    anchors = torch.tensor([[2, 9, 15]])
    with torch.no_grad():
        want, got = _train_logits(source, taps, ids, anchors), _train_logits(deeper, taps, ids, anchors)
        assert (want - got).abs().max().item() <= 1e-5
        mine = deeper.state_dict()
        for key, value in source.state_dict().items():
            assert torch.equal(mine[key], value), key
        prefix = deeper.layer_prefix
        added = [k for k in mine if k.startswith(prefix) and int(k[len(prefix):].split(".")[0]) >= 2]
        assert any(mine[k].abs().sum() > 0 for k in added if k.endswith("weight") and "norm" not in k)
        for layer in getattr(deeper, prefix.rstrip("."))[2:]:  # un-zero the residual outputs: not the function
            for p in layer.parameters():
                if p.abs().sum() == 0:
                    p.normal_(std=0.1)
        assert (want - _train_logits(deeper, taps, ids, anchors)).abs().max().item() > 1e-3


def test_add_layers_refusals(tmp_path, capsys):
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    assert main(_dflash(tmp_path, common, "a", "--layers", "1")) == 0
    capsys.readouterr()
    cases = {"b": (["--layers", "2", "--init-from", str(tmp_path / "a/drafter")], "or --add-layers"),
             "c": (["--layers", "1", "--add-layers", "--init-from", str(tmp_path / "a/drafter")],
                   "--layers must be larger"),
             "d": (["--layers", "2", "--add-layers"], "pass --init-from"),
             "e": (["--layers", "2", "--add-layers", "--block-size", "4", "--init-from", str(tmp_path / "a/drafter")],
                   "config differs")}
    for out, (flags, fragment) in cases.items():
        assert main(_dflash(tmp_path, common, out, *flags)) == 2, out
        err = capsys.readouterr().err
        assert "--add-layers" in err or "--init-from" in err, err
        assert fragment in err and err.count("\n") == 1, (out, err)
    assert main(_dflash(tmp_path, common, "g", "--layers", "3", "--add-layers",
                        "--init-from", str(tmp_path / "a/drafter"))) == 0
    out = capsys.readouterr().out
    assert "layers 1..2 added" in out


def test_resume_takes_the_checkpoint_not_the_warm_start_and_says_when_steps_change(tmp_path, capsys):
    """An --init-from run resumed from its own checkpoint: the checkpoint's weights win, so the warm start is not
    loaded (nor announced) again and may have been deleted since; a new --steps is said on stderr."""
    import shutil
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    assert main(_dflash(tmp_path, common, "a")) == 0
    shutil.copytree(tmp_path / "a/drafter", tmp_path / "init")
    assert main(_dflash(tmp_path, common, "b", "--save-every", "1", "--init-from", str(tmp_path / "init"))) == 0
    shutil.rmtree(tmp_path / "init")
    capsys.readouterr()
    assert main(_dflash(tmp_path, common, "b", "--save-every", "1", "--init-from", str(tmp_path / "init"),
                        "--resume", "--steps", "2")) == 0
    out = capsys.readouterr()
    assert "warm start" not in out.out
    assert "--resume: --steps 2 (the run so far: 1)" in out.err


@pytest.mark.parametrize("flags, message", [
    (["--lr", "inf"], "--lr: must be a finite number > 0 (got inf)"),
    (["--warmup", "nan"], "--warmup: must be a finite number >= 0 (got nan)"),
    (["--width", "0"], "--width: must be >= 1 (got 0)"),
    (["--heads", "3"], "--heads 3: must divide --width 128"),
])
def test_size_and_rate_flags_are_refused_in_one_line(tmp_path, capsys, flags, message):
    common = tiny_feature_cache(tmp_path, ("one",))
    capsys.readouterr()
    assert main(["train", "flow", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny",
                 "--steps", "1", "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_map_and_a_flow_model_do_not_warm_start_each_other(tmp_path):
    """`train flow` builds a flow model (two_time=False) and `distill` a map (two_time=True): no flag turns
    one into the other, so each refuses the other's checkpoint saying what to give instead."""
    from conftest import tiny_qwen3
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    from flashmap_ext.train.distill import make_student
    target = tiny_qwen3()
    flow = FlashMapDrafter.for_target(target, n_layers=1, width=32, heads=2, block_size=4, target_layer_ids=[0, 2],
                                     two_time=False)
    flow.save_pretrained(tmp_path / "flow")
    make_student(flow).save_pretrained(tmp_path / "map")
    with pytest.raises(ValueError, match=r"^--init-from \S+map: a distilled map \(two_time=True\) cannot "
                                         r"warm-start the flow model; give a flow checkpoint .*distill --init-from"):
        runner.warm_start(flow, str(tmp_path / "map"), target)
    with pytest.raises(ValueError, match=r"^--init-from \S+flow: a flow model \(two_time=False\) cannot "
                                         r"warm-start the distilled map; give it to `flashmap distill --teacher`"):
        runner.warm_start(make_student(flow), str(tmp_path / "flow"), target)


def test_a_drafter_class_is_named_with_its_article(tmp_path):
    """'an' before a vowel: an Eagle3Drafter (here warm-started from a FlashMap checkpoint)."""
    from conftest import tiny_qwen3
    from flashmap_ext.drafters.eagle3 import Eagle3Drafter
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    target = tiny_qwen3()
    FlashMapDrafter.for_target(target, "cpu-tiny", target_layer_ids=[0, 2]).save_pretrained(tmp_path / "fm")
    eagle = Eagle3Drafter.for_target(target, num_draft_tokens=3, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"a FlashMapDrafter checkpoint, this stage trains an Eagle3Drafter$"):
        runner.warm_start(eagle, str(tmp_path / "fm"), target)


def test_new_draft_vocab_copies_every_weight_onto_the_runs_vocabulary(tmp_path):
    """--new-draft-vocab: a FlashMap checkpoint drafted from 64 rows starts a drafter of 96 other rows with
    every weight copied and the run's own d2t kept; without it the other vocabulary is refused; an EAGLE-3
    drafter with a trained head (a tensor per draft row) is refused even with it."""
    from conftest import tiny_qwen3
    from flashmap_ext.drafters.eagle3 import Eagle3Drafter
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    target = tiny_qwen3()
    shape = dict(n_layers=1, width=32, heads=2, block_size=4, target_layer_ids=[0, 2], init="random")
    src = FlashMapDrafter.for_target(target, draft_vocab_size=64, **shape)
    src.set_draft_vocab(torch.arange(64) + 40, target)
    src.save_pretrained(tmp_path / "src")
    dst = FlashMapDrafter.for_target(target, draft_vocab_size=96, **{**shape, "init": "zero"})
    dst.set_draft_vocab(torch.arange(96) + 7, target)
    with pytest.raises(ValueError, match=r"its draft vocabulary \(64 rows\) differs from this run's --draft-vocab "
                                         r"\(96\); .* or --new-draft-vocab"):
        runner.warm_start(dst, str(tmp_path / "src"), target)
    runner.warm_start(dst, str(tmp_path / "src"), target, new_vocab=True)
    theirs = src.state_dict()
    for key, value in dst.state_dict().items():
        expected = DraftVocab.offsets(torch.arange(96) + 7, 96) if key == "d2t" else theirs[key]
        assert torch.equal(value, expected), key
    e3 = Eagle3Drafter.for_target(target, draft_ids=torch.arange(64) + 40, frozen_lm_head=False)
    e3.save_pretrained(tmp_path / "e3")
    other = Eagle3Drafter.for_target(target, draft_ids=torch.arange(96) + 7, frozen_lm_head=False)
    with pytest.raises(ValueError, match=r"^--new-draft-vocab: .*\(lm_head.weight: .*--frozen-lm-head"):
        runner.warm_start(other, str(tmp_path / "e3"), target, new_vocab=True)


def test_a_config_difference_names_a_long_table_by_its_length():
    """A differing clock table (thousands of floats) used to be printed in full in the one-line refusal."""
    import dataclasses

    from conftest import tiny_qwen3
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    from flashmap_ext.train.warm_start import config_differences
    base = FlashMapDrafter.for_target(tiny_qwen3(), n_layers=1, width=32, heads=2, block_size=4,
                                      target_layer_ids=[0, 2]).config
    a = dataclasses.replace(base, clock_t=tuple(i / 999 for i in range(1000)), clock_tau=tuple(i / 999 for i in range(1000)))
    b = dataclasses.replace(a, clock_tau=tuple((i / 999) ** 2 for i in range(1000)))
    (line,) = config_differences(a, b)
    assert line == "clock_tau=<1000 values> (this run: <1000 values>)"
