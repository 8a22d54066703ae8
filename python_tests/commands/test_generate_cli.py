"""`flashmap generate` end to end on the built-in tiny random target (no weights, no downloads)."""
import io
import json

import pytest
import torch

from flashmap_ext import cli
from flashmap_ext.commands.generate import TextStream
from flashmap_ext.drafters.common.checkpoint import CheckpointError
from flashmap_ext.drafters.load import checkpoint_type, load_drafter
from flashmap_ext.target import ByteTokenizer
from flashmap_ext.target import load_target as load_target_and_tokenizer
from support.cli_runs import BASE, run_cli


def test_generate_streams_text_and_stats(capsys):
    """A random FlashMap drafter at T = 0 prints exactly the autoregressive text, then γ and tokens/s."""
    ar_out, ar_err = run_cli(BASE, capsys)
    spec_out, spec_err = run_cli(BASE + ["--drafter", "random", "--steps", "2"], capsys)
    assert spec_out == ar_out and ar_out.endswith("\n")
    assert "γ = 1.00" in ar_err and "tokens/s" in ar_err
    assert "24 tokens" in spec_err and "γ = " in spec_err
    best_out, _ = run_cli(BASE + ["--drafter", "random", "--draws", "3"], capsys)
    assert best_out == ar_out
    assert "no effect" not in ar_err
    greedy_out, greedy_err = run_cli(BASE + ["--top-k", "5", "--top-p", "0.5"], capsys)  # ignored, now said
    assert greedy_out == ar_out and "[--top-k and --top-p: no effect at --temperature 0" in greedy_err


@pytest.mark.parametrize("kind", ["flashmap", "dflash"])
def test_drafter_checkpoint_round_trip_through_the_cli(kind, tmp_path, capsys):
    target, _ = load_target_and_tokenizer("tiny-random", torch.float32, "cpu")
    if kind == "flashmap":
        from flashmap_ext.drafters.flashmap import FlashMapDrafter
        drafter = FlashMapDrafter.for_target(target, n_layers=1, width=64, heads=4, block_size=4)
    else:
        from flashmap_ext.drafters.dflash import DFlashDrafter
        drafter = DFlashDrafter.for_target(target, mask_token_id=200, block_size=4, num_hidden_layers=1)
    drafter.save_pretrained(tmp_path)
    assert checkpoint_type(str(tmp_path)) == kind
    assert type(load_drafter(str(tmp_path), target)) is type(drafter)
    ar_out, _ = run_cli(BASE, capsys)
    spec_out, spec_err = run_cli(BASE + ["--drafter", str(tmp_path), "--drafter-type", kind], capsys)
    assert spec_out == ar_out and "24 tokens" in spec_err


def test_tree_decoding_with_random_eagle3(capsys):
    """--tree with a random EAGLE-3 drafter prints exactly the autoregressive text at T = 0."""
    ar_out, _ = run_cli(BASE, capsys)
    tree_out, tree_err = run_cli(BASE + ["--drafter", "random-eagle3", "--tree", "3,4,8"], capsys)
    assert tree_out == ar_out and "24 tokens" in tree_err and "γ = " in tree_err


@pytest.mark.parametrize("extra, message", [
    (["--drafter", "random-eagle3", "--tree", "7,10"], "DEPTH,TOPK,NODES"),
    (["--drafter", "random", "--tree", "7,10,16"], "EAGLE-3")])
def test_tree_argument_errors(extra, message, capsys):
    try:
        code = cli.main(BASE + extra)
    except SystemExit as done:  # argparse's own errors
        code = done.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_checkpoint_type_errors(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        checkpoint_type(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Foo"], "model_type": "bar"}))
    with pytest.raises(ValueError, match="unknown drafter type.*its config.json must name it"):
        checkpoint_type(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    assert checkpoint_type(str(tmp_path)) == "eagle3"


def test_text_stream_holds_back_partial_utf8():
    out = io.StringIO()
    stream = TextStream(ByteTokenizer(), out)
    data = list("aé€".encode("utf-8"))  # 1 + 2 + 3 bytes
    seen = []
    for b in data:
        stream([b])
        seen.append(out.getvalue())
    stream.finish()
    assert seen == ["a", "a", "aé", "aé", "aé", "aé€"] and out.getvalue() == "aé€\n"


def test_byte_tokenizer_round_trips_invalid_utf8():
    """A random byte-level target emits invalid UTF-8; decode used to turn it into U+FFFD (42% of the
    characters `data regenerate` wrote for tiny-random), so drafters trained on text the target never said.
    Now decode → json → encode gives back the ids, and streaming still holds back a cut-off sequence."""
    tok, gen = ByteTokenizer(), torch.Generator().manual_seed(0)
    for _ in range(200):
        ids = torch.randint(0, 256, (int(torch.randint(1, 40, (1,), generator=gen)),), generator=gen).tolist()
        text = json.loads(json.dumps(tok.decode(ids + [65]), ensure_ascii=False))  # 'A' ends any cut sequence
        assert tok.encode(text) == ids + [65]
    assert tok.encode("héllo €") == list("héllo €".encode("utf-8"))
    assert tok.decode(list("€".encode("utf-8"))[:2]) == "\ufffd"
    out = io.StringIO()
    stream = TextStream(tok, out)
    for b in [0xFF, 0xE2, 0x82, 0xAC, 0x41]:
        stream([b])
    stream.finish()
    assert tok.encode(out.getvalue()[:-1]) == [0xFF, 0xE2, 0x82, 0xAC, 0x41]


def test_negative_max_new_tokens_is_an_argument_error(capsys):
    """It used to print nothing and exit 0."""
    with pytest.raises(SystemExit):
        cli.main(BASE[:-4] + ["--max-new-tokens", "-3"])
    assert "expected an integer >= 0" in capsys.readouterr().err


def test_missing_paths_name_the_argument(tmp_path):
    with pytest.raises(FileNotFoundError, match="--target .*no such file or directory"):
        load_target_and_tokenizer(str(tmp_path / "nope"), torch.float32, "cpu")
    with pytest.raises(CheckpointError, match="--drafter .*no such directory"):
        checkpoint_type(str(tmp_path / "nope"))
    run = tmp_path / "run"
    (run / "drafter").mkdir(parents=True)
    (run / "drafter" / "config.json").write_text("{}")
    (run / "checkpoints" / "step-00000001").mkdir(parents=True)
    (run / "checkpoints" / "step-00000001" / "state.json").write_text("{}")
    with pytest.raises(ValueError, match="the trained drafter of this run is .*drafter"):
        checkpoint_type(str(run))
    with pytest.raises(ValueError, match="training checkpoint"):
        checkpoint_type(str(run / "checkpoints" / "step-00000001"))


def test_user_errors_print_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    assert cli.main(["generate", "--target", "/nonexistent/model", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("flashmap generate: error: --target /nonexistent/model")


def test_builtin_target_name_resolves_to_the_offline_model(tmp_path, monkeypatch):
    """`--target qwen2.5-coder-0.5b` used to go to the hub; it is the cached offline model, as in `bench`
    (the one resolver, assets.models.resolve_target). Here a tiny model stands in for the cached one."""
    from transformers import AutoTokenizer

    from conftest import tiny_qwen3
    from flashmap_ext.assets import models as assets
    tiny_qwen3(vocab_size=97).save_pretrained(tmp_path)
    monkeypatch.setattr(assets, "qwen05_dir", lambda download=True: tmp_path)
    asked = []
    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        lambda path, **kw: asked.append(path) or ByteTokenizer())
    for name in ("qwen2.5-coder-0.5b", "Qwen/Qwen2.5-Coder-0.5B-Instruct"):
        target, _ = load_target_and_tokenizer(name, torch.float32, "cpu")
        assert target.vocab_size == 97
    assert asked == [str(tmp_path)] * 2


def test_auto_dtype_is_the_bench_rule(monkeypatch):
    """One auto-dtype rule (bench.machine.auto_dtype) for generate, bench and demo."""
    from flashmap_ext.bench import machine
    from flashmap_ext.commands import generate
    seen = []

    def fake_loader(name, dtype, device=None):
        seen.append(dtype)
        raise KeyboardInterrupt  # stop before generating
    monkeypatch.setattr(generate, "load_target", fake_loader)
    monkeypatch.delenv("FLASHMAP_DEBUG", raising=False)
    for rule, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        monkeypatch.setattr(machine, "auto_dtype", lambda rule=rule: rule)
        assert cli.main(["generate", "--target", "tiny-random", "--prompt", "hi"]) == 130  # Ctrl-C: one line, 130
    assert seen == [torch.bfloat16, torch.float32]


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit):
        cli.main(argv + ["--help"])
    return " ".join(capsys.readouterr().out.split())


def test_data_help_names_every_action(capsys):
    """`flashmap data --help` lists each subcommand the parser really has (not only `regenerate`)."""
    data = next(a for a in cli.build_parser()._subparsers._group_actions[0].choices["data"]._actions
                if a.dest == "action")
    text = _help(["data"], capsys)
    assert set(data.choices) == {"regenerate", "generate"}
    for action in data.choices:
        assert f"flashmap data {action}" in text


def test_generate_help_says_which_drafters_draw_trees(capsys):
    """--tree works for block drafters too (--block-tree, --lookup): the help must not say EAGLE-3 only."""
    text = _help(["generate"], capsys)
    start = text.rindex("--tree DEPTH,TOPK,NODES")   # the option's entry, not the usage line
    tree_help = text[start:text.index("--steps", start)]
    assert "--block-tree" in tree_help and "--lookup" in tree_help and "EAGLE-3 drafters)" not in tree_help


def test_threads_sets_torchs_intra_op_threads_and_is_checked(capsys):
    import torch
    before = torch.get_num_threads()
    try:
        out, _ = run_cli(BASE + ["--threads", "1"], capsys)
        assert out and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(SystemExit):
        cli.main(["generate", "--target", "tiny-random", "--prompt", "hi", "--threads", "-2"])
    assert "--threads" in capsys.readouterr().err
