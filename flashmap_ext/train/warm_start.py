"""`--init-from`: a training stage starts from a drafter checkpoint's weights (long runs in pieces, DFlash2
from DFlash, a deeper drafter from a shallower one with `--add-layers`)."""
from __future__ import annotations

import dataclasses

import torch

from flashmap_ext.checks import with_article


def warm_start(drafter: torch.nn.Module, path: str, target, *, add_layers: bool = False,
               new_vocab: bool = False) -> None:
    """Copies the weights of the drafter checkpoint at `path` into `drafter` (in place, its dtype kept).

    The checkpoint must be of the same class, hold every tensor of `drafter`'s state dict with the same shape
    and the same draft vocabulary (`d2t`); ValueError naming --init-from otherwise (a silent partial load would
    train from a half-random start). Two exceptions:
    - a drafter class may name a base class it extends (`warm_start_base`) and the modules it adds
      (`warm_start_added`, key prefixes/infixes); from a checkpoint of that base, every other tensor is copied
      and the added modules keep their initialisation (DFlash2 from DFlash: identity convolutions, a fresh
      selector);
    - add_layers: the checkpoint may have fewer layers than `drafter` (its config otherwise equal); they are
      copied into the first ones and each added layer starts as the identity (`identity_layer_init`: its
      residual outputs zeroed), so the deeper drafter starts out computing the checkpoint's function;
    - new_vocab: the checkpoint's draft vocabulary (`d2t`, `draft_vocab_size`) may differ from `drafter`'s,
      which keeps its own (and a FlashMap drafter its clock table, built from those rows); allowed only where no
      trained tensor depends on it (a head made of the target's frozen LM-head rows: FlashMap, DFlash), so every
      weight is copied and only the rows drafted from change."""
    from flashmap_ext.drafters.load import load_drafter
    source = load_drafter(path, target, dtype=torch.float32, flag="--init-from")
    if type(source).__name__ == "DFlashDrafter" and type(drafter).__name__ == "FlashMapDrafter":
        return _from_dflash(drafter, source, path, new_vocab)
    added = ()
    if type(source) is not type(drafter):
        if type(source) is not getattr(drafter, "warm_start_base", None):
            raise ValueError(f"--init-from {path}: {with_article(type(source).__name__)} checkpoint, this stage "
                             f"trains {with_article(type(drafter).__name__)}")
        added = drafter.warm_start_added
    check_same_time_kind(drafter.config, source.config, path)
    mine, theirs = drafter.state_dict(), source.state_dict()
    kept = [k for k in mine if k not in theirs and any(a in k for a in added)]
    grown = _added_layers(drafter, source, path) if add_layers else []
    mine = {k: v for k, v in mine.items() if k not in kept and k not in grown}
    deeper = (not add_layers and _depth(drafter) > _depth(source)
              and "; or --add-layers to start this deeper drafter from it") or ""
    revocab = check_vocab(drafter, source, path, new_vocab)
    vocab = ("d2t", "draft_vocab_size", "clock_t") if revocab else ()  # clock_t, clock_tau: built from E's rows
    mine = {k: v for k, v in mine.items() if not k.endswith(vocab)} if vocab else mine
    differ = [d for d in config_differences(drafter.config, source.config, drafter.depth_fields if grown else ())
              if not d.startswith(vocab)]
    if differ:  # first: a field name says more than the tensors whose shapes it changes
        raise ValueError(f"--init-from {path}: its config differs from this run's ({'; '.join(differ[:3])}); "
                         f"pass the flags it was trained with (its config.json){deeper}")
    missing = sorted(set(mine) - set(theirs))
    shapes = sorted(k for k in mine if k in theirs and mine[k].shape != theirs[k].shape)
    if revocab and shapes:
        raise ValueError(f"--new-draft-vocab: --init-from {path} trained tensors of one row per draft token "
                         f"({', '.join(shapes[:3])}: e.g. an EAGLE-3 head without --frozen-lm-head), which another "
                         "vocabulary cannot take; pass the checkpoint's vocabulary as --draft-vocab instead")
    if missing or shapes:
        raise ValueError(f"--init-from {path}: not the shape of this run's drafter (missing: {missing[:3]}, "
                         f"other shapes: {shapes[:3]}); pass the flags it was trained with (its config.json)"
                         f"{deeper}")
    with torch.no_grad():
        for key, value in mine.items():
            value.copy_(theirs[key].to(value.dtype))
        for layer in _layers(drafter)[_depth(source):] if grown else ():
            drafter.identity_layer_init(layer)
    note = f" ({len(kept)} tensors of the added modules at their initialisation)" if kept else ""
    if revocab:
        note += f" (draft vocabulary: {_rows(source)} rows in the checkpoint, {_rows(drafter)} in this run)"
    if grown:
        note += f" (layers {_depth(source)}..{_depth(drafter) - 1} added, each starting as the identity)"
    print(f"warm start: weights from {path}{note}")


def _rows(drafter) -> int | str:
    return getattr(drafter.config, "draft_vocab_size", None) or "all"


def check_vocab(drafter, source, path: str, new_vocab: bool) -> bool:
    """True when the checkpoint drafts from other rows than `drafter` (`d2t`) and `new_vocab` allows it;
    ValueError naming --init-from and --new-draft-vocab when they differ without it."""
    mine, theirs = getattr(drafter, "d2t", None), getattr(source, "d2t", None)
    if (mine is None) == (theirs is None) and (mine is None or (mine.shape == theirs.shape
                                                                and torch.equal(mine, theirs.to(mine.device)))):
        return False
    if not new_vocab:
        raise ValueError(f"--init-from {path}: its draft vocabulary ({_rows(source)} rows) differs from this run's "
                         f"--draft-vocab ({_rows(drafter)}); pass the checkpoint's ids as --draft-vocab "
                         "(recipes/long_run.sh writes them from its d2t), or --new-draft-vocab to start its weights "
                         "on this run's vocabulary")
    return True


def _from_dflash(drafter, source, path: str, new_vocab: bool = False) -> None:
    """A qwen3-trunk flow model from a DFlash checkpoint (drafters/flashmap/from_dflash.py)."""
    from flashmap_ext.drafters.flashmap.from_dflash import start_from_dflash
    if drafter.config.two_time:
        raise ValueError(f"--init-from {path}: a DFlash checkpoint starts a flow model (`flashmap train flow`), "
                         "not a distilled map")
    check_vocab(drafter, source, path, new_vocab)
    try:
        start_from_dflash(drafter, source)
    except ValueError as err:
        raise ValueError(f"--init-from {path}: {err}") from None
    print(f"warm start: the qwen3 trunk from the DFlash drafter at {path}")


def check_same_time_kind(mine, theirs, path: str) -> None:
    """ValueError naming --init-from when one FlashMap config is a distilled map (two_time) and the other a
    flow model: `train flow` always builds a flow model, `distill` a map, and neither converts the other."""
    if getattr(theirs, "two_time", None) is None or mine.two_time == theirs.two_time:
        return
    if theirs.two_time:
        raise ValueError(f"--init-from {path}: a distilled map (two_time=True) cannot warm-start the flow model; "
                         "give a flow checkpoint (`flashmap train flow`), or continue the map with "
                         "`flashmap distill --init-from`")
    raise ValueError(f"--init-from {path}: a flow model (two_time=False) cannot warm-start the distilled map; "
                     "give it to `flashmap distill --teacher`, whose student starts from its weights")


def _layers(drafter):
    """The drafter's stack of layers (`layer_prefix` names it), or None for a drafter that has none."""
    prefix = getattr(drafter, "layer_prefix", None)
    return getattr(drafter, prefix.rstrip(".")) if prefix else None


def _depth(drafter) -> int:
    return len(_layers(drafter)) if _layers(drafter) is not None else 0


def _added_layers(drafter, source, path: str) -> list[str]:
    """The state-dict keys of `drafter`'s layers beyond the checkpoint's (--add-layers)."""
    if _layers(drafter) is None or not hasattr(drafter, "identity_layer_init"):
        raise ValueError(f"--add-layers: {with_article(type(drafter).__name__)} cannot be deepened")
    if _depth(drafter) <= _depth(source):
        raise ValueError(f"--add-layers: --init-from {path} has {_depth(source)} layers, this run's drafter "
                         f"{_depth(drafter)}; --layers must be larger")
    prefix = drafter.layer_prefix
    return [k for k in drafter.state_dict() if k.startswith(prefix)
            and int(k[len(prefix):].split(".")[0]) >= _depth(source)]


def config_differences(mine, theirs, depth_fields: tuple[str, ...] = ()) -> list[str]:
    """The fields two drafter configs share with different values, as "name=checkpoint's (this run: run's)".
    A warm start continues the checkpoint's function only where these agree: a mask token, block size or
    context window of another value changes what the copied weights compute without changing a shape.
    depth_fields (--add-layers): the layer count may grow, and a per-layer list (DFlash's `layer_types`) must
    begin with the checkpoint's."""
    a, b = _as_saved(mine), _as_saved(theirs)
    return [f"{k}={_short(b[k])} (this run: {_short(a[k])})" for k in a
            if k in b and a[k] != b[k] and not (k in depth_fields and _extends(a[k], b[k]))]


def _short(value) -> str:
    """repr of a config value, a long list or table as its length (a clock table has thousands of entries)."""
    text = repr(value)
    return f"<{len(value)} values>" if len(text) > 60 and isinstance(value, (list, tuple)) else text


def _extends(longer, shorter) -> bool:
    if isinstance(longer, int):
        return longer > shorter
    return isinstance(longer, (list, tuple)) and tuple(longer[:len(shorter)]) == tuple(shorter)


def _as_saved(config) -> dict:
    """A config's fields as its config.json would give them back (defaults spelt out, e.g. DFlash's
    `layer_types` None -> all full attention), so that equal configs compare equal."""
    if hasattr(config, "to_hf_dict"):
        config = type(config).from_hf_dict(config.to_hf_dict())
    elif hasattr(config, "to_dict"):
        config = type(config).from_dict(config.to_dict())
    return dataclasses.asdict(config)
