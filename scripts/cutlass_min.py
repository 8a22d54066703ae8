"""Copies only the CUTLASS headers the CUDA kernels include, transitively, into third_party/cutlass-min.

The full CUTLASS include tree (`make cutlass`, ~26 MB) is too large to carry to a GPU machine next to the
repository (the device tool sends at most 64 MiB); the kernels need a small part of it. The part is found
by the compiler itself: `nvcc -M` lists every header a translation unit opens, for every csrc/**/*.cu, with
the flags of `make cuda-check` and with those torch's CUDAExtension adds (setup.py's build), for the host
pass and the sm_90a device pass. `make cuda-check` then compiles every kernel against this copy, so a missing
header fails in CI, not on the GPU machine.

    python scripts/cutlass_min.py [--src third_party/cutlass] [--dst third_party/cutlass-min]

Fails when the copy would exceed MAX_MIB (a header set that grew this much is worth a look).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MIB = 8.0  # the trimmed copy is 5.3 MiB for CUTLASS 4.2.0.0
BASE = ["-std=c++20", "--expt-relaxed-constexpr", "--expt-extended-lambda", "-gencode=arch=compute_90a,code=sm_90a"]
TORCH_DEFINES = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                 "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "-DFLASHMAP_WITH_CUDA"]
PASSES = ([], ["-D__CUDA_ARCH__=900", "-D__CUDA_ARCH_FEAT_SM90_ALL"])  # host pass, then sm_90a device code


def nvcc() -> str:
    home = subprocess.run([str(ROOT / "scripts" / "cuda_home.sh")], capture_output=True, text=True).stdout.strip()
    if not home:
        sys.exit("cutlass_min: no CUDA toolkit found (scripts/cuda_home.sh)")
    return os.path.join(home, "bin", "nvcc")


def dependencies(compiler: str, source: Path, include: Path, flags: list[str]) -> set[Path]:
    """Headers under `include` that `source` opens with `flags` (nvcc -M: make-style dependency output)."""
    cmd = [compiler, "-M", *BASE, *flags, "-I", str(ROOT / "csrc"), "-I", str(include), str(source)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"cutlass_min: {' '.join(cmd)}\n{done.stderr}")
    words = done.stdout.replace("\\\n", " ").split()
    found = set()
    for w in words:
        p = Path(w).resolve()
        if p.is_relative_to(include):
            found.add(p.relative_to(include))
    return found


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=ROOT / "third_party" / "cutlass")
    ap.add_argument("--dst", type=Path, default=ROOT / "third_party" / "cutlass-min")
    args = ap.parse_args(argv)
    include = (args.src / "include").resolve()
    if not (include / "cute").is_dir():
        sys.exit(f"cutlass_min: no CUTLASS headers under {include} (run `make cutlass`)")
    compiler = nvcc()
    sources = sorted((ROOT / "csrc").rglob("*.cu"))
    headers: set[Path] = set()
    for source in sources:
        for extra in ([], TORCH_DEFINES):
            for arch in PASSES:
                headers |= dependencies(compiler, source, include, extra + arch)
    if not headers:
        sys.exit("cutlass_min: the kernels include no CUTLASS header: wrong --src?")
    mib = sum((include / rel).stat().st_size for rel in headers) / 2**20
    if mib > MAX_MIB:  # checked before writing, so no oversized copy is left behind looking up to date
        sys.exit(f"cutlass_min: {mib:.2f} MiB exceeds MAX_MIB = {MAX_MIB} MiB: raise it here if the copy must grow")
    shutil.rmtree(args.dst, ignore_errors=True)
    for rel in sorted(headers):
        target = args.dst / "include" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(include / rel, target)
    print(f"cutlass-min: {len(headers)} headers of {len(sources)} kernel files, {mib:.2f} MiB in {args.dst}")


if __name__ == "__main__":
    main()
