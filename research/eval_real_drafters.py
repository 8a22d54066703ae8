"""Held-out acceptance check of the drafters trained by recipes/train_real_drafters.sh.

For each held-out ShareGPT prompt (never trained on): AR greedy through `speculate.generate(drafter=None)`,
then each drafter at T = 0; reports γ (mean committed per round, bonus included), per-slot acceptance,
tokens/s and whether the output is token-identical to AR greedy.

    python research/eval_real_drafters.py [--run runs/real] [--n 4] [--max-new-tokens 64] [--dtype bf16]
        [--drafters flow:1,map:1,map:2,dflash,eagle3] [--from-checkpoints] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/real")
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--drafters", default="flow:1,map:1,map:2,dflash")
    p.add_argument("--from-checkpoints", action="store_true", help="load the committed bf16 checkpoints/")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))

    from flashmap_ext.assets.models import qwen05_dir
    from flashmap_ext.bench.methods import StepsDrafter
    from flashmap_ext.drafters.load import load_drafter
    from flashmap_ext.speculate import generate
    from flashmap_ext.target import load_target, resolve_dtype
    from flashmap_ext.train.data import prompt_ids, stop_token_ids

    model_dir = str(qwen05_dir())
    target, tok = load_target(model_dir, dtype=resolve_dtype(args.dtype), device="cpu")
    stops = sorted(stop_token_ids(tok))
    rows = [json.loads(line) for line in open(os.path.join(args.run, "heldout.jsonl"))][:args.n]
    prompts = [prompt_ids(tok, [r["messages"][0]]) for r in rows]
    ckpt = {"flow": "checkpoints/flashmap-flow-qwen2.5-coder-0.5b", "map": "checkpoints/flashmap-map-qwen2.5-coder-0.5b",
            "dflash": "checkpoints/dflash-qwen2.5-coder-0.5b", "eagle3": "checkpoints/eagle3-qwen2.5-coder-0.5b"}
    results = {}

    def run(name, drafter):
        outs, stats = [], []
        for ids in prompts:
            o = generate(target, drafter, ids, args.max_new_tokens, stop_token_ids=stops)
            outs.append(o.tokens)
            stats.append(o.stats)
        rounds = sum(s.rounds for s in stats)
        acc = sum(sum(s.accepted) for s in stats)
        k = max((len(s.slot_drafted) for s in stats), default=0)
        slot = [sum(s.slot_accepted[i] for s in stats if len(s.slot_accepted) > i) /
                max(1, sum(s.slot_drafted[i] for s in stats if len(s.slot_drafted) > i)) for i in range(k)]
        t = sum(s.total_time_s for s in stats)
        n_tok = sum(s.new_tokens for s in stats)
        results[name] = {"gamma": (acc + rounds) / rounds, "per_prompt_gamma": [s.acceptance_length for s in stats],
                         "slot_acceptance": slot, "tokens": n_tok, "tokens_per_s": n_tok / t,
                         "draft_s": sum(s.draft_time_s for s in stats), "verify_s": sum(s.verify_time_s for s in stats)}
        return outs

    t0 = time.time()
    ar = run("AR", None)
    for spec in args.drafters.split(","):
        name, _, steps = spec.partition(":")
        path = ckpt[name] if args.from_checkpoints else os.path.join(args.run, name, "drafter")
        if not os.path.exists(os.path.join(path, "model.safetensors")):
            print(f"skip {spec}: {path} missing", file=sys.stderr)
            continue
        d = load_drafter(path, target)
        if steps:
            d = StepsDrafter(d, int(steps))
        label = {"flow": "FlashMap-flow", "map": "FlashMap", "dflash": "DFlash", "eagle3": "EAGLE-3"}[name] + (f"-{steps}" if steps else "")
        outs = run(label, d)
        results[label]["identical_to_greedy"] = [a == b for a, b in zip(outs, ar)]
    print(f"{len(prompts)} held-out prompts, {args.max_new_tokens} new tokens, {args.dtype}, "
          f"{time.time() - t0:.0f} s")
    print("| method | γ | tok/s | identical to AR greedy | slot acceptance 1..K |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        same = r.get("identical_to_greedy")
        same = "-" if same is None else f"{sum(same)}/{len(same)}"
        slots = " ".join(f"{x:.2f}" for x in r["slot_acceptance"])
        print(f"| {name} | {r['gamma']:.2f} | {r['tokens_per_s']:.1f} | {same} | {slots} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
