"""`load_drafter`: a drafter for a target, from a checkpoint directory (dispatched on its config.json) or
'random' / 'random-eagle3' (small random drafters for plumbing runs)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

from flashmap_ext.checkpoint_kind import KINDS, config_kind
from flashmap_ext.checks import check_int
from flashmap_ext.drafters.common.base import TargetMismatch
from flashmap_ext.drafters.common.checkpoint import (
    CheckpointError,
    check_weights_present,
    load_config,
    read_config,
)
from flashmap_ext.drafters.common.window import check_window
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.dflash.config import DFlashConfig
from flashmap_ext.drafters.dflash2 import DFlash2Drafter
from flashmap_ext.drafters.dflash2.speculators_format import parse as parse_dflash2
from flashmap_ext.drafters.eagle3 import Eagle3Drafter
from flashmap_ext.drafters.flashmap import FlashMapConfig, FlashMapDrafter
from flashmap_ext.target.model import hf_causal_lm

CLASSES = {"flashmap": FlashMapDrafter, "dflash": DFlashDrafter, "dflash2": DFlash2Drafter, "eagle3": Eagle3Drafter}


KEEP = "checkpoint"  # context_window: as the checkpoint's config says


def load_drafter(path: str, target: Any, kind: str | None = None, *, dtype: torch.dtype | None = None,
                 steps: int | None = None, draws: int | None = None, context_window: int | None | str = KEEP,
                 flag: str = "--drafter", target_flag: str = "--target") -> torch.nn.Module:
    """A drafter for `target` (a Target or an HF causal LM) in eval mode and `dtype` (default: the target's).

    path: a checkpoint directory, 'random' (a small random FlashMap drafter: 2 layers, width 128, K = 8) or
    'random-eagle3'. kind: 'flashmap' | 'dflash' | 'dflash2' | 'eagle3', the type expected (default: the one config.json
    names); a checkpoint whose config.json names another type, or none, is refused (CheckpointError).
    steps: FlashMap draft steps (1 or 2; default the checkpoint's). draws: FlashMap noise draws per block, the
    best kept (drafters/flashmap/mode.py; default the checkpoint's). context_window: W, the FlashMap or
    DFlash drafter reads the last W memory entries only (common/window.py); None: all; default the
    checkpoint's. Raises CheckpointError (a ValueError) for a missing directory, a bad config, unreadable
    weights or an unknown checkpoint type; TargetMismatch (a ValueError) for a drafter built for another
    target; ValueError for a window a drafter cannot take. Checkpoint errors name `flag`, the option that
    gave `path` (target mismatches name it and `target_flag`).
    """
    dtype = dtype or hf_causal_lm(target).get_input_embeddings().weight.dtype
    if path == "random":
        torch.manual_seed(0)
        drafter = FlashMapDrafter.for_target(target, "cpu-tiny", init="random")  # adaLN-Zero: one id everywhere
    elif path == "random-eagle3":
        torch.manual_seed(0)
        drafter = Eagle3Drafter.for_target(target, num_draft_tokens=7)
    else:
        with named_errors(flag, path, target_flag):
            drafter = CLASSES[kind or checkpoint_type(path, flag)].from_pretrained(path, target, dtype=dtype)
    if steps is not None and hasattr(drafter.config, "draft_steps"):
        drafter.config.draft_steps = steps
    if draws is not None:
        if not hasattr(drafter.config, "draft_draws"):
            raise ValueError(f"draws: the {type(drafter).__name__} has no noise draws (FlashMap drafters only)")
        drafter.config.draft_draws = check_int("draws", draws, 1, 65)
    check_draws_differ(drafter, getattr(drafter.config, "draft_draws", 1), None, "draws")
    if context_window != KEEP:
        if not hasattr(drafter.config, "context_window"):
            raise ValueError(f"context_window: the {type(drafter).__name__} has no context window")
        drafter.config.context_window = check_window(context_window)
    return drafter.to(dtype=dtype).eval()


def check_draws_differ(drafter, draws: int, steps: int | None, name: str) -> None:
    """ValueError starting with `name` when `draws` > 1 noise draws of a FlashMap drafter at `steps` (None: its
    config's) would all draft the same block (`draws_differ`: a tau_gated_input drafter at 1 step)."""
    if draws > 1 and hasattr(drafter, "draws_differ") and not drafter.draws_differ(steps):
        raise ValueError(f"{name}: {draws} noise draws of a tau_gated_input drafter at 1 step are one block "
                         "repeated (its one-step draft ignores the noise): use 1 draw, or 2 steps")


@contextmanager
def named_errors(flag: str, path: str, target_flag: str = "--target"):
    """Re-raises a CheckpointError with `flag` in front, a TargetMismatch naming `flag` and `target_flag`."""
    try:
        yield
    except TargetMismatch as err:
        raise TargetMismatch(f"{flag} {path} does not fit {target_flag}: {err}") from None
    except CheckpointError as err:
        if str(err).startswith(flag):
            raise
        raise type(err)(f"{flag} {err}") from None


def checkpoint_type(path: str, flag: str = "--drafter") -> str:
    """'flashmap' | 'dflash' | 'dflash2' | 'eagle3' from the checkpoint's config.json; CheckpointError (a ValueError,
    one line naming `flag`) for a missing directory, a missing / malformed / empty config or an unknown kind."""
    with named_errors(flag, path):
        cfg = read_config(path)
    kind = config_kind(cfg)
    if kind is None:
        raise CheckpointError(f"{flag} {path}: unknown drafter type (architectures="
                              f"{cfg.get('architectures') or []}, model_type={cfg.get('model_type')!r}); its "
                              f"config.json must name it: architectures ['DFlashDraftModel'] (dflash), ['DFlash2DraftModel'] (dflash2), "
                              f"['LlamaForCausalLMEagle3'] (eagle3) or model_type 'flashmap_drafter' (flashmap)")
    return kind


RANDOM = ("random", "random-eagle3")


def check_drafter(path: str, kind: str | None = None, flag: str = "--drafter",
                  kind_flag: str | None = "--drafter-type") -> str:
    """Reads and parses a drafter checkpoint's config.json and checks that its weights file is there,
    without loading weights or a target (commands call it before any model loads). Returns its kind;
    CheckpointError (one line naming `flag`) as `load_drafter`, a missing model.safetensors included, and,
    when `kind` differs from the type the config names, naming `kind_flag` (the option that asked for it),
    or saying that `flag` takes a `kind` checkpoint where the option itself implies the type (kind_flag None:
    bench's --dflash, demo's --drafter)."""
    def wrong_type(what: str) -> CheckpointError:
        if kind_flag is None:
            return CheckpointError(f"{flag} {path} is {what}; {flag} takes {KINDS[kind]} checkpoint")
        return CheckpointError(f"{kind_flag} {kind}: {flag} {path} is {what}" + (
            "" if path in RANDOM else "; --drafter-type checks the type, it cannot change it"))
    if path in RANDOM:
        made = "eagle3" if path == "random-eagle3" else "flashmap"
        if kind not in (None, made):
            raise wrong_type(f"a random {KINDS[made].split(' ', 1)[1]} drafter (random drafters: 'random' = FlashMap, "
                                   "'random-eagle3' = EAGLE-3)")
        return made
    found = checkpoint_type(path, flag)
    if kind not in (None, found):
        raise wrong_type(f"{KINDS[found]} checkpoint (its config.json says so)")
    kind = found
    parse = {"flashmap": FlashMapConfig.from_dict, "dflash": DFlashConfig.from_hf_dict,
             "dflash2": parse_dflash2}.get(kind)
    with named_errors(flag, path):
        if parse is not None:  # EAGLE-3's tap ids may come from the target: its config is parsed at load
            load_config(path, kind, parse)
        else:
            read_config(path, kind)
        check_weights_present(path, kind)
    return kind
