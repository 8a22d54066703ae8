"""`flashmap generate` end to end on the built-in tiny random target (no weights, no downloads)."""
import io
import json

import pytest
import torch

from flashmap_ext import cli
from flashmap_ext.commands.generate import (ByteTokenizer, TextStream, checkpoint_type, load_drafter,
                                            load_target_and_tokenizer)

BASE = ["generate", "--target", "tiny-random", "--prompt", "Hello, world", "--max-new-tokens", "24",
        "--dtype", "fp32"]


def run_cli(argv, capsys):
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_generate_streams_text_and_stats(capsys):
    """A random FlashMap drafter at T = 0 prints exactly the autoregressive text, then γ and tokens/s."""
    ar_out, ar_err = run_cli(BASE, capsys)
    spec_out, spec_err = run_cli(BASE + ["--drafter", "random", "--steps", "2"], capsys)
    assert spec_out == ar_out and ar_out.endswith("\n")
    assert "γ = 1.00" in ar_err and "tokens/s" in ar_err
    assert "24 tokens" in spec_err and "γ = " in spec_err


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
    with pytest.raises(SystemExit) as err:
        cli.main(BASE + extra)
    assert message in str(err.value) + capsys.readouterr().err


def test_checkpoint_type_errors(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        checkpoint_type(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Foo"], "model_type": "bar"}))
    with pytest.raises(ValueError, match="unknown drafter type.*--drafter-type"):
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
