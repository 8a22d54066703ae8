"""The stages of `flashmap testbed run` (DESIGN.md §13): target, corpus, features, the drafters' trainings with
the project's own CLI (flow, map, DFlash, DFlash2, EAGLE-3, or the subset --drafters names), learning curves, the
measurement and the report. A stage whose output exists is skipped."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import torch

from flashmap_ext.synthetic import report
from flashmap_ext.synthetic.language import Language
from flashmap_ext.synthetic.target import TargetRecipe, conversation, load_spec, train_target

TAPS = "1,2,3"
CORPUS_SEED, HELDOUT_SEED, CURVE_SEED = 3, 2, 4
# Equal parameter budgets (~210 k trainable each at the target's width 64, K = 8): flow 209,920 / map 219,200,
# DFlash 209,504, DFlash2 (DFlash's 3 layers + convolutions, group 16, + selector, rank 16) 226,400, EAGLE-3 211,200.
# At width 64 FlashMap's default cond_dim 256 would hold most of its weights.
FLOW_SHAPE = ("--layers", "2", "--width", "64", "--heads", "4", "--cond-dim", "32")
DFLASH_SHAPE = ("--layers", "3")
DFLASH2_SHAPE = (*DFLASH_SHAPE, "--conv-group-size", "16", "--selector-rank", "16", "--selector-top-k", "16")
EAGLE3_SHAPE = ("--intermediate-size", "800")


def _stage_args(target: Path, feats: Path, run: Path, opts: dict, steps: int) -> list[str]:
    every = max(1, steps // opts["curve_points"])
    return ["--target", str(target), "--features", str(feats), "--out", str(run), "--preset", "cpu-tiny",
            "--steps", str(steps), "--save-every", str(every), "--keep-checkpoints", "0", "--device", "cpu",
            "--no-progress", "--log-every", str(max(1, steps // 50)), "--seed", str(opts.get("seed", 0))]


def drafter_commands(out: Path, target: Path, opts: dict) -> dict[str, list[str]]:
    """{run name: the `flashmap` argv that trains it} for flow, map, DFlash, DFlash2 and EAGLE-3 (the map needs
    the flow)."""
    k, steps, feats = opts["block_size"], opts["steps"], out / "feats"
    vocab = Language(load_spec(target)).vocab_size
    taps = ["--tap-layers", TAPS]  # the student of `distill` keeps its teacher's
    runs = {"flow": ["train", "flow", *taps, *FLOW_SHAPE, "--block-size", str(k), "--tau0-frac", "0.5",
                     "--slot-decay", "auto"],
            "map": ["distill", "--teacher", str(out / "flow" / "drafter")],
            "dflash": ["train", "dflash", *taps, *DFLASH_SHAPE, "--block-size", str(k + 1), "--mask-token-id", str(vocab)],
            "dflash2": ["train", "dflash2", *taps, *DFLASH2_SHAPE, "--block-size", str(k + 1),
                        "--mask-token-id", str(vocab)],
            "eagle3": ["train", "eagle3", *taps, *EAGLE3_SHAPE, "--draft-tokens", str(k)]}
    return {name: [*argv, *_stage_args(target, feats, out / name, opts, steps // 2 if name == "map" else steps)]
            for name, argv in runs.items()}


def train_drafters(out: Path, target: Path, opts: dict, flashmap: Callable) -> dict[str, Path]:
    """Trains the drafters of opts["drafters"] (default all; skipping finished runs); {name: run directory}."""
    commands = drafter_commands(out, target, opts)
    chosen = opts.get("drafters") or tuple(commands)
    for name in ("flow", "dflash", "dflash2", "eagle3", "map"):
        if name in chosen and not (out / name / "drafter" / "config.json").is_file():
            flashmap(*commands[name])
    return {name: out / name for name in commands if name in chosen}


def prepare(out: Path, opts: dict, flashmap: Callable) -> Path:
    """The target (trained unless present), the training corpus and its feature cache; returns the target dir."""
    from flashmap_ext.synthetic.greedy import greedy_corpus
    from flashmap_ext.synthetic.language import sample_corpus
    target = out / "target"
    if not (target / "testbed.json").is_file():
        train_target(target, recipe=TargetRecipe(steps=opts["target_steps"]))
    lang = Language(load_spec(target))
    data = out / "train.jsonl"
    if not data.is_file():
        n, h = opts["train_sequences"], lang.spec.header
        records = greedy_corpus(lang, n, CORPUS_SEED) if opts.get("data") == "greedy" else \
            [(s, h + 1) for s in sample_corpus(lang, n, CORPUS_SEED)]
        data.write_text("".join(json.dumps(conversation(lang, s, c)) + "\n" for s, c in records))
    if not (out / "feats" / "index.jsonl").is_file() or not (out / "feats.done").is_file():
        flashmap("features", "--target", str(target), "--data", str(data), "--out", str(out / "feats"),
                 "--layers", TAPS, "--dtype", "fp32", "--max-length", "256", "--device", "cpu", "--no-progress")
        (out / "feats.done").write_text("ok\n")
    return target


# The options that shape what a run directory holds (target, corpus, drafters, their checkpoints): a rerun on the
# same --out reuses the finished stages, so it must ask for the same; the others only change the measurement.
BUILD_OPTIONS = ("target_steps", "train_sequences", "data", "block_size", "steps", "curve_points", "seed")


def check_build_options(out: Path, opts: dict) -> None:
    """Records BUILD_OPTIONS in out/build.json on the first run; on a rerun, ValueError naming every flag whose
    value differs from the one the finished stages were built with (they would be reused, not rebuilt)."""
    path, now = out / "build.json", {k: opts.get(k) for k in BUILD_OPTIONS}
    if not path.is_file():
        path.write_text(json.dumps(now, indent=1) + "\n")
        return
    was = json.loads(path.read_text())
    changed = [f"--{k.replace('_', '-')} {was.get(k)} (asked: {now[k]})" for k in BUILD_OPTIONS if was.get(k) != now[k]]
    if changed:
        raise ValueError(f"--out {out} was built with {', '.join(changed)}: its finished stages would be reused; "
                         "choose another --out, or rerun with the values it was built with")


def run_testbed(out: Path, opts: dict, flashmap: Callable) -> dict:
    """All stages; writes results.json, results.md and curves.png in `out` and returns the results."""
    from flashmap_ext.synthetic.measure import learning_curves, measure
    from flashmap_ext.synthetic.select import select_checkpoints
    out.mkdir(parents=True, exist_ok=True)
    check_build_options(out, opts)
    target = prepare(out, opts, flashmap)
    runs = train_drafters(out, target, opts, flashmap)
    torch.set_num_threads(1)
    curves = learning_curves(target, runs, opts, CURVE_SEED)
    selected = {}
    if opts.get("select", "last") == "best":
        runs, selected = select_checkpoints(runs, curves)
    results = measure(target, runs, opts, HELDOUT_SEED)
    results["curves"], results["selected"] = curves, selected
    results["target"] = json.loads((target / "testbed.json").read_text())
    results["options"] = {k: v for k, v in opts.items() if k not in ("func",) and not callable(v)}
    results["summary"] = report.summary(results)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=_jsonable) + "\n")
    (out / "results.md").write_text(report.markdown(results))
    report.plot_curves(curves, out / "curves.png")
    return results


def _jsonable(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)
