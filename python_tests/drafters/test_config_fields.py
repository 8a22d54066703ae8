"""Drafter config.json fields as a user gets them wrong: a wrong JSON type names the field,
a missing block_size is refused (not defaulted), an unknown format_version is refused. The configs are
the committed checkpoints' own files with one field changed; nothing is loaded past config.json."""
import json
from pathlib import Path

import pytest

from flashmap_ext.drafters.common.checkpoint import CheckpointError, UnsupportedCheckpoint
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.eagle3 import Eagle3Drafter
from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.drafters.load import check_drafter

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = {kind: ROOT / "checkpoints" / f"{name}-qwen2.5-coder-0.5b"
             for kind, name in (("flashmap", "flashmap-map"), ("dflash", "dflash"), ("eagle3", "eagle3"))}
CLASSES = {"flashmap": FlashMapDrafter, "dflash": DFlashDrafter, "eagle3": Eagle3Drafter}


def config_dir(tmp_path, kind, change=lambda cfg: None):
    cfg = json.loads((COMMITTED[kind] / "config.json").read_text())
    change(cfg)
    folder = tmp_path / kind
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def set_field(path, value):
    def change(cfg):
        *parents, name = path.split(".")
        node = cfg
        for p in parents:
            node = node[p]
        node[name] = value
    return change


def load(kind, folder):
    return CLASSES[kind].from_pretrained(folder, None)


@pytest.mark.parametrize("kind, field, value", [
    ("flashmap", "n_layers", "two"), ("flashmap", "width", 384.5), ("flashmap", "two_time", "yes"),
    ("flashmap", "target_layer_ids", [1, "6"]), ("flashmap", "softcap", "30"), ("flashmap", "draft_vocab_size", 1.5),
    ("flashmap", "block_size", True),
    ("dflash", "num_hidden_layers", "two"), ("dflash", "block_size", "9"), ("dflash", "rms_norm_eps", "1e-6"),
    ("dflash", "dflash_config.mask_token_id", "151665"), ("dflash", "dflash_config.target_layer_ids", "1,6"),
    ("dflash", "attention_bias", "false"),
    ("eagle3", "num_hidden_layers", "one"), ("eagle3", "hidden_size", "896"), ("eagle3", "frozen_lm_head", 1),
    ("eagle3", "eagle_config.eagle_aux_hidden_state_layer_ids", [1, 11.5, 20]),
])
def test_a_wrong_typed_field_is_named(tmp_path, kind, field, value):
    folder = config_dir(tmp_path, kind, set_field(field, value))
    with pytest.raises(CheckpointError) as err:
        load(kind, folder)
    message = str(err.value)
    assert f"field {field}:" in message and repr(value) in message and "\n" not in message, message
    assert str(folder / "config.json") in message


@pytest.mark.parametrize("kind, field", [("flashmap", "block_size"), ("flashmap", "n_layers"),
                                         ("flashmap", "softcap"), ("dflash", "block_size")])
def test_a_missing_field_is_refused_not_defaulted(tmp_path, kind, field):
    folder = config_dir(tmp_path, kind, lambda cfg: cfg.pop(field))
    with pytest.raises(CheckpointError, match=f"missing field {field}"):
        load(kind, folder)
    with pytest.raises(CheckpointError, match=f"missing field {field}"):
        check_drafter(str(folder))  # what the commands call before loading a target


def test_dflash_block_size_from_dflash_config_still_reads(tmp_path):
    from flashmap_ext.drafters.dflash.config import DFlashConfig
    cfg = json.loads((COMMITTED["dflash"] / "config.json").read_text())
    block = cfg.pop("block_size")
    cfg["dflash_config"]["block_size"] = block
    assert DFlashConfig.from_hf_dict(cfg).block_size == block


@pytest.mark.parametrize("version, error, message", [
    (2, UnsupportedCheckpoint, "format_version 2 is newer"), (0, CheckpointError, "field format_version: expected 1"),
    ("1", CheckpointError, "field format_version: expected 1, got '1'"),
    (None, CheckpointError, "field format_version: expected 1, got None")])
def test_an_unknown_format_version_is_refused(tmp_path, version, error, message):
    folder = config_dir(tmp_path, "flashmap", set_field("format_version", version))
    with pytest.raises(error, match=message):
        load("flashmap", folder)


def test_the_committed_configs_parse(tmp_path):
    for kind in ("flashmap", "dflash"):
        folder = config_dir(tmp_path, kind)
        (folder / "model.safetensors").write_bytes(b"")  # check_drafter wants the weights file there
        assert check_drafter(str(folder)) == kind
