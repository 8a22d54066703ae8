"""`flashmap train {flow,dflash,dflash2,eagle3}`: train a drafter on a feature cache (`snapshot`: a drafter
folder from one of a run's training checkpoints).

  flow    the FlashMap flow model (DESIGN.md §4): τ ~ U[0,1] stratified, slot-weighted CE, d-space noise.
          Its output is the teacher for `flashmap distill`, and already drafts on its own (one Euler step).
  dflash  the DFlash baseline (block = anchor + masks, weighted CE, decay γ = 7 for block 16; --slot-decay).
  dflash2 DFlash2: DFlash plus dynamic convolutions and a candidate selector; DFlash's loss plus the
          selector's (train/dflash.py), on the same features.
  eagle3  the EAGLE-3 baseline (training-time test over 7 steps, weights 0.8^j, draft vocabulary of the
          most frequent response tokens). Its taps differ: cache them with `flashmap features --layers eagle3`.
"""
from __future__ import annotations

import argparse
import json
import sys

from flashmap_ext.checks import check_int
from flashmap_ext.train import runner


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a FlashMap flow drafter or a baseline (DFlash, EAGLE-3)",
                              description=__doc__, epilog=runner.EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    stages = p.add_subparsers(dest="stage", required=True, metavar="STAGE")
    flow = stages.add_parser("flow", help="FlashMap flow model (the distillation teacher)", epilog=runner.EPILOG,
                             description="Train the FlashMap flow model (DESIGN.md §4) on a feature cache.",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    runner.add_training_args(flow, init_from_note=". With --trunk qwen3 --tau-gated-input it also starts from a "
                                                 "DFlash checkpoint of its shape")
    shape = flow.add_argument_group("drafter shape (default: from --preset)")
    shape.add_argument("--layers", type=int, help="DiT blocks")
    shape.add_argument("--width", type=int, help="DiT width")
    shape.add_argument("--heads", type=int, help="attention heads (width %% heads == 0)")
    shape.add_argument("--block-size", type=int, help="draft tokens per block (K)")
    shape.add_argument("--cond-dim", type=int, help="width of the time conditioning c (default 256 with every preset, "
                                                     "cpu-tiny's width 128 included; on a narrow drafter a value at or "
                                                     "below --width keeps it from dominating the parameters)")
    shape.add_argument("--mlp-ratio", type=runner.positive_float_arg,
                       help="each block's MLP width as a multiple of --width (default 4; width x ratio is rounded "
                            "down, with --trunk qwen3 to the nearest, and must be >= 1)")
    shape.add_argument("--joint-attention", action="store_true",
                       help="one attention per block over the memory and the block's own slots (DFlash's layout) "
                            "instead of slot self-attention + memory cross-attention; reference path only (no "
                            "fused CUDA kernels, no vLLM export)")
    shape.add_argument("--tau-gated-input", action="store_true",
                       help="scale the state's part of each slot token by τ: at τ = 0 (a one-step draft) a slot "
                            "holds only its position, as DFlash's mask tokens, and the draft does not depend on "
                            "the noise; reference path only (no fused CUDA kernels, no vLLM export)")
    shape.add_argument("--memory-width", type=int,
                       help="width of the memory entries (tap and anchor projections) that each block's keys and "
                            "values are projected from (default: --width; DFlash's are the target's hidden size); "
                            "reference path only (no fused CUDA kernels, no vLLM export) unless equal to --width")
    shape.add_argument("--head-mlp", type=int, metavar="H",
                       help="a residual MLP with H hidden units at the target's width between the final Linear and "
                            "the LM head, so the logits are not confined to a --width-dim subspace (DFlash's hidden "
                            "state is the target's width); reference path only (no fused CUDA kernels, no vLLM "
                            "export)")
    shape.add_argument("--trunk", choices=("dit", "qwen3"), default="dit",
                       help="'dit' (default): adaLN-Zero DiT blocks; 'qwen3': DFlash's decoder layer (one "
                            "grouped-query attention over the memory and the block's own slots, SwiGLU MLP of "
                            "--width x --mlp-ratio units) at the target's hidden size, the time conditioning "
                            "added to the slot tokens, the final RMSNorm read by the LM head; reference path only "
                            "(no fused CUDA kernels, no vLLM export)")
    shape.add_argument("--kv-heads", type=int, metavar="G",
                       help="key/value heads of --trunk qwen3 (grouped-query attention; must divide --heads; "
                            "default --heads)")
    flow.add_argument("--tau0-frac", type=runner.fraction_arg, default=0.0,
                      help="fraction of blocks trained at τ = 0 (pure noise, what 1-step drafting sees); the rest "
                           "τ ~ U[0,1] stratified (default 0: the FLM recipe)")
    flow.add_argument("--rollout-weight", type=runner.fraction_arg, default=0.0, metavar="W",
                      help="share W in [0, 1] of the loss given to the 2-step draft's second evaluation, trained at the "
                           "--tau0-frac blocks on the state the draft builds from the first one (default 0)")
    flow.add_argument("--rollout-reachable", action="store_true",
                      help="with --rollout-weight: the second evaluation's CE only at the slots verification "
                           "reaches (every earlier slot of the first evaluation's draft right)")
    flow.add_argument("--reachable", action="store_true",
                      help="the --tau0-frac blocks' CE only at the slots verification reaches (every earlier slot "
                           "of their 1-step draft right): slot k learns the token after the draft's own prefix")
    add_slot_decay(flow, "7", "default 7 (DFlash's value for 15 slots)")
    flow.add_argument("--no-head-recompute", action="store_true",
                      help="keep the draft-vocab logits for backward instead of recomputing the head under "
                           "activation checkpointing (less compute, more memory: for CPU runs)")
    shape.add_argument("--tap-input-norm", action="store_true",
                       help="RMS-normalise each tapped layer before the tap projection (recorded in the "
                            "checkpoint's config as tap_input_norm; default off)")
    shape.add_argument("--clock", choices=("projected", "full-state"), default="projected",
                       help="τ↔t clock: 'projected' (default) calibrates τ for the network's d-dim input Eᵀx "
                            "(a Monte-Carlo table built once from E, stored in config.json); 'full-state' is "
                            "FLM's clock of the V-dim state, which that input cannot show")
    shape.add_argument("--state-loglik", action="store_true",
                       help="add the input state's exact log-likelihood to the logits (config state_loglik)")
    shape.add_argument("--draft-vocab", metavar="N|FILE",
                       help="draft vocabulary: the N most frequent supervised ids of --features, or a JSON file "
                            "with 'ids' (target ids); the flow lives on these rows only (default: full vocab)")
    runner.add_new_draft_vocab(shape)
    flow.set_defaults(func=run_flow)
    dflash = stages.add_parser("dflash", help="DFlash baseline drafter", epilog=runner.EPILOG,
                               description="Train the DFlash baseline drafter on a feature cache.",
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dflash_args(dflash)
    dflash.set_defaults(func=run_dflash)
    dflash2 = stages.add_parser("dflash2", help="DFlash2 drafter (convolutions + candidate selector)",
                                epilog=runner.EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Train a DFlash2 drafter on a feature cache: DFlash's loss plus "
                                            "the candidate selector's.")
    shape = add_dflash_args(dflash2)
    shape.add_argument("--conv-kernel-size", type=int, help="taps of each dynamic convolution (default 2)")
    shape.add_argument("--conv-group-size", type=int,
                       help="channels sharing one dynamic kernel value (default: from --preset)")
    shape.add_argument("--selector-rank", type=int, help="rank of the selector's bilinear term (default: --preset)")
    shape.add_argument("--selector-top-k", type=int, help="unary candidates the selector re-scores (default 16)")
    dflash2.add_argument("--selector-weight", type=float, default=1.0,
                         help="weight of the selector loss next to the unary loss (default 1.0, the reference's)")
    dflash2.set_defaults(func=run_dflash)
    eagle = stages.add_parser("eagle3", help="EAGLE-3 baseline drafter", epilog=runner.EPILOG,
                              description="Train the EAGLE-3 baseline on a feature cache of its low/mid/high "
                                          "taps (`flashmap features --layers eagle3`).",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    runner.add_training_args(eagle, add_layers=False)
    shape = eagle.add_argument_group("drafter shape (default: from --preset)")
    shape.add_argument("--draft-vocab-size", type=int, help="rows of the draft LM head (capped at the target's)")
    shape.add_argument("--draft-tokens", type=int, help="chain length drafted per round")
    shape.add_argument("--intermediate-size", type=int, help="MLP width of its decoder layer (default: the target's)")
    shape.add_argument("--frozen-lm-head", action="store_true", default=None,
                       help="use the target's LM-head rows of the draft vocabulary, frozen and not stored (as the "
                            "FlashMap and DFlash drafters do), instead of training EAGLE-3's own head")
    shape.add_argument("--draft-vocab", metavar="N|FILE",
                       help="draft vocabulary as for `train flow` (overrides --draft-vocab-size)")
    runner.add_new_draft_vocab(shape)
    shape.add_argument("--ttt-steps", type=int, default=7, help="training-time-test unroll length (default 7)")
    eagle.set_defaults(func=run_eagle3)
    from flashmap_ext.train import snapshot
    snap = stages.add_parser("snapshot", help="a drafter folder from one training checkpoint of a run",
                             description=snapshot.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    snapshot.add_arguments(snap)
    snap.set_defaults(func=snapshot.run, resume_hint="")


def add_dflash_args(parser):
    """The training, shape and --slot-decay options `train dflash` and `train dflash2` share; returns the
    shape group."""
    runner.add_training_args(parser)
    shape = parser.add_argument_group("drafter shape (default: from --preset)")
    shape.add_argument("--layers", type=int, help="decoder layers")
    shape.add_argument("--block-size", type=int, help="anchor + draft tokens per block")
    shape.add_argument("--intermediate-size", type=int, help="MLP width (default: the target's)")
    shape.add_argument("--draft-vocab", metavar="N|FILE",
                       help="draft vocabulary as for `train flow` (drafts and loss on these LM-head rows only)")
    runner.add_new_draft_vocab(shape)
    shape.add_argument("--mask-token-id", type=int,
                       help="embedding row used as the mask token of the draft slots: a token the training data "
                            "never uses (a warning counts its uses in --features). Default: the first row past the "
                            "tokenizer; a tokenizer that fills the embedding table (tiny-random's) needs this option")
    add_slot_decay(parser, "auto", "default auto (DFlash's rule)")
    parser.add_argument("--reachable", action="store_true",
                        help="the block CE only at the slots verification reaches (every earlier slot of the "
                             "draft right): slot k learns the token after the draft's own prefix, as `train flow "
                             "--reachable` trains FlashMap's one step")
    return shape


def add_slot_decay(parser, default: str, default_help: str) -> None:
    """--slot-decay D|auto of `train flow` and `train dflash` (one rule, two defaults: DESIGN.md §8)."""
    parser.add_argument("--slot-decay", default=default, metavar="D|auto",
                        help="slot weights w_k = exp(-(k-1)/D) over the K draft slots; 'auto' ties D to K as "
                             f"DFlash does (7·K/15, 3.73 at K = 8); {default_help}")


def _overrides(args, preset_shape: dict, names: dict) -> dict:
    """Drafter config: the preset's shape, overridden by the options given (names: option -> field)."""
    out = dict(preset_shape)
    for opt, field in names.items():
        if getattr(args, opt, None) is not None:
            if opt in SIZE_OPTIONS:  # before the target loads: a 0 used to end in a ZeroDivisionError
                check_int(f"--{opt.replace('_', '-')}", getattr(args, opt), 1)
            out[field] = getattr(args, opt)
    return out


#: drafter size options, each a count >= 1
SIZE_OPTIONS = ("layers", "width", "heads", "block_size", "cond_dim", "intermediate_size", "draft_tokens",
                "memory_width", "head_mlp", "kv_heads")


def check_heads(shape: dict) -> None:
    if shape["width"] % shape["heads"] or (shape["width"] // shape["heads"]) % 2:
        raise ValueError(f"--heads {shape['heads']}: must divide --width {shape['width']} into heads of an even "
                         "dimension (rotary embeddings rotate pairs)")
    kv = shape.get("kv_heads")
    if kv is not None and shape["heads"] % kv:
        raise ValueError(f"--kv-heads {kv}: must divide --heads {shape['heads']}")


def qwen3_shape(args, shape: dict, model_config) -> None:
    """--trunk qwen3 runs at the target's hidden size and RoPE base, as DFlash's layers: sets shape's trunk, width
    and rope_theta from the target's HF config (ValueError naming --width for another explicit width, --mlp-ratio
    for no MLP unit, --memory-width / --head-mlp / --joint-attention, which it has no use for)."""
    from flashmap_ext.drafters.common.config import target_shape
    target = target_shape(model_config)
    d_target = target["hidden_size"]
    if args.width is not None and args.width != d_target:
        raise ValueError(f"--width {args.width}: --trunk qwen3 runs at the target's hidden size, {d_target} "
                         "(leave --width out)")
    for opt, given in (("--memory-width", args.memory_width is not None), ("--head-mlp", args.head_mlp is not None),
                       ("--joint-attention", args.joint_attention)):
        if given:
            raise ValueError(f"{opt}: not with --trunk qwen3 (its entries and state are the target's width "
                             "and its one attention reads memory and slots)")
    shape.update(trunk="qwen3", width=d_target, rope_theta=float(target["rope_theta"]))
    if round(d_target * shape.get("mlp_ratio", 4.0)) < 1:
        raise ValueError(f"--mlp-ratio {shape['mlp_ratio']}: the target's width {d_target} x ratio rounds to no MLP unit")
    check_heads(shape)


def run_flow(args) -> int:
    from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter
    from flashmap_ext.train.flow import flow_loss
    run, shape = runner.settings(args, "flow", "flashmap")
    shape = _overrides(args, shape, {"layers": "n_layers", "width": "width", "heads": "heads",
                                     "block_size": "block_size", "cond_dim": "cond_dim",
                                     "mlp_ratio": "mlp_ratio", "memory_width": "memory_width",
                                     "head_mlp": "head_mlp", "kv_heads": "kv_heads"})
    if args.kv_heads is not None and args.trunk != "qwen3":
        raise ValueError(f"--kv-heads {args.kv_heads}: only --trunk qwen3 has grouped key/value heads")
    if args.joint_attention:
        shape["joint_attention"] = True
    if args.tau_gated_input:
        shape["tau_gated_input"] = True
    if args.joint_attention and shape.get("memory_width") not in (None, shape["width"]):
        raise ValueError(f"--memory-width {shape['memory_width']}: --joint-attention shares the memory's K/V "
                         f"projections with the slots, so the memory entries must be --width {shape['width']} wide")
    if args.trunk == "dit" and int(shape["width"] * shape.get("mlp_ratio", FlashMapConfig.mlp_ratio)) < 1:
        raise ValueError(f"--mlp-ratio {shape['mlp_ratio']}: --width {shape['width']} x ratio leaves no MLP unit")
    if args.trunk == "dit":
        check_heads(shape)
    from flashmap_ext.target import load_target
    target, _ = load_target(args.target, *runner.target_placement(args))
    if args.trunk == "qwen3":
        qwen3_shape(args, shape, target.model.config)
    cache = runner.target_features(args, target)
    vocab = draft_vocab(args.draft_vocab, cache, target.model.get_input_embeddings().weight.shape[0])
    if vocab is not None:
        shape["draft_vocab_size"] = len(vocab)
    layers = runner.tap_layers(args, cache.meta["target_layer_ids"], target.num_layers)
    drafter = FlashMapDrafter.for_target(target, **shape, target_layer_ids=tuple(layers),
                                         two_time=False, tap_input_norm=args.tap_input_norm,
                                         state_loglik=args.state_loglik)
    if vocab is not None:
        drafter.set_draft_vocab(vocab, target)
    check_resumed_clock(args)
    decay = slot_decay_arg(args.slot_decay)
    options = runner.loss_options(args)
    if options["loss"] == "kl" and args.tau0_frac <= 0:
        raise ValueError("--loss kl: the flow model trains on the target's distribution at its τ = 0 blocks "
                         "only; set --tau0-frac > 0 (e.g. 0.5)")
    if args.rollout_weight and args.tau0_frac <= 0:
        raise ValueError("--rollout-weight: the second step is trained at the τ = 0 blocks; set --tau0-frac > 0")
    if args.reachable and args.tau0_frac <= 0:
        raise ValueError("--reachable: selects the slots of the τ = 0 blocks; set --tau0-frac > 0")
    if args.rollout_reachable and not args.rollout_weight:
        raise ValueError("--rollout-reachable: selects the second step's slots; set --rollout-weight > 0")
    if args.clock == "projected":
        drafter.calibrate_clock()  # from the state rows: after the draft vocabulary is set

    def loss_fn(model, batch, generator):
        return flow_loss(model, batch, generator, tau0_frac=args.tau0_frac, slot_decay=decay,
                         recompute_head=not args.no_head_recompute, rollout_weight=args.rollout_weight,
                         rollout_reachable=args.rollout_reachable, reachable=args.reachable, **options)
    metrics = runner.run_stage(drafter, loss_fn, args, run, "flow", target=target)
    return runner.finish("flow", metrics, args)


def check_resumed_clock(args) -> None:
    """--resume of a run started before --clock existed (its run.json args have no "clock") trained on the
    full-state clock: ValueError unless --clock full-state (the generic flag check skips flags it lacks)."""
    import os
    path = os.path.join(args.out, "run.json")
    if not args.resume or not os.path.exists(path):
        return
    with open(path) as f:
        run = json.load(f)
    before = run.get("args", {})
    if run.get("stage") != "flow":
        return  # another stage's run: runner.check_out_dir refuses it, naming that stage
    if "clock" not in before and args.clock != "full-state":
        raise ValueError(f"--clock {args.clock}: the run in {args.out} was started on the full-state clock "
                         "(before --clock existed); resume it with --clock full-state")


def slot_decay_arg(spec: str) -> float | None:
    """--slot-decay: 'auto' → None (tied to K), else a positive float. Raises ValueError naming the flag."""
    if spec == "auto":
        return None
    try:
        value = float(spec)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"--slot-decay: expected a positive number or 'auto', got {spec!r}")
    return value


def draft_vocab(spec, cache, rows: int, option: str = "--draft-vocab"):
    """[n] int64 target ids for a draft vocabulary, or None (spec None: the full vocabulary).

    spec: a JSON file holding a list of target ids or {"ids": [...]}, or a count N: the N most frequent
    response (loss-masked) tokens of the feature cache, capped at `rows` (said on stderr, naming `option`,
    what set the count). Raises ValueError otherwise."""
    import os

    import torch

    from flashmap_ext.train.eagle3 import build_draft_vocab, count_tokens
    if spec is None:
        return None
    if os.path.isfile(str(spec)):
        with open(spec) as f:
            data = json.load(f)
        ids = data["ids"] if isinstance(data, dict) else data
        if not isinstance(ids, list) or not ids:
            raise ValueError(f"--draft-vocab {spec}: expected a list of ids or {{\"ids\": [...]}}")
        return torch.tensor(ids, dtype=torch.long)
    if not str(spec).isdigit() or int(spec) < 1:
        raise ValueError(f"--draft-vocab: expected a count N >= 1 or a JSON file (got {spec!r})")
    if int(spec) > rows:
        print(f"{option} {spec}: the target has {rows} embedding rows; the draft vocabulary is all {rows}",
              file=sys.stderr)
    counts = count_tokens((cache.supervised_tokens(i) for i in range(len(cache))), rows)
    return build_draft_vocab(counts, min(int(spec), rows))


DFLASH2_OPTIONS = {"conv_kernel_size": "conv_kernel_size", "conv_group_size": "conv_group_size",
                   "selector_rank": "selector_rank", "selector_top_k": "selector_top_k"}


def run_dflash(args) -> int:
    """`train dflash` and `train dflash2` (args.stage): one recipe, DFlash2 adds its shape and selector loss."""
    from flashmap_ext.drafters.dflash import DFlashDrafter
    from flashmap_ext.drafters.dflash2 import DFlash2Drafter
    from flashmap_ext.train.dflash import dflash_loss
    stage = args.stage
    run, shape = runner.settings(args, f"train-{stage}", stage)
    shape = _overrides(args, shape, {"layers": "num_hidden_layers", "block_size": "block_size",
                                     "mask_token_id": "mask_token_id", "intermediate_size": "intermediate_size",
                                     **(DFLASH2_OPTIONS if stage == "dflash2" else {})})
    cls = DFlash2Drafter if stage == "dflash2" else DFlashDrafter
    selector = {"selector_weight": args.selector_weight} if stage == "dflash2" else {}
    from flashmap_ext.target import load_target
    target, tokenizer = load_target(args.target, *runner.target_placement(args))
    cache = runner.target_features(args, target)
    layer_ids = runner.tap_layers(args, cache.meta["target_layer_ids"], target.num_layers)
    warn_mask_token_in_data(args)
    tok = tokenizer if hasattr(tokenizer, "__len__") else None
    from flashmap_ext.target import hf_causal_lm
    ids = draft_vocab(args.draft_vocab, cache,
                      hf_causal_lm(target).get_input_embeddings().weight.shape[0])
    if ids is not None:
        shape["draft_vocab_size"] = ids.numel()
    drafter = cls.for_target(target, tokenizer=tok, target_layer_ids=list(layer_ids), **shape)
    if ids is not None:
        drafter.set_draft_vocab(ids)
    options = runner.loss_options(args)
    gamma = slot_decay_arg(args.slot_decay)

    def loss_fn(model, batch, generator):
        return dflash_loss(model, batch, generator, gamma=gamma, reachable=args.reachable, **options, **selector)
    metrics = runner.run_stage(drafter, loss_fn, args, run, stage, target=target)
    return runner.finish(stage, metrics, args)


def warn_mask_token_in_data(args) -> None:
    """One line on stderr when the --mask-token-id token occurs in the sequences of --features: the drafter's
    masked slots then share their input embedding with a token of the data. Counted over the cached token
    ids (`FeatureCache.count_token`); nothing without --mask-token-id (the default row is past the tokenizer)."""
    import os
    import sys
    token = getattr(args, "mask_token_id", None)
    if token is None or int(os.environ.get("RANK", "0")) != 0:
        return
    n = runner.FeatureCache(args.features).count_token(token)
    if n:
        print(f"train {args.stage}: warning: --mask-token-id {token} occurs {n} times in the sequences of --features "
              f"{args.features}; the masked draft slots then look like that token to the drafter: give a row the "
              "data never uses", file=sys.stderr, flush=True)


def run_eagle3(args) -> int:
    import torch

    from flashmap_ext.drafters.eagle3 import Eagle3Drafter
    from flashmap_ext.train.eagle3 import eagle3_loss
    run, shape = runner.settings(args, "train-eagle3", "eagle3")
    shape = _overrides(args, shape, {"draft_vocab_size": "draft_vocab_size", "draft_tokens": "num_draft_tokens",
                                     "intermediate_size": "intermediate_size", "frozen_lm_head": "frozen_lm_head"})
    from flashmap_ext.target import load_target
    target, _ = load_target(args.target, *runner.target_placement(args))
    cache = runner.target_features(args, target)
    rows = target.model.get_input_embeddings().weight.shape[0]
    spec = shape.pop("draft_vocab_size")
    if args.draft_vocab is not None:
        ids = draft_vocab(args.draft_vocab, cache, rows)
    else:
        given = args.draft_vocab_size is not None
        ids = draft_vocab(spec, cache, rows, "--draft-vocab-size" if given else f"--preset {args.preset}'s draft vocabulary")
    if args.tap_layers is not None:  # default: EAGLE-3's low/mid/high taps
        shape["target_layer_ids"] = runner.tap_layers(args, (), target.num_layers)
    drafter = Eagle3Drafter.for_target(target, draft_ids=ids, dtype=torch.float32, **shape)

    options = runner.loss_options(args)

    def loss_fn(model, batch, generator):
        return eagle3_loss(model, batch, generator, steps=args.ttt_steps, **options)
    metrics = runner.run_stage(drafter, loss_fn, args, run, "eagle3",
                               num_labels=max(args.ttt_steps, drafter.num_draft_tokens), target=target)
    return runner.finish("eagle3", metrics, args)
