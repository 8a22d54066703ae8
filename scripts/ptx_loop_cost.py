"""PTX instructions per logit of a kernel's streaming loops, from `nvcc -ptx` output (no GPU needed).

    python scripts/ptx_loop_cost.py FILE.ptx NAME_SUBSTRING [--ids-per-load N] [--load ld.global.nc.v4]

For each loop of the kernel or device function (a label and a later branch back to it) that holds a vector load matching
--load, prints its instructions in all, the instructions it skips with forward branches inside it (the
rare paths, e.g. a rescale when a chunk max rises), the vector loads, and per logit: the hot path
(instructions − skipped) / (loads × ids per load), and the upper bound with every path taken. Counts
are PTX instructions (ptxas may fuse or split some); labels, directives and braces are not counted.
"""
from __future__ import annotations

import argparse
import re
import sys

LABEL = re.compile(r"^\s*(\$?[\w$]+):\s*$")
BRANCH = re.compile(r"^\s*(@!?%p\w+\s+)?bra(\.uni)?\s+(\$?[\w$]+);")


def entry_body(ptx: str, name: str) -> list[str]:
    """The lines of the first .entry or .func definition (not a declaration) whose name contains `name`."""
    lines = ptx.splitlines()
    for i, line in enumerate(lines):
        if not ((".entry" in line or ".func" in line) and name in line):
            continue
        depth, body = 0, []
        for follow in lines[i:]:
            if depth == 0 and follow.strip().endswith(";") and "{" not in "".join(body):
                break  # a declaration: `.func name(params);`
            depth += follow.count("{") - follow.count("}")
            body.append(follow)
            if depth == 0 and "}" in follow:
                return body
    raise SystemExit(f"ptx_loop_cost: no .entry or .func definition containing {name!r}")


def is_instruction(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith(("//", ".", "{", "}", "$L", "@$")) and not LABEL.match(line) \
        and s.endswith(";") and not s.startswith(".reg")


def loops(body: list[str]) -> list[tuple[int, int]]:
    """(label line, back-branch line) of every backward branch."""
    where = {m.group(1): i for i, line in enumerate(body) if (m := LABEL.match(line))}
    out = []
    for i, line in enumerate(body):
        m = BRANCH.match(line)
        if m and m.group(3) in where and where[m.group(3)] < i:
            out.append((where[m.group(3)], i))
    return out


def skipped(body: list[str], lo: int, hi: int) -> set[int]:
    """Lines inside (lo, hi) jumped over by a forward conditional branch that lands inside the loop."""
    where = {m.group(1): i for i, line in enumerate(body) if (m := LABEL.match(line))}
    out: set[int] = set()
    for i in range(lo, hi):
        m = BRANCH.match(body[i])
        if m and m.group(1) and m.group(3) in where and i < where[m.group(3)] <= hi:
            out.update(range(i + 1, where[m.group(3)]))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ptx")
    ap.add_argument("entry")
    ap.add_argument("--ids-per-load", type=int, default=8)
    ap.add_argument("--load", default="ld.global.nc.v4")
    args = ap.parse_args(argv)
    body = entry_body(open(args.ptx).read(), args.entry)
    found = False
    for lo, hi in loops(body):
        inner = [i for i in range(lo, hi + 1) if is_instruction(body[i])]
        loads = sum(args.load in body[i] for i in inner)
        if not loads:
            continue
        found = True
        rare = skipped(body, lo, hi) & set(inner)
        ids = loads * args.ids_per_load
        print(f"loop at line {lo}: {len(inner)} instructions, {len(rare)} on skipped paths, {loads} loads "
              f"({ids} ids): {(len(inner) - len(rare)) / ids:.2f} per logit on the hot path, "
              f"{len(inner) / ids:.2f} with every path")
    if not found:
        print(f"ptx_loop_cost: no loop with {args.load} in {args.entry}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
