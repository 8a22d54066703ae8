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


def cuda_include() -> pathlib.Path:
    """The CUDA toolkit's include directory (scripts/cuda_home.sh); skips the test without one."""
    home = subprocess.run([str(ROOT / "scripts" / "cuda_home.sh")], capture_output=True, text=True)
    inc = pathlib.Path(home.stdout.strip() or "/nonexistent") / "include"
    if home.returncode or not (inc / "cuda_runtime_api.h").is_file():
        pytest.skip("no CUDA toolkit headers (scripts/cuda_home.sh)")
    return inc
