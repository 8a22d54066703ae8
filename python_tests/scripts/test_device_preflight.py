"""`make device-preflight` (benches/device_check.sh --preflight), run on a fresh copy of this checkout — the
files git does not ignore, in a new git repository, as a clone has them: it passes once
third_party/cutlass-min is there, and otherwise fails in one line that names what would fail on the GPU
machine (cutlass-min missing, a step's file absent, shares that do not sum to the budget)."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def clone(tmp_path):
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    dst = tmp_path / "clone"
    for rel in filter(None, out.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    subprocess.run(["git", "init", "-q", str(dst)], check=True)
    subprocess.run(["git", "-C", str(dst), "add", "-A"], check=True)
    return dst


def add_cutlass_min(clone: pathlib.Path):
    """The real `make cutlass-min` output when it is built here, else a stand-in with the one path the
    preflight checks (CI runs the tests before `make cuda-check` builds it)."""
    real, dst = ROOT / "third_party" / "cutlass-min", clone / "third_party" / "cutlass-min"
    if (real / "include" / "cute").is_dir():
        shutil.copytree(real, dst)
    else:
        (dst / "include" / "cute").mkdir(parents=True)
        (dst / "include" / "cute" / "config.hpp").write_text("// stand-in for `make cutlass-min`\n")


def preflight(clone: pathlib.Path, **env) -> tuple[int, list[str]]:
    done = subprocess.run(["bash", "benches/device_check.sh", "--preflight"], cwd=clone, capture_output=True,
                          text=True, env={**os.environ, "PYTHON": sys.executable, **env}, timeout=120)
    return done.returncode, (done.stdout + done.stderr).splitlines()


def test_it_passes_after_make_cutlass_min(clone):
    add_cutlass_min(clone)
    rc, lines = preflight(clone)
    assert rc == 0 and len(lines) == 1 and lines[0].startswith("device preflight ok: 11 steps"), lines


def test_it_fails_in_one_line_without_cutlass_min(clone):
    rc, lines = preflight(clone)
    assert rc == 1 and len(lines) == 1, lines
    assert lines[0] == "device preflight FAILED: third_party/cutlass-min is missing: run `make cutlass-min`"


def test_it_fails_when_a_step_file_is_absent(clone):
    add_cutlass_min(clone)
    (clone / "benches" / "bench_round.py").unlink()
    rc, lines = preflight(clone)
    assert rc == 1 and lines == ["device preflight FAILED: step bench_round: benches/bench_round.py is missing"]


def test_it_fails_when_the_shares_do_not_sum_to_the_budget(clone):
    add_cutlass_min(clone)
    rc, lines = preflight(clone, BUDGET_S="600")
    assert rc == 1 and len(lines) == 1 and "not BUDGET_S - 10 = 590s" in lines[0], lines
