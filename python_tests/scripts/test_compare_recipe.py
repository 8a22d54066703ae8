"""recipes/compare_drafters.sh: the bench rows each drafter gets, with trees and chains only (TREES)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "compare_drafters.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def rows(drafter: str, trees: str | None) -> str:
    """The recipe's `rows DRAFTER` with TREES unset (None) or set, the checkpoints named F, D and D2."""
    set_trees = "unset TREES" if trees is None else f"TREES={trees}"
    script = f"{set_trees}; FLOW=F DFLASH=D DFLASH2=D2; source {RECIPE}; rows {drafter}"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return out.stdout.strip()



def test_default_rows_are_the_chain_and_trees_of_16_and_32():
    assert rows("flow", None) == "--drafter F --methods FlashMap-1,FlashMap-1 top-k 16,FlashMap-1 top-k 32"
    assert rows("dflash", None) == "--dflash D --methods DFlash,DFlash top-k 16,DFlash top-k 32"
    assert rows("dflash2", None) == "--dflash D2 --methods DFlash2,DFlash2 selector 16,DFlash2 selector 32"


def test_empty_trees_gives_chains_only():
    assert rows("flow", "") == "--drafter F --methods FlashMap-1"
    assert rows("dflash", "") == "--dflash D --methods DFlash"
    assert rows("dflash2", "") == "--dflash D2 --methods DFlash2"


def test_one_tree_size():
    assert rows("dflash", "32") == "--dflash D --methods DFlash,DFlash top-k 32"


def test_sourcing_runs_nothing():
    out = subprocess.run(["bash", "-c", f"source {RECIPE}; echo sourced"], capture_output=True, text=True,
                         check=True, timeout=30)
    assert out.stdout.strip() == "sourced"
