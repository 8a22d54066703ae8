"""`flashmap train {flow,dflash}`: train a drafter on a feature cache.

  flow    the FlashMap flow model (DESIGN §4): τ ~ U[0,1] stratified, slot-weighted CE, d-space noise.
          Its output is the teacher for `flashmap distill`, and already drafts on its own (one Euler step).
  dflash  the DFlash baseline (block = anchor + masks, weighted CE, γ = 7 for block 16).
"""
from __future__ import annotations

import argparse

from flashmap_ext.train import runner


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a FlashMap flow drafter or the DFlash baseline",
                              description=__doc__, epilog=runner.EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    stages = p.add_subparsers(dest="stage", required=True, metavar="STAGE")
    flow = stages.add_parser("flow", help="FlashMap flow model (the distillation teacher)", epilog=runner.EPILOG,
                             description="Train the FlashMap flow model (DESIGN §4) on a feature cache.",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    runner.add_training_args(flow)
    shape = flow.add_argument_group("drafter shape (default: from --preset)")
    shape.add_argument("--layers", type=int, help="DiT blocks")
    shape.add_argument("--width", type=int, help="DiT width")
    shape.add_argument("--heads", type=int, help="attention heads (width %% heads == 0)")
    shape.add_argument("--block-size", type=int, help="draft tokens per block (K)")
    flow.set_defaults(func=run_flow)
    dflash = stages.add_parser("dflash", help="DFlash baseline drafter", epilog=runner.EPILOG,
                               description="Train the DFlash baseline drafter on a feature cache.",
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    runner.add_training_args(dflash)
    shape = dflash.add_argument_group("drafter shape (default: from --preset)")
    shape.add_argument("--layers", type=int, help="decoder layers")
    shape.add_argument("--block-size", type=int, help="anchor + draft tokens per block")
    shape.add_argument("--mask-token-id", type=int,
                       help="embedding row used as the mask token (default: the first row past the tokenizer)")
    dflash.set_defaults(func=run_dflash)


def _overrides(args, preset_shape: dict, names: dict) -> dict:
    """Drafter config: the preset's shape, overridden by the options given (names: option -> field)."""
    out = dict(preset_shape)
    for opt, field in names.items():
        if getattr(args, opt, None) is not None:
            out[field] = getattr(args, opt)
    return out


def run_flow(args) -> int:
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    from flashmap_ext.train.flow import flow_loss
    run, shape = runner.settings(args, "flow", "flashmap")
    shape = _overrides(args, shape, {"layers": "n_layers", "width": "width", "heads": "heads",
                                     "block_size": "block_size"})
    target, _ = runner.load_target(args)
    layer_ids = runner.FeatureCache(args.features).meta["target_layer_ids"]
    drafter = FlashMapDrafter.for_target(target, **shape, target_layer_ids=tuple(layer_ids), two_time=False)
    metrics = runner.run_stage(drafter, flow_loss, args, run, "flow")
    print(f"flow: step {metrics['step']}, loss {metrics.get('loss', float('nan')):.4f}; "
          f"drafter in {args.out}/drafter")
    return 0


def run_dflash(args) -> int:
    from flashmap_ext.drafters.dflash import DFlashDrafter
    from flashmap_ext.train.dflash import dflash_loss
    run, shape = runner.settings(args, "train-dflash", "dflash")
    shape = _overrides(args, shape, {"layers": "num_hidden_layers", "block_size": "block_size",
                                     "mask_token_id": "mask_token_id"})
    target, tokenizer = runner.load_target(args)
    layer_ids = runner.FeatureCache(args.features).meta["target_layer_ids"]
    tok = tokenizer if hasattr(tokenizer, "__len__") else None
    drafter = DFlashDrafter.for_target(target, tokenizer=tok, target_layer_ids=list(layer_ids), **shape)
    metrics = runner.run_stage(drafter, dflash_loss, args, run, "dflash")
    print(f"dflash: step {metrics['step']}, loss {metrics.get('loss', float('nan')):.4f}; "
          f"drafter in {args.out}/drafter")
    return 0
