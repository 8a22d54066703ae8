"""Argument checks of `flashmap train` / `flashmap distill`: counts and fractions out of range, and a
--max-length that keeps no supervised label, are refused in one line naming the flag, before any training."""
import json

import pytest
import torch

from flashmap_ext.cli import main
from flashmap_ext.train.features import FeatureCache, FeatureWriter
from flashmap_ext.train.trainer import TrainConfig
from python_tests.train.test_train_cli import tiny_feature_cache


@pytest.fixture(autouse=True)
def _raise_user_errors(monkeypatch):
    """These tests match the exceptions themselves; `flashmap` prints them as one line otherwise."""
    monkeypatch.setenv("FLASHMAP_DEBUG", "1")


STAGES = [["train", "flow"], ["train", "dflash"], ["train", "eagle3"],
          ["distill", "--teacher", "no-such-teacher"]]
BAD = [(["--log-every", "0"], r"^--log-every: must be >= 1 \(got 0\)$"),
       (["--save-every", "-1"], r"^--save-every: must be >= 0 \(got -1\)$"),
       (["--max-length", "0"], r"^--max-length: must be >= 2 \(got 0\)$"),
       (["--max-length", "1"], r"^--max-length: must be >= 2 \(got 1\)$"),
       (["--steps", "0"], r"^--steps: must be >= 1 \(got 0\)$"),
       (["--num-anchors", "0"], r"^--num-anchors: must be >= 1 \(got 0\)$"),
       (["--keep-checkpoints", "-2"], r"^--keep-checkpoints: must be >= 0 \(got -2\)$")]


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: " ".join(s[:2]))
@pytest.mark.parametrize("flag,message", BAD, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_counts_out_of_range_are_refused_before_any_file_is_read(stage, flag, message, tmp_path):
    """--log-every 0 ended in a ZeroDivisionError after the first step; --max-length 0 in an error about
    `context_window`; --max-length 1 trained on nothing and saved a drafter. (--features and --teacher do not
    exist: an error about them would mean the check came too late.)"""
    argv = [*stage, "--target", "tiny-random", "--features", str(tmp_path / "f"), "--out", str(tmp_path / "o"),
            "--preset", "cpu-tiny", *flag]
    with pytest.raises(ValueError, match=message):
        main(argv)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: " ".join(s[:2]))
@pytest.mark.parametrize("out,features", [("f", "f"), ("f/run", "f"), ("run", "run/f"), ("g/../f", "f")])
def test_a_run_folder_that_is_or_holds_the_feature_cache_is_refused(stage, out, features, tmp_path):
    """`train flow --features f --out f` wrote its checkpoints and drafter/ among the cache's shards. (--features
    does not exist: the check comes before the cache is read.)"""
    (tmp_path / "g").mkdir()
    with pytest.raises(ValueError, match=rf"^--out .*{out.split('/')[-1]}: the run's folder must lie outside"):
        main([*stage, "--target", "tiny-random", "--features", str(tmp_path / features), "--out",
              str(tmp_path / out), "--preset", "cpu-tiny"])
    assert not (tmp_path / "f").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("out", ["flow/drafter", "flow/drafter/map", "flow"])
def test_distill_refuses_an_out_that_is_or_holds_its_teacher(out, tmp_path):
    """`distill --teacher runs/flow/drafter --out runs/flow/drafter` wrote checkpoints/ and drafter/ beside the
    teacher's weights. (The teacher does not exist: the check comes first.)"""
    with pytest.raises(ValueError, match=r"^--out .*: the run's folder must lie outside --teacher .*the teacher's"):
        main(["distill", "--teacher", str(tmp_path / "flow" / "drafter"), "--target", "tiny-random", "--features",
              str(tmp_path / "f"), "--out", str(tmp_path / out), "--preset", "cpu-tiny"])
    assert not (tmp_path / "flow").exists()


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: " ".join(s[:2]))
def test_an_out_that_is_a_file_is_refused_naming_it(stage, tmp_path):
    """`train flow --out README.md` said only "[Errno 17] File exists: 'README.md'"."""
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(ValueError, match=r"^--out .*notes.md: a file is there \(expected a folder\)"):
        main([*stage, "--target", "tiny-random", "--features", str(tmp_path / "f"), "--out",
              str(tmp_path / "notes.md"), "--preset", "cpu-tiny"])


def test_runs_beside_the_cache_are_not_refused():
    from flashmap_ext.train.runner import check_apart
    for out, features in (("runs/f2", "runs/f"), ("f", "feats"), ("runs/flow", "cache/f")):
        check_apart(out, features)


@pytest.mark.parametrize("length", ["1", "0", "-1"])
def test_features_refuses_a_max_length_below_two(length, tmp_path):
    """`features --max-length -1` cropped the last token off every sequence (--data does not exist: the check
    comes first)."""
    with pytest.raises(ValueError, match=rf"^--max-length: must be >= 2 \(got {length}\)$"):
        main(["features", "--target", "tiny-random", "--data", str(tmp_path / "c.jsonl"), "--out",
              str(tmp_path / "f"), "--max-length", length])


def test_trainer_refuses_log_every_zero():
    with pytest.raises(ValueError, match="log_every must be >= 1, got 0"):
        TrainConfig(out="unused", steps=1, lr=1e-3, warmup=0, log_every=0)


@pytest.mark.parametrize("argv,flag", [(["distill", "--teacher", "t", "--frac-01", "2"], "--frac-01"),
                                       (["distill", "--teacher", "t", "--frac-01", "-0.5"], "--frac-01"),
                                       (["distill", "--teacher", "t", "--frac-01", "1/0"], "--frac-01"),
                                       (["distill", "--teacher", "t", "--frac-01", "nan"], "--frac-01"),
                                       (["distill", "--teacher", "t", "--data-weight", "1.5"], "--data-weight"),
                                       (["train", "flow", "--tau0-frac", "1.5"], "--tau0-frac")])
def test_fractions_outside_zero_one_are_refused_by_the_parser(argv, flag, capsys):
    """`distill --frac-01 2` and `-0.5` used to train normally."""
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--target", "tiny-random", "--features", "f", "--out", "o"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"argument {flag}: expected a number in [0, 1]" in err


@pytest.mark.parametrize("argv, message", [
    (["train", "flow", "--kl-ce-weight", "0.5"], "--kl-ce-weight 0.5: the weight of the CE added to --loss kl's KL"),
    (["train", "eagle3", "--kl-ce-weight", "0.5"], "--kl-ce-weight 0.5: the weight of the CE added to --loss kl's"),
    (["distill", "--teacher", "t", "--frac-01", "0", "--reachable"], "--reachable: selects the slots of the 0→1")])
def test_options_that_would_do_nothing_are_refused(argv, message, tmp_path, capsys, monkeypatch):
    """--kl-ce-weight without --loss kl and distill's --reachable without 0→1 jumps trained as if not given."""
    from flashmap_ext.train import runner
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    monkeypatch.setattr(runner, "run_stage", lambda *a, **kw: pytest.fail("trained"))
    assert main([*argv, "--target", "tiny-random", "--features", str(tmp_path / "f"), "--out", str(tmp_path / "o"),
                 "--preset", "cpu-tiny"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("option", [["--loss", "kl"], ["--kl-ce-weight", "1"], ["--context-window", "none"],
                                    ["--tap-layers", "0"]])
def test_distill_has_no_options_the_teacher_decides(option, capsys):
    """The student keeps the teacher's taps and window and learns its distributions: distill offered --loss,
    --kl-ce-weight, --context-window and --tap-layers only to refuse them after parsing."""
    with pytest.raises(SystemExit) as exit_:
        main(["distill", "--teacher", "t", "--target", "tiny-random", "--features", "f", "--out", "o", *option])
    assert exit_.value.code == 2 and f"unrecognized arguments: {' '.join(option)}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["distill", "--help"])
    assert option[0] not in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["distill", "--teacher", "t"], ["train", "eagle3"]])
def test_stages_without_layers_have_no_add_layers(argv, capsys):
    """`distill --help` offered --add-layers ('than --layers', which distill does not have) and --init-from
    from a DFlash checkpoint, both `train flow`'s."""
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--target", "tiny-random", "--features", "f", "--out", "o", "--add-layers"])
    assert exit_.value.code == 2 and "unrecognized arguments: --add-layers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    help_text = capsys.readouterr().out
    assert "--add-layers" not in help_text and "DFlash checkpoint" not in help_text


def test_distill_roles_refuse_a_fraction_outside_zero_one():
    from flashmap_ext.train.distill import assign_roles
    for frac in (-0.5, 2.0, float("nan")):
        with pytest.raises(ValueError, match=r"^frac_01 must be in \[0.0, 1.0\]"):
            assign_roles(4, 4, frac, torch.Generator().manual_seed(0))
    zero, one = assign_roles(4, 4, 1.0, torch.Generator().manual_seed(0))
    assert int(one.sum()) == 8 and not (zero & one).any()  # every block that is not zero-length jumps 0→1


def test_fraction_bounds_and_spellings_are_accepted():
    from flashmap_ext.cli import build_parser
    for text, value in (("0", 0.0), ("1", 1.0), ("1/16", 0.0625), ("0.25", 0.25)):
        args = build_parser().parse_args(["distill", "--teacher", "t", "--target", "x", "--features", "f",
                                          "--out", "o", "--frac-01", text])
        assert args.frac_01 == value


def _cache(root, masks) -> FeatureCache:
    with FeatureWriter(str(root), {"target_layer_ids": [0], "feature_dim": 2, "dtype": "fp32"}) as w:
        for i, mask in enumerate(masks):
            w.add(f"s{i}", list(range(len(mask))), mask, torch.zeros(len(mask), 2))
    return FeatureCache(str(root))


def test_the_shortest_crop_that_keeps_a_label_is_named(tmp_path):
    from flashmap_ext.train.runner import check_supervised
    # first anchors (a response token followed by another): s0 at 3 (needs 5 tokens), s1 at 2 (needs 4)
    cache = _cache(tmp_path / "c", [[0, 0, 0, 1, 1, 1], [0, 0, 1, 1], [0, 1, 0, 1, 0]])
    for length in (None, 4, 6):
        check_supervised(cache, length, "c")  # trains: some sequence keeps a label
    with pytest.raises(ValueError, match=r"^--max-length 3: every sequence .*\(the shortest crop that keeps one "
                                         r"is 4\); raise --max-length$"):
        check_supervised(cache, 3, "c")
    none = _cache(tmp_path / "n", [[0, 1, 0, 1], [1, 0, 0, 0]])
    with pytest.raises(ValueError, match="^--features n: no sequence has two response tokens in a row"):
        check_supervised(none, None, "n")


def test_max_length_without_a_supervised_label_is_refused_before_training(tmp_path):
    """`train dflash --max-length 2` trained on zero supervised tokens ('loss 0.0000', NaN accuracy) and saved
    a drafter. The crop the error names trains on labels; the one below it is refused."""
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    cache = FeatureCache(str(tmp_path / "f"))
    masks = [cache[i]["loss_mask"].tolist() for i in range(len(cache))]
    shortest = min(next(a for a in range(len(m) - 1) if m[a] and m[a + 1]) + 2 for m in masks)
    assert shortest > 2  # the prompt comes first
    args = [*common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--batch-size", "2",
            "--steps", "1", "--log-every", "1"]
    for stage in (["train", "dflash", "--mask-token-id", "0"], ["train", "flow"]):
        out = tmp_path / stage[1]
        with pytest.raises(ValueError, match=f"^--max-length 2: .*the shortest crop that keeps one is {shortest}"):
            main([*stage, *args, "--out", str(out), "--max-length", "2"])
        assert not (out / "drafter").exists() and not (out / "run.json").exists()
    with pytest.raises(ValueError, match=f"^--max-length {shortest - 1}: "):
        main(["train", "flow", *args, "--out", str(tmp_path / "below"), "--max-length", str(shortest - 1)])
    assert main(["train", "flow", *args, "--out", str(tmp_path / "ok"), "--max-length", str(shortest)]) == 0
    logged = json.loads((tmp_path / "ok" / "metrics.jsonl").read_text().splitlines()[-1])
    assert logged["tokens"] >= 1 and logged["loss"] > 0


def test_a_cache_of_another_hidden_size_is_refused_naming_both_widths(tmp_path):
    """A cache whose taps are 32 wide (another model's) against the tiny random target (hidden size 64)."""
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    from flashmap_ext.target import load_target
    with FeatureWriter(str(tmp_path / "f"), {"target_layer_ids": [1], "feature_dim": 32, "dtype": "fp32"}) as w:
        w.add("s0", list(range(8)), [0, 0, 1, 1, 1, 1, 1, 1], torch.zeros(8, 32))
    target, _ = load_target("tiny-random", "fp32", "cpu")
    FlashMapDrafter.for_target(target, "cpu-tiny", target_layer_ids=[1], two_time=False).save_pretrained(tmp_path / "teacher")
    every_stage_refuses(tmp_path, [], rf"^--features {tmp_path / 'f'}: its taps are 32 wide .*the "
                                      r"target's hidden size is 64")


def every_stage_refuses(tmp_path, extra: list, pattern: str) -> None:
    """train flow / dflash / eagle3 and distill (teacher tmp_path/teacher) on the cache tmp_path/f against
    tiny-random raise ValueError matching `pattern` and write no --out."""
    common = ["--target", "tiny-random", "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--steps", "1",
              *extra]
    for stage in (["train", "flow", "--tap-layers", "1"], ["train", "dflash", "--mask-token-id", "0", "--tap-layers", "1"],
                  ["train", "eagle3", "--tap-layers", "1"], ["distill", "--teacher", str(tmp_path / "teacher")]):
        out = tmp_path / stage[1]
        with pytest.raises(ValueError, match=pattern):
            main([*stage, *common, "--out", str(out)])
        assert not out.exists()


def _tiny_cache(root, model, meta=None) -> None:
    """Two answered byte sequences run through `model`, their layer-1 taps cached in `root`."""
    from types import SimpleNamespace

    from flashmap_ext.train.features import cache_features
    texts = [b"say one, two, three", b"say four, five"]
    seqs = [SimpleNamespace(id=f"s{i}", input_ids=list(t), loss_mask=[0] * 4 + [1] * (len(t) - 4))
            for i, t in enumerate(texts)]
    cache_features(model, seqs, str(root), [1], dtype="fp32", meta=meta, progress=False)


def test_a_cache_of_another_target_of_the_same_width_is_refused_naming_the_one_that_built_it(tmp_path):
    """A plain `flashmap features` cache of another 64-wide target (the tiny Qwen3 of seed 1) trained every stage
    against --target tiny-random (seed 0) as if its taps were tiny-random's."""
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    from flashmap_ext.target import load_target, tiny_random_model
    _tiny_cache(tmp_path / "f", tiny_random_model(seed=1), meta={"target": "tiny-seed-1"})
    target, _ = load_target("tiny-random", "fp32", "cpu")
    teacher = FlashMapDrafter.for_target(target, "cpu-tiny", target_layer_ids=[1], two_time=False)
    teacher.save_pretrained(tmp_path / "teacher")
    every_stage_refuses(tmp_path, ["--no-progress"], rf"^--features {tmp_path / 'f'}: cached from --target "
                                                     r"tiny-seed-1 \(target fingerprint [0-9a-f]{16}\), not from "
                                                     r"this --target ")


def test_a_cache_of_another_target_is_refused_before_the_draft_vocabulary_and_the_clock(tmp_path, monkeypatch):
    """Counting the cache's tokens and calibrating the clock take minutes on a real target: the target check
    comes first (a refusal after them left a mistaken run silent for that long)."""
    from flashmap_ext.commands import train as train_cmd
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    from flashmap_ext.target import tiny_random_model

    def must_not_run(*_args, **_kwargs):
        raise AssertionError("ran before the target check")
    monkeypatch.setattr(train_cmd, "draft_vocab", must_not_run)
    monkeypatch.setattr(FlashMapDrafter, "calibrate_clock", must_not_run)
    _tiny_cache(tmp_path / "f", tiny_random_model(seed=1), meta={"target": "tiny-seed-1"})
    for stage in (["train", "flow"], ["train", "dflash", "--mask-token-id", "0"], ["train", "eagle3"]):
        with pytest.raises(ValueError, match="cached from --target tiny-seed-1"):
            main([*stage, "--target", "tiny-random", "--features", str(tmp_path / "f"), "--no-progress",
                  "--tap-layers", "1", "--out", str(tmp_path / stage[1])])


def test_the_target_check_ignores_the_dtype_and_skips_caches_without_a_fingerprint(tmp_path):
    """The same weights in bf16 or fp16 are the same target; a manifest written before it held the target's
    fingerprint is read as before."""
    from flashmap_ext.target import Target, tiny_random_model
    from flashmap_ext.train.runner import open_features
    _tiny_cache(tmp_path / "f", tiny_random_model())
    manifest = json.loads((tmp_path / "f" / "manifest.json").read_text())
    assert len(manifest["target_identity"]) == 16
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert len(open_features(str(tmp_path / "f"), [1], Target(tiny_random_model(dtype)))) == 2
    other = Target(tiny_random_model(seed=1))
    with pytest.raises(ValueError, match="cached from another target"):
        open_features(str(tmp_path / "f"), [1], other)
    del manifest["target_identity"]
    (tmp_path / "f" / "manifest.json").write_text(json.dumps(manifest))
    assert len(open_features(str(tmp_path / "f"), [1], other)) == 2


def test_dflash_warns_when_the_mask_token_occurs_in_the_training_data(tmp_path, capsys):
    """`--mask-token-id 7` on sequences that use token 7 three times trained without a word: the masked draft
    slots share their input embedding with a token of the data."""
    with FeatureWriter(str(tmp_path / "f"), {"target_layer_ids": [1], "feature_dim": 64, "dtype": "fp32"}) as w:
        for i, ids in enumerate([[5, 7, 1, 2, 7, 3, 4, 5, 6, 8], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]]):
            w.add(f"s{i}", ids, [0, 0] + [1] * 8, torch.randn(10, 64))
    common = ["--target", "tiny-random", "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--steps", "1",
              "--batch-size", "2", "--tap-layers", "1", "--no-progress"]
    assert main(["train", "dflash", *common, "--out", str(tmp_path / "o"), "--mask-token-id", "7"]) == 0
    err = capsys.readouterr().err
    assert (f"train dflash: warning: --mask-token-id 7 occurs 3 times in the sequences of --features "
            f"{tmp_path / 'f'};") in err


def test_a_capped_draft_vocabulary_names_what_set_it(capsys):
    """`train eagle3` without --draft-vocab said "--draft-vocab 32000: ..." about the preset's count."""
    from flashmap_ext.commands.train import draft_vocab

    class Cache:  # two sequences whose supervised tokens are 1, 2, 2 and 3
        def __len__(self):
            return 2

        def supervised_tokens(self, i):
            return torch.tensor([[1, 2], [2, 3]][i])
    ids = draft_vocab("32000", Cache(), 6, "--preset cpu-tiny's draft vocabulary")
    assert sorted(ids.tolist()) == list(range(6))  # capped at the target's rows
    assert capsys.readouterr().err.startswith("--preset cpu-tiny's draft vocabulary 32000: the target has 6 ")
    assert draft_vocab("2", Cache(), 6).tolist() == [1, 2]  # the two most frequent (ties: lower id); no note
    assert capsys.readouterr().err == ""
