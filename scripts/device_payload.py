"""What one call of the device tool sends for benches/device_check.sh, in bytes: the files git does not
ignore (tracked, and untracked but not ignored) plus the paths of the documented `carry` list (the
run(...) line in device_check.sh's header). The tool refuses more than 64 MiB; LIMIT keeps 8 MiB free.

    python scripts/device_payload.py [--root DIR]

Prints one line, `device payload: <parts> = <total> MiB`, and exits 1 when the total is over LIMIT or a
built carried path is over its bound. A carried path that is not built counts at its bound, never at zero
(CI runs the tests before building third_party/cutlass-min; `device_check.sh --preflight` checks that it
is built). Standard library only.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 56 * 2**20
RUN_LINE = re.compile(r'run\(command="bash benches/device_check.sh", carry=(\[[^\]]*\]), timeout_s=(\d+)\)')


def carry_bounds(root: Path) -> dict[str, int]:
    """Bytes each carried path may take, as enforced where it is built (scripts/cutlass_min.py)."""
    spec = importlib.util.spec_from_file_location("cutlass_min", root / "scripts" / "cutlass_min.py")
    cutlass_min = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cutlass_min)
    return {"third_party/cutlass-min": int(cutlass_min.MAX_MIB * 2**20)}


def documented_carry(root: Path) -> list[str]:
    """The carry list of the one command in device_check.sh's header; ValueError when it is not there."""
    m = RUN_LINE.search((root / "benches" / "device_check.sh").read_text())
    if not m:
        raise ValueError("benches/device_check.sh's header must show the one run(...) command")
    return json.loads(m.group(1))


def git_bytes(root: Path) -> int:
    """Bytes of the files that travel without a carry: tracked, and untracked but not ignored."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    paths = {root / p for p in out.decode().split("\0") if p}
    return sum(os.lstat(p).st_size for p in paths if os.path.lexists(p))


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def payload(root: Path) -> tuple[int, list[str], list[str]]:
    """(total bytes, one description per part, problems): problems name what is over a bound."""
    total = git_bytes(root)
    parts, problems = [f"git files {total / 2**20:.1f} MiB"], []
    bounds = carry_bounds(root)
    for path in documented_carry(root):
        if path not in bounds:
            problems.append(f"carry {path} has no size bound in scripts/device_payload.py")
            continue
        built = root / path
        size = folder_bytes(built) if built.is_dir() else bounds[path]
        if built.is_dir() and size > bounds[path]:
            problems.append(f"{path} is {size / 2**20:.1f} MiB, over its bound {bounds[path] / 2**20:.1f} MiB")
        total += size
        parts.append(f"{path} {size / 2**20:.1f} MiB ({'built' if built.is_dir() else 'bound'})")
    if total > LIMIT:
        problems.append(f"the payload is {total / 2**20:.1f} MiB > {LIMIT / 2**20:.0f} MiB")
    return total, parts, problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args()
    total, parts, problems = payload(args.root.resolve())
    if problems:
        print("device payload: " + "; ".join(problems))
        return 1
    print("device payload: " + ", ".join(parts) + f" = {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
