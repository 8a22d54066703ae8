"""The acceptance step side by side: `verify` (v1 and v2 kernels), the PyTorch composition and FlashInfer's
chain speculative sampling with its softmax, K = 16, V = 151,936 bf16 logits, B = 1, 8, 64; greedy, T = 1,
and T = 1 with top-p 0.9. Point-mass drafts drawn uniformly (a typical early rejection).

    python benches/bench_verify_side.py [--json side.json] [--flashinfer third_party/flashinfer/include]
                                        [--curand third_party/curand/include] [--cpu-smoke]

Each implementation is timed by CUDA-graph replay of `calls` calls (benches/bench_utils.py), median over
`rounds`; a row gives µs per call and the logits' bytes over that time as a share of this GPU's measured
device-to-device copy bandwidth (a 1 GiB copy, read + write bytes). FlashInfer (built here with nvcc from
the header-only sources of the `flashinfer-python` wheel, benches/flashinfer_chain.cu) takes fp32
probabilities: its row is the bf16 -> fp32 cast, OnlineSoftmax, TopPRenormProb (top-p rows) and
ChainSpeculativeSampling with one-hot draft probabilities; it has no greedy mode (those rows are n/a). Its
coins are its own (curand Philox), so only times are compared. The JSON has pytest-benchmark's layout, so
benches/device_check.sh's summary picks it up; it is rewritten after every row. --cpu-smoke runs the
flashmap and composition rows on the CPU at V = 4,096 (no timing claims: a check that the script runs).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_utils import device_name, graph_replayer  # noqa: E402
from verify_composition import verify_composition  # noqa: E402

from flashmap_ext import ops  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
K, V = 16, 151936
MODES = {"greedy": dict(temperature=0.0, top_p=1.0), "T1": dict(temperature=1.0, top_p=1.0),
         "T1-topp0.9": dict(temperature=1.0, top_p=0.9)}
IMPLS = ("verify-v1", "verify-v2", "composition", "flashinfer")


def copy_bandwidth_GBps() -> float:
    """Device-to-device copy of 1 GiB: (read + write bytes) / time, best of 5."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * a.numel() / best / 1e9


def build_flashinfer(include: Path, curand: Path | None) -> ctypes.CDLL:
    """nvcc benches/flashinfer_chain.cu into a shared library (sm_90a unless TORCH_CUDA_ARCH_LIST says else)."""
    cuda_home = os.environ.get("CUDA_HOME") or str(Path(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc").parents[1])
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0a").split(";")[0].replace(".", "")
    out = Path(tempfile.mkdtemp()) / "libfi_chain.so"
    cmd = [f"{cuda_home}/bin/nvcc", "-O3", "-std=c++17", f"-arch=sm_{arch}", "-shared", "-Xcompiler", "-fPIC",
           "-I", str(include), *(["-I", str(curand)] if curand else []), str(ROOT / "benches" / "flashinfer_chain.cu"),
           "-o", str(out)]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(str(out))
    ptr, u32, u64, f32, size = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_float, ctypes.c_size_t
    lib.fi_softmax_f32.argtypes = [ptr, ptr, u32, u32, f32, ptr, size, ptr]
    lib.fi_top_p_renorm_f32.argtypes = [ptr, ptr, u32, u32, f32, ptr]
    lib.fi_chain_f32.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, u32, u32, u32, u64, u64, ptr]
    return lib


def flashinfer_fn(lib, logits, drafts, top_p):
    """The FlashInfer pipeline as one callable (outputs and scratch allocated once, outside the timing)."""
    B, K1, Vv = logits.shape
    dev = logits.device
    probs = torch.empty(B * K1, Vv, dtype=torch.float32, device=dev)
    work = torch.empty(B * K1, Vv, dtype=torch.float32, device=dev)
    renormed = torch.empty_like(probs) if top_p < 1 else probs
    q = torch.zeros(B, K1 - 1, Vv, dtype=torch.float32, device=dev)
    q.scatter_(-1, drafts.unsqueeze(-1), 1.0)  # one-hot: point-mass drafts
    ids = drafts.to(torch.int32)
    out_ids = torch.empty(B, K1, dtype=torch.int32, device=dev)
    acc, emitted = (torch.empty(B, dtype=torch.int32, device=dev) for _ in range(2))
    logits32 = torch.empty(B * K1, Vv, dtype=torch.float32, device=dev)

    def call():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        logits32.copy_(logits.view(B * K1, Vv))  # its API takes fp32 logits
        rc = lib.fi_softmax_f32(logits32.data_ptr(), probs.data_ptr(), B * K1, Vv, 1.0, work.data_ptr(),
                                work.numel() * 4, stream)
        if top_p < 1:
            rc |= lib.fi_top_p_renorm_f32(probs.data_ptr(), renormed.data_ptr(), B * K1, Vv, top_p, stream)
        rc |= lib.fi_chain_f32(q.data_ptr(), ids.data_ptr(), renormed.data_ptr(), out_ids.data_ptr(),
                               acc.data_ptr(), emitted.data_ptr(), B, K1 - 1, Vv, 0, 0, stream)
        if rc:
            raise RuntimeError(f"flashinfer returned cudaError {rc}")
    return call


def composition_fn(logits, drafts, mode):
    temperature, top_p = MODES[mode]["temperature"], MODES[mode]["top_p"]
    if temperature == 0:
        return lambda: logits.argmax(-1)  # greedy: argmax of every row, accepted prefix on top is negligible
    if top_p == 1:
        return lambda: verify_composition(logits, drafts, temperature)

    def with_top_p():  # softmax, sort, nucleus mask, renormalise, then the composition's accept/resample
        p = torch.softmax(logits.float() / temperature, dim=-1)
        ps, order = p.sort(dim=-1, descending=True)
        keep = (ps.cumsum(-1) - ps) < top_p
        p = torch.zeros_like(p).scatter_(-1, order, ps * keep)
        return verify_composition(torch.log(p), drafts, 1.0)
    return with_top_p


def verify_fn(kernel, logits, drafts, mode, seed):
    temperature, top_p = MODES[mode]["temperature"], MODES[mode]["top_p"]

    def call():  # the switch is read at every call: inside the capture, so the graph keeps this kernel
        os.environ["FLASHMAP_VERIFY_KERNEL"] = kernel
        return ops.verify(logits, drafts, temperature=temperature, top_p=top_p, seed=seed, position=0, check=False)
    return call


def time_us(fn, device, calls, rounds) -> tuple[float, bool]:
    if device != "cuda":
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6, False
    run, graphed = graph_replayer(fn, calls)
    run()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples) * 1e6, graphed


def write_json(path: Path, env: dict, rows: list[dict]) -> None:
    benchmarks = [dict(name=r["name"], fullname=f"benches/bench_verify_side.py::{r['name']}", group="verify side",
                       stats=dict(median=r["us_per_call"] / 1e6), extra_info=r) for r in rows]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(machine_info=env, benchmarks=benchmarks), indent=1) + "\n")
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--flashinfer", type=Path, default=ROOT / "third_party" / "flashinfer" / "include")
    ap.add_argument("--curand", type=Path, default=ROOT / "third_party" / "curand" / "include")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args(argv)
    device = "cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda"
    vocab = 4096 if device == "cpu" else V
    env = dict(device=device_name(device), torch=torch.__version__, cuda=torch.version.cuda,
               date=time.strftime("%Y-%m-%d"), K=K, V=vocab)
    lib, fi_error = None, "needs a CUDA GPU"
    if device == "cuda":
        env["copy_GBps"] = copy_bandwidth_GBps()
        try:
            curand = args.curand if args.curand.is_dir() else None
            lib = build_flashinfer(args.flashinfer, curand) if args.flashinfer.is_dir() else None
            fi_error = None if lib else f"no FlashInfer headers at {args.flashinfer}"
        except (OSError, subprocess.CalledProcessError) as err:
            fi_error = f"FlashInfer build failed: {err}"
    rows = []
    for B in (1, 8, 64):
        g = torch.Generator().manual_seed(B)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        logits = (torch.randn(B, K + 1, vocab, generator=g) * 2).to(device, dtype)
        drafts = torch.randint(0, vocab, (B, K), generator=g).to(device)
        seed = torch.arange(B, device=device)
        nbytes = logits.numel() * logits.element_size()
        for mode in MODES:
            for impl in IMPLS:
                row = dict(name=f"{impl}[B={B}-{mode}]", impl=impl, B=B, mode=mode, dtype=str(dtype))
                if impl == "flashinfer" and (lib is None or mode == "greedy"):
                    row.update(us_per_call=float("nan"), skipped=fi_error or "no greedy mode")
                    print(f"{row['name']:<36} n/a ({row['skipped']})", flush=True)
                    continue
                if impl == "verify-v2" or impl == "verify-v1":
                    fn = verify_fn(impl[-2:], logits, drafts, mode, seed)
                elif impl == "composition":
                    fn = composition_fn(logits, drafts, mode)
                else:
                    fn = flashinfer_fn(lib, logits, drafts, MODES[mode]["top_p"])
                us, graphed = time_us(fn, device, args.calls, args.rounds)
                row.update(us_per_call=us, cuda_graph=graphed, logits_GBps=nbytes / us / 1e3)
                if "copy_GBps" in env:
                    row["hbm_pct"] = 100 * row["logits_GBps"] / env["copy_GBps"]
                rows.append(row)
                pct = f"{row['hbm_pct']:5.1f} % of copy bandwidth" if "hbm_pct" in row else ""
                print(f"{row['name']:<36} {us:9.1f} us  {pct}", flush=True)
                if args.json:
                    write_json(args.json, env, rows)
    os.environ.pop("FLASHMAP_VERIFY_KERNEL", None)
    print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    """Markdown: one line per (B, mode), µs (and % of copy bandwidth) per implementation."""
    cell = {(r["B"], r["mode"], r["impl"]): r for r in rows}
    lines = ["| B | mode | " + " | ".join(IMPLS) + " |", "|---|---|" + "---|" * len(IMPLS)]
    for B in sorted({r["B"] for r in rows}):
        for mode in MODES:
            out = []
            for impl in IMPLS:
                r = cell.get((B, mode, impl))
                pct = f" ({r['hbm_pct']:.0f} %)" if r and "hbm_pct" in r else ""
                out.append(f"{r['us_per_call']:.1f} µs{pct}" if r else "n/a")
            lines.append(f"| {B} | {mode} | " + " | ".join(out) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
