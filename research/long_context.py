"""γ against prompt length for the committed drafters on the real target.

Prompt of N tokens: the chat-templated user turn "<Python source>\n\n" + QUESTION (explain the last function
above in detail), where the source is the standard library's argparse, typing, inspect, ... modules concatenated and
cut so that the whole prompt is exactly N tokens (the question, so the answer, always concerns the end of
the context). Each drafter decodes `--max-new-tokens` at T = 0 (greedy); the output is checked
token-identical to the autoregressive baseline's, which runs once per length (`--no-ar` skips it).

    taskset -c 0 python research/long_context.py --lengths 1024,4096,8192 [--drafters flashmap,dflash]
        [--max-new-tokens 48] [--context-window W] [--json out.json]

--context-window W | none: the drafters read the last W memory entries only (common/window.py), or all
of them; default: as the checkpoint says (the committed checkpoints: 384, their training length).
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import time

CHECKPOINTS = {"flashmap": "checkpoints/flashmap-map-qwen2.5-coder-0.5b", "dflash": "checkpoints/dflash-qwen2.5-coder-0.5b"}
SOURCES = ("argparse", "typing", "inspect", "dataclasses", "pathlib", "subprocess", "tarfile", "pydoc")
QUESTION = "\n\nExplain in detail, step by step, what the last function above does and how it could be improved."


def source_text() -> str:
    import importlib
    return "\n\n".join(inspect.getsource(importlib.import_module(name)) for name in SOURCES)


def make_prompt(tok, n: int, code_ids: list) -> list:
    """Exactly `n` prompt tokens: the chat template around a prefix of the code and the question."""
    from flashmap_ext.train.data import prompt_ids
    lo, hi = 0, len(code_ids)
    while lo < hi:  # the longest code prefix whose prompt fits (token merges at the cut: search, not arithmetic)
        mid = (lo + hi + 1) // 2
        ids = prompt_ids(tok, [{"role": "user", "content": tok.decode(code_ids[:mid]) + QUESTION}])
        lo, hi = (mid, hi) if len(ids) <= n else (lo, mid - 1)
    ids = prompt_ids(tok, [{"role": "user", "content": tok.decode(code_ids[:lo]) + QUESTION}])
    if len(ids) > n or len(ids) < n - 8:
        raise SystemExit(f"could not build a {n}-token prompt (got {len(ids)})")
    return ids


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="1024,4096,8192")
    p.add_argument("--drafters", default="flashmap,dflash")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--no-ar", action="store_true", help="skip the AR baseline (no identity check)")
    p.add_argument("--context-window", default=None,
                   help="drafter context window W, or 'none' (unlimited); default: the checkpoint's")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    from flashmap_ext.assets.models import qwen05_dir
    from flashmap_ext.bench import machine
    from flashmap_ext.drafters.load import KEEP, load_drafter
    from flashmap_ext.speculate import generate
    from flashmap_ext.target import load_target, resolve_dtype
    from flashmap_ext.train.data import stop_token_ids

    threads = machine.set_threads(1)
    dtype = machine.auto_dtype()
    model_dir = str(qwen05_dir())
    target, tok = load_target(model_dir, resolve_dtype(dtype), "cpu")
    stops = sorted(stop_token_ids(tok))
    code_ids = tok.encode(source_text(), add_special_tokens=False)
    window = (KEEP if args.context_window is None else None if args.context_window == "none"
              else int(args.context_window))
    drafters = {name: load_drafter(CHECKPOINTS[name], target, context_window=window)
                for name in args.drafters.split(",")}
    rows = []
    print(f"# {machine.cpu_model()}, {dtype}, {threads} thread(s), target context {target.max_positions}",
          flush=True)
    for n in (int(x) for x in args.lengths.split(",")):
        ids = make_prompt(tok, n, code_ids)
        ar = None if args.no_ar else generate(target, None, ids, args.max_new_tokens, stop_token_ids=stops).tokens
        for name, drafter in drafters.items():
            t0 = time.time()
            out = generate(target, drafter, ids, args.max_new_tokens, stop_token_ids=stops)
            s = out.stats
            row = {"prompt_tokens": len(ids), "drafter": name, "context_window": drafter.config.context_window,
                   "gamma": s.acceptance_length, "rounds": s.rounds,
                   "new_tokens": s.new_tokens, "identical_to_ar": None if ar is None else out.tokens == ar,
                   "slot_acceptance": [a / d if d else None for a, d in zip(s.slot_accepted, s.slot_drafted)],
                   "wall_s": round(time.time() - t0, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": machine.describe(), "dtype": dtype, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
