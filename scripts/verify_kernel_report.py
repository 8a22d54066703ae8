"""Registers, spills and PTX instructions per logit of the verify CUDA kernels (part of `make cuda-check`).

    python scripts/verify_kernel_report.py [--nvcc PATH] [--arch sm_90a]

Compiles csrc/verify/verify_kernel.cu (v1) and verify_v2_kernel.cu (v2) to PTX with the build's flags, runs
ptxas -v on the PTX and prints, per kernel and per out-of-line device function of the streaming pass:
registers, stack frame and spill bytes; then v2's streaming loops' PTX instructions per logit for bf16
logits (scripts/ptx_loop_cost.py): the sampling and the greedy / max-only pass. (v1's per-element guards
defeat the loop parser's hot-path split; its count is in BENCHMARKS.md.) No GPU needed.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ptx_loop_cost import entry_body, is_instruction, loops, skipped  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["-O3", "-std=c++20", "--expt-relaxed-constexpr", "--expt-extended-lambda", "-I", os.path.join(ROOT, "csrc")]
DTYPES = {"0": "fp32", "1": "fp16", "2": "bf16"}
# (label, file, function name pattern, ids per 16-byte load): the streaming loops reported per logit
LOOPS = [("v2 sampling pass", "v2", "slice_passILNS0_10LogitDTypeE2ELb1E", 8),
         ("v2 greedy / max-only pass", "v2", "slice_passILNS0_10LogitDTypeE2ELb0E", 8)]


def short(name: str) -> str | None:
    """A readable name for the verify kernels and the v2 pass functions, else None."""
    if m := re.search(r"verify_slot_kernelILNS_10LogitDTypeE(\d)E", name):
        return f"v1 verify_slot_kernel<{DTYPES[m.group(1)]}>"
    if "verify_combine_kernel" in name:
        return "v1 verify_combine_kernel"
    if m := re.search(r"verify_v2_kernelILNS_10LogitDTypeE(\d)ELi(\d)E", name):
        return f"v2 verify_v2_kernel<{DTYPES[m.group(1)]}, cluster {m.group(2)}>"
    if m := re.search(r"slice_passILNS0_10LogitDTypeE(\d)ELb(\d)E", name):
        return f"v2   slice_pass<{DTYPES[m.group(1)]}, {'sum' if m.group(2) == '1' else 'max only'}>"
    return None


def ptxas_report(nvcc: str, ptx: str, arch: str) -> list[str]:
    ptxas = os.path.join(os.path.dirname(nvcc), "ptxas")
    out = subprocess.run([ptxas, f"-arch={arch}", "-O3", "-v", ptx, "-o", os.devnull], capture_output=True,
                         text=True, check=True).stderr.splitlines()
    rows, name, seen = [], None, set()
    for line in out:
        if m := re.search(r"(?:Compiling entry function|Function properties for) '?([\w$]+)", line):
            name = short(m.group(1))
        elif name and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            frame, stores, loads = m.groups()
            if "Function properties" not in line and name not in seen and not name.startswith("v2   "):
                rows.append([name, None, frame, stores, loads])
            elif name.startswith("v2   ") and name not in seen:
                seen.add(name)
                rows.append([name, "-", frame, stores, loads])
        elif name and (m := re.search(r"Used (\d+) registers", line)):
            for row in rows:
                if row[0] == name and row[1] is None:
                    row[1] = m.group(1)
            seen.add(name)
    return [f"  {n:<44} {r or '-':>4} registers  stack {f:>4} B  spills {s:>4} B stored / {l:>4} B loaded"
            for n, r, f, s, l in rows]


def loop_cost(ptx_text: str, name: str, ids_per_load: int) -> str:
    body = entry_body(ptx_text, name)
    best = None
    for lo, hi in loops(body):
        inner = [i for i in range(lo, hi + 1) if is_instruction(body[i])]
        n_loads = sum("ld.global.nc.v4" in body[i] for i in inner)
        rare = len(skipped(body, lo, hi) & set(inner))
        cand = (len(inner) - rare, len(inner), n_loads * ids_per_load)
        if n_loads and (best is None or cand[2] > best[2]):  # the loop streaming the most ids
            best = cand
    if best is None:
        return "no streaming loop found"
    hot, every, ids = best
    return f"{hot / ids:5.2f} PTX instructions per logit on the hot path ({every / ids:.2f} with every path)"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvcc", default=os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ptx = {}
        for tag, src in (("v1", "verify_kernel.cu"), ("v2", "verify_v2_kernel.cu")):
            ptx[tag] = os.path.join(tmp, f"{tag}.ptx")
            subprocess.run([args.nvcc, f"-arch={args.arch}", *FLAGS, "-ptx",
                            os.path.join(ROOT, "csrc", "verify", src), "-o", ptx[tag]], check=True)
        print(f"verify kernels, {args.arch} (ptxas -v):")
        for tag in ("v1", "v2"):
            print("\n".join(ptxas_report(args.nvcc, ptx[tag], args.arch)))
        print("streaming loops, bf16 logits (PTX, scripts/ptx_loop_cost.py):")
        for label, tag, name, ids in LOOPS:
            print(f"  {label:<28} {loop_cost(open(ptx[tag]).read(), name, ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
