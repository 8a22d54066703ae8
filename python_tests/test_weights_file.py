"""Weight files get the permissions `open()` gives any other file (0666 minus the umask), not safetensors' 0600."""
import os
import stat

import pytest
import torch

from flashmap_ext.drafters.flashmap import FlashMapDrafter
from flashmap_ext.target import tiny_random_model
from flashmap_ext.target.model import Target
from flashmap_ext.weights_file import save_weights


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_weights_and_a_saved_drafter_are_readable_by_others(tmp_path, umask_022):
    save_weights({"w": torch.zeros(2)}, tmp_path / "w.safetensors")
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert mode(tmp_path / "w.safetensors") == mode(plain) == 0o644
    drafter = FlashMapDrafter.for_target(Target(tiny_random_model()), "cpu-tiny", init="random")
    drafter.save_pretrained(tmp_path / "d")
    assert mode(tmp_path / "d" / "model.safetensors") == 0o644


def test_the_umask_still_applies(tmp_path):
    old = os.umask(0o077)
    try:
        save_weights({"w": torch.zeros(2)}, tmp_path / "w.safetensors")
    finally:
        os.umask(old)
    assert mode(tmp_path / "w.safetensors") == 0o600
