"""`flashmap convert SRC DST --to FORMAT`: rewrite a drafter checkpoint in the format an engine loads.

  --to dflash       z-lab's DFlash format (`DFlashDraftModel`; loaded by z-lab's code, SGLang and vLLM, which
                    add 1 to the tap ids itself). From a DFlash checkpoint in any format we read; a draft
                    vocabulary also stores the target's LM-head rows (vLLM's drafter owns them: pass --target).
                    The same writer as vLLM's `export_dflash` (drafters/dflash/release.py).
  --to dflash2      z-lab's DFlash2 format (`DFlash2DraftModel`: DFlash's plus the dynamic convolutions and
                    the candidate selector), from a DFlash2 checkpoint in z-lab's or speculators' layout;
                    vLLM >= 0.28.0 serves it on GPU only (its CPU build refuses it): vLLM's `export_dflash2`.
  --to specforge    SpecForge's EAGLE-3 format (`LlamaForCausalLMEagle3`, SGLang; vLLM reads it too) with the
                    LM head stored (a frozen-head drafter's head is taken from --target) and the tap ids
                    both in `eagle_config` (SGLang numbering) and top level (vLLM numbering, +1).
  --to speculators  vLLM's `speculators` format (tap ids +1): EAGLE-3 (`Eagle3Speculator`) from an EAGLE-3
                    drafter, DFlash2 (`speculators_model_type: dflash2`) from a DFlash2 drafter
                    (drafters/dflash2/speculators_format.py; what it has no place for is refused by name).

A DFlash or DFlash2 drafter with a context window (ours: it reads the last W committed positions) is
refused unless --unwindowed, which writes it without: the engines' drafter attends to the whole context,
so its drafts past the window differ from ours (lossless either way).

Any supported source format is read (z-lab / SpecForge / speculators / ours). FlashMap drafters have no
engine format of their own and are refused, pointing to `export_flashmap` (vLLM through our plugin, README
"Serving with vLLM"), as is a conversion between drafter kinds (DFlash, DFlash2, EAGLE-3).
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from flashmap_ext.checks import check_output_path

FORMATS = ("dflash", "dflash2", "specforge", "speculators")
# the formats each drafter kind converts to
TARGETS = {"dflash": ("dflash",), "dflash2": ("dflash2", "speculators"), "eagle3": ("specforge", "speculators")}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert a drafter checkpoint for SGLang / vLLM / z-lab",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="example: flashmap convert checkpoints/eagle3-qwen2.5-coder-0.5b out/ "
                                     "--to speculators --target qwen2.5-coder-0.5b")
    p.add_argument("src", help="drafter checkpoint directory (config.json + safetensors)")
    p.add_argument("dst", help="output directory (must not hold a checkpoint yet)")
    p.add_argument("--to", required=True, choices=FORMATS, help="output format")
    p.add_argument("--target", help="the target (as for `flashmap generate`): needed for the LM head of a "
                                    "frozen-head EAGLE-3 drafter and of a DFlash draft vocabulary; gives DFlash "
                                    "its num_target_layers; named as verifier")
    p.add_argument("--unwindowed", action="store_true",
                   help="DFlash, DFlash2: drop our context_window (every format's engines read the whole "
                        "context, so their drafts past the window differ from ours; lossless either way)")
    p.set_defaults(func=run)


def _flashmap_serving(cfg: dict) -> str:
    """Where a FlashMap checkpoint of config `cfg` can be served: our vLLM plugin, or nowhere but our decoder."""
    from flashmap_ext.drafters.flashmap.config import FlashMapConfig
    from flashmap_ext.integrations.vllm.export import plugin_refusal
    refusal = plugin_refusal(FlashMapConfig.from_dict(cfg))
    if refusal:
        return f", and {refusal}; it runs in flashmap's own decoder (flashmap generate, speculate.generate)"
    unwindowed = ", unwindowed=True" if cfg.get("context_window") is not None else ""  # check_window_export
    return (f"; for vLLM (our plugin) use flashmap_ext.integrations.vllm.export_flashmap(src, dst{unwindowed}), "
            "README 'Serving with vLLM'")


def run(args) -> int:
    from flashmap_ext.checkpoint_kind import KINDS, config_kind
    from flashmap_ext.drafters.common.checkpoint import read_config
    check_output_path("dst", args.dst, folder=True)
    if (Path(args.dst) / "config.json").exists():
        raise FileExistsError(f"{args.dst} already holds a checkpoint (config.json): choose an empty directory")
    cfg = read_config(args.src)
    kind = config_kind(cfg)
    if kind is None:
        raise ValueError(f"{args.src}: not a drafter checkpoint this tool reads (architectures="
                         f"{cfg.get('architectures')}, model_type={cfg.get('model_type')!r})")
    if kind == "flashmap":
        raise ValueError(f"{args.src} is a FlashMap drafter: no engine format to convert it to{_flashmap_serving(cfg)}")
    formats = TARGETS[kind]
    if args.to not in formats:
        raise ValueError(f"{args.src} is {KINDS[kind]} drafter: it converts to "
                         f"{' or '.join('--to ' + f for f in formats)}, not --to {args.to}")
    if kind == "dflash2":
        convert_dflash2(args.src, args.dst, args.to, args.target, args.unwindowed)
        print(f"wrote {args.to} checkpoint to {args.dst}")
        return 0
    target = _target(args.target) if args.target else None
    if kind == "dflash":
        convert_dflash(args.src, args.dst, target, args.unwindowed)
    else:
        convert_eagle3(args.src, args.dst, args.to, target, args.target)
    print(f"wrote {args.to} checkpoint to {args.dst}")
    return 0


def convert_dflash(src: str, dst: str, target=None, unwindowed: bool = False) -> None:
    from flashmap_ext.drafters.common import checkpoint as ckpt
    from flashmap_ext.drafters.common.window import check_window_export
    from flashmap_ext.drafters.dflash.config import DFlashConfig
    from flashmap_ext.drafters.dflash.release import export_released
    config = ckpt.load_config(src, "dflash", DFlashConfig.from_hf_dict)
    check_window_export(src, config, unwindowed, flag="--unwindowed")
    try:
        export_released(src, dst, target, unwindowed=unwindowed)
    except ValueError as err:
        if str(err).startswith("target:"):
            raise ValueError(f"{src} has a draft vocabulary: pass --target to store its LM-head rows") from err
        raise


def convert_dflash2(src: str, dst: str, to: str, verifier: str | None = None, unwindowed: bool = False) -> None:
    """z-lab's or speculators' DFlash2 layout, weights in their stored dtype (no target needed: the
    embedding and LM head are the target's and never stored); a context window is refused unless
    `unwindowed`, then left out (`check_window_export`)."""
    from flashmap_ext.drafters.common.window import check_window_export
    from flashmap_ext.drafters.dflash2 import DFlash2Drafter
    drafter = DFlash2Drafter.from_pretrained(src, device="cpu")
    check_window_export(src, drafter.config, unwindowed, flag="--unwindowed")
    drafter.config = dataclasses.replace(drafter.config, context_window=None)  # refused above unless unwindowed
    drafter.save_pretrained(dst, layout="speculators" if to == "speculators" else "zlab", verifier=verifier)


def convert_eagle3(src: str, dst: str, to: str, target=None, verifier: str | None = None) -> None:
    from flashmap_ext.drafters.eagle3 import Eagle3Drafter
    try:
        drafter = Eagle3Drafter.from_pretrained(src, target)
    except ValueError as err:
        if "frozen_lm_head" in str(err):
            raise ValueError(f"{src} has a frozen LM head (the target's rows): pass --target to export it") from err
        raise
    if to == "specforge":
        flags = [f for f in ("norm_before_residual", "norm_before_fc", "norm_output", "qk_norm")
                 if getattr(drafter.config, f)]
        if flags:
            raise ValueError(f"{src} sets {', '.join(flags)}, which SpecForge's format does not carry: "
                             "use --to speculators")
    drafter.save_pretrained(dst, format=to, verifier=verifier)


def _target(name: str):
    """The target model alone (no tokenizer needed), fp32 on CPU."""
    from flashmap_ext.assets.models import resolve_target
    from flashmap_ext.target import TINY, Target, tiny_random_model
    if name == TINY:
        return Target(tiny_random_model())
    return Target.from_pretrained(resolve_target(name), dtype="fp32", device="cpu")
