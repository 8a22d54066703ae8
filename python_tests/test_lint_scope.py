"""`make lint` runs ruff on every tracked Python folder (python_tests_vllm was left out)."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDORED = {"third_party"}  # excluded from ruff in pyproject.toml


def test_make_lint_covers_every_python_folder():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    folders = {Path(f).parts[0] for f in tracked if len(Path(f).parts) > 1} - VENDORED
    line = re.search(r"ruff check (.+)", (ROOT / "Makefile").read_text()).group(1).split()
    assert folders and folders <= set(line), sorted(folders - set(line))
