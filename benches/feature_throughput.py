"""Feature-cache throughput: target tokens/s of `cache_features` by target dtype and prefill batch size.

    PYTHONPATH=. taskset -c 0 .venv/bin/python benches/feature_throughput.py --data CORPUS_PART [--limit 24]
        [--runs fp32:1 bf16:1 bf16:2048 bf16:4096 bf16:8192]

Each run caches the same conversations (rendered as `flashmap features` does, max_length 384) into a fresh
temporary cache with the offline target, taps 1,6,11,16,20,21, bf16 stored; tokens/s per wall second and per
CPU second of this process (the per-core figure on a shared core), one torch thread. Prints one JSON line
per run and the machine.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from flashmap_ext.bench.machine import describe, set_threads
from flashmap_ext.target import load_target
from flashmap_ext.train.data import load_samples
from flashmap_ext.train.features import cache_features

LAYERS = [1, 6, 11, 16, 20, 21]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--target", default="qwen2.5-coder-0.5b")
    p.add_argument("--limit", type=int, default=24)
    p.add_argument("--max-length", type=int, default=384)
    p.add_argument("--runs", nargs="+", default=["fp32:1", "bf16:1", "bf16:2048", "bf16:4096", "bf16:8192"])
    args = p.parse_args()
    set_threads(1)
    print(json.dumps({k: v for k, v in describe().items() if k != "command"}))
    models = {}
    for run in args.runs:
        dtype, batch = run.split(":")
        if dtype not in models:
            models[dtype] = load_target(args.target, dtype, "cpu")
        target, tok = models[dtype]
        samples = list(load_samples(args.data, tok, max_length=args.max_length))[:args.limit]
        tokens = sum(len(s.input_ids) for s in samples)
        with tempfile.TemporaryDirectory() as out:
            wall, cpu = time.perf_counter(), time.process_time()
            cache_features(target.model, samples, out, LAYERS, dtype="bf16", progress=False,
                           batch_tokens=int(batch), window=256 if int(batch) > 1 else 1)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(json.dumps({"target_dtype": dtype, "batch_tokens": int(batch), "sequences": len(samples),
                          "tokens": tokens, "wall_s": round(wall, 1), "tok_per_s": round(tokens / wall, 1),
                          "tok_per_cpu_s": round(tokens / cpu, 1), "threads": torch.get_num_threads()}),
              flush=True)


if __name__ == "__main__":
    main()
