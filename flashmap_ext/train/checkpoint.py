"""Training checkpoints: atomic, pickle-free, resumable bit for bit (DESIGN.md §8).

A checkpoint is a directory `<out>/checkpoints/step-NNNNNNNN/` holding
    state.json            step, data position, optimizer param_groups, config, python/numpy RNG per rank
    model.safetensors     the full (unsharded) model state dict
    optim.safetensors     optimizer tensors, keys `<param fqn>/<name>` (AdamW: step, exp_avg, exp_avg_sq)
    rng-<rank>.safetensors  torch CPU (and CUDA) generator states of each rank
It is written under `step-NNNNNNNN.tmp/` and renamed into place (os.replace), then `latest` (a text file
naming it) is replaced the same way, so a crash at any moment leaves the previous checkpoint usable.
Loading never unpickles anything.
"""
from __future__ import annotations

import errno
import json
import os
import random
import shutil

import numpy as np
import torch
from safetensors.torch import load_file

from flashmap_ext.weights_file import save_weights


def flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], list]:
    """Optimizer state dict keyed by parameter FQN -> (tensors by `fqn/name`, param_groups json)."""
    tensors = {f"{fqn}/{name}": t.detach().cpu().contiguous() for fqn, per in state["state"].items()
               for name, t in per.items() if isinstance(t, torch.Tensor)}
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state["param_groups"]]
    return tensors, groups


def unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list) -> dict:
    state: dict = {}
    for key, t in tensors.items():
        fqn, name = key.rsplit("/", 1)
        state.setdefault(fqn, {})[name] = t
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in groups]
    return {"state": state, "param_groups": groups}


def rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    """This process's RNG states: (torch tensors, json-able python/numpy states)."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    py = random.getstate()
    return tensors, {"numpy": [name, keys.tolist(), pos, has_gauss, gauss], "python": [py[0], list(py[1]), py[2]]}


def set_rng_state(tensors: dict[str, torch.Tensor], other: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("cuda")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[:torch.cuda.device_count()])
    name, keys, pos, has_gauss, gauss = other["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    random.setstate((other["python"][0], tuple(other["python"][1]), other["python"][2]))


def step_dir(out: str, step: int) -> str:
    return os.path.join(out, "checkpoints", f"step-{step:08d}")


def latest(out: str) -> str | None:
    """The newest complete checkpoint directory under `out`, or None."""
    path = os.path.join(out, "checkpoints", "latest")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        name = f.read().strip()
    full = os.path.join(out, "checkpoints", name)
    return full if os.path.isdir(full) else None


def remove_partial(out: str) -> None:
    """Deletes `*.tmp` checkpoint directories left by an interrupted write."""
    root = os.path.join(out, "checkpoints")
    for d in os.listdir(root) if os.path.isdir(root) else []:
        if d.endswith(".tmp"):
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)


def write_rank_rng(tmp: str, rank: int) -> None:
    """Each rank writes its own RNG states into the checkpoint being built at `tmp`."""
    tensors, other = rng_state()
    save_weights(tensors, os.path.join(tmp, f"rng-{rank}.safetensors"), metadata={"other": json.dumps(other)})


def write_main(tmp: str, state: dict, model_sd: dict, optim_sd: dict) -> None:
    """Rank 0: writes state.json, model and optimizer tensors into `tmp` (already created)."""
    tensors, groups = flatten_optimizer(optim_sd)
    save_weights({k: v.detach().cpu().contiguous() for k, v in model_sd.items()}, os.path.join(tmp, "model.safetensors"))
    save_weights(tensors, os.path.join(tmp, "optim.safetensors"))
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({**state, "param_groups": groups}, f, indent=1)


def publish(out: str, step: int, keep: int) -> str:
    """Renames `step-N.tmp` into place, points `latest` at it, deletes all but the newest `keep`."""
    final = step_dir(out, step)
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(final + ".tmp", final)
    pointer = os.path.join(out, "checkpoints", "latest")
    with open(pointer + ".tmp", "w") as f:
        f.write(os.path.basename(final))
        f.flush()
        os.fsync(f.fileno())
    os.replace(pointer + ".tmp", pointer)
    root = os.path.dirname(final)
    done = sorted(d for d in os.listdir(root) if d.startswith("step-") and not d.endswith(".tmp"))
    for d in done[:-keep] if keep > 0 else []:
        shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    return final


def estimated_bytes(model: torch.nn.Module) -> int:
    """Bytes of one checkpoint of `model`: its state dict as stored plus AdamW's two fp32 moments per
    trainable element (the RNG files and state.json are a few KB)."""
    state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return state + sum(8 * p.numel() for p in model.parameters() if p.requires_grad)


def check_disk(out: str, per_checkpoint: int, saves: int, keep: int) -> None:
    """OSError (ENOSPC) before training when the checkpoints this run will hold at once cannot fit on the
    disk of `out`: all `saves` of them when keep = 0, else keep + 1 (the new one is written before the
    oldest is deleted). Names the options that bound it, so a long run never dies of a full disk mid-way."""
    held = saves if keep == 0 else min(saves, keep + 1)
    need, free = held * per_checkpoint, shutil.disk_usage(out).free
    if need > free:
        gib = 2 ** 30
        raise OSError(errno.ENOSPC, f"{out}: this run would hold {held} checkpoints of about "
                      f"{per_checkpoint / 2**20:.0f} MiB ({need / gib:.1f} GiB) but the disk has "
                      f"{free / gib:.1f} GiB free: keep fewer (--keep-checkpoints N, 0 keeps all) or save less "
                      "often (--save-every)")


def saves_left(step: int, steps: int, save_every: int) -> int:
    """Checkpoints a run at `step` writes until `steps`: every save_every steps and one at the end."""
    if step >= steps:
        return 0
    if save_every == 0:
        return 1
    periodic = steps // save_every - step // save_every
    return periodic + (0 if steps % save_every == 0 else 1)


def read(path: str, rank: int) -> tuple[dict, dict, dict, tuple | None]:
    """-> (state, model state dict, optimizer state dict, this rank's RNG (tensors, other) or None)."""
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    model_sd = load_file(os.path.join(path, "model.safetensors"))
    optim_sd = unflatten_optimizer(load_file(os.path.join(path, "optim.safetensors")), state.pop("param_groups"))
    rng_path = os.path.join(path, f"rng-{rank}.safetensors")
    rng = None
    if os.path.exists(rng_path):
        from safetensors import safe_open
        with safe_open(rng_path, "pt") as f:
            rng = ({k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["other"]))
    return state, model_sd, optim_sd, rng


def load_model_weights(path: str, model: torch.nn.Module) -> torch.nn.Module:
    """Loads a checkpoint's model weights (strict) into an unwrapped `model`, e.g. before save_pretrained."""
    model.load_state_dict(load_file(os.path.join(path, "model.safetensors")), strict=True)
    return model
