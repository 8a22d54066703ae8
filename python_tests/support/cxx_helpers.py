"""C++ test drivers for host-side code of csrc/ (plans, shared-memory rules, the counter pool): compiled with
the system C++ compiler against csrc/ alone (no torch), then run as a subprocess by the tests."""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def build_driver(tmp_path_factory, name: str, source: str, *flags: str) -> pathlib.Path:
    """The executable of `source` (C++17, -O1, -I csrc plus `flags`); skips the test without a compiler."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path_factory.mktemp(name) / f"{name}.cpp"
    src.write_text(source)
    exe = src.with_suffix("")
    subprocess.run([cxx, "-std=c++17", "-O1", "-I", str(ROOT / "csrc"), *flags, str(src), "-o", str(exe)], check=True)
    return exe
