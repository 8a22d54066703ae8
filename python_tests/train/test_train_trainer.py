"""train/trainer.py: bit-exact resume after SIGTERM, schedule, atomic checkpoints, DDP/FSDP2 on gloo."""
import json
import os
import signal
import socket

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from flashmap_ext.train import checkpoint as ckpt
from flashmap_ext.train.trainer import TrainConfig, lr_at, train


class Net(torch.nn.Module):
    """Tiny stand-in drafter: two layers (so FSDP2 shards each), dropout to exercise the global RNG."""

    def __init__(self, dropout=0.0):
        super().__init__()
        torch.manual_seed(123)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)])
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x):
        return self.layers[1](self.drop(torch.tanh(self.layers[0](x))))


def dataset(n=13):
    g = torch.Generator().manual_seed(7)
    return [{"x": torch.randn(4, generator=g), "y": torch.randn(1, generator=g)} for _ in range(n)]


def collate(items, gen):
    return {"x": torch.stack([i["x"] for i in items]), "y": torch.stack([i["y"] for i in items]),
            "noise": torch.randn(len(items), 4, generator=gen)}


def noisy_loss(model, batch, gen):
    """Uses the step generator (noise) and the global RNG (dropout): both must be restored on resume."""
    pred = model(batch["x"] + 0.1 * batch["noise"])
    return torch.nn.functional.mse_loss(pred, batch["y"]), {"pred_mean": float(pred.detach().mean())}


def plain_loss(model, batch, gen):
    return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"]), {}


def cfg(out, **kw):
    base = dict(out=str(out), steps=10, lr=1e-2, warmup=2, batch_size=3, accum=2, save_every=3, keep=2,
                log_every=1, progress=False, weight_decay=0.01)
    return TrainConfig(**{**base, **kw})


class SigtermAt:
    """Loss wrapper that sends this process SIGTERM during the n-th call (a scheduler preempting us)."""

    def __init__(self, n, loss=noisy_loss):
        self.n, self.calls, self.loss = n, 0, loss

    def __call__(self, model, batch, gen):
        self.calls += 1
        if self.calls == self.n:
            os.kill(os.getpid(), signal.SIGTERM)
        return self.loss(model, batch, gen)


def test_resume_after_sigterm_is_bit_exact(tmp_path):
    straight = Net(dropout=0.2)
    train(straight, noisy_loss, dataset(), collate, cfg(tmp_path / "a"))
    first = Net(dropout=0.2)
    out = train(first, SigtermAt(9), dataset(), collate, cfg(tmp_path / "b"))  # call 9 = step 5, micro-step 1
    assert out["step"] == 5 and ckpt.latest(str(tmp_path / "b")).endswith("step-00000005")
    assert out["signal"] == signal.SIGTERM  # the CLI exits 128 + 15, as a process killed by it would
    with pytest.raises(FileExistsError, match="resume"):
        train(Net(dropout=0.2), noisy_loss, dataset(), collate, cfg(tmp_path / "b"))
    resumed = Net(dropout=0.2)
    assert train(resumed, noisy_loss, dataset(), collate, cfg(tmp_path / "b"), resume=True)["step"] == 10
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(first.layers[0].weight, resumed.layers[0].weight)
    logs = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logs] == list(range(1, 11))
    assert [m["loss"] for m in logs] == [m["loss"] for m in ref]
    elapsed = [m["elapsed_s"] for m in logs]
    assert elapsed == sorted(elapsed) and elapsed[5] >= elapsed[4] > 0, "elapsed_s keeps counting across the resume"
    kept = sorted(os.listdir(tmp_path / "b" / "checkpoints"))
    assert kept == ["latest", "step-00000009", "step-00000010"]  # keep=2, no .tmp left behind
    weights = ckpt.load_model_weights(str(tmp_path / "b" / "checkpoints" / "step-00000010"), Net())
    assert torch.equal(weights.layers[1].weight, resumed.layers[1].weight)


def test_lr_schedule_warmup_then_cosine():
    c = TrainConfig(out="x", steps=100, lr=6e-4, warmup=0.04, min_lr_ratio=0.1)
    assert [lr_at(s, c) for s in range(4)] == pytest.approx([1.5e-4, 3e-4, 4.5e-4, 6e-4])
    assert lr_at(4, c) == pytest.approx(6e-4)
    assert lr_at(52, c) == pytest.approx(6e-4 * (0.1 + 0.9 * 0.5))  # halfway through the cosine
    assert lr_at(100, c) == pytest.approx(6e-5)
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(out="x", steps=1, lr=1e-3, batch_size=0)


def test_interrupted_checkpoint_write_leaves_previous_usable(tmp_path):
    train(Net(), plain_loss, dataset(), collate, cfg(tmp_path, steps=3))
    os.makedirs(tmp_path / "checkpoints" / "step-00000004.tmp")  # a crash mid-write
    (tmp_path / "checkpoints" / "step-00000004.tmp" / "model.safetensors").write_bytes(b"partial")
    assert ckpt.latest(str(tmp_path)).endswith("step-00000003")
    assert train(Net(), plain_loss, dataset(), collate, cfg(tmp_path, steps=5), resume=True)["step"] == 5
    assert not (tmp_path / "checkpoints" / "step-00000004.tmp").exists()


def _free_ports(n):
    """n distinct free loopback ports (sockets held open together so they cannot repeat)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


MODES = ("ddp", "fsdp")


def _worker(rank, ports, root):
    """One torchrun-style process, trying each parallel mode in turn (one spawn, two process groups).

    Rank 0 alone receives SIGTERM during step 2: both ranks must checkpoint after step 2 and stop; the
    run then resumes (fresh model, as a restarted job) and finishes its 4 steps."""
    torch.set_num_threads(1)
    for mode, port in zip(MODES, ports):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                          LOCAL_RANK=str(rank))
        out = os.path.join(root, mode)
        c = cfg(out, steps=4, batch_size=2, accum=2, save_every=0, parallel=mode)
        stop = SigtermAt(3, plain_loss) if rank == 0 else plain_loss
        assert train(Net(), stop, dataset(), collate, c, device="cpu")["step"] == 2
        model = Net()
        train(model, plain_loss, dataset(), collate, c, resume=True, device="cpu")
        weights = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                   for k, v in model.state_dict().items()}
        torch.save(weights, os.path.join(out, f"rank{rank}.pt"))
        torch.distributed.barrier()  # neither rank tears its connections down while the other still uses them
        torch.distributed.destroy_process_group()


def test_two_gloo_processes_match_single_process(tmp_path):
    """DDP and FSDP2 over 2 ranks × micro-batch 2 × accum 2, stopped and resumed halfway, == one process ×
    micro-batch 4 × accum 2 straight through."""
    single = Net()
    train(single, plain_loss, dataset(), collate, cfg(tmp_path / "single", steps=4, batch_size=4, accum=2))
    mp.spawn(_worker, args=(_free_ports(len(MODES)), str(tmp_path)), nprocs=2)
    for mode in MODES:
        out = tmp_path / mode
        r0, r1 = (torch.load(out / f"rank{r}.pt") for r in range(2))
        for name, ref in single.state_dict().items():
            assert torch.equal(r0[name], r1[name]), (mode, name)
            torch.testing.assert_close(r0[name], ref, rtol=1e-5, atol=1e-6, msg=f"{mode} {name}")
        saved = load_file(out / "checkpoints" / "step-00000004" / "model.safetensors")
        assert torch.equal(saved["layers.0.weight"], r0["layers.0.weight"]), mode


def test_a_diverging_run_stops_before_its_weights_turn_non_finite(tmp_path):
    """A loss that turns NaN at step 5 used to train on and save a NaN drafter: the run stops there, naming the
    step, with the step-3 checkpoint and the model's weights still finite; an infinite LR is refused."""
    def nan_at_5(model, batch, gen, calls=[0]):
        calls[0] += 1
        loss = plain_loss(model, batch, gen)[0]
        return (loss * float("nan") if calls[0] > 8 else loss), {}  # accum 2: micro-step 9 is step 5's
    model = Net()
    with pytest.raises(FloatingPointError, match="diverged at step 5: gradient norm nan"):
        train(model, nan_at_5, dataset(), collate, cfg(tmp_path))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert ckpt.latest(str(tmp_path)).endswith("step-00000003")
    weights = load_file(os.path.join(ckpt.latest(str(tmp_path)), "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in weights.values())
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="lr must be a finite number > 0"):
            cfg(tmp_path / "x", lr=bad)
