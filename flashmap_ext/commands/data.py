"""`flashmap data`: training data answered by the target itself.

    flashmap data regenerate   answer a conversations file with the target (resumable)
    flashmap data generate     grow the self-answered corpus under data/ (math/code/chat, jsonl.gz, resumable)

`flashmap data ACTION --help` describes each.
"""
from __future__ import annotations

import argparse
import os
import sys

from flashmap_ext.bench.machine import add_threads_argument, positive_int
from flashmap_ext.checks import check_input_path, check_output_path
from flashmap_ext.commands import io_parser
from flashmap_ext.commands.generate import non_negative_float, probability
from flashmap_ext.train.runner import seed_below

REGENERATE_DOC = """`flashmap data regenerate`: answer a conversations file with the target itself.

Input: jsonl, one conversation per line: {"id": ..., "messages": [{"role": "user", "content": ...}, ...]}.
Each conversation is cut after its last user turn and answered by the target (greedy by default), so
the drafter learns what the target would say. Output: the same ids with the new assistant turn, plus
`enable_thinking`, `finish` ("stop" | "length") and the `settings` it was answered with. Safe to
interrupt: rerun the same command and it continues after the last conversation written (a rerun with
other --max-new-tokens, --temperature, --top-p, --seed or --thinking is refused).
"""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("data", help="training data answered by the target (regenerate: a conversations file; "
                              "generate: grow the corpus under data/)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = io_parser(actions, "regenerate", "answer every conversation with the target (resumable)", REGENERATE_DOC,
                  "flashmap data regenerate --target Qwen/Qwen3-8B --data sharegpt.jsonl --out regen.jsonl "
                  "--max-new-tokens 2048", "input conversations (jsonl with 'messages')",
                  "output jsonl (appended to; existing ids are skipped)")
    r.add_argument("--batch-size", type=positive_int, default=8, help="conversations per generate call")
    r.add_argument("--max-new-tokens", type=positive_int, default=1024)
    r.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy (the default)")
    r.add_argument("--top-p", type=probability, default=1.0, help="nucleus mass in (0, 1] (1 = all)")
    r.add_argument("--thinking", action="store_true", help="enable_thinking=True in the chat template")
    r.add_argument("--limit", type=positive_int, help="only the first N input conversations")
    r.add_argument("--seed", type=seed_below(2**32, "seed·2**32 + crc32(id) seeds torch per batch"), default=0)
    r.add_argument("--dtype", choices=["fp32", "bf16", "fp16"],
                   help="default: bf16 on a GPU, else fp32 (data generate: also bf16 on a CPU with "
                   "avx512_bf16 / amx_bf16)")
    r.add_argument("--device", choices=["cpu", "cuda"])
    r.add_argument("--no-progress", action="store_true")
    add_threads_argument(r)
    r.set_defaults(func=run_regenerate)
    from flashmap_ext.data import generate
    g = actions.add_parser("generate", help="grow the self-answered corpus (math/code/chat, refill batches, "
                           "jsonl.gz, resumable)", description=generate.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog="example: flashmap data generate --out data/qwen2.5-coder-0.5b-instruct/train")
    generate.add_arguments(g)
    g.set_defaults(func=generate.run)


def run_regenerate(args) -> int:
    from flashmap_ext.bench.machine import set_threads
    from flashmap_ext.target import load_target
    from flashmap_ext.train.regenerate import regenerate, resume_state
    from flashmap_ext.train.runner import target_placement
    args.target_dtype = args.dtype
    check_input_path("--data", args.data)
    check_output_path("--out", args.out, folder=False)
    if os.path.exists(args.out) and os.path.samefile(args.out, args.data):
        raise ValueError(f"--out {args.out}: the same file as --data; the answered conversations go to another file")
    resume_state(args.out, {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature,  # before the
                            "top_p": args.top_p, "seed": args.seed, "enable_thinking": args.thinking})  # target
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    set_threads(args.threads)
    target, tokenizer = load_target(args.target, *target_placement(args))
    if args.max_new_tokens > target.max_positions:
        print(f"--max-new-tokens {args.max_new_tokens}: the target's context is {target.max_positions} positions; "
              "each answer ends there at the latest (finish: length)", file=sys.stderr)
    n = regenerate(target.model, tokenizer, args.data, args.out, batch_size=args.batch_size,
                   max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                   enable_thinking=args.thinking, seed=args.seed, limit=args.limit,
                   progress=not args.no_progress)
    if not os.path.exists(args.out):
        print(f"regenerate: no conversation of --data {args.data} to answer; {args.out} not written", file=sys.stderr)
        return 0
    print(f"regenerate: wrote {n} conversations to {args.out}", file=sys.stderr)
    return 0
