"""Glue shared by `flashmap train {flow,dflash}` and `flashmap distill`: arguments, presets, data, export.

Every stage reads a feature cache (`flashmap features`), builds a drafter for the target, trains it with
train/trainer.py and writes `<out>/drafter/` (save_pretrained: config.json + model.safetensors) next to
`<out>/checkpoints/` and `<out>/metrics.jsonl`.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import signal
import sys
from fractions import Fraction
from typing import Callable

import torch

from flashmap_ext.checks import bound_text, check_int, check_output_path
from flashmap_ext.drafters.common.window import check_window
from flashmap_ext.train import parallel
from flashmap_ext.train.anchors import candidate_anchors, collate
from flashmap_ext.train.checkpoint import latest, load_model_weights
from flashmap_ext.train.domain_mix import domain_weight_arg, mixed
from flashmap_ext.train.features import FeatureCache, target_identity, writer_lock
from flashmap_ext.train.presets import PRESETS, preset
from flashmap_ext.train.soft_labels import LOSSES, check_cache
from flashmap_ext.train.trainer import TrainConfig, train
from flashmap_ext.train.warm_start import warm_start

EPILOG = """Typical pipeline (defaults are the paper's Qwen3-8B settings; --preset cpu-tiny trains in minutes on a CPU):
  flashmap data regenerate --target Qwen/Qwen3-8B --data sharegpt.jsonl --out regen.jsonl
  flashmap features --target Qwen/Qwen3-8B --data regen.jsonl --out feats/
  flashmap train flow  --target Qwen/Qwen3-8B --features feats/ --out runs/flow
  flashmap distill     --target Qwen/Qwen3-8B --teacher runs/flow/drafter --features feats/ --out runs/map
  flashmap generate    --target Qwen/Qwen3-8B --drafter runs/map/drafter --prompt "Hello" --chat
Baselines: `train dflash` on the same cache (--mask-token-id where the tokenizer fills the embedding table); `train eagle3` on a cache made with `features --layers eagle3`.
Several GPUs or nodes: torchrun --nproc-per-node 8 -m flashmap_ext.cli train flow ... --parallel ddp
Interrupted (Ctrl-C, SIGTERM, preemption)? Rerun the same command with --resume."""


def add_training_args(p: argparse.ArgumentParser, init_from_note: str = "", add_layers: bool = True,
                      from_teacher: bool = False) -> None:
    """Options common to every training stage; unset values come from --preset. `init_from_note`: a sentence the
    stage adds to --init-from's help (what else it starts from); `add_layers`: whether the stage has --layers
    and so --add-layers; `from_teacher`: the drafter copies a teacher's taps and context window and learns the
    teacher's distributions, so the stage has no --tap-layers, --context-window, --loss or --kl-ce-weight."""
    p.add_argument("--target", required=True, help="the target: hub name, local dir, .gguf file, or 'tiny-random'")
    p.add_argument("--features", required=True, help="feature cache directory written by `flashmap features`")
    p.add_argument("--out", required=True, help="run directory: checkpoints/, metrics.jsonl, drafter/")
    p.add_argument("--preset", default="qwen3-8b", choices=sorted(PRESETS),
                   help="defaults for everything below (default: qwen3-8b, the paper's settings)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--init-from", metavar="DIR",
                   help="warm start: a drafter checkpoint directory (config.json + model.safetensors) of the same "
                        "kind, shape and draft vocabulary whose weights the run starts from (a checkpoint of "
                        "--out, when resuming, still takes precedence); the optimizer starts fresh" + init_from_note)
    if add_layers:
        p.add_argument("--add-layers", action="store_true",
                       help="with --init-from: the checkpoint may have fewer layers than --layers; they are copied "
                            "into the first ones and each added layer starts as the identity, so training starts "
                            "from the checkpoint's function")
    if not from_teacher:
        p.add_argument("--tap-layers", metavar="IDS",
                       help="target layers whose taps the drafter reads, e.g. 1,6,11,16,21: a subset of --features "
                            "(default: flow/dflash all of the cache's, eagle3 its low/mid/high layers)")
    g = p.add_argument_group("optimisation (default: from --preset)")
    g.add_argument("--steps", type=int, help="optimizer steps")
    g.add_argument("--lr", type=float, help="peak learning rate (AdamW, warmup then cosine)")
    g.add_argument("--warmup", type=float, help="warmup: a fraction of --steps (< 1) or a step count")
    g.add_argument("--batch-size", type=int, help="sequences per process per micro-step")
    g.add_argument("--accum", type=int, help="micro-steps per optimizer step (gradient accumulation)")
    g.add_argument("--num-anchors", type=int, help="random anchors (blocks) per sequence per step")
    g.add_argument("--max-length", type=int,
                   help="crop sequences to this many tokens (>= 2: an anchor and the token it predicts)")
    if not from_teacher:
        g.add_argument("--context-window", type=window_arg, metavar="W",
                       help="FlashMap/DFlash: the drafter reads the last W committed positions only, in training "
                            "and inference (recorded in its config.json); 'none': all of them; default: the longest "
                            "context training shows it, --max-length or the --features cache's shorter crop")
    g.add_argument("--save-every", type=int, help="steps between checkpoints (0: only at the end)")
    g.add_argument("--keep-checkpoints", type=int, default=2, metavar="N",
                   help="checkpoints kept in <out>/checkpoints, the newest N (0: all, e.g. for a learning curve; "
                        "default 2)")
    if not from_teacher:
        g.add_argument("--loss", choices=LOSSES, default="ce",
                       help="ce: cross-entropy of the data tokens; kl: forward KL to the target's top-k "
                            "distribution stored by `flashmap features --topk K` (+ --kl-ce-weight x CE on its "
                            "argmax; the flow model uses it at its τ = 0 blocks). Default ce")
        g.add_argument("--kl-ce-weight", type=float, default=0.0, metavar="W",
                       help="--loss kl: weight of the CE on the target's argmax added to the KL (default 0)")
    g.add_argument("--seed", type=seed_arg, default=0)
    d = p.add_argument_group("data mix")
    d.add_argument("--domain-weight", type=domain_weight_arg, action="append", metavar="DOMAIN=N",
                   help="show each sequence of DOMAIN (math, code, chat: its corpus record's domain) N times per "
                        "epoch, 0 never; the others once. Repeatable; needs --corpus")
    d.add_argument("--corpus", metavar="PATH", action="append",
                   help="the corpus the --features were computed from (a folder of part-NNNNN.jsonl.gz or one "
                        ".jsonl / .jsonl.gz file; repeat it for a cache of several): --domain-weight takes each "
                        "sequence's domain from the record of its id there (the text is not compared)")
    r = p.add_argument_group("runtime")
    r.add_argument("--parallel", choices=parallel.MODES, default="none",
                   help="under torchrun: ddp (replicated drafter) or fsdp (sharded, for large drafters)")
    r.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    r.add_argument("--target-dtype", choices=["fp32", "bf16", "fp16"], help="default: bf16 on CUDA, else fp32")
    r.add_argument("--log-every", type=int, default=10,
                   help="steps between lines of <out>/metrics.jsonl (>= 1; a run that reaches --steps logs its "
                        "last step too; one stopped by Ctrl-C ends at its last multiple of N)")
    r.add_argument("--no-progress", action="store_true", help="no tqdm bar (metrics still go to metrics.jsonl)")


def add_new_draft_vocab(group) -> None:
    """--new-draft-vocab, beside a stage's --draft-vocab."""
    group.add_argument("--new-draft-vocab", action="store_true",
                       help="with --init-from: start from the checkpoint's weights on this run's --draft-vocab "
                            "instead of refusing a checkpoint drafted from other rows (only for drafters whose "
                            "head is the target's frozen LM-head rows, where no weight depends on the vocabulary)")


def tap_layers(args, default, num_layers: int | None = None) -> list[int]:
    """--tap-layers as a list of ints, or `default`. Raises ValueError for a malformed list, or (given the
    target's `num_layers`) for an id outside [0, num_layers)."""
    if getattr(args, "tap_layers", None) is None:
        return [int(i) for i in default]
    try:
        ids = [int(i) for i in args.tap_layers.split(",")]
    except ValueError:
        raise ValueError(f"--tap-layers: expected comma-separated layer ids like 1,6,11 (got {args.tap_layers!r})") \
            from None
    if num_layers is not None and not all(0 <= i < num_layers for i in ids):
        raise ValueError(f"--tap-layers {args.tap_layers}: the target has {num_layers} layers (ids 0 to "
                         f"{num_layers - 1})")
    return ids


def settings(args, stage: str, model_key: str) -> tuple[dict, dict]:
    """(train + data settings, drafter shape) from --preset, overridden by the options given."""
    chosen = preset(args.preset)
    run = {**chosen["data"], **chosen[stage]}
    for key in ("steps", "lr", "warmup", "batch_size", "accum", "num_anchors", "max_length", "save_every"):
        if getattr(args, key, None) is not None:
            run[key] = getattr(args, key)
    check_counts(args)
    if getattr(args, "out", None) is not None:  # the CLI's; a Namespace of the settings alone has none
        check_output_path("--out", args.out, folder=True)
        check_apart(args.out, args.features)
    loss_options(args)  # --kl-ce-weight checked before any model or cache loads
    for key in ("lr", "warmup"):
        value = getattr(args, key, None)
        if value is not None and not (math.isfinite(value) and value >= 0 and (value > 0 or key == "warmup")):
            raise ValueError(f"--{key}: must be a finite number {'>' if key == 'lr' else '>='} 0 (got {value})")
    if run.get("warmup", 0) >= 1 and run["warmup"] > run.get("steps", math.inf):  # a step count: the peak LR never comes
        raise ValueError(f"--warmup {run['warmup']:g}: a step count longer than the run (--steps {run['steps']}); "
                         "give fewer steps or a fraction of --steps (< 1)")
    shape = dict(chosen[model_key])
    window = getattr(args, "context_window", None)
    if model_key in ("flashmap", "dflash", "dflash2"):
        shape["context_window"] = run.get("max_length") if window is None else window or None
    elif window is not None:
        raise ValueError(f"--context-window: FlashMap and DFlash drafters only, DFlash2 included (not {model_key})")
    return run, shape


#: the least value of each count option given on the command line (None: the preset's, always valid)
LEAST = {"steps": 1, "batch_size": 1, "accum": 1, "num_anchors": 1, "max_length": 2, "save_every": 0,
         "keep_checkpoints": 0, "log_every": 1}


def check_counts(args) -> None:
    """ValueError naming the flag for a count option below its least value (LEAST), before any model loads:
    --log-every 0 used to end in a ZeroDivisionError after the first step, --max-length 0 in an error about
    the drafter's context_window, --max-length 1 in a run on no supervised token."""
    for key, low in LEAST.items():
        if getattr(args, key, None) is not None:
            check_int(f"--{key.replace('_', '-')}", getattr(args, key), low)


def fraction_arg(text: str) -> float:
    """argparse type of a fraction option (--frac-01, --tau0-frac): '1/16' or 0.0625, in [0, 1]."""
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], as a decimal or a fraction (0.5, 1/2), got {text!r}") \
            from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return float(value)


def positive_float_arg(text: str) -> float:
    """argparse type of a positive finite number (--mlp-ratio)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def window_arg(text: str) -> int:
    """argparse type of --context-window: an integer >= 1, or 'none' (0: unlimited)."""
    if text.strip().lower() == "none":
        return 0
    try:
        return check_window(int(text), "--context-window")
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'none', got {text!r}") from err


def seed_arg(text: str, bound: int = 2**63, why: str = "the request seed is an int64 Philox key") -> int:
    """argparse type of --seed: an integer in [0, bound) (default 2**63: the request seed is an int64
    Philox key); `seed_below(bound, why)` is the type of a narrower --seed."""
    what = f"an integer in [0, {bound_text(bound)})"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r} ({why})") from None
    if not 0 <= value < bound:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value} ({why})")
    return value


def seed_below(bound: int, why: str):
    """The argparse type of a --seed in [0, bound)."""
    return functools.partial(seed_arg, bound=bound, why=why)


def loss_options(args) -> dict:
    """{"loss", "ce_weight"} of --loss / --kl-ce-weight for the stage losses. ValueError for a weight < 0."""
    weight = getattr(args, "kl_ce_weight", 0.0)
    if not weight >= 0:
        raise ValueError(f"--kl-ce-weight: expected a weight >= 0, got {weight}")
    if weight and getattr(args, "loss", "ce") != "kl":
        raise ValueError(f"--kl-ce-weight {weight:g}: the weight of the CE added to --loss kl's KL; pass --loss kl, "
                         "or leave it out (--loss ce is the CE alone)")
    return {"loss": getattr(args, "loss", "ce"), "ce_weight": weight}


def device_of(args) -> str:
    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def target_placement(args) -> tuple[str, str]:
    """(dtype, device) of --target in this process: `load_target(args.target, *target_placement(args))`.
    --target-dtype, else bf16 on CUDA and fp32 on CPU; this process's GPU (LOCAL_RANK) on CUDA."""
    device = device_of(args)
    dtype = args.target_dtype or ("bf16" if device == "cuda" else "fp32")
    world_local = int(os.environ.get("LOCAL_RANK", "0"))
    return dtype, f"cuda:{world_local}" if device == "cuda" else "cpu"


CROPPED = ("input_ids", "loss_mask", "taps", "topk_logp", "topk_ids")  # per-position item fields


def make_collate(num_anchors: int, k: int, max_length: int | None, taps_dtype: torch.dtype) -> Callable:
    """collate_fn(items, generator) for the trainer: crop to max_length, draw anchors, K = k labels."""
    def collate_fn(items, generator):
        if max_length:
            items = [{**it, **{key: it[key][:max_length] for key in CROPPED if key in it}} for it in items]
        return collate(items, num_anchors, k, generator, taps_dtype)
    return collate_fn


def open_features(path: str, layer_ids, target=None) -> FeatureCache:
    """The cache at `path`, viewed as the taps of `layer_ids` (the drafter's; a subset of the cache's taps,
    so one cache of the union serves several drafters). ValueError when a layer is missing, it is empty, or
    it is a cache of another model: its taps are not `target`'s hidden size wide, or its manifest's
    "target_identity" is not `target`'s (`features.target_identity`: the weights, whatever their dtype; a
    cache written before manifests recorded it is not checked)."""
    try:
        cache = FeatureCache(path, layers=[int(i) for i in layer_ids])
    except (ValueError, FileNotFoundError) as err:
        raise type(err)(f"--features {err}") from None
    if len(cache) == 0:
        raise ValueError(f"--features {path} holds no sequence")
    width = cache.meta["feature_dim"] // len(cache.meta["target_layer_ids"])
    if target is not None and width != target.hidden_size:
        raise ValueError(f"--features {path}: its taps are {width} wide (cached from {cache.meta.get('target')}), "
                         f"the target's hidden size is {target.hidden_size}; cache them with this --target")
    cached = cache.meta.get("target_identity")
    ours = target_identity(target) if target is not None and cached is not None else cached
    if ours != cached:
        built = f"--target {cache.meta['target']}" if cache.meta.get("target") else "another target"
        raise ValueError(f"--features {path}: cached from {built} (target fingerprint {cached}), not from this "
                         f"--target (fingerprint {ours}: other weights of the same width); "
                         "cache the features with this --target, or train with the target that built them")
    return cache


def check_apart(out: str, other: str, flag: str = "--features", what: str = "the cache's files") -> None:
    """ValueError when the run's --out and `other` (the folder of option `flag`, holding `what`) are one folder
    or one holds the other: checkpoints and drafter/ would be written among its files (a rebuilt cache or a
    cleaned run takes both)."""
    a, b = os.path.realpath(out), os.path.realpath(other)
    if a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep):
        raise ValueError(f"--out {out}: the run's folder must lie outside {flag} {other} and not hold it "
                         f"(checkpoints would be written among {what}); choose another --out")


def target_features(args, target) -> FeatureCache:
    """--features, checked against `target` (`open_features` over all its taps) before the setup that reads
    the cache or the target at length (draft vocabulary, clock): a cache of another model is refused at once."""
    try:
        layers = FeatureCache(args.features).meta["target_layer_ids"]
    except (ValueError, FileNotFoundError) as err:
        raise type(err)(f"--features {err}") from None
    return open_features(args.features, layers, target)


def check_supervised(cache: FeatureCache, max_length: int | None, path: str) -> None:
    """ValueError when no sequence of `cache`, cropped to `max_length`, keeps an anchor with a supervised
    label (a response token followed by another, train/anchors.py): every step would train on nothing
    (loss 0, NaN accuracy) and still save a drafter. Reads the loss masks only, up to the first that keeps one."""
    shortest = None
    for i in range(len(cache)):
        anchors = candidate_anchors(cache.loss_mask(i))
        if len(anchors):
            need = int(anchors[0]) + 2  # the anchor and its first label
            if max_length is None or need <= max_length:
                return
            shortest = need if shortest is None else min(shortest, need)
    if shortest is None:
        raise ValueError(f"--features {path}: no sequence has two response tokens in a row, so no anchor has a "
                         "label (nothing to train on); rebuild the cache from answered conversations")
    raise ValueError(f"--max-length {max_length}: every sequence of --features {path} was dropped: none keeps an "
                     f"anchor and its first label within {max_length} tokens (the shortest crop that keeps one is "
                     f"{shortest}); raise --max-length")


def fit_context_window(drafter: torch.nn.Module, crop: int | None, args) -> None:
    """Without --context-window the window is --max-length, the longest context training shows the drafter;
    a cache whose sequences `flashmap features --max-length` cropped shorter (`crop`) shows it no more than
    that, so the window becomes the crop."""
    config = getattr(drafter, "config", None)
    window = getattr(config, "context_window", None)
    if getattr(args, "context_window", None) is None and crop and window and int(crop) < window:
        config.context_window = int(crop)


def run_stage(drafter: torch.nn.Module, loss_fn: Callable, args, run: dict, name: str,
              num_labels: int | None = None, target=None) -> dict:
    """Trains `drafter` (fp32 master weights) on --features and exports `<out>/drafter`; returns last metrics.

    num_labels: K of the batch labels (default: the drafter's num_draft_tokens). target: the Target the
    drafter was built for (needed by --init-from, which loads the warm-start checkpoint against it)."""
    device = device_of(args)
    cache = open_features(args.features, drafter.target_layer_ids, target)
    check_cache(cache.meta, args.features, getattr(args, "loss", "ce"))
    check_supervised(cache, run.get("max_length"), args.features)
    stream = mixed(cache, cache.ids, getattr(args, "corpus", None), getattr(args, "domain_weight", None))
    if stream is not cache:
        print(f"--domain-weight: sequences per epoch {stream.summary()}")
    fit_context_window(drafter, cache.meta.get("max_length"), args)
    if args.parallel != "none" and "WORLD_SIZE" not in os.environ:
        print(f"--parallel {args.parallel}: not started by torchrun (no WORLD_SIZE set): one process trains",
              file=sys.stderr)
    drafter = drafter.float()
    optional = {k: run[k] for k in ("betas", "grad_clip", "weight_decay") if k in run}
    cfg = TrainConfig(out=args.out, steps=run["steps"], lr=run["lr"], warmup=run["warmup"],
                      batch_size=run["batch_size"], accum=run["accum"], save_every=run["save_every"],
                      keep=getattr(args, "keep_checkpoints", 2), seed=args.seed, log_every=args.log_every, parallel=args.parallel,
                      progress=not args.no_progress, **optional)
    taps_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    collate_fn = make_collate(run["num_anchors"], num_labels or drafter.num_draft_tokens, run.get("max_length"),
                              taps_dtype)
    with contextlib.ExitStack() as held:  # one trainer per --out: a second would overwrite the checkpoints
        if int(os.environ.get("RANK", "0")) == 0:
            held.enter_context(writer_lock(args.out, "training run", "two trainers would overwrite each "
                                                                      "other's checkpoints"))
        check_out_dir(args.out, name, args.resume)
        newest = latest(args.out) if args.resume else None
        complete = newest is not None and int(os.path.basename(newest).split("-")[-1]) >= run["steps"]
        if args.resume:  # a complete run trains nothing: no schedule note, and its run.json stays as it is
            check_same_flags(args.out, args, None if complete else run["steps"])
        for flag in ("add_layers", "new_draft_vocab"):
            if getattr(args, flag, False) and not getattr(args, "init_from", None):
                raise ValueError(f"--{flag.replace('_', '-')} applies to the --init-from checkpoint: pass "
                                 "--init-from DIR")
        if getattr(args, "init_from", None) and not (args.resume and latest(args.out)):  # a checkpoint wins
            if target is None:
                raise ValueError(f"--init-from: the {name} stage does not take a warm start")
            warm_start(drafter, args.init_from, target, add_layers=getattr(args, "add_layers", False),
                       new_vocab=getattr(args, "new_draft_vocab", False))
        if int(os.environ.get("RANK", "0")) == 0 and not complete:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "run.json"), "w") as f:
                json.dump({"stage": name, "args": {k: v for k, v in vars(args).items() if k != "func"},
                           "settings": run, "features": cache.meta}, f, indent=1, default=str)
        metrics = train(drafter, loss_fn, stream, collate_fn, cfg, resume=args.resume, device=device)
        export(drafter, args)
    if metrics.pop("complete", False) and int(os.environ.get("RANK", "0")) == 0:
        loss = f"{metrics['loss']:.4f}" if "loss" in metrics else "none (no metrics.jsonl line)"
        print(f"{name}: the run in {args.out} is already complete (step {metrics['step']} of {cfg.steps}); "
              f"nothing to train. Last logged loss {loss}.")
    elif metrics["step"] < cfg.steps:
        metrics["stopped"] = True
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"{name}: stopped by a signal at step {metrics['step']} of {cfg.steps}; checkpoint saved and "
                  f"{args.out}/drafter holds those weights. Rerun the same command with --resume to continue.",
                  file=sys.stderr)
    return metrics


def finish(name: str, metrics: dict, args) -> int:
    """Prints a stage's last line; its exit code: 128 + the signal's number when one stopped it before --steps
    (130 Ctrl-C, 143 SIGTERM: a script's `train ... && distill ...` must not go on with half-trained weights; its
    last line, "stopped by a signal", is `run_stage`'s), else 0."""
    if metrics.get("stopped"):
        return 128 + metrics.get("signal", signal.SIGINT)
    print(f"{name}: step {metrics['step']}, loss {metrics.get('loss', float('nan')):.4f}; "
          f"drafter in {os.path.join(args.out, 'drafter')}")
    return 0


def check_out_dir(out: str, stage: str, resume: bool) -> None:
    """Before run.json is rewritten: --out must not hold checkpoints unless --resume, and --resume must
    continue the same stage (another stage's checkpoint fails to load with a long state_dict error)."""
    if latest(out) is None:
        if resume:  # a start-or-continue script may pass it always; a mistyped --out must not go unnoticed
            print(f"--resume: no checkpoint in {out}: starting a new run from step 0", file=sys.stderr)
        return
    if not resume:
        raise FileExistsError(f"--out {out} already holds checkpoints ({os.path.basename(latest(out))}): "
                              "pass --resume to continue, or choose another output directory")
    try:
        with open(os.path.join(out, "run.json")) as f:
            previous = json.load(f).get("stage")
    except (OSError, ValueError):
        return
    if previous is not None and previous != stage:
        command = "flashmap distill" if previous == "distill" else f"flashmap train {previous}"
        raise ValueError(f"--out {out} holds a {previous!r} run, not {stage!r}: resume it with `{command} "
                         f"... --resume`, or choose another output directory")


# Flags that may change on --resume: how the run is shown and saved, where it runs and lies (--out: a run
# moved or copied elsewhere), and how long it goes on (--steps: a resumed run may be extended). Every other
# flag shapes the drafter, its data or its optimisation.
RESUME_MAY_CHANGE = {"func", "resume", "no_progress", "log_every", "save_every", "keep_checkpoints", "parallel", "device",
                     "steps", "out"}


def check_same_flags(out: str, args, steps: int | None = None) -> None:
    """--resume continues the run in `out` bit for bit only with the flags it was started with (its run.json
    "args"): ValueError naming each other flag that differs (a changed drafter shape used to end in a
    screenful of load_state_dict size mismatches, a changed --lr or data went on silently). `steps`, the
    resumed run's: another count than the run's is allowed (a run may be extended) and said on stderr, since
    the warmup + cosine schedule then changes from the checkpoint on."""
    try:
        with open(os.path.join(out, "run.json")) as f:
            saved = json.load(f)
        before = saved.get("args", {})
    except (OSError, ValueError):
        return
    now = json.loads(json.dumps(vars(args), default=str))  # as run.json stores it

    def same(a, b) -> bool:
        if isinstance(a, str) and isinstance(b, str) and os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return a == b

    def shown(key: str, value) -> str:
        return f"not given: the default, under --preset {before.get('preset')}" if value is None else str(value)

    changed = [f"--{key.replace('_', '-')} {shown(key, now[key])} (the run's: {shown(key, before[key])})"
               for key in before if key in now and key not in RESUME_MAY_CHANGE and not same(before[key], now[key])]
    if changed:
        raise ValueError(f"--resume: {out} was started with other flags: {'; '.join(changed)}; rerun with the "
                         f"run's flags ({out}/run.json \"args\"), or choose another --out")
    was = saved.get("settings", {}).get("steps")
    if steps is not None and was is not None and steps != was:
        print(f"--resume: --steps {steps} (the run so far: {was}): the warmup and cosine schedule are "
              f"those of {steps} steps from the checkpoint on, so the learning rate differs from the run's",
              file=sys.stderr)


def export(drafter: torch.nn.Module, args) -> str:
    """Rank 0 writes `<out>/drafter` with save_pretrained (FSDP: from the last checkpoint's full weights)."""
    path = os.path.join(args.out, "drafter")
    if int(os.environ.get("RANK", "0")) != 0:
        return path
    if args.parallel == "fsdp":
        fresh = type(drafter)(drafter.config)
        drafter = load_model_weights(latest(args.out), fresh)
    drafter.save_pretrained(path)
    return path
