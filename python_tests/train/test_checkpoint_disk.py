"""train/checkpoint.py: a run refuses to start when the checkpoints it will hold cannot fit on the disk."""
import collections
import errno
import os

import pytest
from test_train_trainer import Net, collate, dataset, plain_loss

from flashmap_ext.train import checkpoint as ckpt
from flashmap_ext.train.trainer import TrainConfig, train


def brute_force_saves(step, steps, save_every):
    """The trainer's rule, step by step: a checkpoint when save_every divides the step, and at the end."""
    return sum(1 for s in range(step + 1, steps + 1) if s == steps or (save_every and s % save_every == 0))


@pytest.mark.parametrize("step,steps,every", [(0, 10, 3), (0, 9, 3), (4, 10, 3), (9, 10, 3), (10, 10, 3),
                                              (0, 10, 0), (5, 10, 0), (0, 1, 1), (7, 100, 7), (0, 16000, 100)])
def test_saves_left_matches_the_step_loop(step, steps, every):
    assert ckpt.saves_left(step, steps, every) == brute_force_saves(step, steps, every)


def test_estimate_matches_the_files_written(tmp_path):
    cfg = TrainConfig(out=str(tmp_path), steps=2, lr=1e-2, warmup=0, batch_size=2, save_every=1, keep=0,
                      progress=False)
    model = Net()
    train(model, plain_loss, dataset(), collate, cfg)
    d = ckpt.latest(str(tmp_path))
    written = sum(os.path.getsize(os.path.join(d, f)) for f in ("model.safetensors", "optim.safetensors"))
    tensors = ckpt.estimated_bytes(model)
    assert tensors <= written <= tensors + 4096      # the safetensors headers and AdamW's step counters


def fake_free(monkeypatch, free):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda path: usage(10 * free, 9 * free, free))


def test_keep_all_refuses_before_training_when_the_disk_is_too_small(tmp_path, monkeypatch):
    model = Net()
    per = ckpt.estimated_bytes(model)
    fake_free(monkeypatch, 5 * per)                   # room for 5 checkpoints; keep=0 would hold 10
    cfg = TrainConfig(out=str(tmp_path), steps=10, lr=1e-2, warmup=0, batch_size=2, save_every=1, keep=0,
                      progress=False)
    with pytest.raises(OSError) as e:
        train(model, plain_loss, dataset(), collate, cfg)
    assert e.value.errno == errno.ENOSPC and "--keep-checkpoints" in str(e.value) and "10 checkpoints" in str(e.value)
    assert not os.path.exists(tmp_path / "metrics.jsonl")          # refused before the first step


def test_bounded_keep_fits_where_keep_all_does_not(tmp_path, monkeypatch):
    model = Net()
    fake_free(monkeypatch, 5 * ckpt.estimated_bytes(model))
    cfg = TrainConfig(out=str(tmp_path), steps=10, lr=1e-2, warmup=0, batch_size=2, save_every=1, keep=2,
                      progress=False)
    assert train(model, plain_loss, dataset(), collate, cfg)["step"] == 10
    assert len([d for d in os.listdir(tmp_path / "checkpoints") if d.startswith("step-")]) == 2
