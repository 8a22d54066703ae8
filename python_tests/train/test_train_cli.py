"""The training commands: --help, presets, and the whole CLI pipeline on `--target tiny-random`."""
import argparse
import json
import os

import pytest
import torch

from flashmap_ext.cli import build_parser, main
from flashmap_ext.commands.features import tap_layers
from flashmap_ext.train.checkpoint import latest
from flashmap_ext.train.features import FeatureCache
from flashmap_ext.train.runner import settings, window_arg

COMMANDS = [["train", "flow"], ["train", "dflash"], ["train", "dflash2"], ["train", "eagle3"], ["distill"], ["data", "regenerate"],
            ["features"]]


@pytest.fixture(autouse=True)
def _raise_user_errors(monkeypatch):
    """These tests match the exceptions themselves; `flashmap` prints them as one line otherwise."""
    monkeypatch.setenv("FLASHMAP_DEBUG", "1")


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_help_explains_the_command(cmd, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(cmd + ["--help"])
    text = capsys.readouterr().out
    assert exit_.value.code == 0 and "--target" in text and "--out" in text
    if cmd[0] in ("train", "distill"):
        assert "--resume" in text and "--preset" in text and "flashmap features" in text


def test_qwen3_8b_preset_is_the_paper_and_options_override_it():
    args = argparse.Namespace(preset="qwen3-8b", steps=None, lr=None, warmup=None, batch_size=None, accum=None,
                              num_anchors=None, max_length=None, save_every=None)
    flow, shape = settings(args, "flow", "flashmap")
    assert (flow["steps"], flow["lr"], flow["num_anchors"]) == (39_000, 6e-4, 512)
    assert shape == dict(n_layers=6, width=2048, heads=16, block_size=16, context_window=3072)  # = max_length
    distill, _ = settings(args, "distill", "flashmap")
    assert (distill["steps"], distill["lr"]) == (23_000, 5e-5)
    args.steps, args.lr = 7, 1e-3
    assert settings(args, "flow", "flashmap")[0]["steps"] == 7
    args.warmup = 8  # a step count past the run's end: the peak learning rate would never be reached
    with pytest.raises(ValueError, match="--warmup 8: a step count longer than the run"):
        settings(args, "flow", "flashmap")
    args.warmup = 7
    assert settings(args, "flow", "flashmap")[0]["warmup"] == 7
    args.max_length, args.context_window = 512, None
    assert settings(args, "train-dflash", "dflash")[1]["context_window"] == 512
    args.context_window = 0  # --context-window none
    assert settings(args, "flow", "flashmap")[1]["context_window"] is None
    args.context_window = 100
    assert settings(args, "flow", "flashmap")[1]["context_window"] == 100
    assert "context_window" not in settings(argparse.Namespace(**{**vars(args), "context_window": None}),
                                            "train-eagle3", "eagle3")[1]
    with pytest.raises(ValueError, match="--context-window: FlashMap and DFlash drafters only"):
        settings(args, "train-eagle3", "eagle3")
    assert window_arg("none") == 0 and window_arg("384") == 384
    with pytest.raises(argparse.ArgumentTypeError, match="'none'"):
        window_arg("0")
    args.preset = "nope"
    with pytest.raises(ValueError, match="cpu-tiny"):
        settings(args, "flow", "flashmap")


@pytest.mark.parametrize("ratio", ["0", "-1", "inf", "wide"])
def test_mlp_ratio_must_be_a_positive_number(ratio, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "flow", "--target", "t", "--features", "f", "--out", "o",
                                   "--mlp-ratio", ratio])
    assert "--mlp-ratio" in capsys.readouterr().err


def test_tap_layer_names():
    assert tap_layers("flashmap", 36) == [1, 9, 17, 25, 33]
    assert tap_layers("eagle3", 36) == [1, 17, 32]
    assert tap_layers("3,5", 36) == [3, 5]
    with pytest.raises(ValueError, match="--layers"):
        tap_layers("middle", 36)


def test_cli_pipeline_on_tiny_random(tmp_path, capsys):
    conv = tmp_path / "conv.jsonl"
    conv.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"say {w}"},
                                                     {"role": "assistant", "content": "?"}]}) + "\n"
                            for w in ("one", "two", "three", "four", "five")))
    common = ["--target", "tiny-random", "--no-progress"]
    threads = torch.get_num_threads()
    assert main(["data", "regenerate", *common, "--data", str(conv), "--out", str(tmp_path / "regen.jsonl"),
                 "--max-new-tokens", "24", "--batch-size", "3", "--threads", "1"]) == 0
    assert torch.get_num_threads() == 1  # --threads reached torch
    torch.set_num_threads(threads)
    assert len((tmp_path / "regen.jsonl").read_text().splitlines()) == 5
    assert main(["features", *common, "--data", str(tmp_path / "regen.jsonl"), "--out", str(tmp_path / "f")]) == 0
    train_args = [*common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--batch-size", "2"]
    assert main(["train", "flow", *train_args, "--out", str(tmp_path / "flow"), "--steps", "3",
                 "--draft-vocab", "64", "--memory-width", "96", "--head-mlp", "48"]) == 0
    flow_cfg = json.loads((tmp_path / "flow" / "drafter" / "config.json").read_text())
    assert flow_cfg["memory_width"] == 96 and flow_cfg["width"] == 128  # cpu-tiny's trunk
    assert flow_cfg["head_mlp"] == 48
    assert flow_cfg["two_time"] is False and flow_cfg["draft_vocab_size"] == 64
    assert flow_cfg["tap_input_norm"] is False
    assert main(["train", "flow", *train_args, "--out", str(tmp_path / "qwen3"), "--steps", "2",
                 "--trunk", "qwen3", "--heads", "4", "--kv-heads", "2"]) == 0
    qwen_cfg = json.loads((tmp_path / "qwen3" / "drafter" / "config.json").read_text())
    assert (qwen_cfg["trunk"], qwen_cfg["kv_heads"], qwen_cfg["width"]) == ("qwen3", 2, qwen_cfg["d_target"])
    assert flow_cfg["context_window"] == 256  # cpu-tiny's max_length: the longest context training showed
    (tmp_path / "vocab.json").write_text(json.dumps({"ids": list(range(0, 257, 2))}))
    assert main(["train", "flow", *train_args, "--out", str(tmp_path / "flow2"), "--steps", "1",
                 "--draft-vocab", str(tmp_path / "vocab.json"), "--tap-input-norm", "--cond-dim", "16", "--mlp-ratio", "0.5",
                 "--joint-attention", "--tau-gated-input"]) == 0
    flow2_cfg = json.loads((tmp_path / "flow2" / "drafter" / "config.json").read_text())
    assert flow2_cfg["draft_vocab_size"] == 129 and flow2_cfg["tap_input_norm"] is True
    assert flow_cfg["cond_dim"] == 256 and flow2_cfg["cond_dim"] == 16
    assert flow_cfg["mlp_ratio"] == 4.0 and flow2_cfg["mlp_ratio"] == 0.5
    assert flow_cfg["joint_attention"] is False and flow2_cfg["joint_attention"] is True
    assert flow_cfg["tau_gated_input"] is False and flow2_cfg["tau_gated_input"] is True
    from safetensors.torch import load_file
    weights = load_file(tmp_path / "flow2" / "drafter" / "model.safetensors")
    assert weights["blocks.0.mlp.0.weight"].shape == (flow2_cfg["width"] // 2, flow2_cfg["width"])
    assert not any(".self_attn." in name for name in weights)  # one attention per block
    with pytest.raises(ValueError, match="--draft-vocab"):
        main(["train", "flow", *train_args, "--out", str(tmp_path / "flow3"), "--draft-vocab", "many"])
    with pytest.raises(ValueError, match="^--memory-width 96: --joint-attention shares"):
        main(["train", "flow", *train_args, "--out", str(tmp_path / "flow3"), "--memory-width", "96",
              "--joint-attention"])
    assert main(["distill", *train_args, "--teacher", str(tmp_path / "flow" / "drafter"),
                 "--out", str(tmp_path / "map"), "--steps", "2", "--frac-01", "1/8"]) == 0
    map_cfg = json.loads((tmp_path / "map" / "drafter" / "config.json").read_text())
    assert map_cfg["two_time"] is True and map_cfg["memory_width"] == 96 and map_cfg["head_mlp"] == 48  # the student keeps the teacher's shape
    assert map_cfg["target_layer_ids"] == flow_cfg["target_layer_ids"]  # the teacher's taps and window
    assert map_cfg["context_window"] == flow_cfg["context_window"]
    import shutil
    shutil.copytree(tmp_path / "flow" / "drafter", tmp_path / "teacher2")
    resumed = ["distill", *train_args, "--teacher", str(tmp_path / "teacher2"), "--out", str(tmp_path / "map3"),
               "--save-every", "1"]
    assert main([*resumed, "--steps", "1"]) == 0
    weights = load_file(tmp_path / "teacher2" / "model.safetensors")
    from safetensors.torch import save_file
    save_file({k: v + 1 if v.is_floating_point() else v for k, v in weights.items()},
              tmp_path / "teacher2" / "model.safetensors")  # the teacher retrained in place
    with pytest.raises(ValueError, match=r"^--teacher .*teacher2: its weights differ from those the run in"):
        main([*resumed, "--steps", "2", "--resume"])
    dflash = [*train_args, "--out", str(tmp_path / "dflash"), "--mask-token-id", "0", "--save-every", "1",
              "--log-every", "1"]
    assert main(["train", "dflash", *dflash, "--steps", "2"]) == 0
    assert main(["train", "dflash", *dflash, "--steps", "3", "--resume"]) == 0
    assert latest(str(tmp_path / "dflash")).endswith("step-00000003")
    dflash_cfg = json.loads((tmp_path / "dflash" / "drafter" / "config.json").read_text())
    assert qwen_cfg["rope_theta"] == dflash_cfg["rope_theta"]  # the qwen3 trunk takes the target's RoPE base, as DFlash
    steps = [json.loads(line)["step"] for line in (tmp_path / "dflash" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    kept = sorted(p.name for p in (tmp_path / "dflash" / "checkpoints").glob("step-*"))
    assert kept == ["step-00000002", "step-00000003"]  # the newest 2 by default
    assert main(["train", "dflash", *train_args, "--mask-token-id", "0", "--out", str(tmp_path / "dflash-all"), "--save-every", "1",
                 "--steps", "3", "--keep-checkpoints", "0"]) == 0
    kept = sorted(p.name for p in (tmp_path / "dflash-all" / "checkpoints").glob("step-*"))
    assert kept == ["step-00000001", "step-00000002", "step-00000003"]  # 0 keeps them all (learning curves)
    assert main(["generate", "--target", "tiny-random", "--drafter", str(tmp_path / "map" / "drafter"),
                 "--prompt", "say one", "--max-new-tokens", "8"]) == 0
    with pytest.raises(ValueError, match="cache holds"):  # EAGLE-3 taps other layers than the FlashMap cache
        main(["train", "eagle3", *train_args, "--out", str(tmp_path / "e3"), "--steps", "1"])
    with pytest.raises(ValueError, match="--tap-layers"):
        main(["train", "flow", *train_args, "--out", str(tmp_path / "flow4"), "--tap-layers", "one"])
    assert main(["features", *common, "--data", str(tmp_path / "regen.jsonl"), "--out", str(tmp_path / "f3"),
                 "--layers", "eagle3"]) == 0
    eagle = [*common, "--features", str(tmp_path / "f3"), "--preset", "cpu-tiny", "--batch-size", "2"]
    assert main(["train", "eagle3", *eagle, "--out", str(tmp_path / "e3"), "--steps", "2", "--ttt-steps", "3"]) == 0
    assert json.loads((tmp_path / "e3" / "drafter" / "config.json").read_text())["draft_vocab_size"] == 257
    # one cache of the union of taps serves both: flow reads --tap-layers, EAGLE-3 its own subset
    assert main(["features", *common, "--data", str(tmp_path / "regen.jsonl"), "--out", str(tmp_path / "fu"),
                 "--layers", "0,1,2"]) == 0
    union = [*common, "--features", str(tmp_path / "fu"), "--preset", "cpu-tiny", "--batch-size", "2"]
    capsys.readouterr()
    assert main(["train", "flow", *union, "--out", str(tmp_path / "flow5"), "--steps", "1", "--tap-layers", "1",
                 "--resume", "--draft-vocab", "1000"]) == 0
    err = capsys.readouterr().err  # a fresh --out under --resume, and a count above the target's rows, are said
    assert f"--resume: no checkpoint in {tmp_path / 'flow5'}" in err and "the draft vocabulary is all 257" in err
    assert json.loads((tmp_path / "flow5" / "drafter" / "config.json").read_text())["target_layer_ids"] == [1]
    assert main(["train", "eagle3", *union, "--out", str(tmp_path / "e4"), "--steps", "1", "--ttt-steps", "2",
                 "--draft-vocab", "64", "--intermediate-size", "32", "--frozen-lm-head"]) == 0
    e4 = json.loads((tmp_path / "e4" / "drafter" / "config.json").read_text())
    assert e4["draft_vocab_size"] == 64 and e4["intermediate_size"] == 32 and e4["frozen_lm_head"] is True


def tiny_feature_cache(tmp_path, words) -> list[str]:
    """Prompts "say <word>" answered by the tiny random target, their taps cached in tmp_path/f; returns the
    common CLI flags of the resume tests."""
    conv = tmp_path / "conv.jsonl"
    conv.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"say {w}"}]}) + "\n"
                            for w in words))
    common = ["--target", "tiny-random", "--no-progress"]
    assert main(["data", "regenerate", *common, "--data", str(conv), "--out", str(tmp_path / "r.jsonl"),
                 "--max-new-tokens", "8"]) == 0
    assert main(["features", *common, "--data", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "f")]) == 0
    return common


def test_features_into_a_cache_of_another_data_file_says_it_adds(tmp_path, capsys):
    """`features --out F --data other.jsonl` added other.jsonl's sequences to F without a word."""
    common = tiny_feature_cache(tmp_path, ("one",))
    capsys.readouterr()
    assert main(["features", *common, "--data", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "f")]) == 0
    assert "adding those of" not in capsys.readouterr().err  # the same file: a resumed cache
    other = tmp_path / "other.jsonl"
    record = json.loads((tmp_path / "r.jsonl").read_text().replace("say one", "say two"))
    other.write_text(json.dumps(record) + "\n")  # line 0 again: the id of r.jsonl's sequence, other tokens
    with pytest.raises(ValueError, match=r"ids repeat across the two files .* give the records distinct ids"):
        main(["features", *common, "--data", str(other), "--out", str(tmp_path / "f")])
    other.write_text(json.dumps({**record, "id": "two"}) + "\n")
    assert main(["features", *common, "--data", str(other), "--out", str(tmp_path / "f")]) == 0
    err = capsys.readouterr().err
    assert f"holds the sequences of --data {tmp_path / 'r.jsonl'}; adding those of {other}" in err, err
    assert FeatureCache(str(tmp_path / "f")).ids == ["0/0", "two/0"]
    manifest = json.loads((tmp_path / "f" / "manifest.json").read_text())  # each file's report, the first kept
    assert manifest["data"] == str(tmp_path / "r.jsonl") and manifest["samples"]["kept"] == 1
    assert manifest["added_data"][str(other)]["samples"]["kept"] == 1


def test_resume_checks_the_stage_before_touching_the_run(tmp_path, capsys, monkeypatch):
    """`train flow --resume` on a dflash run used to overwrite its run.json, then die in load_state_dict with
    a screenful of unexpected keys; an interrupted run used to end with the normal success line only."""
    common = tiny_feature_cache(tmp_path, ("one", "two", "three"))
    run = tmp_path / "dflash"
    args = [*common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--batch-size", "2",
            "--out", str(run), "--steps", "1"]
    assert main(["train", "dflash", *args, "--mask-token-id", "0"]) == 0
    with pytest.raises(ValueError, match="holds a 'dflash' run, not 'flow'.*flashmap train dflash"):
        main(["train", "flow", *args, "--resume"])
    with pytest.raises(FileExistsError, match="--resume"):
        main(["train", "flow", *args])
    assert json.loads((run / "run.json").read_text())["stage"] == "dflash"

    from flashmap_ext.train import runner
    real_train = runner.train
    monkeypatch.setattr(runner, "train", lambda *a, **kw: {**real_train(*a, **kw), "step": 1})  # as if stopped
    capsys.readouterr()
    # a stopped run exited 0, so `train ... && distill ...` went on with half-trained weights
    assert main(["train", "dflash", *args[:-1], "3", "--mask-token-id", "0", "--resume"]) == 130
    out, err = capsys.readouterr()
    assert "stopped by a signal at step 1 of 3" in err
    assert "drafter in" not in out  # the completion line used to follow the stop, as if the run had ended
    monkeypatch.setattr(runner, "train", lambda *a, **kw: {**real_train(*a, **kw), "step": 1, "signal": 15})
    assert main(["train", "dflash", *args[:-1], "4", "--mask-token-id", "0", "--resume"]) == 143  # SIGTERM


def test_resume_of_a_finished_run_says_it_is_complete(tmp_path, capsys):
    """`--resume` on a run already at --steps used to print 'loss nan': it trains nothing and says the run
    is complete, with its last logged loss."""
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    run = tmp_path / "flow"
    args = ["train", "flow", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--batch-size",
            "2", "--out", str(run), "--steps", "2", "--log-every", "1"]
    assert main(args) == 0
    logged = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    capsys.readouterr()
    assert main(args + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out
    assert f"already complete (step 2 of 2); nothing to train. Last logged loss {logged['loss']:.4f}" in out
    assert f"flow: step 2, loss {logged['loss']:.4f}" in out
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2   # nothing appended
    record = (run / "run.json").read_text()
    assert main(args[:-3] + ["1", "--log-every", "1", "--resume"]) == 0   # fewer --steps: still nothing to train
    assert "already complete (step 2 of 1)" in capsys.readouterr().out
    assert (run / "run.json").read_text() == record, "a run that trains nothing keeps its record"


def test_resume_refuses_flags_other_than_the_runs(tmp_path, capsys):
    """`--resume` with another --width ended in a screenful of load_state_dict size mismatches, and with another
    --lr went on silently (not the run it resumes); both now stop in one line naming the flag, before run.json
    is rewritten. --steps may change (a run is extended), as may the progress/logging flags."""
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    run = tmp_path / "flow"
    args = ["train", "flow", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--batch-size",
            "2", "--out", str(run), "--steps", "1"]
    assert main(args) == 0
    before = (run / "run.json").read_text()
    with pytest.raises(ValueError, match=r"^--resume: .* --width 64 \(the run's: not given: the default, under --preset cpu-tiny\)"):
        main(args + ["--resume", "--width", "64"])
    with pytest.raises(ValueError, match=r"--lr 0.005 \(the run's: not given: the default, under --preset cpu-tiny\).*--seed 3 \(the run's: 0\)"):
        main(args + ["--resume", "--lr", "5e-3", "--seed", "3"])
    assert (run / "run.json").read_text() == before
    capsys.readouterr()
    with pytest.raises(ValueError, match=r"--lr 0.005"):  # refused: no note about the schedule of --steps 3
        main(args[:-1] + ["3", "--resume", "--lr", "5e-3"])
    assert "schedule" not in capsys.readouterr().err
    (tmp_path / "x").mkdir()
    features_again = str(tmp_path / "x" / ".." / "f")  # the same folder, spelled differently
    assert main([*args[:6], features_again, *args[7:-1], "2", "--resume", "--log-every", "1"]) == 0
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
    import shutil
    shutil.copytree(run, tmp_path / "moved")  # a run copied elsewhere resumes there (--out may change)
    assert main([*args[:-3], str(tmp_path / "moved"), "--steps", "3", "--resume"]) == 0
    assert json.loads((tmp_path / "moved" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3
    assert "--resume: --steps 2 (the run so far: 1): the warmup and cosine schedule" in capsys.readouterr().err


def test_flow_trains_on_the_projected_clock_and_an_older_run_resumes_only_on_its_own(tmp_path):
    """New flow runs store the projected clock's table; a run started before --clock existed
    (run.json without it) trained on the full-state clock, and resuming it on another clock is refused."""
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    run = tmp_path / "flow"
    args = ["train", "flow", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--batch-size",
            "2", "--out", str(run), "--steps", "1"]
    assert main(args) == 0
    cfg = json.loads((run / "drafter" / "config.json").read_text())
    assert cfg["clock_t"][0] == 0.0 and cfg["clock_tau"][-1] == 1.0 and len(cfg["clock_t"]) == 81
    meta = json.loads((run / "run.json").read_text())
    del meta["args"]["clock"]  # as written before --clock existed
    (run / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"^--clock projected: .* resume it with --clock full-state"):
        main(args[:-1] + ["2", "--resume"])
    assert main(args[:-1] + ["2", "--resume", "--clock", "full-state"]) == 0
    assert json.loads((run / "drafter" / "config.json").read_text())["clock_t"] is None


def test_dflash_slot_decay_reaches_the_loss(tmp_path, monkeypatch):
    """`train dflash --slot-decay` (one flag for both drafters' slot weighting): the value reaches
    dflash_loss's gamma, 'auto' / no flag leaves DFlash's rule (None → default_gamma), a bad value is refused."""
    from flashmap_ext.train import dflash
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    seen = []
    real = dflash.dflash_loss
    monkeypatch.setattr(dflash, "dflash_loss", lambda *a, **kw: (seen.append(kw["gamma"]), real(*a, **kw))[1])
    args = ["train", "dflash", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny",
            "--batch-size", "2", "--steps", "1", "--mask-token-id", "0"]
    for i, (flag, gamma) in enumerate(((["--slot-decay", "7"], 7.0), ([], None), (["--slot-decay", "auto"], None))):
        seen.clear()
        assert main([*args, "--out", str(tmp_path / f"d{i}"), *flag]) == 0
        assert seen and set(seen) == {gamma}
    assert json.loads((tmp_path / "d0" / "run.json").read_text())["args"]["slot_decay"] == "7"
    with pytest.raises(ValueError, match="--slot-decay"):
        main([*args, "--out", str(tmp_path / "bad"), "--slot-decay", "0"])


def test_a_second_trainer_on_one_out_is_refused_while_the_first_runs(tmp_path, capsys, monkeypatch):
    """Two trainers started on one --out both ran, each overwriting the other's checkpoints and run.json."""
    from flashmap_ext.train.features import writer_lock
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    run = tmp_path / "dflash"
    argv = ["train", "dflash", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny",
            "--batch-size", "2", "--out", str(run), "--steps", "1", "--mask-token-id", "0"]
    capsys.readouterr()
    with writer_lock(str(run), "training run"):  # what the first trainer holds while it runs
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"pid {os.getpid()}" in err and "training run" in err and "another --out" in err, err
        assert err.count("\n") == 1 and not (run / "run.json").exists()
    assert main(argv) == 0  # the lock went with its holder
    assert (run / "drafter" / "model.safetensors").is_file()


def test_a_refused_start_leaves_no_run_folder(tmp_path, capsys, monkeypatch):
    """A start refused inside the trainer's lock (here --add-layers without --init-from) left an --out folder
    holding only writer.lock; a folder that was there before stays."""
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    argv = ["train", "dflash", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny",
            "--batch-size", "2", "--steps", "1", "--mask-token-id", "0", "--add-layers"]
    assert main([*argv, "--out", str(tmp_path / "new")]) == 2
    assert "--add-layers applies to the --init-from checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    assert main([*argv, "--out", str(tmp_path / "old")]) == 2
    assert (tmp_path / "old").is_dir()


def test_context_window_is_the_cache_crop_when_shorter(tmp_path):
    """A cache that `flashmap features --max-length 40` cropped shows training at most 40 positions, so the
    default window (--max-length, 256 in cpu-tiny) is 40; an explicit --context-window is kept."""
    conv = tmp_path / "conv.jsonl"
    conv.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"say {w} twice"},
                                                     {"role": "assistant", "content": f"{w} {w}, {w} {w}"}]}) + "\n"
                            for w in ("one", "two", "three")))
    common = ["--target", "tiny-random", "--no-progress"]
    assert main(["features", *common, "--data", str(conv), "--out", str(tmp_path / "f"), "--max-length", "40"]) == 0
    train = ["train", "flow", *common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--steps", "1",
             "--batch-size", "1", "--draft-vocab", "64"]
    assert main([*train, "--out", str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "drafter" / "config.json").read_text())["context_window"] == 40
    assert main([*train, "--out", str(tmp_path / "b"), "--context-window", "100"]) == 0
    assert json.loads((tmp_path / "b" / "drafter" / "config.json").read_text())["context_window"] == 100


def test_parallel_without_torchrun_says_one_process_trains(tmp_path, capsys, monkeypatch):
    """--parallel ddp outside torchrun has no process group: it trains in one process, and says so."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    common = tiny_feature_cache(tmp_path, ("one", "two"))
    args = [*common, "--features", str(tmp_path / "f"), "--preset", "cpu-tiny", "--batch-size", "2", "--steps", "1"]
    capsys.readouterr()
    assert main(["train", "flow", *args, "--out", str(tmp_path / "a"), "--parallel", "ddp"]) == 0
    assert "--parallel ddp: not started by torchrun (no WORLD_SIZE set): one process trains" in capsys.readouterr().err
    assert main(["train", "flow", *args, "--out", str(tmp_path / "b")]) == 0
    assert "torchrun" not in capsys.readouterr().err
