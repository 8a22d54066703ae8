"""HF-style drafter checkpoints: `config.json` + `model.safetensors` (or sharded with an index).

No pickle anywhere: loading never runs code (DESIGN.md §8).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from flashmap_ext.checkpoint_kind import KINDS, config_kind, describe_kind
from flashmap_ext.target.model import hf_causal_lm, resolve_dtype
from flashmap_ext.weights_file import save_weights

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A drafter checkpoint that cannot be loaded; the message is one line naming the path, what is wrong
    and the drafter kind its config.json names."""


class UnsupportedCheckpoint(CheckpointError, NotImplementedError):
    """A well-formed checkpoint using a feature this implementation does not reproduce."""


def _file_hint(file: Path) -> str:
    """Where the drafter is when a file was given: its own folder, or (a run's checkpoints/latest) the run's
    drafter/."""
    run_drafter = file.parent.parent / "drafter"
    if not (file.parent / "config.json").is_file() and (run_drafter / "config.json").is_file():
        return f"the trained drafter of this run is {run_drafter}"
    return f"pass the folder that holds it ({file.parent})"


def read_config(path: str | os.PathLike, expected: str | None = None) -> dict:
    """The parsed `config.json` of checkpoint folder `path`. CheckpointError (one line) for a missing
    folder or file, invalid JSON, an empty or non-object config, or (with `expected`, a kind of KINDS)
    a config naming another drafter kind."""
    folder = Path(path)
    if not folder.exists():
        raise CheckpointError(f"{path}: no such directory (expected a drafter checkpoint: config.json + "
                              f"{WEIGHTS})")
    if folder.is_file():
        raise CheckpointError(f"{path}: a file, not a drafter checkpoint directory (config.json + {WEIGHTS}); "
                              f"{_file_hint(folder)}")
    file = folder / "config.json"
    if not file.is_file():
        hint = ""
        if (folder / "drafter" / "config.json").is_file():  # a training run directory
            hint = f"; the trained drafter of this run is {folder / 'drafter'}"
        elif (folder / "state.json").is_file():              # a training checkpoint
            hint = "; this is a training checkpoint: pass the run's drafter/ directory"
        raise CheckpointError(f"{path}: no config.json there (expected a drafter checkpoint directory: "
                              f"config.json + {WEIGHTS}){hint}")
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file}: not valid JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{file}: not a JSON object (got {type(cfg).__name__})")
    if not cfg:
        raise CheckpointError(f"{file}: empty config ({{}}): it names no drafter kind and no shape")
    kind = config_kind(cfg)
    if expected is not None and kind != expected:
        raise CheckpointError(f"{file}: not {KINDS[expected]} checkpoint: its config describes "
                              f"{'a checkpoint of unknown kind' if kind is None else KINDS[kind] + ' drafter'} "
                              f"(architectures={cfg.get('architectures')}, model_type={cfg.get('model_type')!r})")
    return cfg


def load_config(path: str | os.PathLike, kind: str, parse):
    """`parse(config dict)` of checkpoint `path` of `kind`; its ValueError / TypeError / KeyError become a
    CheckpointError naming the file (NotImplementedError: UnsupportedCheckpoint)."""
    cfg = read_config(path, kind)
    where = f"{Path(path) / 'config.json'} ({describe_kind(kind)})"
    try:
        return parse(cfg)
    except NotImplementedError as err:
        raise UnsupportedCheckpoint(f"{where}: {err}") from None
    except KeyError as err:
        raise CheckpointError(f"{where}: missing field {err}") from None
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{where}: {err}") from None


def read_weights(path: str | os.PathLike, kind: str | None = None) -> dict[str, torch.Tensor]:
    """All tensors of `model.safetensors`, or of every shard listed in `model.safetensors.index.json`.
    CheckpointError (one line, naming the file and `kind`) when none is there or a file is unreadable."""
    check_weights_present(path, kind)
    folder = Path(path)
    if (folder / WEIGHTS).is_file():
        return _load_file(folder / WEIGHTS, kind)
    try:
        shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{folder / INDEX} ({describe_kind(kind)}): not a valid shard index "
                              f"({type(err).__name__}: {err})") from None
    weights: dict[str, torch.Tensor] = {}
    for shard in shards:
        weights.update(_load_file(folder / shard, kind))
    return weights


def check_weights_present(path: str | os.PathLike, kind: str | None = None) -> None:
    """CheckpointError (one line, naming the folder and `kind`) when checkpoint folder `path` holds neither
    `model.safetensors` nor `model.safetensors.index.json`; reads nothing (commands call it before any
    model loads, `read_weights` when it finds no weights)."""
    folder = Path(path)
    if (folder / WEIGHTS).is_file() or (folder / INDEX).is_file():
        return
    hint = ("; committed checkpoints: run `make checkpoints`" if (folder.parent / "MANIFEST.json").is_file()
            else "")
    raise CheckpointError(f"{path} ({describe_kind(kind)}): no {WEIGHTS} or {INDEX} there{hint}")


def _load_file(file: Path, kind: str | None) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    try:
        return load_file(file)
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{file} ({describe_kind(kind)}): unreadable, truncated or corrupt "
                              f"safetensors file ({err})") from None


def write_checkpoint(path: str | os.PathLike, config: dict, module: nn.Module | dict[str, torch.Tensor],
                     skip: set[str] = frozenset()) -> None:
    """Writes config.json and model.safetensors (the module's parameters and persistent buffers, or the
    given tensors, but the names in `skip`) into folder `path`."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    state = module if isinstance(module, dict) else module.state_dict()
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items() if k not in skip}
    tmp = folder / (WEIGHTS + ".tmp")
    save_weights(tensors, tmp, metadata={"format": "pt"})
    os.replace(tmp, folder / WEIGHTS)
    with open(folder / "config.json.tmp", "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    os.replace(folder / "config.json.tmp", folder / "config.json")


def load_strict(module: nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Assigns `weights` to `module` (which may live on the meta device: the tensors are taken as they
    are, dtype included); CheckpointError listing missing/unexpected names or wrong shapes."""
    own = module.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    wrong = [f"{k}: {tuple(weights[k].shape)} vs expected {tuple(own[k].shape)}"
             for k in own if k in weights and weights[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        raise CheckpointError(f"checkpoint {source} does not match its config: missing {missing[:8]}, "
                         f"unexpected {unexpected[:8]}, wrong shapes {wrong[:8]}")
    module.load_state_dict(weights, strict=True, assign=True)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_load_args(path, dtype, owner: str) -> torch.dtype | None:
    """`from_pretrained(path, ..., dtype=...)`: `path` a str or os.PathLike (a target passed first, with the
    arguments swapped, is named as such); `dtype` None (as stored), a floating torch.dtype the drafters run
    in or its name ('fp32', 'bf16', 'fp16', as `resolve_dtype` takes them). Returns the torch.dtype (None
    for None); TypeError naming the argument otherwise (before reading the checkpoint)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{owner}.from_pretrained: path must be a checkpoint folder (str or os.PathLike), got "
                        f"{type(path).__name__} (the call is from_pretrained(path, target))")
    if dtype is None:
        return None
    try:
        return resolve_dtype(dtype)
    except ValueError:
        raise TypeError(f"{owner}.from_pretrained: dtype must be None (as stored), 'fp32', 'bf16', 'fp16' or "
                        f"torch.float32, torch.bfloat16, torch.float16, got {dtype!r}") from None


def build_loaded(cls, config, weights: dict[str, torch.Tensor], source: str, target=None,
                 device=None, dtype: torch.dtype | None = None):
    """`cls(config)` built on the meta device, `weights` loaded strictly (errors name missing/unexpected
    keys), moved to `device` (default: the target's embedding device) and `dtype` (default: the dtype of
    `fc.weight`; only floating tensors are cast), then the target attached when given."""
    with torch.device("meta"):
        module = cls(config)
    load_strict(module, weights, source)
    if device is None and target is not None:
        device = hf_causal_lm(target).get_input_embeddings().weight.device
    module = module.to(device=device, dtype=dtype or weights["fc.weight"].dtype)
    return module.attach_target(target) if target is not None else module


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]
