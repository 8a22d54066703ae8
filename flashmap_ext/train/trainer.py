"""A generic drafter trainer (DESIGN.md §8): AdamW, warmup + cosine, grad-clip, accumulation, DDP/FSDP2.

`train(model, loss_fn, dataset, collate_fn, cfg)` runs `cfg.steps` optimizer steps of

    loss, metrics = loss_fn(model, batch, generator)      # batch = collate_fn(items, generator)

Data order: an endless stream of per-epoch permutations of `dataset` (seeded by (seed, epoch)). Optimizer
step s consumes the global batch of `batch_size · accum · world` items starting at the saved data position;
micro-step m of rank r takes chunk m·world + r of it (items are read one step ahead by a background
thread). The generator handed to collate_fn and loss_fn is seeded from (seed, step, chunk), so a step's
randomness does not depend on how the run was interrupted.
Checkpoints (train/checkpoint.py) hold the weights, AdamW state, the data position and every RNG state;
`resume=True` continues from the newest one bit for bit (on CPU). SIGTERM/SIGINT save a checkpoint at
the end of the current step and return. Rank 0 writes `<out>/metrics.jsonl` and shows a tqdm bar.
"""
from __future__ import annotations

import functools
import json
import math
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from tqdm.auto import tqdm

from flashmap_ext.checks import check_int
from flashmap_ext.train import checkpoint as ckpt
from flashmap_ext.train import parallel


@dataclass
class TrainConfig:
    """Optimisation settings of one training run (AdamW, linear warmup then cosine decay)."""
    out: str                                   # run directory: checkpoints/, metrics.jsonl
    steps: int                                 # optimizer steps
    lr: float                                  # peak learning rate
    warmup: float = 0.04                       # a fraction of `steps` (< 1) or a step count (>= 1)
    min_lr_ratio: float = 0.0                  # final LR / peak at the end of the cosine
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0                     # max global gradient norm
    batch_size: int = 4                        # items per micro-batch per process
    accum: int = 1                             # micro-batches per optimizer step
    save_every: int = 1000                     # steps between checkpoints (0 = only at the end)
    keep: int = 2                              # checkpoints kept
    seed: int = 0
    log_every: int = 10                        # steps between metrics.jsonl lines (>= 1)
    parallel: str = "none"                     # "none" | "ddp" | "fsdp"
    autocast: bool | None = None               # bf16 autocast (None = on CUDA only)
    progress: bool = True                      # a tqdm bar

    def __post_init__(self):
        for name in ("steps", "batch_size", "accum", "log_every"):
            check_int(f"TrainConfig: {name}", getattr(self, name), 1)
        for name in ("save_every", "keep"):
            check_int(f"TrainConfig: {name}", getattr(self, name), 0)
        check_int("TrainConfig: seed", self.seed, 0, 2**63)
        if not (math.isfinite(self.lr) and self.lr > 0 and math.isfinite(self.warmup) and self.warmup >= 0):
            raise ValueError(f"lr must be a finite number > 0 and warmup one >= 0 (got lr={self.lr}, "
                             f"warmup={self.warmup})")


def check_train_args(model, loss_fn, collate_fn, cfg) -> None:
    """TypeError naming the argument of `train` that is not what it takes (before any work)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"train: model must be a torch.nn.Module, got {type(model).__name__}")
    for name, fn in (("loss_fn", loss_fn), ("collate_fn", collate_fn)):
        if not callable(fn):
            raise TypeError(f"train: {name} must be callable, got {type(fn).__name__}")
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"train: cfg must be a TrainConfig, got {type(cfg).__name__}")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """LR of optimizer step `step` (0-based): linear warmup to cfg.lr, then cosine to min_lr_ratio·lr."""
    warm = int(cfg.warmup * cfg.steps) if cfg.warmup < 1 else int(cfg.warmup)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def step_generator(seed: int, step: int, chunk: int) -> torch.Generator:
    """The CPU generator for (step, chunk): a pure function of its arguments."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + step) * 65_537 + chunk) % 2**64)  # torch's range


@functools.lru_cache(maxsize=4)
def _epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed((seed * 7919 + epoch) % 2**64)).tolist()


def chunk_indices(n: int, seed: int, start: int, count: int) -> list[int]:
    """Dataset indices at stream positions [start, start + count) of the endless shuffled stream."""
    return [_epoch_order(n, seed, p // n)[p % n] for p in range(start, start + count)]


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class _StopFlag:
    """Records SIGTERM/SIGINT instead of dying; the loop checkpoints and returns. Restores the old handlers."""

    def __init__(self):
        self.set, self.signum, self._old = False, None, {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals stay with their owner
                pass
        return self

    def _handle(self, signum, frame):
        self.set, self.signum = True, signum
        signal.signal(signum, self._old.get(signum, signal.SIG_DFL))  # a second signal acts as usual

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


class Trainer:
    """Holds the wrapped model, optimizer and position; see the module docstring and `train`."""

    def __init__(self, model, loss_fn: Callable, dataset: Sequence, collate_fn: Callable, cfg: TrainConfig,
                 device: str | None = None):
        if len(dataset) == 0:
            raise ValueError("dataset is empty")
        self.world, self.device = parallel.init(device)
        self.cfg, self.loss_fn, self.dataset, self.collate_fn = cfg, loss_fn, dataset, collate_fn
        torch.manual_seed(cfg.seed + self.world.rank)
        self.model = parallel.wrap(model.to(self.device), cfg.parallel, self.device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.step, self.position = 0, 0
        self.elapsed_before = 0.0  # training seconds of the run before this process (restored on resume)
        use_autocast = cfg.autocast if cfg.autocast is not None else self.device.type == "cuda"
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_autocast)
        self.opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        self._pool, self._pending = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch"), None

    @property
    def global_batch(self) -> int:
        return self.cfg.batch_size * self.cfg.accum * self.world.size

    def _items_at(self, position: int) -> list[list]:
        """This rank's dataset items for the step starting at stream `position`, one list per micro-step."""
        b, w = self.cfg.batch_size, self.world.size
        return [[self.dataset[i] for i in chunk_indices(len(self.dataset), self.cfg.seed,
                                                       position + (m * w + self.world.rank) * b, b)]
                for m in range(self.cfg.accum)]

    def _take_items(self) -> list[list]:
        """Items of the current step (prefetched by a background thread while the previous step ran);
        queues the next step's. Only reading happens off the main thread: collation and RNG stay here."""
        pending, self._pending = self._pending, None
        items = pending[1].result() if pending and pending[0] == self.position else self._items_at(self.position)
        nxt = self.position + self.global_batch
        self._pending = (nxt, self._pool.submit(self._items_at, nxt))
        return items

    def micro_batches(self):
        """Yields (generator, batch on device) for this rank's micro-steps of the current step."""
        for m, items in enumerate(self._take_items()):
            gen = step_generator(self.cfg.seed, self.step, m * self.world.size + self.world.rank)
            yield gen, to_device(self.collate_fn(items, gen), self.device)

    def train_step(self) -> dict:
        """One optimizer step; returns metrics averaged over micro-steps and processes."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.step, self.cfg)
        totals: dict[str, float] = {}
        for m, (gen, batch) in enumerate(self.micro_batches()):
            with parallel.grad_sync(self.model, m == self.cfg.accum - 1):
                with self.autocast:
                    loss, metrics = self.loss_fn(self.model, batch, gen)
                (loss / self.cfg.accum).backward()
            for k, v in {"loss": float(loss.detach()), **metrics}.items():
                totals[k] = totals.get(k, 0.0) + float(v) / self.cfg.accum
        norm = torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]],
                                              self.cfg.grad_clip)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        if not torch.isfinite(norm):  # the global norm: every rank sees it, and no weight has moved yet
            raise FloatingPointError(
                f"training diverged at step {self.step + 1}: gradient norm {float(norm)} (loss "
                f"{totals.get('loss', float('nan')):.4g}); the newest checkpoint in {self.cfg.out} holds the "
                "weights before it; a lower --lr, or --resume from it, may help")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.position += self.global_batch
        keys = sorted(totals)
        values = parallel.mean([totals[k] for k in keys], self.device)
        return {**dict(zip(keys, values)), "grad_norm": float(norm), "lr": self.optimizer.param_groups[0]["lr"]}

    def save(self, elapsed: float | None = None) -> str | None:
        """Writes a checkpoint of the current step (collective: every rank must call it); elapsed: the run's
        training seconds so far, restored on resume so metrics.jsonl's elapsed_s keeps counting."""
        model_sd = get_model_state_dict(self.model, options=self.opts)
        optim_sd = get_optimizer_state_dict(self.model, self.optimizer, options=self.opts)
        tmp = ckpt.step_dir(self.cfg.out, self.step) + ".tmp"
        if self.world.main:
            os.makedirs(tmp, exist_ok=True)
        parallel.barrier()
        ckpt.write_rank_rng(tmp, self.world.rank)
        parallel.barrier()
        path = None
        if self.world.main:
            state = {"step": self.step, "position": self.position, "world_size": self.world.size,
                     "elapsed_s": self.elapsed_before if elapsed is None else round(elapsed, 3),
                     "config": {k: v for k, v in asdict(self.cfg).items() if k != "progress"}}
            ckpt.write_main(tmp, state, model_sd, optim_sd)
            path = ckpt.publish(self.cfg.out, self.step, self.cfg.keep)
        parallel.barrier()
        return path

    def load(self, path: str) -> None:
        """Restores weights, optimizer, step, data position and this rank's RNG from checkpoint `path`."""
        state, model_sd, optim_sd, rng = ckpt.read(path, self.world.rank)
        set_model_state_dict(self.model, model_sd, options=StateDictOptions(full_state_dict=True))
        set_optimizer_state_dict(self.model, self.optimizer, optim_sd, options=StateDictOptions(full_state_dict=True))
        self.step, self.position = state["step"], state["position"]
        self.elapsed_before = float(state.get("elapsed_s", 0.0))  # absent in checkpoints written before it
        if rng is not None:
            ckpt.set_rng_state(*rng)

    def log(self, metrics: dict, started: float) -> None:
        if self.world.main:
            with open(os.path.join(self.cfg.out, "metrics.jsonl"), "a") as f:
                f.write(json.dumps({"step": self.step, "samples": self.position,
                                    "elapsed_s": round(time.time() - started, 3), **metrics}) + "\n")

    def _step_and_maybe_save(self, stop: "_StopFlag", started: float) -> dict:
        """One step, its metrics line and, when due or when a signal arrived on any rank, a checkpoint."""
        cfg = self.cfg
        self.model.train()
        metrics = self.train_step()
        if self.step % cfg.log_every == 0 or self.step == cfg.steps:
            self.log(metrics, started)
        stopping = parallel.any_true(stop.set, self.device)
        if stopping or self.step == cfg.steps or (cfg.save_every and self.step % cfg.save_every == 0):
            self.save(time.time() - started)
        return {**metrics, "stopped": stopping}

    def last_logged(self) -> dict:
        """Metrics of the newest line of metrics.jsonl at or before the current step ({} if none)."""
        path = os.path.join(self.cfg.out, "metrics.jsonl")
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            lines = [json.loads(ln) for ln in f if ln.strip() and ln.endswith("\n")]
        lines = [ln for ln in lines if ln["step"] <= self.step]
        skip = ("step", "samples", "elapsed_s")
        return {k: v for k, v in lines[-1].items() if k not in skip} if lines else {}

    def run(self) -> dict:
        """Trains until cfg.steps (or a signal); checkpoints every save_every steps and at the end. A run
        resumed at or past cfg.steps trains nothing: its last logged metrics, with "complete": True."""
        cfg, metrics, started = self.cfg, {}, time.time() - self.elapsed_before
        if self.step >= cfg.steps:
            self._pool.shutdown()
            return {"step": self.step, **self.last_logged(), "complete": True}
        bar = tqdm(total=cfg.steps, initial=self.step, desc="train", unit="step",
                   disable=not (cfg.progress and self.world.main))
        with _StopFlag() as stop, bar:
            try:
                while self.step < cfg.steps:
                    metrics = self._step_and_maybe_save(stop, started)
                    bar.set_postfix(loss=f"{metrics['loss']:.4f}", lr=f"{metrics['lr']:.2e}", refresh=False)
                    bar.update(1)  # after the postfix: the line of step n shows step n's loss
                    if metrics.pop("stopped"):
                        metrics["signal"] = int(stop.signum or signal.SIGINT)  # another rank's: not known here
                        break
            finally:
                self._pool.shutdown(cancel_futures=True)
        return {"step": self.step, **metrics}


def train(model: torch.nn.Module, loss_fn: Callable, dataset: Sequence, collate_fn: Callable, cfg: TrainConfig,
          *, resume: bool = False, device: str | None = None) -> dict:
    """Trains `model` in place (see the module docstring); returns the last step's metrics plus "step"
    (plus "complete": True when a resumed run had already reached cfg.steps: its last logged metrics).

    resume: continue from `<cfg.out>/checkpoints/latest` (a fresh start when there is none).
    device: "cpu" | "cuda" | None (cuda when available). Under torchrun, every process calls this.
    Raises FileExistsError when `cfg.out` holds checkpoints and resume is False, and OSError (errno ENOSPC)
    before the first step when the checkpoints the run will hold at once exceed the disk's free space
    (`checkpoint.check_disk`).
    """
    check_train_args(model, loss_fn, collate_fn, cfg)
    os.makedirs(cfg.out, exist_ok=True)
    path = ckpt.latest(cfg.out)
    if path is not None and not resume:
        raise FileExistsError(f"{cfg.out} already holds checkpoints ({os.path.basename(path)}): "
                              "pass resume=True (--resume) to continue, or choose another output directory")
    trainer = Trainer(model, loss_fn, dataset, collate_fn, cfg, device)
    if trainer.world.main:
        ckpt.remove_partial(cfg.out)
    if path is not None:
        trainer.load(path)
        if trainer.world.main:
            _truncate_metrics(os.path.join(cfg.out, "metrics.jsonl"), trainer.step)
    if trainer.world.main:
        ckpt.check_disk(cfg.out, ckpt.estimated_bytes(model), ckpt.saves_left(trainer.step, cfg.steps,
                        cfg.save_every), cfg.keep)
    parallel.barrier()
    return trainer.run()


def _truncate_metrics(path: str, step: int) -> None:
    """Drops metric lines logged after checkpoint `step` (they are about to be recomputed)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = [ln for ln in f if ln.strip() and ln.endswith("\n") and json.loads(ln)["step"] <= step]
    with open(path + ".tmp", "w") as f:
        f.writelines(lines)
    os.replace(path + ".tmp", path)
