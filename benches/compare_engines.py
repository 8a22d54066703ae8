"""Both `flashmap data generate` engines on the same prompts, one after the other, in one run: answer tokens/s
(engine start excluded; per wall second and per CPU second of the process, the per-core figure on a shared
core), the engine's start time, and the share of answers identical between them.

    taskset -c 0 .venv-vllm/bin/python benches/compare_engines.py --out DIR --flashmap-python .venv/bin/python
        [--limit 48 --max-new-tokens 128]

Runs the CLI as two subprocesses, ours with --flashmap-python (default: this Python), vLLM's with this
Python (so it needs vLLM); writes DIR/{flashmap,vllm}/ and DIR/compare.json. Identity is judged on the decoded answer text and its token count (both engines decode
the same way, `data.generate.build_record`).
"""
from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path


def answers(folder: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for part in sorted(folder.glob("part-*.jsonl.gz")):
        with gzip.open(part, "rt", encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                out[r["id"]] = (r["messages"][-1]["content"], r["answer_tokens"])
    return out


def start_engine(engine: str, out: Path, args) -> subprocess.Popen:
    python = args.flashmap_python if engine == "flashmap" else sys.executable
    cmd = [python, "-m", "flashmap_ext.cli", "data", "generate", "--engine", engine, "--out", str(out),
           "--source", args.source, "--limit", str(args.limit), "--max-new-tokens", str(args.max_new_tokens),
           "--batch-size", str(args.batch_size), "--dtype", args.dtype, "--threads", str(args.threads),
           "--no-progress"]
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, stderr=open(out.parent / f"{engine}.log", "w"), stdout=subprocess.DEVNULL)


def finish_engine(engine: str, proc: subprocess.Popen, out: Path) -> dict:
    log = (out.parent / f"{engine}.log")
    if proc.wait() != 0:
        raise SystemExit(f"{engine} failed (exit {proc.returncode}):\n{log.read_text()[-4000:]}")
    return json.loads([line for line in log.read_text().splitlines() if '"done": true' in line][-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--flashmap-python", default=sys.executable, help="the Python that runs our engine")
    p.add_argument("--source", default="asdiv")
    p.add_argument("--limit", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--parallel", action="store_true",
                   help="run both at once (on a shared core: compare the per-CPU-second rates only)")
    args = p.parse_args()
    engines = ("flashmap", "vllm")
    if args.parallel:
        procs = {e: start_engine(e, args.out / e, args) for e in engines}
        result = {e: finish_engine(e, procs[e], args.out / e) for e in engines}
    else:
        result = {e: finish_engine(e, start_engine(e, args.out / e, args), args.out / e) for e in engines}
    a, b = answers(args.out / "flashmap"), answers(args.out / "vllm")
    common = sorted(set(a) & set(b))
    same = sum(a[i] == b[i] for i in common)
    result["identical"] = f"{same}/{len(common)}"
    for rate in ("answer_tok_per_s", "answer_tok_per_cpu_s"):
        result[f"ratio_{rate}"] = round(result["vllm"][rate] / result["flashmap"][rate], 2)
    (args.out / "compare.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
