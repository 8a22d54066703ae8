"""Per-kernel profile of the fused FlashMap draft step: where the step's GPU time goes, kernel by kernel.

Shape: bench_draft's Qwen3-8B drafter (6 layers, width 2048, 16 heads, K 16, d 4096, V 151,936; random bf16
weights), batch 1, 1 step, L = 1,024 memory entries. torch.profiler with CUDA activities records --steps eager
fused draft steps (`fused_draft_block`: the kernels the graph replays, launched from Python) after a warm-up,
then --steps replays of the step captured in a CUDA graph (`FusedDraftGraph`). Per kernel and per kind of
step: calls, total µs, mean µs, and share of that kind's kernel time. The graphed total is the median replay
over 50 replays timed with CUDA events (a replay has no host gaps: the step's floor is its sum of kernels).

    python benches/profile_step.py --json profile_step.json --markdown profile_step.md [--length 1024] [--steps 5]

Writes the JSON in the pytest-benchmark layout benches/device_summary.py reads (`benchmarks`: eager_step and
graphed_step, median and extra_info) plus `kernels` (the tables), and the tables as markdown.
Without a GPU: a dry run of the same code on bench_draft's tiny CPU shape (L = 128) with CPU activities: the
table then lists operators by self CPU time, and there is no graphed step.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from flashmap_ext.drafters.flashmap import fused

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_draft  # noqa: E402  (benches/ is not a package when run as a script)

CUDA = torch.cuda.is_available()


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def profiled(fn, steps: int):
    """fn() run `steps` times under torch.profiler (CUDA activities on a GPU, CPU ones elsewhere)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        sync()
    return prof


def kernel_table(prof, steps: int) -> list[dict]:
    """Rows (name, calls, total_us, mean_us, share), largest total first: device kernels, memsets and copies
    on a GPU; operators by self CPU time without one. calls and total_us cover all `steps` steps."""
    rows = []
    for e in prof.key_averages():
        if CUDA and e.device_type == DeviceType.CUDA:
            total = e.self_device_time_total
        elif not CUDA and e.device_type == DeviceType.CPU:
            total = e.self_cpu_time_total
        else:
            continue
        if total > 0 and e.count > 0:
            rows.append(dict(name=e.key, calls=int(e.count), total_us=float(total), mean_us=float(total) / e.count))
    grand = sum(r["total_us"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["total_us"] / grand
    rows.sort(key=lambda r: -r["total_us"])
    return rows


def graphed_median_us(graph, memory, anchor, z, reps: int = 50) -> float:
    """Median µs of one graph replay (CUDA events around each replay)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph(memory, anchor, z)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def eager_median_us(fn, reps: int = 10) -> float:
    """Median host µs of one eager step, synced."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def summary(rows: list[dict], steps: int) -> dict:
    top = rows[0] if rows else {}
    return dict(kernel_us_per_step=sum(r["total_us"] for r in rows) / steps,
                launches_per_step=sum(r["calls"] for r in rows) / steps, distinct_kernels=len(rows),
                top_kernel=top.get("name"), top_share=top.get("share"))


def short(name: str, width: int = 90) -> str:
    """A kernel's name without its argument list and return type, cut to `width` characters."""
    name = name.split("(")[0].removeprefix("void ").strip()
    return name if len(name) <= width else name[:width - 1] + "…"


def markdown(result: dict) -> str:
    env = result["machine"]
    lines = [f"# Per-kernel profile of the fused draft step ({env['date']})", "",
             f"`{env['command']}`; {env['device']}, torch {env['torch']}, CUDA {env['cuda']}, {env['dtype']}, "
             f"batch 1, 1 step, L = {env['length']}, {env['steps']} steps per kind.", ""]
    what = "kernels" if CUDA else "operators' self CPU time"
    for b in result["benchmarks"]:
        lines.append(f"- {b['name']}: median {b['stats']['median'] * 1e6:.1f} µs per step; {what} "
                     f"{b['extra_info']['kernel_us_per_step']:.1f} µs per step in "
                     f"{b['extra_info']['launches_per_step']:.0f} calls")
    for kind, rows in result["kernels"].items():
        lines += ["", f"## {kind}", "", f"| {'kernel' if CUDA else 'operator'} | calls | total µs | mean µs | share |", "|---|---:|---:|---:|---:|"]
        lines += [f"| `{short(r['name'])}` | {r['calls']} | {r['total_us']:.1f} | {r['mean_us']:.2f} | "
                  f"{100 * r['share']:.1f} % |" for r in rows]
    return "\n".join(lines) + "\n"


def run(length: int, steps: int, command: str) -> dict:
    drafter, packed = bench_draft.drafter_setup()
    memory, z, anchor = bench_draft.make_memory(drafter, length)
    eager = lambda: fused.fused_draft_block(packed, memory, anchor, steps=1, noise=z).tokens
    benchmarks, kernels = [], {}
    with torch.no_grad():
        for _ in range(2):
            eager()  # lazily built tables and plans stay out of the profile
        sync()
        kernels["eager"] = kernel_table(profiled(eager, steps), steps)
        benchmarks.append(dict(name="eager_step", group="profile_step", stats=dict(median=eager_median_us(eager) / 1e6),
                               extra_info=summary(kernels["eager"], steps)))
        if CUDA:
            graph = fused.FusedDraftGraph(packed, memory, batch_size=1, steps=1)
            replay = lambda: graph(memory, anchor, z)
            kernels["graph"] = kernel_table(profiled(replay, steps), steps)
            benchmarks.append(dict(name="graphed_step", group="profile_step",
                                   stats=dict(median=graphed_median_us(graph, memory, anchor, z) / 1e6),
                                   extra_info=summary(kernels["graph"], steps)))
    machine = dict(command=command, device=torch.cuda.get_device_name() if CUDA else "cpu", torch=torch.__version__,
                   cuda=torch.version.cuda, dtype="bfloat16", length=length, steps=steps,
                   date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    return dict(machine=machine, benchmarks=benchmarks, kernels=kernels)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the tables and the step times here")
    ap.add_argument("--markdown", type=Path, help="write the tables here as markdown")
    ap.add_argument("--length", type=int, default=1024 if CUDA else 128, help="memory entries (CPU: 128)")
    ap.add_argument("--steps", type=int, default=5, help="profiled steps of each kind")
    args = ap.parse_args(argv)
    if args.length < 1 or args.steps < 1:
        ap.error(f"--length and --steps must be >= 1, got {args.length} and {args.steps}")
    command = "python benches/profile_step.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = run(args.length, args.steps, command.strip())
    text = markdown(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.markdown:
        args.markdown.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
