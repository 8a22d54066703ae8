"""Broken drafter checkpoints: a missing directory, a malformed or empty config.json, a
truncated model.safetensors, another kind's checkpoint. The API raises CheckpointError (a ValueError) with
one line naming the path, what is wrong and the drafter kind its config names; the CLI exits 2 with that
line and no traceback."""
import json

import pytest
import torch

from flashmap_ext import cli
from flashmap_ext.drafters.common.checkpoint import CheckpointError
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.eagle3 import Eagle3Drafter
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.drafters.load import load_drafter
from flashmap_ext.target import load_target as load_target_and_tokenizer

CLASSES = {"flashmap": FlashMapDrafter, "dflash": DFlashDrafter, "eagle3": Eagle3Drafter}
LABELS = {"flashmap": "FlashMap", "dflash": "DFlash", "eagle3": "EAGLE-3"}


@pytest.fixture(scope="module")
def target():
    return load_target_and_tokenizer("tiny-random", torch.float32, "cpu")[0]


def save(kind: str, target, path):
    torch.manual_seed(0)
    if kind == "flashmap":
        drafter = FlashMapDrafter.for_target(target, n_layers=1, width=64, heads=4, block_size=4)
    elif kind == "dflash":
        drafter = DFlashDrafter.for_target(target, mask_token_id=200, block_size=4, num_hidden_layers=1)
    else:
        drafter = Eagle3Drafter.for_target(target, num_draft_tokens=3)
    drafter.save_pretrained(path)
    return path


def broken(kind: str, damage: str, target, tmp_path):
    """A checkpoint directory of `kind` with `damage`; returns (path, the file the error must name)."""
    path = save(kind, target, tmp_path / kind)
    config, weights = path / "config.json", path / "model.safetensors"
    if damage == "missing dir":
        return tmp_path / "nowhere", tmp_path / "nowhere"
    if damage == "malformed config":
        config.write_text(config.read_text()[:40])
        return path, config
    if damage == "empty config":
        config.write_text("{}")
        return path, config
    if damage == "no weights":
        weights.unlink()
        return path, path
    data = weights.read_bytes()  # truncated weights: the header survives, the tensors do not
    weights.write_bytes(data[:len(data) // 2] if damage == "truncated weights" else data[:5])
    return path, weights


DAMAGES = ["missing dir", "malformed config", "empty config", "no weights", "truncated weights",
           "truncated header"]
WHAT = {"missing dir": "no such directory", "malformed config": "not valid JSON", "empty config": "empty",
        "no weights": "no model.safetensors", "truncated weights": "truncated or corrupt",
        "truncated header": "truncated or corrupt"}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("kind", CLASSES)
def test_api_error_is_one_line_naming_path_problem_and_kind(kind, damage, target, tmp_path):
    path, named = broken(kind, damage, target, tmp_path)
    for load in (lambda: CLASSES[kind].from_pretrained(path, target), lambda: load_drafter(str(path), target)):
        with pytest.raises(CheckpointError) as err:
            load()
        message = str(err.value)
        assert "\n" not in message and str(named) in message and WHAT[damage] in message, message
        if damage in ("no weights", "truncated weights", "truncated header"):  # the config still says
            assert f"{LABELS[kind]} drafter" in message, message


@pytest.mark.parametrize("kind, other", [("flashmap", "dflash"), ("dflash", "eagle3"), ("eagle3", "flashmap")])
def test_loading_another_kinds_checkpoint_names_both(kind, other, target, tmp_path):
    path = save(other, target, tmp_path / other)
    with pytest.raises(CheckpointError, match=f"not an? {LABELS[kind]} checkpoint.*{LABELS[other]} drafter"):
        CLASSES[kind].from_pretrained(path, target)


@pytest.mark.parametrize("damage", DAMAGES)
def test_cli_exits_2_with_one_line(damage, target, tmp_path, capsys):
    path, named = broken("flashmap", damage, target, tmp_path)
    code = cli.main(["generate", "--target", "tiny-random", "--prompt", "hi", "--max-new-tokens", "4",
                     "--dtype", "fp32", "--drafter", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1 and str(named) in err, err


def test_config_json_that_is_not_an_object(target, tmp_path):
    path = save("flashmap", target, tmp_path / "list")
    (path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(CheckpointError, match="not a JSON object"):
        FlashMapDrafter.from_pretrained(path, target)
