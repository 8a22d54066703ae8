"""setup.py: a CUDA build without the CUTLASS headers stops at once with what to do (it used to fail inside
nvcc on a missing <cute/...> include, e.g. `pip install .` with a CUDA torch on a fresh clone)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import runpy, sys, torch
from torch.utils import cpp_extension
torch.version.cuda, cpp_extension.CUDA_HOME = "12.8", "/usr/local/cuda"  # as if torch were a CUDA build
sys.argv = ["setup.py", "--name"]
runpy.run_path("setup.py")
"""


def _probe(tmp_path, with_cutlass: bool):
    shutil.copy(ROOT / "setup.py", tmp_path / "setup.py")
    (tmp_path / "csrc").mkdir()
    if with_cutlass:
        (tmp_path / "third_party" / "cutlass" / "include" / "cute").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("CUTLASS_DIR", "FLASHMAP_CUDA")}
    return subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_cuda_build_without_cutlass_says_make_cutlass(tmp_path):
    res = _probe(tmp_path, with_cutlass=False)
    assert res.returncode != 0 and "make cutlass" in res.stderr and "FLASHMAP_CUDA=0" in res.stderr


def test_cuda_build_with_cutlass_gets_past_the_check(tmp_path):
    res = _probe(tmp_path, with_cutlass=True)
    assert res.returncode == 0, res.stderr
