"""Draft cost of DFlash2 against DFlash at the CPU recipe's shape (recipes/train_real_drafters.sh): width 896,
2 layers, block 9, intermediate 384, 5 taps, 8,192-row draft vocabulary; DFlash2 with convolution group 32 and
selector rank 32, top-16. Random weights (the cost does not depend on them) and a stand-in target of the real
one's width whose embedding has 16,384 rows (the drafters read only its embedding and the draft vocabulary's
LM-head rows).

    taskset -c 0 .venv/bin/python benches/dflash2_draft_cost.py --threads 1

Times one `draft` call (after a context of --context positions) for DFlash, DFlash2 greedy (the selector's
walk) and DFlash2 best path (Viterbi), interleaved, median of --repeats; prints one Markdown table.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--context", type=int, default=256)
    args = p.parse_args(argv)
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from flashmap_ext.bench.machine import describe, set_threads, summary_line
    from flashmap_ext.drafters.dflash import DFlashDrafter
    from flashmap_ext.drafters.dflash2 import DFlash2Drafter
    set_threads(args.threads)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=16384, hidden_size=896, intermediate_size=64, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False)
    target = Qwen3ForCausalLM(cfg).eval()
    shape = dict(num_hidden_layers=2, block_size=9, intermediate_size=384, mask_token_id=16383,
                 target_layer_ids=[1, 6, 11, 16, 21], draft_vocab_size=8192)
    vocab = torch.randperm(16383)[:8192]
    dflash = DFlashDrafter.for_target(target, **shape)
    dflash2 = DFlash2Drafter.for_target(target, **shape, conv_group_size=32, selector_rank=32)
    rows = {"DFlash": (dflash, None), "DFlash2 greedy": (dflash2, "greedy"), "DFlash2 best path": (dflash2, "best")}
    taps = torch.randn(1, args.context, 5 * 896)
    memories = {}
    for d in (dflash, dflash2):
        d.set_draft_vocab(vocab)
        d.eval()
        memories[id(d)] = d.new_memory(1)
        d.extend_memory(memories[id(d)], torch.zeros(1, args.context, dtype=torch.long), taps)
    anchor, pos = torch.tensor([5]), torch.tensor([args.context])
    times: dict = {name: [] for name in rows}
    with torch.inference_mode():
        for _ in range(args.repeats + 3):  # the first 3 rounds warm up
            for name, (d, path) in rows.items():
                if path is not None:
                    d.path = path
                start = time.perf_counter()
                d.draft(memories[id(d)], anchor, num_tokens=8, position=pos)
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["DFlash"][3:])
    print(f"{summary_line(describe())}; fp32, context {args.context}, median of {args.repeats}\n")
    print("| drafter | trainable parameters | draft ms | vs DFlash |\n|---|---|---|---|")
    for name, (d, _) in rows.items():
        ms = statistics.median(times[name][3:])
        n = sum(p.numel() for p in d.parameters())
        print(f"| {name} | {n / 1e6:.2f} M | {ms * 1e3:.2f} | {ms / base:.3f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
