"""γ of the block-drafter tree shapes on the real target, and how distinct the multi-noise draws are.

T = 0, fp32, the committed FlashMap checkpoint (1 step), the first N prompts of each dataset, first turns:
FlashMap-1 chain, multi-noise N = 2 / 4 (16 nodes), top-k 8 / 16 (top-4 per slot), through `generate`
exactly as `flashmap bench --shapes` runs them. For the multi-noise rounds it also counts, over 4 draws,
the distinct slot-1 tokens and the distinct chains. γ is hardware-independent (no timings are printed).

usage: taskset -c 0 python research/tree_gamma.py N MAX_NEW_TOKENS gsm8k,humaneval
"""
from __future__ import annotations

import collections
import sys

import torch

from flashmap_ext.assets import datasets
from flashmap_ext.bench.methods import StepsDrafter
from flashmap_ext.draft_shapes.block_tree import MultiNoiseDrafter, TopKTreeDrafter, block_log_probs
from flashmap_ext.drafters.load import load_drafter
from flashmap_ext.speculate import generate
from flashmap_ext.target import load_target
from flashmap_ext.train.data import prompt_ids, stop_token_ids
from flashmap_ext.tree import TreeSpec

CHECKPOINT = "checkpoints/flashmap-map-qwen2.5-coder-0.5b"


class CountingMultiNoise(MultiNoiseDrafter):
    """A multi-noise drafter that also counts how distinct 4 noise draws are at each round."""

    def __init__(self, drafter, counts: collections.Counter):
        super().__init__(drafter)
        self.counts = counts

    def draft_tree(self, memory, anchor, position, *, depth, topk, num_nodes, seed=None):
        seed = torch.zeros_like(position) if seed is None else seed
        chains = [block_log_probs(self.inner, memory, anchor, position, seed, j)[:depth].argmax(-1).tolist()
                  for j in range(4)]
        self.counts.update(rounds=1, distinct_slot1=len({c[0] for c in chains}),
                           distinct_chains=len({tuple(c) for c in chains}))
        return super().draft_tree(memory, anchor, position, depth=depth, topk=topk, num_nodes=num_nodes, seed=seed)


def main(n: int, new: int, names: str) -> None:
    torch.set_num_threads(1)
    target, tokenizer = load_target("qwen2.5-coder-0.5b", torch.float32)
    chain = StepsDrafter(load_drafter(CHECKPOINT, target, "flashmap", dtype=torch.float32), 1)
    k, counts = chain.num_draft_tokens, collections.Counter()
    rows = {"chain": (chain, None), "multi-noise N=2": (CountingMultiNoise(chain, counts), TreeSpec(k, 2, 16)),
            "multi-noise N=4": (CountingMultiNoise(chain, counts), TreeSpec(k, 4, 16)),
            "top-k 8": (TopKTreeDrafter(chain), TreeSpec(k, 4, 8)), "top-k 16": (TopKTreeDrafter(chain), TreeSpec(k, 4, 16))}
    stop = stop_token_ids(tokenizer)
    for name in names.split(","):
        totals = collections.defaultdict(lambda: [0, 0, 0])  # accepted, rounds, drafted
        counts.clear()
        for prompt in datasets.load(name, n):
            ids = prompt_ids(tokenizer, prompt.messages)
            for row, (drafter, spec) in rows.items():
                s = generate(target, drafter, ids, new, stop_token_ids=stop, tree=spec).stats
                t = totals[row]
                t[0], t[1], t[2] = t[0] + sum(s.accepted), t[1] + len(s.accepted), t[2] + sum(s.drafted)
        print(f"{name} ({n} prompts, {new} tokens):")
        for row, (acc, rounds, drafted) in totals.items():
            print(f"  {row:16s} γ {(acc + rounds) / rounds:.3f}  nodes/round {drafted / rounds:.1f}")
        r = counts["rounds"]
        print(f"  4 noise draws: {counts['distinct_slot1'] / r:.2f} distinct slot-1 tokens, "
              f"{counts['distinct_chains'] / r:.2f} distinct chains per round ({r} rounds)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
