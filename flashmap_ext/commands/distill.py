"""`flashmap distill`: distil a trained flow drafter into a flow map that drafts in 1 or 2 steps.

Semigroup flow-map distillation (DESIGN.md §4): half the blocks are zero-length jumps matched to the frozen
flow teacher, a fraction (--frac-01, default 1/16) are full 0→1 jumps, the rest random jumps whose target
is the student's own two half-jumps (no grad). The student starts as the teacher's Euler step.
"""
from __future__ import annotations

import argparse

from flashmap_ext.train import runner


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("distill", help="distil a flow drafter into a 1-2 step flow map",
                              description=__doc__, epilog=runner.EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    runner.add_training_args(p, init_from_note=": here a distilled map (a `distill` run's drafter/); the "
                                              "student otherwise starts as --teacher's Euler step",
                            add_layers=False, from_teacher=True)
    p.add_argument("--teacher", required=True, help="the flow drafter: <flow run>/drafter (from `train flow`)")
    p.add_argument("--frac-01", type=runner.fraction_arg, default=1 / 16,
                   help="fraction of all jumps that go 0→1, in [0, 1] (default 1/16; '1/16' or 0.0625)")
    p.add_argument("--data-weight", type=runner.fraction_arg, default=0.0, metavar="W",
                   help="weight of the data label in the targets taken from the teacher (zero-length jumps and a "
                        "τ-gated student's 0→1 jumps): (1 − W)·teacher + W·label, in [0, 1] (default 0: the "
                        "teacher alone). W > 0 lets the one-step map learn past its teacher")
    p.add_argument("--reachable", action="store_true",
                   help="the 0→1 jumps' loss only at the slots verification reaches (those whose one-step draft "
                        "prefix is right), as `train flow --reachable` trains a teacher's one step")
    p.set_defaults(func=run, tap_layers=None, context_window=None)  # the student keeps the teacher's taps, window


def run(args) -> int:
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    from flashmap_ext.train.distill import distill_loss, make_student
    if args.reachable and args.frac_01 == 0:
        raise ValueError("--reachable: selects the slots of the 0→1 jumps; set --frac-01 > 0")
    run_settings, _ = runner.settings(args, "distill", "flashmap")
    runner.check_apart(args.out, args.teacher, "--teacher", "the teacher's weights")
    teacher_config(args)  # a --teacher that is not a flow model refused before any model loads
    args.teacher_sha256 = teacher_digest(args)  # recorded in run.json; a resumed run checks it
    from flashmap_ext.target import load_target
    target, _ = load_target(args.target, *runner.target_placement(args))
    teacher = FlashMapDrafter.from_pretrained(args.teacher, target).float().eval().requires_grad_(False)
    student = make_student(teacher)
    device = runner.device_of(args)
    teacher.to(device)

    def loss_fn(model, batch, generator):
        return distill_loss(model, teacher, batch, generator, frac_01=args.frac_01, data_weight=args.data_weight,
                            reachable=args.reachable)
    metrics = runner.run_stage(student, loss_fn, args, run_settings, "distill", target=target)
    return runner.finish("distill", metrics, args)


def teacher_digest(args) -> str:
    """sha256 of --teacher's model.safetensors. With --resume, ValueError naming --teacher when the run in --out
    recorded other teacher weights: its targets would change mid-run without a word."""
    import json
    import os
    from pathlib import Path

    from flashmap_ext.assets.models import sha256_file
    weights = Path(args.teacher) / "model.safetensors"
    if not weights.is_file():
        return ""  # from_pretrained names the missing file
    digest = sha256_file(weights)
    try:
        with open(os.path.join(args.out, "run.json")) as f:
            was = json.load(f).get("args", {}).get("teacher_sha256")
    except (OSError, ValueError):
        was = None
    if args.resume and was and digest and was != digest:
        raise ValueError(f"--teacher {args.teacher}: its weights differ from those the run in {args.out} started "
                         f"with (sha256 {digest[:12]}…, the run's {was[:12]}…); resume with the same teacher, or "
                         "choose another --out")
    return digest


def teacher_config(args):
    """The --teacher checkpoint's FlashMapConfig, read before any model loads: ValueError naming --teacher for a
    folder that is not a FlashMap checkpoint or holds a distilled map (two_time) instead of a flow model."""
    from flashmap_ext.drafters.common.checkpoint import CheckpointError, load_config
    from flashmap_ext.drafters.flashmap import FlashMapConfig
    try:
        config = load_config(args.teacher, "flashmap", FlashMapConfig.from_dict)
    except CheckpointError as err:
        raise CheckpointError(f"--teacher {err}") from None
    if config.two_time:
        raise ValueError(f"--teacher {args.teacher}: a distilled flow map (two_time=True), not a flow model; "
                         "distill from the `train flow` run's drafter/")
    return config

