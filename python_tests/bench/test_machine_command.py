"""The command line recorded with every figure names the program as a user types it (`describe`)."""
import sys

from flashmap_ext.bench import machine


def test_module_runs_are_recorded_as_the_flashmap_command(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/x/flashmap_ext/cli.py", "bench", "--target", "tiny-random"])
    assert machine.describe()["command"] == "flashmap bench --target tiny-random"
    monkeypatch.setattr(sys, "argv", ["/x/.venv/bin/flashmap", "eval", "--out", "a b"])
    assert machine.describe()["command"] == "flashmap eval --out 'a b'"
