"""scripts/need_disk.py: the Makefile's disk preflight refuses with one line, against the real free space."""
import shutil
import subprocess
import sys


def run(gib):
    return subprocess.run([sys.executable, "scripts/need_disk.py", str(gib), ".", ".venv (test)"],
                          capture_output=True, text=True)


def test_refuses_more_than_is_free_and_names_the_step():
    free_gib = shutil.disk_usage(".").free / 2**30
    r = run(free_gib * 2 + 1)
    assert r.returncode == 1 and r.stderr.startswith("not enough disk for .venv (test)")
    assert r.stderr.count("\n") == 1


def test_passes_when_it_fits():
    r = run(0.001)
    assert r.returncode == 0 and r.stderr == ""
