"""Error paths a user can reach from the CLI: each ends with exit code 2 and one
line on stderr naming the argument, never a traceback."""
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from flashmap_ext import cli
from flashmap_ext.target import load as target_load

TINY = ["--target", "tiny-random"]
ROOT = Path(__file__).resolve().parents[2]


def one_line_error(argv, capsys) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (code, err)
    return err


def test_unknown_hub_name_offline(monkeypatch, capsys):
    def offline(name, **kw):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find "
                      f"them in the cached files.\nCheck your internet connection or see how to run ... {name}")
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", offline)
    monkeypatch.setattr(target_load, "in_hub_cache", lambda name: True)  # reach the hub client's own error
    err = one_line_error(["generate", "--target", "nobody/nomodel", "--prompt", "x"], capsys)
    assert "--target nobody/nomodel" in err and "couldn't connect" in err


def test_directory_that_is_not_a_model(tmp_path, capsys):
    err = one_line_error(["generate", "--target", str(tmp_path), "--prompt", "x"], capsys)
    assert f"--target {tmp_path}" in err and "no config.json" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda(capsys):
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--device", "cuda"], capsys)
    assert "--device cuda" in err and "no CUDA device" in err


def test_bogus_device(capsys):
    assert "--device 'tpu'" in one_line_error(["generate", *TINY, "--prompt", "x", "--device", "tpu"], capsys)


def test_features_on_an_empty_dataset(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    err = one_line_error(["features", *TINY, "--data", str(tmp_path / "empty.jsonl"), "--out",
                          str(tmp_path / "f"), "--no-progress", "--device", "cpu"], capsys)
    assert "no conversation" in err


def test_bench_target_not_in_the_offline_cache(monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    def offline(name, **kw):
        raise OSError(f"We couldn't connect to 'https://huggingface.co'.\nCheck your connection ({name})")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", offline)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", offline)
    monkeypatch.setattr(target_load, "in_hub_cache", lambda name: True)  # reach the hub client's own error
    err = one_line_error(["bench", "--target", "nobody/nomodel", "--n", "1", "--no-peers"], capsys)
    assert "--target nobody/nomodel" in err and "couldn't connect" in err


# --- arguments are checked before any model loads ---------------------------
@pytest.fixture
def no_loads(monkeypatch):
    """Any target load fails the test: these errors must come first."""
    def refuse(*a, **kw):
        raise AssertionError("a model was loaded before the argument error")
    import flashmap_ext.commands.generate as generate_cmd
    import flashmap_ext.target as target_pkg
    monkeypatch.setattr(generate_cmd, "load_target", refuse)
    monkeypatch.setattr(target_pkg, "load_target", refuse)
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)


def argparse_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("flag, value, message", [
    ("--temperature", "-1", "expected a number >= 0, got -1.0"), ("--temperature", "nan", "expected a number >= 0"),
    ("--top-p", "0", "expected a number in (0, 1], got 0.0"), ("--top-p", "1.5", "in (0, 1]"),
    ("--top-k", "-2", "expected an integer >= 0, got -2"), ("--top-k", "x", "expected an integer >= 0, got 'x'")])
def test_generate_sampling_flags_are_checked_by_the_parser(flag, value, message, capsys, no_loads):
    err = argparse_error(["generate", *TINY, "--prompt", "x", flag, value], capsys)
    assert err.startswith(f"flashmap generate: error: argument {flag}") and message in err


def test_bench_temperature_is_checked_by_the_parser(capsys, no_loads):
    err = argparse_error(["bench", "--temperature", "-1", "--n", "1"], capsys)
    assert "argument --temperature" in err


def write_config(folder, change):
    cfg = json.loads((ROOT / "checkpoints" / "flashmap-map-qwen2.5-coder-0.5b" / "config.json").read_text())
    change(cfg)
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def test_drafter_type_checks_the_type_and_its_help_says_so(tmp_path, capsys, no_loads):
    """--drafter-type's help said "override the type read from the drafter's config.json",
    but a checkpoint of another type was refused (it checks, it cannot convert): help and error now agree."""
    from flashmap_ext.drafters.load import check_drafter
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices["generate"]
    entry = next(a.help for a in sub._actions if "--drafter-type" in a.option_strings)
    assert "override" not in entry and "check that --drafter is of this type" in entry, entry
    path = write_config(tmp_path / "fm", lambda cfg: None)  # a FlashMap checkpoint's config
    (tmp_path / "fm" / "model.safetensors").write_bytes(b"")  # check_drafter wants the weights file there
    assert check_drafter(path, "flashmap") == "flashmap" == check_drafter(path)
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--drafter", path, "--drafter-type", "dflash"], capsys)
    assert f"--drafter-type dflash: --drafter {path} is a FlashMap checkpoint" in err
    assert "cannot change it" in err, err


@pytest.fixture
def bench_no_loads(monkeypatch):
    """`flashmap bench` must fail before its target loads."""
    from flashmap_ext.bench import run as bench_run
    monkeypatch.setattr(bench_run, "load_target", lambda *a, **kw: pytest.fail("the target loaded first"))


def test_bench_checks_checkpoints_and_out_before_the_target_loads(tmp_path, capsys, bench_no_loads):
    """`bench --drafter /nonexistent` loaded the 0.5B target (48 s) before saying
    so; `--out FILE` loaded it, then said only "[Errno 17] File exists"."""
    fm = write_config(tmp_path / "fm", lambda cfg: None)  # a FlashMap checkpoint's config
    (tmp_path / "fm" / "model.safetensors").write_bytes(b"")
    base = ["bench", "--n", "1", "--no-peers", "--out", str(tmp_path / "out")]
    err = one_line_error([*base, "--drafter", str(tmp_path / "nope")], capsys)
    assert f"--drafter {tmp_path / 'nope'}" in err, err
    err = one_line_error([*base, "--dflash", fm], capsys)
    assert f"--dflash {fm} is a FlashMap checkpoint (its config.json says so); --dflash takes a DFlash" in err, err
    (tmp_path / "file").write_text("x")
    err = one_line_error(["bench", "--n", "1", "--drafter", fm, "--out", str(tmp_path / "file")], capsys)
    assert f"--out {tmp_path / 'file'}: a file is there" in err, err


def test_demo_names_its_own_option_for_a_checkpoint_of_another_type(tmp_path, capsys):
    """`demo --drafter <a DFlash checkpoint>` blamed --drafter-type, which demo lacks."""
    dflash = tiny_drafter("dflash", tmp_path / "d")
    err = one_line_error(["demo", "--drafter", dflash], capsys)
    assert "--drafter-type" not in err and f"--drafter {dflash} is a DFlash checkpoint" in err, err
    assert "--drafter takes a FlashMap checkpoint" in err, err


def test_generate_bad_drafter_config_before_the_target_loads(tmp_path, capsys, no_loads):
    path = write_config(tmp_path / "d", lambda cfg: cfg.update(n_layers="two"))
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--drafter", path], capsys)
    assert "field n_layers: expected an integer, got 'two'" in err and "config.json" in err
    path = write_config(tmp_path / "e", lambda cfg: cfg.pop("block_size"))
    assert "missing field block_size" in one_line_error(["generate", *TINY, "--prompt", "x", "--drafter", path], capsys)


def test_generate_tree_needs_a_tree_drafter_before_the_target_loads(capsys, no_loads):
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--drafter", "random", "--tree", "7,10,16"], capsys)
    assert "--tree needs an EAGLE-3 drafter" in err
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--block-tree", "topk"], capsys)
    assert "--block-tree needs --drafter and --tree" in err


@pytest.mark.parametrize("shape, K", [(["--block-tree", "topk"], 8), (["--block-tree", "multinoise"], 8),
                                      (["--lookup"], 10)])
def test_tree_deeper_than_the_drafters_k_is_refused_naming_the_flag(shape, K, capsys):
    """A block drafter drafts K tokens (random: 8; the lookup hybrid max(10 lookup tokens, 8)): --tree with a
    depth above K was cut to K without a word."""
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--drafter", "random", *shape,
                          "--tree", f"{K + 1},2,{K + 4}"], capsys)
    assert f"--tree {K + 1},2,{K + 4}: depth {K + 1} exceeds" in err and f"K = {K}" in err


def test_eval_missing_heldout_names_the_option(tmp_path, capsys, no_loads):
    err = one_line_error(["eval", "--heldout", str(tmp_path / "nope"), "--drafter", "A=random"], capsys)
    assert f"--heldout {tmp_path / 'nope'}: no such file or folder" in err and "Errno" not in err


@pytest.mark.parametrize("extra, message", [
    (["--slots", "0"], "--slots: must be >= 1"), (["--per-domain", "0"], "--per-domain: must be >= 1"),
    (["--drafter", "nameless"], "expected NAME=DIR"), (["--drafter", "A=random:3"], "STEPS must be 1 or 2"),
    # a repeated NAME kept only the last drafter: one column where two were asked for
    (["--drafter", "A=random", "--drafter", "A=random:2"], "--drafter A=random:2: NAME A is already used")])
def test_eval_arguments_before_the_target_loads(tmp_path, capsys, no_loads, extra, message):
    (tmp_path / "h.jsonl").write_text("")
    argv = ["eval", "--heldout", str(tmp_path / "h.jsonl"), *extra]
    if "--drafter" not in extra:
        argv += ["--drafter", "A=random"]
    assert message in one_line_error(argv, capsys)


def test_eval_bad_drafter_checkpoint_before_the_target_loads(tmp_path, capsys, no_loads):
    (tmp_path / "h.jsonl").write_text("")
    path = write_config(tmp_path / "d", lambda cfg: cfg.update(format_version=7))
    err = one_line_error(["eval", "--heldout", str(tmp_path / "h.jsonl"), "--drafter", f"A={path}"], capsys)
    assert "format_version 7 is newer" in err
    err = one_line_error(["eval", "--heldout", str(tmp_path / "h.jsonl"), "--drafter", f"A={tmp_path}/none"], capsys)
    assert "no such directory" in err


@pytest.mark.parametrize("argv, needle", [
    (["--drafter", "random", "--auto", "--tree", "8,2,16"], "--auto picks the draft shape itself: drop --tree"),
    (["--drafter", "random", "--auto", "--lookup"], "drop --lookup"),
    (["--drafter", "random", "--drafter-type", "eagle3"], "--drafter-type eagle3"),
    (["--drafter", "random-eagle3", "--steps", "2"], "--steps: FlashMap drafters only (got eagle3)"),
    (["--steps", "2"], "--steps: FlashMap drafters only (got no drafter)"),
    (["--drafter", "random-eagle3", "--draws", "4"], "--draws: FlashMap drafters only (got eagle3)"),
    (["--drafter", "random-eagle3", "--context-window", "64"], "--context-window: FlashMap and DFlash"),
    (["--lookup", "--tree", "4,2,8"], "--lookup --tree needs --drafter"),  # the tree was silently a chain
    # --tree shaped the lookup hybrid's branches; the top-k tree drafted a plain chain inside it, unsaid
    (["--drafter", "random", "--lookup", "--block-tree", "topk", "--tree", "8,2,16"],
     "--lookup --block-tree topk --tree: --tree is the lookup hybrid's two branches with --lookup and the "
     "drafter's topk tree with --block-tree: give one of --lookup, --block-tree"),
    (["--drafter", "random", "--lookup", "--block-tree", "multinoise", "--tree", "4,2,8"], "give one of --lookup"),
])
def test_conflicting_or_ignored_flags_are_refused_before_any_load(argv, needle, monkeypatch, capsys):
    """--auto with --tree/--lookup, --drafter-type on a random drafter, --steps on a drafter
    without draft steps, --lookup --tree without --drafter used to run silently, the flags ignored."""
    from flashmap_ext.commands import generate as gen

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the arguments were checked")
    monkeypatch.setattr(gen, "load_target", no_load)
    err = one_line_error(["generate", *TINY, "--prompt", "x", *argv], capsys)
    assert needle in err, err


def test_prompt_longer_than_the_context_is_one_line(capsys):
    """It printed '[max-new-tokens cut to 0 ...]' and then a second error line."""
    from flashmap_ext.target import TINY as NAME
    from flashmap_ext.target import load_target
    context = load_target(NAME, "fp32", "cpu")[0].max_positions
    err = one_line_error(["generate", *TINY, "--prompt", "hello " * context, "--max-new-tokens", "4"], capsys)
    assert "--prompt:" in err and f"context is {context}" in err and "cut to" not in err


@pytest.mark.parametrize("argv, needle", [
    (["demo", "--max-new-tokens", "-1"], "--max-new-tokens: expected an integer >= 1"),
    (["generate", *TINY, "--prompt", "x", "--context-window", "0"], "expected an integer >= 1 or 'none'"),
    (["demo", "--threads", "-2"], "--threads: expected an integer >= 0 (0 = auto), got -2"),
    (["bench", "--threads", "-2"], "--threads: expected an integer >= 0 (0 = auto), got -2"),
    (["data", "generate", "--out", "x", "--threads", "-2"], "--threads: expected an integer >= 0 (0 = auto)"),
    (["demo", "--threads", "two"], "--threads: expected an integer >= 0 (0 = auto), got 'two'"),
])
def test_checked_at_parse(argv, needle, capsys):
    """demo --max-new-tokens -1 used to load the model and fail inside the first prompt; demo --threads -2
    ran the whole demo (set_threads took any negative count for auto)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and needle in err and err.count("\n") == 1, err


@pytest.mark.parametrize("command", [["demo"], ["bench"], ["data", "generate", "--out", "x"]])
@pytest.mark.parametrize("text, threads", [("0", 0), ("3", 3)])
def test_threads_zero_is_auto_and_stays_valid(command, text, threads):
    assert cli.build_parser().parse_args([*command, "--threads", text]).threads == threads


@pytest.mark.parametrize("command, flag", [
    (["data", "generate", "--out", "x"], f) for f in ("--limit", "--max-new-tokens", "--batch-size", "--refill-at",
                                                       "--per-domain", "--records-per-part", "--flush-every")
] + [(["data", "regenerate", "--data", "in.jsonl", "--out", "o.jsonl"], f)
     for f in ("--limit", "--batch-size", "--max-new-tokens")])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_data_counts_below_one_are_argparse_errors(command, flag, value, capsys):
    """`data generate` used to take --batch-size 0 or --limit -3 and fail (or do
    nothing) only after the target loaded; now argparse refuses them in one line, naming the option."""
    err = argparse_error([*command, flag, value], capsys)
    assert flag in err and f"expected an integer >= 1, got {value}" in err, err


@pytest.mark.parametrize("flag, value, message", [
    ("--temperature", "-1", "expected a number >= 0, got -1.0"), ("--temperature", "nan", "expected a number >= 0"),
    ("--top-p", "7", "expected a number in (0, 1], got 7.0")])
def test_data_regenerate_sampling_is_checked_like_generate(flag, value, message, capsys):
    """`data regenerate --temperature -1` (or nan, or --top-p 7) ran and wrote
    greedy data, since any temperature not > 0 meant greedy there; generate and bench refused them."""
    err = argparse_error(["data", "regenerate", "--data", "in.jsonl", "--out", "o.jsonl", flag, value], capsys)
    assert flag in err and message in err, err


def test_generate_context_window_none_runs(capsys):
    assert cli.main(["generate", *TINY, "--drafter", "random", "--prompt", "hi", "--max-new-tokens", "3",
                     "--context-window", "none"]) == 0


def test_unbuilt_extension_says_make_build():
    """`flashmap --help` while `make` was still compiling said 'cannot import name _C ...
    (most likely due to a circular import)'."""
    import subprocess
    import sys
    code = ("import sys\n"
            "class NotBuilt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'flashmap_ext._C':\n"
            "            raise ImportError(\"cannot import name '_C' from 'flashmap_ext'\")\n"
            "sys.meta_path.insert(0, NotBuilt())\n"
            "import flashmap_ext\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 1 and "is not built in this checkout: run `make build`" in run.stderr, run.stderr


# --- drafter errors name the option that gave the path (review leftovers) -----------------------------
def tiny_drafter(kind: str, folder, hidden_size: int = 64, vocab_size: int = 257):
    """A small drafter of `kind` saved to `folder`, built for a tiny Qwen3 of that hidden size / vocabulary
    (tiny-random: 64 / 257)."""
    from conftest import tiny_qwen3
    from flashmap_ext.drafters.dflash import DFlashDrafter
    from flashmap_ext.drafters.eagle3 import Eagle3Drafter
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    model = tiny_qwen3(vocab_size=vocab_size, hidden_size=hidden_size)
    build = {"flashmap": lambda: FlashMapDrafter.for_target(model, n_layers=1, width=64, heads=4, block_size=4),
             "dflash": lambda: DFlashDrafter.for_target(model, mask_token_id=vocab_size - 1, block_size=4,
                                                        num_hidden_layers=1),
             "eagle3": lambda: Eagle3Drafter.for_target(model, num_draft_tokens=3),
             "eagle3-frozen-head": lambda: Eagle3Drafter.for_target(model, num_draft_tokens=3,
                                                                    frozen_lm_head=True)}[kind]
    build().save_pretrained(folder)
    return str(folder)


def drafter_argv(command: str, path: str, tmp_path) -> list:
    if command == "generate":
        return ["generate", *TINY, "--prompt", "hi", "--max-new-tokens", "2", "--drafter", path]
    (tmp_path / "h.jsonl").write_text(json.dumps({"domain": "x", "text": "hello world " * 4}) + "\n")
    return ["eval", *TINY, "--heldout", str(tmp_path / "h.jsonl"), "--drafter", f"A={path}",
            "--out", str(tmp_path / "out")]


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_truncated_drafter_weights_name_the_drafter_option(command, tmp_path, capsys):
    """The message named the file only (`.../model.safetensors (FlashMap drafter): unreadable, ...`)."""
    path = tiny_drafter("flashmap", tmp_path / "d")
    weights = tmp_path / "d" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    err = one_line_error(drafter_argv(command, path, tmp_path), capsys)
    assert f"error: --drafter {weights} (FlashMap drafter): unreadable, truncated or corrupt" in err, err


@pytest.mark.parametrize("argv", [[], ["--drafter-type", "flashmap"]])
def test_drafter_dir_without_config_says_what_was_expected(argv, tmp_path, capsys, no_loads):
    """It said '--drafter DIR: no config.json there' (without --drafter-type: not even --drafter)."""
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--drafter", str(tmp_path), *argv], capsys)
    assert (f"--drafter {tmp_path}: no config.json there (expected a drafter checkpoint directory: config.json "
            "+ model.safetensors)") in err, err


def test_demo_drafter_dir_without_config_before_the_assets_load(tmp_path, monkeypatch, capsys):
    """demo fetched and loaded the real target first, then exited 1 with a bare line."""
    import flashmap_ext.commands.demo as demo

    def no_fetch():
        raise AssertionError("the assets were fetched before the --drafter error")
    monkeypatch.setattr(demo, "fetch_assets", no_fetch)
    err = one_line_error(["demo", "--drafter", str(tmp_path)], capsys)
    assert f"flashmap demo: error: --drafter {tmp_path}: no config.json there (expected" in err, err


@pytest.mark.parametrize("command", ["demo", "generate"])
def test_drafter_dir_without_weights_before_any_load(command, tmp_path, monkeypatch, capsys, no_loads):
    """demo --drafter DIR with config.json but no model.safetensors loaded the 0.5B target first and only
    then failed: check_drafter read the config alone."""
    import flashmap_ext.commands.demo as demo

    def no_fetch():
        raise AssertionError("the assets were fetched before the --drafter error")
    monkeypatch.setattr(demo, "fetch_assets", no_fetch)
    config = ROOT / "checkpoints" / "flashmap-flow-qwen2.5-coder-0.5b" / "config.json"
    (tmp_path / "config.json").write_text(config.read_text())
    argv = ["demo"] if command == "demo" else ["generate", *TINY, "--prompt", "x"]
    err = one_line_error([*argv, "--drafter", str(tmp_path)], capsys)
    assert (f"flashmap {command}: error: --drafter {tmp_path} (FlashMap drafter): no model.safetensors or "
            "model.safetensors.index.json there") in err, err


@pytest.mark.parametrize("kind, shape, field", [
    ("flashmap", {"hidden_size": 32}, "d_target 32 != the target's hidden size 64"),
    ("flashmap", {"vocab_size": 300}, "vocab_size 300 != the target's vocabulary (embedding rows) 257"),
    ("dflash", {"hidden_size": 32}, "hidden_size 32 != the target's hidden size 64"),
    ("dflash", {"vocab_size": 250}, "vocab_size 250 != the target's vocabulary (embedding rows) 257"),
    ("eagle3", {"vocab_size": 300}, "vocab_size 300 != the target's vocabulary (embedding rows) 257"),
    # a frozen-head checkpoint gathered its head rows from the target first (IndexError)
    ("eagle3-frozen-head", {"vocab_size": 300}, "vocab_size 300 != the target's vocabulary (embedding rows) 257"),
    ("eagle3-frozen-head", {"hidden_size": 32}, "hidden_size 32 != the target's hidden size 64"),
])
@pytest.mark.parametrize("command", ["generate", "eval"])
def test_drafter_for_another_target_names_both_options_and_the_field(command, kind, shape, field, tmp_path,
                                                                     capsys):
    """The message was e.g. 'target hidden size 64 != drafter hidden_size 32': no option named (and a DFlash
    drafter for a smaller vocabulary was not refused at all)."""
    path = tiny_drafter(kind, tmp_path / "d", **shape)
    err = one_line_error(drafter_argv(command, path, tmp_path), capsys)
    assert f"error: --drafter {path} does not fit --target: " in err and field in err, err


@pytest.mark.parametrize("argv, bound", [
    (["generate", *TINY, "--prompt", "x"], 63), (["bench", "--n", "1"], 63),
    (["data", "regenerate", *TINY, "--data", "d.jsonl", "--out", "o.jsonl"], 32),  # seed·2**32 + crc32 seeds torch
    (["train", "flow", *TINY, "--features", "f", "--out", "o"], 63),
    (["distill", *TINY, "--teacher", "t", "--features", "f", "--out", "o"], 63)])
@pytest.mark.parametrize("seed", ["-1", "bound", "1.5"])
def test_seed_outside_its_range_is_refused_at_parse(argv, bound, seed, capsys, no_loads):
    """--seed -1 was accepted (2**63 failed after the target had loaded; data regenerate overflowed torch's
    seed from 2**32 on). Every command: [0, 2**63), data regenerate [0, 2**32)."""
    text = str(2**bound) if seed == "bound" else seed
    err = argparse_error([*argv, "--seed", text], capsys)
    shown = repr(text) if seed == "1.5" else text
    assert f"argument --seed: expected an integer in [0, 2**{bound}), got {shown}" in err, err


def test_ctrl_c_prints_one_line_and_exits_130(monkeypatch, capsys):
    from flashmap_ext.commands import generate

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(generate, "run", interrupted)  # the parser is built per call: it binds this one
    code = cli.main(["generate", "--target", "tiny-random", "--prompt", "x"])
    out, err = capsys.readouterr()
    assert code == 130 and err.count("\n") == 1 and "Traceback" not in err and "interrupted" in err, (code, err)
    # generate's message spoke of train/distill, and was glued onto the streamed text
    assert err == "flashmap generate: interrupted\n" and out.endswith("\n"), (out, err)


def test_ctrl_c_before_a_training_run_saved_a_checkpoint_does_not_point_to_resume(monkeypatch, capsys, tmp_path):
    """Ctrl-C while the target loaded said 'rerun with --resume ... from the newest checkpoint', of which there
    was none; once a checkpoint exists it does."""
    from flashmap_ext.commands import train

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(train, "run_flow", interrupted)
    argv = ["train", "flow", "--target", "tiny-random", "--features", "f", "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 130
    assert capsys.readouterr().err == ("flashmap train flow: interrupted; no checkpoint was saved yet: rerun the "
                                       "same command to start again\n")
    (tmp_path / "run" / "checkpoints" / "step-00000010").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step-00000010\n")
    assert cli.main(argv) == 130
    assert "rerun with --resume to continue from the newest checkpoint" in capsys.readouterr().err


def test_ctrl_c_while_the_commands_load_prints_one_line(monkeypatch, capsys):
    def loading():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", loading)
    code = cli.main(["generate", "--target", "tiny-random", "--prompt", "x"])
    err = capsys.readouterr().err
    assert code == 130 and err == "flashmap: interrupted while starting; nothing was run\n", (code, err)


def test_an_empty_prompt_is_named_before_anything_loads(capsys):
    code = cli.main(["generate", "--target", "/nonexistent/target", "--prompt", ""])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("flashmap generate: error: --prompt: empty"), (code, err)


def test_options_are_never_abbreviated(capsys):
    """`demo --n 4` parsed as `--no-auto 4`'s abbreviation (argparse allow_abbrev);
    a prefix of an option is now an unknown argument, reported by the subcommand."""
    err = argparse_error(["demo", "--n", "4"], capsys)
    assert err.startswith("flashmap demo: error: unrecognized arguments: --n 4"), err
    assert cli.build_parser().parse_args(["demo", "--no-auto"]).auto is False


@pytest.mark.parametrize("command", [["eval"], ["bench"], ["data", "generate", "--out", "x"]])
def test_unknown_argument_names_the_subcommand(command, capsys):
    """`flashmap eval --bogus` said `flashmap: error:`, not which command refused it."""
    err = argparse_error([*command, "--bogus"], capsys)
    assert err.startswith(f"flashmap {command[0]}: error: unrecognized arguments: --bogus"), err


@pytest.fixture
def runner_no_loads(monkeypatch):
    import flashmap_ext.target as target_pkg
    monkeypatch.setattr(target_pkg, "load_target", lambda *a, **k: pytest.fail("the target loaded before the check"))
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)


@pytest.mark.parametrize("command, out_is", [
    (["features", *TINY], "folder"), (["data", "regenerate", *TINY], "file")])
def test_data_and_out_paths_are_checked_before_the_target_loads(command, out_is, tmp_path, capsys,
                                                                runner_no_loads):
    """`features --data missing` gave a bare Errno after loading the target, and
    `data regenerate --data missing` glued its error onto the weights' progress bar."""
    data, a_file, a_folder = tmp_path / "d.jsonl", tmp_path / "f", tmp_path / "dir"
    a_file.write_text("x")
    a_folder.mkdir()
    err = one_line_error([*command, "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")], capsys)
    assert f"--data {tmp_path / 'missing.jsonl'}: no such file or folder" in err, err
    data.write_text("")
    wrong = a_file if out_is == "folder" else a_folder
    err = one_line_error([*command, "--data", str(data), "--out", str(wrong)], capsys)
    assert f"--out {wrong}: a {'file' if out_is == 'folder' else 'folder'} is there" in err, err
    err = one_line_error([*command, "--data", str(data), "--out", str(a_file / "sub")], capsys)
    assert f"--out {a_file / 'sub'}: {a_file} is a file, not a folder" in err, err


def test_features_refuses_a_folder_of_other_files_before_the_target_loads(tmp_path, capsys, runner_no_loads):
    """`features --out runs/flow/drafter` wrote its shards among a drafter's config.json and weights."""
    data, drafter = tmp_path / "d.jsonl", tmp_path / "drafter"
    data.write_text("")
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    err = one_line_error(["features", *TINY, "--data", str(data), "--out", str(drafter)], capsys)
    assert f"--out {drafter}: a folder that holds other files (config.json) and no feature cache" in err, err


def test_features_refuses_a_topk_past_the_vocabulary_and_leaves_no_folder(tmp_path, capsys):
    """--topk 999999999 failed inside the cache writer ("topk: ..."), leaving a manifest, index and lock."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    err = one_line_error(["features", *TINY, "--data", str(data), "--out", str(tmp_path / "f"), "--topk",
                          "999999999"], capsys)
    assert "--topk 999999999: at most the target's vocabulary size - 1 (256)" in err, err
    assert not (tmp_path / "f").exists()


def test_regenerate_refuses_an_out_that_is_not_its_own_output_before_the_target_loads(tmp_path, capsys,
                                                                                    runner_no_loads):
    """`data regenerate --out F` where F is --data itself or any jsonl without ids ended in a KeyError traceback
    (or a bare JSON error) after the target had loaded."""
    data = tmp_path / "conv.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    err = one_line_error(["data", "regenerate", *TINY, "--data", str(data), "--out", str(data)], capsys)
    assert f"--out {data}: the same file as --data" in err, err
    other = tmp_path / "other.jsonl"
    for text in ('{"messages": []}\n', "# notes\n"):
        other.write_text('{"id": "a"}\n' + text)
        err = one_line_error(["data", "regenerate", *TINY, "--data", str(data), "--out", str(other)], capsys)
        assert f"--out {other}: line 2 is not an answered record with an \"id\"" in err, err


def test_regenerate_refuses_to_resume_with_other_settings(tmp_path, capsys):
    """A rerun with --max-new-tokens 20 --temperature 1 --thinking appended answers of another recipe to the file
    without a word."""
    data, out = tmp_path / "conv.jsonl", tmp_path / "answers.jsonl"
    data.write_text("".join(f'{{"id": "c{i}", "messages": [{{"role": "user", "content": "hi {i}"}}]}}\n'
                            for i in range(2)))
    base = ["data", "regenerate", *TINY, "--data", str(data), "--out", str(out), "--no-progress",
            "--max-new-tokens", "4"]
    assert cli.main([*base, "--limit", "1"]) == 0
    capsys.readouterr()
    err = one_line_error([*base[:-1], "20", "--temperature", "1", "--thinking"], capsys)
    assert ("its answers were made with other settings: --max-new-tokens 20 (the file's: 4); --temperature 1.0 "
            "(the file's: 0.0); --thinking True (the file's: False)") in err, err
    assert cli.main(base) == 0  # the same settings: the rest is added
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["c0", "c1"]


def test_regenerate_makes_the_out_folder_and_says_when_nothing_was_answered(tmp_path, capsys):
    """--out in a folder that did not exist ended in a bare Errno 2; with nothing to answer it said "wrote 0
    conversations to X" of a file it never made."""
    data = tmp_path / "conv.jsonl"
    data.write_text('{"messages": [{"role": "system", "content": "no user turn"}]}\n')
    out = tmp_path / "new" / "answers.jsonl"
    assert cli.main(["data", "regenerate", *TINY, "--data", str(data), "--out", str(out), "--no-progress"]) == 0
    assert "no conversation of --data" in capsys.readouterr().err and not out.exists()
    data.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert cli.main(["data", "regenerate", *TINY, "--data", str(data), "--out", str(out), "--no-progress",
                     "--max-new-tokens", "4"]) == 0
    assert "wrote 1 conversations" in capsys.readouterr().err and out.exists()


def test_data_generate_into_a_file_names_out_before_the_target_loads(tmp_path, capsys, monkeypatch):
    from flashmap_ext.data import generate
    monkeypatch.setattr(generate, "load_engine", lambda *a, **k: pytest.fail("the target loaded before the check"))
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    (tmp_path / "f.jsonl").write_text("x")
    err = one_line_error(["data", "generate", *TINY, "--out", str(tmp_path / "f.jsonl")], capsys)
    assert f"--out {tmp_path / 'f.jsonl'}: a file is there (expected a folder); give a corpus folder" in err, err


@pytest.mark.parametrize("config, kind", [({"model_type": "flashmap_drafter"}, "a FlashMap"),
                                          ({"architectures": ["DFlashDraftModel"]}, "a DFlash")])
def test_a_drafter_passed_as_target_is_named(config, kind, tmp_path, capsys, no_loads):
    """Swapping --target and --drafter failed in the tokenizer, blaming sentencepiece."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    err = one_line_error(["generate", "--target", str(tmp_path), "--prompt", "x"], capsys)
    assert f"--target {tmp_path}: this is {kind} drafter checkpoint, not a target model" in err, err


def test_convert_to_a_file_names_the_destination(tmp_path, capsys):
    """`convert SRC FILE` printed a bare '[Errno 17] File exists'."""
    (tmp_path / "f").write_text("x")
    err = one_line_error(["convert", str(ROOT / "checkpoints" / "dflash-qwen2.5-coder-0.5b"), str(tmp_path / "f"),
                          "--to", "dflash"], capsys)
    assert f"dst {tmp_path / 'f'}: a file is there (expected a folder)" in err, err


@pytest.mark.parametrize("drafter, shape, message", [
    ("checkpoints/dflash-qwen2.5-coder-0.5b", "multinoise", "--block-tree multinoise: for a FlashMap drafter only"),
    ("random", "selector", "--block-tree selector: for a DFlash2 drafter only"),
    ("checkpoints/eagle3-qwen2.5-coder-0.5b", "topk", "--block-tree topk: for a FlashMap, DFlash or DFlash2 drafter")])
def test_block_tree_of_another_drafter_is_refused_before_the_target_loads(capsys, no_loads, drafter, shape, message):
    """A DFlash checkpoint with a multi-noise tree used to stream the prompt's first token, then fail."""
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--drafter", drafter, "--block-tree", shape,
                          "--tree", "4,2,8"], capsys)
    assert message in err, err


def test_drafter_given_as_its_weights_file_names_the_folder(tmp_path, capsys, no_loads):
    """A path to model.safetensors said '<file>: no config.json there', as if it were a folder."""
    path = tiny_drafter("flashmap", tmp_path / "d")
    weights = Path(path) / "model.safetensors"
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--drafter", str(weights)], capsys)
    assert f"--drafter {weights}: a file, not a drafter checkpoint directory" in err, err
    assert f"pass the folder that holds it ({path})" in err, err


def test_drafter_given_as_a_runs_latest_pointer_names_the_runs_drafter(tmp_path, capsys, no_loads):
    """RUN/checkpoints/latest used to point to RUN/checkpoints, which holds no config.json either."""
    run = tmp_path / "run"
    tiny_drafter("flashmap", run / "drafter")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("step-00000010\n")
    err = one_line_error(["generate", *TINY, "--prompt", "x", "--drafter", str(run / "checkpoints" / "latest")],
                         capsys)
    assert f"the trained drafter of this run is {run / 'drafter'}" in err, err


@pytest.mark.parametrize("teacher, message", [
    ("missing", "--teacher {p}: no such directory"),
    ("dflash", "--teacher {p}/config.json: not a FlashMap checkpoint"),
    ("map", "--teacher {p}: a distilled flow map (two_time=True), not a flow model"),
])
def test_distill_teacher_is_named_before_the_target_loads(teacher, message, tmp_path, capsys, no_loads):
    path = tmp_path / teacher
    if teacher == "dflash":
        tiny_drafter("dflash", path)
    elif teacher == "map":
        tiny_drafter("flashmap", path)
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, "two_time": True}))
    err = one_line_error(["distill", *TINY, "--teacher", str(path), "--features", str(tmp_path / "f"),
                          "--out", str(tmp_path / "o")], capsys)
    assert message.format(p=path) in err, err


def test_train_features_that_are_not_a_cache_name_the_option(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    err = one_line_error(["train", "flow", *TINY, "--features", str(tmp_path / "empty"), "--out",
                          str(tmp_path / "o"), "--preset", "cpu-tiny"], capsys)
    assert f"--features {tmp_path / 'empty'}: not a feature cache (no manifest.json)" in err, err


def test_tap_layers_outside_the_target_name_the_option():
    from types import SimpleNamespace

    from flashmap_ext.train.runner import tap_layers
    assert tap_layers(SimpleNamespace(tap_layers="0,3"), (), 4) == [0, 3]
    for spec in ("5", "1,4", "-1"):
        with pytest.raises(ValueError, match=f"^--tap-layers {spec}: the target has 4 layers \\(ids 0 to 3\\)$"):
            tap_layers(SimpleNamespace(tap_layers=spec), (), 4)


def test_trunk_options_that_do_not_fit(tmp_path, capsys):
    flow = ["train", "flow", *TINY, "--features", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
            "--preset", "cpu-tiny", "--device", "cpu"]
    assert "--kv-heads 2: only --trunk qwen3" in one_line_error([*flow, "--kv-heads", "2"], capsys)
    err = one_line_error([*flow, "--trunk", "qwen3", "--width", "100"], capsys)
    assert "--width 100: --trunk qwen3 runs at the target's hidden size" in err
    err = one_line_error([*flow, "--trunk", "qwen3", "--head-mlp", "8"], capsys)
    assert "--head-mlp: not with --trunk qwen3" in err
    assert "--kv-heads 3: must divide --heads 4" in one_line_error([*flow, "--trunk", "qwen3", "--kv-heads", "3"],
                                                                 capsys)


def test_runtime_errors_name_the_stage_as_the_parser_does(tmp_path, capsys):
    """A refusal raised while `train flow` runs used to say `flashmap train: error:` while the same stage's
    argument errors say `flashmap train flow: error:`."""
    argv = ["train", "flow", *TINY, "--features", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]
    err = one_line_error(argv, capsys)
    assert err.startswith("flashmap train flow: error: "), err
    with pytest.raises(SystemExit):
        cli.main([*argv, "--steps", "x"])
    parse_err = capsys.readouterr().err
    assert parse_err.startswith("flashmap train flow: error: argument --steps"), parse_err
