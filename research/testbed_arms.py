"""Testbed arms: several FlashMap drafters (flow model or distilled map, 1 or 2 steps) and DFlash scored on the
same held-out anchors of the synthetic testbed, with paired bootstrap intervals of each against the first.

    .venv/bin/python research/testbed_arms.py --target runs/tb/target --data greedy --prompts 200 \
        --arm flow-1=runs/tb/flow/drafter:1 --arm map-1=runs/tb/map/drafter:1 --arm DFlash=runs/tb/dflash/drafter \
        [--out runs/tb/arms.json]

Each arm is verified by the language itself (synthetic/testbed.py: T = 0 the leading run on its greedy chain,
T = 1 the exact expectation); intervals: 95 % paired percentile bootstrap over prompts (bench/interval.py).
Prints a Markdown table: γ per arm, then Δγ of every later arm minus the first.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _drafter(spec: str, target):
    import torch

    from flashmap_ext.bench.methods import BestOfDrafter, StepsDrafter
    from flashmap_ext.drafters.load import checkpoint_type, load_drafter
    path, _, how = spec.partition(":")
    kind = checkpoint_type(path, "--arm")
    d = load_drafter(path, target, kind, dtype=torch.float32)
    if kind != "flashmap":
        return d
    steps, _, draws = (how or "1").partition("x")
    return BestOfDrafter(d, int(steps), int(draws)) if draws else StepsDrafter(d, int(steps))


def main(argv=None) -> int:
    import torch

    from flashmap_ext.synthetic.measure import _setup
    from flashmap_ext.synthetic.testbed import drafter_drafts, gamma_interval, paired_delta, score_drafts
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="the testbed's target directory")
    p.add_argument("--arm", action="append", required=True,
                   help="NAME=DIR[:STEPS[xDRAWS]] (FlashMap: steps 1 or 2, DRAWS: best of N noise draws)")
    p.add_argument("--data", choices=("sampled", "greedy"), default="sampled")
    p.add_argument("--prompts", type=int, default=40)
    p.add_argument("--stride", type=int, default=2)
    p.add_argument("--seed", type=int, default=2, help="held-out corpus seed (the testbed's: 2)")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    target, lang, seqs = _setup(Path(args.target), args.prompts, args.seed, args.data)
    k = 8
    tallies = {}
    for arm in args.arm:
        name, _, spec = arm.partition("=")
        tallies[name] = score_drafts(lang, seqs, drafter_drafts(_drafter(spec, target), seqs, k, args.stride), k)
    names, res = list(tallies), {"rows": {}, "deltas": {}}
    lines = ["| arm | γ T=0 all | γ T=1 all |", "|---|---|---|"]
    for n in names:
        cells = [(tallies[n].gamma("all", t), gamma_interval(tallies[n], "all", t)) for t in (0, 1)]
        res["rows"][n] = cells
        lines.append(f"| {n} | " + " | ".join(f"{g:.3f} [{iv[0]:.3f}, {iv[1]:.3f}]" for g, iv in cells) + " |")
    lines += ["", f"| paired Δγ vs {names[0]} | T=0 all | T=1 all |", "|---|---|---|"]
    for n in names[1:]:
        cells = [paired_delta(tallies[n], tallies[names[0]], "all", t) for t in (0, 1)]
        res["deltas"][f"{n} - {names[0]}"] = cells
        lines.append(f"| {n} - {names[0]} | " + " | ".join(f"{d:+.3f} [{iv[0]:+.3f}, {iv[1]:+.3f}]" for d, iv in cells)
                     + " |")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), **res}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
