"""Target forward costs by width and dtype on this CPU: the figures behind the README's "without bf16
hardware" paragraph (a k-token verify in one-token forwards, and bf16 against fp32).

    taskset -c 1 .venv/bin/python benches/forward_costs.py --threads 1
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 taskset -c 1 .venv/bin/python benches/forward_costs.py \
        --threads 1 --label "emulated AVX2-only"

Each dtype loads the offline real target (qwen2.5-coder-0.5b) and times forwards over 1, 9 and 17 new tokens
after a 64-token context (logits for all, rolled back; median of --repeats after a warm-up:
draft_shapes.calibrate). The second command keeps oneDNN and ATen to AVX2 kernels, which is how a CPU without
avx512_bf16/AMX runs them; the flags printed are the real CPU's. Prints one Markdown table; timings are ratios
within one run.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--label", default="native", help="what the kernel settings emulate (for the table)")
    args = p.parse_args(argv)
    import torch

    from flashmap_ext.assets.models import qwen05_dir
    from flashmap_ext.bench.machine import describe, set_threads, summary_line
    from flashmap_ext.draft_shapes.calibrate import _verify_times
    from flashmap_ext.target.load import load_target
    set_threads(args.threads)
    widths, rows = (1, 9, 17), {}
    for dtype in args.dtypes.split(","):
        target, _ = load_target(str(qwen05_dir()), dtype=dtype, device="cpu")
        gen = torch.Generator().manual_seed(0)
        with torch.inference_mode():
            cache = target.new_cache()
            target.forward(torch.randint(0, target.vocab_size, (1, 64), generator=gen), cache, num_logits=1)
            rows[dtype] = _verify_times(target, cache, (), widths, args.repeats, gen)
        del target
    isa = {k: os.environ.get(k) for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if os.environ.get(k)}
    print(f"{args.label} ({isa or 'no kernel limits'}); {summary_line(describe())}\n")
    print("| dtype | " + " | ".join(f"{w} tokens (ms)" for w in widths) + " | 9 / 1 | 17 / 1 |")
    print("|---|" + "---|" * (len(widths) + 2))
    for dtype, t in rows.items():
        print(f"| {dtype} | " + " | ".join(f"{t[w] * 1e3:.0f}" for w in widths)
              + f" | {t[9] / t[1]:.2f} | {t[17] / t[1]:.2f} |")
    if {"fp32", "bf16"} <= rows.keys():
        print(f"\nbf16 / fp32 at 1 token: {rows['bf16'][1] / rows['fp32'][1]:.2f}×; at 17: "
              f"{rows['bf16'][17] / rows['fp32'][17]:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
