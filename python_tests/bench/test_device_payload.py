"""What a GPU run sends fits the device tool's limit (issue 11): the tracked files plus the paths that
benches/device_check.sh's documented command carries, at most 56 MiB (the tool refuses more than 64 MiB;
8 MiB stay free for untracked files and growth). Sizes are read from the checkout (`git ls-files`) and
from the carried folders when they are built here; a carried folder that is not built (CI does not build
third_party/cutlass-min before the tests) counts at the bound that scripts/cutlass_min.py enforces when it
builds it — never at zero."""
import importlib.util
import json
import os
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIMIT = 56 * 2**20
spec = importlib.util.spec_from_file_location("cutlass_min", ROOT / "scripts" / "cutlass_min.py")
cutlass_min = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cutlass_min)
CARRY_BOUNDS = {"third_party/cutlass-min": int(cutlass_min.MAX_MIB * 2**20)}  # bytes, enforced when built


def tracked_bytes() -> int:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = [ROOT / p for p in out.decode().split("\0") if p]
    return sum(os.lstat(p).st_size for p in paths if os.path.lexists(p))


def folder_bytes(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def documented_carry() -> list[str]:
    """The carry list of the one command in device_check.sh's header (the README shows the same one)."""
    header = (ROOT / "benches" / "device_check.sh").read_text()
    m = re.search(r'run\(command="bash benches/device_check.sh", carry=(\[[^\]]*\]), timeout_s=(\d+)\)', header)
    assert m, "device_check.sh's header must show the one run(...) command"
    readme = (ROOT / "README.md").read_text()
    assert m.group(0) in readme, "README's Status must show the same command as device_check.sh's header"
    return json.loads(m.group(1))


def test_the_device_payload_fits():
    tracked = tracked_bytes()
    total, parts = tracked, [f"tracked {tracked / 2**20:.1f} MiB"]
    for path in documented_carry():
        assert path in CARRY_BOUNDS, f"carry {path}: record its size bound here (and enforce it where it is built)"
        built = ROOT / path
        size = folder_bytes(built) if built.is_dir() else CARRY_BOUNDS[path]
        if built.is_dir():
            assert size <= CARRY_BOUNDS[path], f"{path} is {size / 2**20:.1f} MiB, over its bound"
        total += size
        parts.append(f"{path} {size / 2**20:.1f} MiB ({'built' if built.is_dir() else 'bound'})")
    print("device payload:", ", ".join(parts), f"= {total / 2**20:.1f} MiB")
    assert total <= LIMIT, f"the device payload is {total / 2**20:.1f} MiB > 56 MiB: " + ", ".join(parts)

