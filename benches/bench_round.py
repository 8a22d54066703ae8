"""One decoding round end to end on a Qwen3-8B-shaped target (DESIGN.md §10 target, measured,
never asserted: everything but the verify forward ≤ 10% of it).

Random weights (timing does not need trained ones): an HF `Qwen3ForCausalLM` of the Qwen3-8B shape (36 layers,
d 4096, 32 query / 8 KV heads of 128, MLP 12,288, V 151,936) in bf16, built directly on the GPU, and the
FlashMap drafter `FlashMapDrafter.for_target` (DESIGN.md §5 defaults: 6 layers, width 2048, K = 16) with
random gates. Rounds run through `speculate.generate` itself (T = 0, after a prompt of --prompt-len
tokens); its `Timer(sync=True)` timestamps each round, with a device sync at every phase boundary:

    draft        drafter.draft: anchor entry, noise, 1 or 2 network evaluations
    forward      the target's verify forward over [anchor, K drafts]
    verify_op    ops.verify and the round's one host read of its result
    bookkeeping  KV rollback, drafter memory extension, stats, token append

A second run without those syncs gives the loop's real round time (`round_ms`, round start to round start).
overhead = (draft + verify_op + bookkeeping) / forward, and overhead_nosync = (round_ms − forward) / forward.
Paths: `fused` (the ops.dit kernels; CUDA bf16 only) and `reference` (allow_fused = False: the PyTorch
drafter); both use the `verify` kernel. Each variant runs once untimed before it is measured. Random drafts are
(almost) never accepted, so a round commits one token and adds one drafter memory entry; the budget-limited last
rounds (fewer than K drafts) are not counted.

    python benches/bench_round.py [--json round.json] [--tiny] [--rounds 20] [--warmup 5] [--prompt-len 1024]

Without a GPU (or with --tiny) a small target and drafter run instead: a smoke test of the same code.
The JSON has pytest-benchmark's layout (benchmarks[].stats.median in seconds = the synced round total, the
split in extra_info), so benches/device_check.sh's summary.json picks it up; it is rewritten after each
variant, so a timeout keeps the finished ones.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

PHASES = ("draft", "forward", "verify", "commit")   # Timer phase names, in round order
COLUMNS = ("draft_ms", "forward_ms", "verify_op_ms", "bookkeeping_ms")
QWEN3_8B = dict(vocab_size=151_936, hidden_size=4096, intermediate_size=12_288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960,
                rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
TINY = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, tie_word_embeddings=False)
TINY_DRAFTER = dict(n_layers=2, width=128, heads=2, cond_dim=64)  # fused-kernel compatible widths


def build_target(tiny: bool, device: torch.device, dtype: torch.dtype):
    """A random Qwen3 target wrapped in `Target`, initialised on `device` (seconds for 8 B on a GPU)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from flashmap_ext.target import Target
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(Qwen3Config(**(TINY if tiny else QWEN3_8B)), dtype=dtype)
    return Target(model)


def build_drafter(target, tiny: bool, dtype: torch.dtype):
    """FlashMapDrafter.for_target with random (not adaLN-zero) weights, on the target's device, in `dtype`."""
    from flashmap_ext.drafters.flashmap import FlashMapDrafter
    torch.manual_seed(1)
    with torch.device(target.device):
        drafter = FlashMapDrafter.for_target(target, **(TINY_DRAFTER if tiny else {"preset": "qwen3-8b"}))
    drafter.reset_parameters(zero_init=False)
    return drafter.to(dtype).eval()


def _timed_rounds(stats, k: int, warmup: int, rounds: int) -> list[int]:
    """Indices of the rounds to count: full K drafts, after `warmup`, at most `rounds`, each with a next one."""
    full = [i for i, d in enumerate(stats.drafted) if d == k and i >= warmup and i + 1 < stats.rounds]
    return full[:rounds]


def time_variant(target, drafter, prompt: torch.Tensor, *, path: str, steps: int, rounds: int,
                 warmup: int) -> dict:
    """Median per-round times of one (path, steps) variant: a synced run for the split, an unsynced one
    for the real round time."""
    from flashmap_ext.speculate import Timer, generate
    drafter.allow_fused = path == "fused"
    drafter.config.draft_steps = steps
    k = drafter.num_draft_tokens
    new_tokens = warmup + rounds + k + 3  # every counted round drafts K even if none is accepted
    synced, free = Timer(sync=True), Timer(sync=False)
    # An untimed run first: a variant's first run pays one-time costs (kernel loading, allocator growth,
    # library plans) through all its rounds, not only the warm-up ones (the first H200 run, 2026-12-04:
    # the first variant's verify forward 76 ms against 34 ms in every later variant).
    generate(target, drafter, prompt, new_tokens)
    out = generate(target, drafter, prompt, new_tokens, timer=synced)
    keep = _timed_rounds(out.stats, k, warmup, rounds)
    if not keep:
        raise RuntimeError(f"no round with {k} drafts after {warmup} warm-up rounds ({out.stats.drafted})")
    split = {col: statistics.median(synced.rounds[i][ph] for i in keep) for col, ph in zip(COLUMNS, PHASES)}
    out_free = generate(target, drafter, prompt, new_tokens, timer=free)
    keep_free = _timed_rounds(out_free.stats, k, warmup, rounds)
    round_ms = statistics.median((free.starts[i + 1] - free.starts[i]) * 1e3 for i in keep_free)
    total = sum(split.values())
    forward = split["forward_ms"]
    return dict(path=path, steps=steps, **split, total_ms=total, round_ms=round_ms,
                overhead=(total - forward) / forward, overhead_nosync=(round_ms - forward) / forward,
                rounds=len(keep), accepted=sum(out.stats.accepted[i] for i in keep))


def environment(target, drafter, args) -> dict:
    from transformers import __version__ as transformers_version
    dev = target.device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or platform.machine())
    cfg = target.config
    return dict(device=name, dtype=str(target.dtype).replace("torch.", ""), torch=torch.__version__,
                transformers=transformers_version, prompt_len=args.prompt_len, warmup=args.warmup,
                target=dict(layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, heads=cfg.num_attention_heads,
                            kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                            intermediate=cfg.intermediate_size, vocab=cfg.vocab_size,
                            params=sum(p.numel() for p in target.model.parameters())),
                drafter=dict(drafter.config.to_dict(), params=sum(p.numel() for p in drafter.parameters())))


def write_json(path: Path, env: dict, results: list[dict]) -> None:
    """pytest-benchmark layout: one entry per variant, median = synced round total in seconds."""
    benchmarks = [dict(name=f"round[{r['path']}-{r['steps']}step]",
                       fullname=f"benches/bench_round.py::round[{r['path']}-{r['steps']}step]",
                       group="decoding round", stats=dict(median=r["total_ms"] / 1e3),
                       extra_info=dict(r, device=env["device"], prompt_len=env["prompt_len"]))
                  for r in results]
    path.write_text(json.dumps(dict(machine_info=env, benchmarks=benchmarks), indent=1) + "\n")


def print_table(results: list[dict]) -> None:
    head = (f"{'path':<10}{'steps':>6}{'draft':>9}{'forward':>9}{'verify':>9}{'bookkeep':>10}{'total':>9}"
            f"{'round':>9}{'overhead':>10}{'(no sync)':>11}")
    print(head + "\n" + "-" * len(head))
    for r in results:
        print(f"{r['path']:<10}{r['steps']:>6}{r['draft_ms']:>9.3f}{r['forward_ms']:>9.3f}{r['verify_op_ms']:>9.3f}"
              f"{r['bookkeeping_ms']:>10.3f}{r['total_ms']:>9.3f}{r['round_ms']:>9.3f}{r['overhead']:>10.1%}"
              f"{r['overhead_nosync']:>11.1%}")
    print("ms per round (median); overhead = (total - forward) / forward, DESIGN.md §10 target <= 10%;"
          " round = unsynced round time")


def script_parser(doc: str, tiny_help: str) -> argparse.ArgumentParser:
    """The options every end-to-end bench script takes: --json, --tiny, --device."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the results here (pytest-benchmark layout)")
    ap.add_argument("--tiny", action="store_true", help=tiny_help)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap


def main(argv=None) -> int:
    ap = script_parser(__doc__, "small target and drafter (default without a GPU)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds counted per variant (median)")
    ap.add_argument("--warmup", type=int, default=5, help="rounds run before counting, per variant")
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 1024; tiny: 64)")
    ap.add_argument("--paths", default=None, help="comma list of fused,reference (default: those available)")
    ap.add_argument("--steps", default="1,2", help="comma list of flow-map steps per draft")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    args.tiny = args.tiny or device.type != "cuda"
    args.prompt_len = args.prompt_len or (64 if args.tiny else 1024)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    from flashmap_ext.drafters.flashmap.fused import fused_supported
    target = build_target(args.tiny, device, dtype)
    drafter = build_drafter(target, args.tiny, dtype)
    available = ["fused", "reference"] if fused_supported(drafter) else ["reference"]
    paths = args.paths.split(",") if args.paths else available
    if not set(paths) <= set(available):
        ap.error(f"--paths: available here: {','.join(available)} (fused needs CUDA, bf16 and kernel shapes)")
    env = environment(target, drafter, args)
    prompt = torch.randint(0, target.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    print(f"{env['device']}, {env['dtype']}: target {env['target']['params'] / 1e9:.2f} B params, drafter "
          f"{env['drafter']['params'] / 1e6:.0f} M, K = {drafter.num_draft_tokens}, prompt {args.prompt_len}",
          flush=True)
    results = []
    for path in paths:
        for steps in (int(s) for s in args.steps.split(",")):
            results.append(time_variant(target, drafter, prompt, path=path, steps=steps, rounds=args.rounds,
                                        warmup=args.warmup))
            if args.json:
                write_json(args.json, env, results)
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
