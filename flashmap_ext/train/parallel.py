"""Process-group plumbing for `torchrun`: DDP or FSDP2 (`fully_shard`), one process per device.

Launch: `torchrun --nproc-per-node N -m flashmap_ext.cli train flow ...` (multi-node: add `--nnodes`,
`--rdzv-endpoint`; checkpoints and the feature cache must be on a filesystem every node sees). Backend:
NCCL on CUDA, gloo on CPU (what the tests use). Without torchrun's environment everything is a no-op.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

MODES = ("none", "ddp", "fsdp")


@dataclass
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init(device: str | None = None) -> tuple[World, torch.device]:
    """Joins the process group described by torchrun's env vars (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*).

    Returns (world, this process's device). `device`: "cpu" | "cuda" | None (cuda when available).
    """
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    size = int(os.environ.get("WORLD_SIZE", "1"))
    world = World(int(os.environ.get("RANK", "0")), size, int(os.environ.get("LOCAL_RANK", "0")))
    dev = torch.device(kind, world.local_rank) if kind == "cuda" else torch.device(kind)
    if kind == "cuda":
        torch.cuda.set_device(dev)
    if size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if kind == "cuda" else "gloo")
    return world, dev


def wrap(model: torch.nn.Module, mode: str, device: torch.device) -> torch.nn.Module:
    """Wraps `model` for data parallelism. mode: "none" | "ddp" | "fsdp".

    FSDP2 shards each element of `model.layers` or `model.blocks` (when present) and then the root, so
    large drafters keep 1/N of their weights, gradients and AdamW moments per process.
    Raises ValueError for an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"parallel mode must be one of {MODES} (got {mode!r})")
    if mode == "none" or not dist.is_initialized():
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard
    for layer in getattr(model, "layers", None) or getattr(model, "blocks", None) or []:
        fully_shard(layer)
    fully_shard(model)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def grad_sync(model: torch.nn.Module, enabled: bool):
    """Context that skips gradient all-reduce on non-final accumulation micro-steps (DDP / FSDP2)."""
    import contextlib
    if hasattr(model, "no_sync") and not enabled:
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def mean(values: list[float], device: torch.device) -> list[float]:
    """Averages a list of floats over all processes (identity without a process group)."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def any_true(flag: bool, device: torch.device) -> bool:
    """True on every process when `flag` is true on any (e.g. a SIGTERM seen by one rank)."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier():
    if dist.is_initialized():
        dist.barrier()
