"""A short `flashmap train flow` run on one GPU: the qwen3-8b preset's FlashMap drafter on a Qwen3-8B-shaped
target (bench_round.QWEN3_8B, random weights, bf16), its steps/s and tokens/s, and whether the loss falls.

    python benches/bench_train.py [--json train.json] [--tiny] [--steps 20] [--sequences 16] [--seq-len 1024]

The data: --sequences sequences of --seq-len tokens from a fixed sparse Markov chain over 2,048 token ids (an
eighth of the vocabulary on small targets)
(each id has one likely successor, p = 0.9): text a drafter can learn within a few dozen steps. Their taps
come from the target itself (`cache_features`, the code behind `flashmap features`) into a feature cache,
then the command line's own `train flow` runs with --preset qwen3-8b (--tiny: cpu-tiny) on that cache; the
target it loads is the one already in memory (`load_target` answers with it), saving an 8B model's
write and two reads. From <out>/metrics.jsonl (one line per step): steps/s and tokens/s over the steps after
the first --warmup (sequence tokens: batch x accum x seq-len; labels: x anchors x K), the first and last
losses (means of 3). The JSON has pytest-benchmark's layout (median = seconds per step).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_round  # noqa: E402  (benches/ is not a package when run as a script)

CHAIN_IDS = 2048


def chain_samples(n: int, length: int, vocab: int, seed: int = 0) -> list:
    """n Samples of `length` ids from a sparse Markov chain over min(2048, vocab / 8) ids (loss on every token)."""
    from flashmap_ext.train.data import Sample
    g = torch.Generator().manual_seed(seed)
    ids = max(min(CHAIN_IDS, vocab // 8), 2)
    successor = torch.randperm(ids, generator=g)
    samples = []
    for i in range(n):
        seq = [int(torch.randint(0, ids, (1,), generator=g))]
        jumps = torch.rand(length, generator=g) >= 0.9
        noise = torch.randint(0, ids, (length,), generator=g)
        for t in range(1, length):
            seq.append(int(noise[t]) if jumps[t] else int(successor[seq[-1]]))
        samples.append(Sample(f"chain/{i}", seq, [1] * length))
    return samples


def run_cli(target, argv: list[str]) -> int:
    """`flashmap train ...` in this process, with --target answered by the Target in memory."""
    import flashmap_ext.target as target_lib
    from flashmap_ext import cli
    cli.build_parser()  # imports every command module now: none may bind the stand-in below at its import
    original = target_lib.load_target
    target_lib.load_target = lambda *args, **kwargs: (target, None)
    try:
        return cli.main(argv)
    finally:
        target_lib.load_target = original


def rates(out: Path, warmup: int) -> dict:
    """steps/s, seconds per step and the first/last losses from <out>/metrics.jsonl and <out>/run.json."""
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    settings = json.loads((out / "run.json").read_text())["settings"]
    timed = lines[warmup:]
    if len(timed) < 2:
        raise RuntimeError(f"{len(lines)} metrics lines: too few steps after {warmup} warm-up steps")
    seconds = (timed[-1]["elapsed_s"] - timed[0]["elapsed_s"]) / (timed[-1]["step"] - timed[0]["step"])
    per_step = settings["batch_size"] * settings["accum"]
    losses = [x["loss"] for x in lines]
    return dict(steps=lines[-1]["step"], s_per_step=seconds, steps_per_s=1 / seconds,
                sequences_per_step=per_step, labels_per_step=per_step * settings["num_anchors"],
                first_loss=statistics.mean(losses[:3]), last_loss=statistics.mean(losses[-3:]),
                losses=losses)


def main(argv=None) -> int:
    from flashmap_ext.drafters.flashmap.config import default_tap_layers
    from flashmap_ext.train.features import cache_features
    ap = bench_round.script_parser(__doc__, "small target, preset cpu-tiny (default without a GPU)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default 20; tiny: 8)")
    ap.add_argument("--sequences", type=int, default=None, help="training sequences (default 16; tiny: 8)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 1024; tiny: 64)")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the rates")
    ap.add_argument("--workdir", type=Path, help="feature cache and run directory (default: a temporary one)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    args.tiny = args.tiny or device.type != "cuda"
    steps = args.steps or (8 if args.tiny else 20)
    n_seq, seq_len = args.sequences or (8 if args.tiny else 16), args.seq_len or (64 if args.tiny else 1024)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = bench_round.build_target(args.tiny, device, dtype)
    preset = "cpu-tiny" if args.tiny else "qwen3-8b"
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        feats, out = Path(work) / "feats", Path(work) / "run"
        layers = default_tap_layers(target.num_layers)
        cache_features(target, chain_samples(n_seq, seq_len, target.vocab_size), str(feats), layers,
                       dtype="bf16" if dtype == torch.bfloat16 else "fp32", progress=False)
        rc = run_cli(target, ["train", "flow", "--target", "in-memory", "--features", str(feats), "--out", str(out),
                              "--preset", preset, "--steps", str(steps), "--save-every", str(steps),
                              "--log-every", "1", "--no-progress", "--max-length", str(seq_len),
                              "--device", device.type])
        if rc != 0:
            return rc
        result = rates(out, args.warmup)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result.update(preset=preset, seq_len=seq_len, sequences=n_seq, device=name,
                  tokens_per_s=result["sequences_per_step"] * seq_len * result["steps_per_s"],
                  labels_per_s=result["labels_per_step"] * result["steps_per_s"],
                  loss_fell=result["last_loss"] < result["first_loss"])
    print(f"train flow --preset {preset}: {result['steps']} steps, {result['steps_per_s']:.3f} steps/s, "
          f"{result['tokens_per_s']:.0f} tokens/s ({result['labels_per_s']:.0f} labels/s); loss "
          f"{result['first_loss']:.3f} -> {result['last_loss']:.3f}")
    if args.json:
        bench = dict(name="train_flow", fullname="benches/bench_train.py::train_flow", group="training",
                     stats=dict(median=result["s_per_step"]), extra_info=result)
        args.json.write_text(json.dumps(dict(machine_info=dict(torch=torch.__version__), benchmarks=[bench]),
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
