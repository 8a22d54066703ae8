"""`flashmap testbed`: FlashMap, DFlash, DFlash2 and EAGLE-3 on a synthetic language with exact ceilings
(DESIGN.md §13).

  target  train the small Qwen3 target on the language (deterministic; a few CPU minutes) into --out
  run     the whole testbed in --out: the target (reused when --out/target exists), a training corpus, the
          feature cache, the flow model, the distilled map, DFlash, DFlash2 and EAGLE-3 (or the subset
          --drafters names) trained with `flashmap features` / `train` / `distill` at the same --steps, their held-out learning curves, then γ at
          T = 0 / 1 against the exact ceilings with paired bootstrap intervals, the shuffle test at 1 and 2
          steps, per-slot acceptance and FlashMap's draws per prompt, and the bench's draft trees (--trees:
          top-k trees of flow-1, FlashMap-1, DFlash and DFlash2, DFlash2's selector trees; depth K, top-4 per
          node, N nodes) scored exactly against the language, paired with their chain → results.json,
          results.md, curves.png.
          Resumable: a finished stage (its output present) is skipped.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from flashmap_ext.commands.demo import positive_int

MAX_K = 8  # the language's longest phrase and copy span: longer blocks have no structure to find
ALL_DRAFTERS = ("flow", "map", "dflash", "dflash2", "eagle3")


def _drafters(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in ALL_DRAFTERS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(ALL_DRAFTERS)}, got {text!r}")
    if "map" in names and "flow" not in names:
        raise argparse.ArgumentTypeError("map needs flow (its distillation teacher)")
    return tuple(x for x in ALL_DRAFTERS if x in names)


def _trees(text: str) -> tuple[int, ...]:
    """'16,32' → (16, 32); 'none' → ()."""
    if text.strip().lower() == "none":
        return ()
    parts = [x.strip() for x in text.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts) or len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(f"expected 'none' or distinct node counts ≥ 1, comma-separated "
                                         f"(e.g. 16,32), got {text!r}")
    return tuple(int(p) for p in parts)


def _block(text: str) -> int:
    k = positive_int(text)
    if k > MAX_K:
        raise argparse.ArgumentTypeError(f"at most {MAX_K} (the language's longest phrase and copy span), got {k}")
    return k


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("testbed", help="drafters on a synthetic language against exact ceilings",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    stages = p.add_subparsers(dest="stage", required=True, metavar="STAGE")
    t = stages.add_parser("target", help="train the synthetic target", description="Train the synthetic target.")
    t.add_argument("--out", required=True, help="model directory to write")
    t.add_argument("--steps", type=positive_int, default=1500, help="optimizer steps (default 1500)")
    t.set_defaults(func=run_target)
    r = stages.add_parser("run", help="the whole testbed", description="Run the whole testbed (see flashmap "
                                                                         "testbed --help).")
    r.add_argument("--out", required=True, help="run directory (created; resumed if it exists)")
    r.add_argument("--steps", type=positive_int, default=3000, help="optimizer steps per drafter (distill: "
                   "half); the equal budget (default 3000; BENCHMARKS.md: still rising there)")
    r.add_argument("--target-steps", type=positive_int, default=1500)
    r.add_argument("--block-size", type=_block, default=MAX_K, help=f"K, drafted tokens per round (≤ {MAX_K})")
    r.add_argument("--train-sequences", type=positive_int, default=4096,
                   help="training corpus (default 4096: 3000 steps of 4 sequences see each about 3 times)")
    r.add_argument("--prompts", type=positive_int, default=40, help="held-out sequences (bootstrap units)")
    r.add_argument("--stride", type=positive_int, default=2, help="score every stride-th anchor")
    r.add_argument("--draws", type=positive_int, default=4, help="noise draws per prompt for FlashMap")
    r.add_argument("--mode-draws", type=positive_int, default=8,
                   help="noise draws of the mode-seeking FlashMap rows (best of N by the drafter's own "
                        "probabilities; the map's per-slot marginal argmax over N)")
    r.add_argument("--no-probes", dest="probes", action="store_false",
                   help="skip the z = 0 rows, the shuffle test and the draw diversity (a shorter measurement)")
    r.add_argument("--data", choices=["sampled", "greedy"], default="sampled",
                   help="what drafters train and are scored on: samples of the language (default) or sampled "
                        "prompts answered by its greedy chain, as the real recipe's self-answered corpus")
    r.add_argument("--drafters", type=_drafters, default=ALL_DRAFTERS,
                   help=f"comma-separated subset of {','.join(ALL_DRAFTERS)} to train and measure (map needs flow)")
    r.add_argument("--curve-points", type=positive_int, default=10,
                   help="checkpoints per drafter on the held-out learning curve (all are kept)")
    r.add_argument("--select", choices=["last", "best"], default="last",
                   help="which checkpoint of each drafter is measured: its last (default) or the one of highest "
                        "γ at T = 1 on the learning curve's validation set (disjoint from the measured held-out set)")
    r.add_argument("--seed", type=int, default=0, help="training seed of every drafter (default 0)")
    r.add_argument("--trees", type=_trees, default=(16, 32), metavar="N[,N...]|none",
                   help="node counts N of the draft-tree rows (default 16,32; 'none' skips them): the bench's "
                        "top-k trees of flow-1, FlashMap-1, DFlash and DFlash2 and DFlash2's selector trees, "
                        "TreeSpec(K, 4, N), each N ≥ --block-size, scored exactly against the language and paired "
                        "with the same drafter's chain")
    r.set_defaults(func=run_all)



def run_target(args) -> int:
    from flashmap_ext.synthetic.target import TargetRecipe, train_target
    record = train_target(args.out, recipe=TargetRecipe(steps=args.steps), log=lambda m: print(m, file=sys.stderr))
    print(f"testbed target: held-out cross-entropy {record['model_entropy']:.4f} nats/token vs the language's "
          f"{record['true_entropy']:.4f}; model in {args.out}")
    return 0


def flashmap(*argv: str) -> None:
    """Runs one `flashmap` command in a child process (what a user runs); raises ValueError when it fails."""
    done = subprocess.run([sys.executable, "-m", "flashmap_ext.cli", *argv])
    if done.returncode:
        raise ValueError(f"`flashmap {' '.join(argv)}` failed (exit {done.returncode})")


def run_all(args) -> int:
    from flashmap_ext.synthetic.pipeline import run_testbed
    small = [n for n in args.trees if n < args.block_size]
    if small:  # a tree of N nodes is at most N deep (TreeSpec), checked before any work
        raise ValueError(f"--trees: every node count must be ≥ --block-size {args.block_size} (a tree of N nodes "
                         f"is at most N deep), got {','.join(map(str, small))}")
    results = run_testbed(Path(args.out), vars(args), flashmap)
    print(json.dumps(results["summary"], indent=1))
    print(f"testbed: results in {args.out}/results.md", file=sys.stderr)
    return 0
