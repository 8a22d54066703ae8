"""`flashmap features`: run the target over the training conversations once and cache its taps on disk.

Each conversation is rendered with the target's chat template exactly as at inference (loss only on
assistant tokens) and run through the target once; the outputs of the tapped decoder layers are streamed
to memory-mappable shards in --out (bf16 by default, ~n_taps·d·2 bytes per token). Sequences are
prefilled in length-sorted, right-padded batches of --batch-tokens. Safe to interrupt: rerun the same command
and it skips the sequences already cached. A rerun is refused when --max-length, --layers, --dtype or --topk
differ from the cache's, or when a cached sequence has other tokens now (its conversation was edited); the
cache may hold the sequences of other --data files too (run once per file into one --out; the manifest keeps
the first file as "data" and each file's report of kept/dropped samples). It also records a fingerprint
of the target's weights (whatever their dtype): `flashmap train` and `flashmap distill` refuse the cache
with a --target of other weights.

With --store the features go to the feature store under the asset cache (`train.feature_store`: one cache
per corpus part, keyed by the part, the target, the taps and the settings), extended with the new sequences
of parts that grew, and --out becomes a link to the store's view of the whole --data: computed once, found
again by any work tree (`flashmap train --features OUT`).
"""
from __future__ import annotations

import sys

from flashmap_ext.bench.machine import positive_int
from flashmap_ext.checks import check_input_path, check_int, check_output_path
from flashmap_ext.commands import io_parser


def add_parser(subparsers) -> None:
    p = io_parser(subparsers, "features", "cache the target's hidden-state taps for training", __doc__,
                  "flashmap features --target Qwen/Qwen3-8B --data regen.jsonl --out feats/",
                  "conversations: a jsonl file (e.g. from `flashmap data regenerate`), or a corpus folder or "
                  ".jsonl.gz part of `flashmap data generate`",
                  "cache directory (created; resumed if it exists)")
    p.add_argument("--layers", default="flashmap",
                   help="0-based decoder layers to tap, e.g. 1,9,17,25,33; or 'flashmap' (default: 5 spread "
                        "over 1..L-3, what FlashMap and DFlash drafters read) or 'eagle3' (low/mid/high)")
    p.add_argument("--max-length", type=int, default=3072,
                   help="crop sequences to this many tokens (>= 2: an anchor and the token it predicts)")
    p.add_argument("--thinking", action="store_true", help="enable_thinking=True in the chat template")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16", help="stored dtype of the taps")
    p.add_argument("--topk", type=int, default=0, metavar="K",
                   help="also store the target's K largest next-token log-probabilities per position (fp16, "
                        "+ the rest's mass; ~6·K bytes/token): the soft labels of `train ... --loss kl`; "
                        "32 is the usual K (default 0: none)")
    p.add_argument("--target-dtype", choices=["fp32", "bf16", "fp16"], help="default: bf16 on CUDA, else fp32")
    p.add_argument("--batch-tokens", type=positive_int, default=2048,
                   help="padded tokens per prefill batch (rows x longest row; 1: one sequence at a time)")
    p.add_argument("--store", action="store_true",
                   help="cache in the feature store under the asset cache (per corpus part, extended "
                        "incrementally) and make --out a link to its view of --data")
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from flashmap_ext.target import load_target
    from flashmap_ext.train.data import DataReport, load_samples
    from flashmap_ext.train.features import cache_features, same_tokens_as_cached, update_manifest
    from flashmap_ext.train.runner import check_counts, target_placement
    if args.topk < 0:
        raise ValueError(f"--topk: expected K >= 0 (0: no soft labels), got {args.topk}")
    check_counts(args)  # --max-length >= 2 (a negative one cropped the last tokens off)
    check_input_path("--data", args.data)
    if args.store:
        check_link_path("--out", args.out)
    else:
        check_output_path("--out", args.out, folder=True)
        check_outside_store("--out", args.out)
        check_cache_folder("--out", args.out)
    target, tokenizer = load_target(args.target, *target_placement(args))
    layers = tap_layers(args.layers, target.num_layers)
    if args.topk >= target.vocab_size:
        raise ValueError(f"--topk {args.topk}: at most the target's vocabulary size - 1 ({target.vocab_size - 1})")
    if args.store:
        return run_store(args, target, tokenizer, layers)
    first = other_data(args.out, args.data)
    report = DataReport()
    samples = first_read(load_samples(args.data, tokenizer, enable_thinking=args.thinking,
                                      max_length=args.max_length, report=report))
    samples = same_tokens_as_cached(args.out, samples, f"--out {args.out}", f"--data {args.data}",
                                    first and f"--data {first}")
    meta = {"target": args.target, "data": args.data, "enable_thinking": args.thinking,
            "max_length": args.max_length}
    n = cache_features(target.model, samples, args.out, layers, dtype=args.dtype, meta=meta,
                       progress=not args.no_progress, topk=args.topk, batch_tokens=args.batch_tokens,
                       window=256 if args.batch_tokens > 1 else 1)
    update_manifest(args.out, manifest_report(args.out, first and args.data, report.as_dict()))
    print(f"features: cached {n} new sequences (layers {layers}) in {args.out}; {args.data}: "
          f"{report.summary(args.max_length)}", file=sys.stderr)
    return 0


def other_data(out: str, data: str) -> str | None:
    """The --data the cache at `out` was started from when it is another file than `data` (else None); says so
    on stderr: the new file's sequences are added to it (one cache may hold several files)."""
    import json
    import os
    try:
        with open(os.path.join(out, "manifest.json")) as f:
            first = json.load(f).get("data")
    except (OSError, ValueError):
        return None
    if not first or os.path.abspath(first) == os.path.abspath(data):
        return None
    print(f"features: --out {out} holds the sequences of --data {first}; adding those of {data} to it "
          "(a cache of their own needs another --out)", file=sys.stderr)
    return first


def manifest_report(out: str, added: str | None, samples: dict) -> dict:
    """The manifest fields recording this run's data report: "samples" for the --data the cache started from,
    else `added` (another file's path) keyed into "added_data" beside the reports of files added before."""
    if not added:
        return {"samples": samples}
    import json
    import os
    with open(os.path.join(out, "manifest.json")) as f:
        before = json.load(f).get("added_data", {})
    return {"added_data": {**before, added: {"samples": samples}}}


def first_read(samples):
    """`samples` as an iterator whose first item is already read: a file that is not a conversation file
    fails here, before the cache folder and its progress bar are made."""
    import itertools
    it = iter(samples)
    first = next(it, None)
    return it if first is None else itertools.chain([first], it)


def check_link_path(flag: str, path: str) -> None:
    """ValueError naming the option when `path` is neither free nor a link (--store replaces a link only)."""
    import os
    if os.path.lexists(path) and not os.path.islink(path):
        raise ValueError(f"{flag} {path}: something that is not a link is there; with --store, --out is made a "
                         "link to the feature store's view (remove it or give another path)")


def check_cache_folder(flag: str, path: str) -> None:
    """ValueError naming the option when `path` is a folder that holds files but no cache (no manifest.json): a
    drafter, a training run or anything else, among whose files the shards would be written."""
    import os
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "manifest.json")):
        held = sorted(name for name in os.listdir(path) if name != "writer.lock")
        if held:
            raise ValueError(f"{flag} {path}: a folder that holds other files ({', '.join(held[:3])}"
                             f"{', …' if len(held) > 3 else ''}) and no feature cache; give a new or empty folder")


def check_outside_store(flag: str, path: str) -> None:
    """ValueError naming the option when `path` (without --store) is, or links into, the feature store:
    a plain cache written there would change the store's shared shards (views hard-link the parts')."""
    import os

    from flashmap_ext.train.feature_store import in_store
    if in_store(path):
        raise ValueError(f"{flag} {path}: {'a link into' if os.path.islink(path) else 'a folder in'} the feature "
                         f"store ({os.path.realpath(path)}), which only --store writes: use --store, or another folder")


def run_store(args, target, tokenizer, layers) -> int:
    """--store: cache every part of --data in the feature store, link --out to the view of all of them."""
    import os

    from flashmap_ext.bench.machine import describe
    from flashmap_ext.train import feature_store
    from flashmap_ext.train.features import DTYPES
    weight = next(target.model.parameters()).dtype
    target_dtype = next(name for name, dt in DTYPES.items() if dt == weight)
    view = feature_store.build(target.model, tokenizer, args.data, layers, dtype=args.dtype,
                               target_dtype=target_dtype, max_length=args.max_length, enable_thinking=args.thinking,
                               topk=args.topk, batch_tokens=args.batch_tokens, progress=not args.no_progress,
                               log=lambda line: print(line, file=sys.stderr))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = f"{args.out}.tmp-link"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(view, tmp)
    os.replace(tmp, args.out)
    print(f"features: {args.out} -> {view} (machine: {describe()['cpu']})", file=sys.stderr)
    return 0


def tap_layers(spec: str, num_layers: int) -> list[int]:
    """--layers: 'flashmap' | 'eagle3' | a comma list of 0-based ids in [0, num_layers). Raises ValueError
    otherwise."""
    from flashmap_ext.drafters.eagle3.config import eagle3_layer_ids
    from flashmap_ext.drafters.flashmap.config import default_tap_layers
    if spec == "flashmap":
        return list(default_tap_layers(num_layers))
    if spec == "eagle3":
        return list(eagle3_layer_ids(num_layers))
    try:
        ids = [int(x) for x in spec.split(",")]
    except ValueError:
        raise ValueError(f"--layers: expected 'flashmap', 'eagle3' or ids like 1,9,17 (got {spec!r})") from None
    return [check_int("--layers", i, 0, num_layers) for i in ids]
