"""HF-style drafter checkpoints: `config.json` + `model.safetensors` (or sharded with an index).

No pickle anywhere: loading never runs code (DESIGN.md §8).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def read_config(path: str | os.PathLike) -> dict:
    """The parsed `config.json` of checkpoint folder `path`; FileNotFoundError names the file."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"no config.json in {path}")
    with open(file) as f:
        return json.load(f)


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of `model.safetensors`, or of every shard listed in `model.safetensors.index.json`."""
    folder = Path(path)
    if (folder / WEIGHTS).is_file():
        return load_file(folder / WEIGHTS)
    if (folder / INDEX).is_file():
        with open(folder / INDEX) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(load_file(folder / shard))
        return weights
    raise FileNotFoundError(f"no {WEIGHTS} or {INDEX} in {path}")


def write_checkpoint(path: str | os.PathLike, config: dict, module: nn.Module, skip: set[str] = frozenset()) -> None:
    """Writes config.json and model.safetensors (parameters and persistent buffers, but the names in `skip`)
    into folder `path`."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items() if k not in skip}
    tmp = folder / (WEIGHTS + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, folder / WEIGHTS)
    with open(folder / "config.json.tmp", "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    os.replace(folder / "config.json.tmp", folder / "config.json")


def load_strict(module: nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Assigns `weights` to `module` (which may live on the meta device: the tensors are taken as they
    are, dtype included); ValueError listing missing/unexpected names or wrong shapes."""
    own = module.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    wrong = [f"{k}: {tuple(weights[k].shape)} vs expected {tuple(own[k].shape)}"
             for k in own if k in weights and weights[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        raise ValueError(f"checkpoint {source} does not match the config: missing {missing[:8]}, "
                         f"unexpected {unexpected[:8]}, wrong shapes {wrong[:8]}")
    module.load_state_dict(weights, strict=True, assign=True)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_loaded(cls, config, weights: dict[str, torch.Tensor], source: str, target=None,
                 device=None, dtype: torch.dtype | None = None):
    """`cls(config)` built on the meta device, `weights` loaded strictly (errors name missing/unexpected
    keys), moved to `device` (default: the target's embedding device) and `dtype` (default: the dtype of
    `fc.weight`; only floating tensors are cast), then the target attached when given."""
    from flashmap_ext.drafters.target_parts import hf_model
    with torch.device("meta"):
        module = cls(config)
    load_strict(module, weights, source)
    if device is None and target is not None:
        device = hf_model(target).get_input_embeddings().weight.device
    module = module.to(device=device, dtype=dtype or weights["fc.weight"].dtype)
    return module.attach_target(target) if target is not None else module


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]
