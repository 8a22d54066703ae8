"""vLLM peer rows on the real target: vLLM AR, n-gram, our DFlash and FlashMap checkpoints (issue 17).

    python -m flashmap_ext.integrations.vllm.bench --out DIR [--n 3] [--max-new-tokens 64]   # DIR also gets the exports

Prompts: the first `n` items of GSM8K, HumanEval and MT-Bench (first turns), chat-templated exactly as
`flashmap bench` does (train.data.prompt_ids). Each method runs in its own process (one vLLM engine
each), prompts one at a time (batch 1, as our loop), T = 0, fp32 (AVX2 CPUs have no fast bf16).
Per method: tokens/s over the timed generate calls (engine start excluded), γ = 1 + accepted/drafts
from vLLM's spec-decode counters, and how many outputs equal vLLM AR's token for token.
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


def _spec(method: str, work: Path, k: int) -> dict | None:
    from flashmap_ext.integrations.vllm import speculative_config
    if method == "ar":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    return speculative_config(work / method)


def run_method(target: str, prompts_file: str, spec: str, out_file: str, max_new_tokens: int) -> None:
    """One engine, every prompt alone; writes per prompt {"tokens", "seconds", "drafts", "accepted"}."""
    from vllm import LLM, SamplingParams
    prompts = json.loads(Path(prompts_file).read_text())
    llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=4096, max_num_seqs=1, seed=0,
              disable_log_stats=False, speculative_config=json.loads(spec) or None)
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    rows = []
    for ids in prompts:
        before, start = _counters(llm), time.perf_counter()
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        seconds, after = time.perf_counter() - start, _counters(llm)
        rows.append({"tokens": list(out[0].outputs[0].token_ids), "seconds": seconds,
                     **{k: after[k] - before[k] for k in after}})
    Path(out_file).write_text(json.dumps(rows))


def _counters(llm) -> dict:
    """vLLM's cumulative spec-decode counters (0 without speculation)."""
    values = {"drafts": 0, "accepted": 0}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            values["drafts"] = m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            values["accepted"] = m.value
    return values


def prepare(work: Path, n: int) -> tuple[str, list[dict]]:
    """Exports the committed drafters for vLLM and writes the prompts; returns (target dir, prompt list)."""
    import transformers

    from flashmap_ext.bench import datasets
    from flashmap_ext.bench.assets import qwen05_dir
    from flashmap_ext.integrations.vllm import export_dflash, export_flashmap
    from flashmap_ext.train.data import prompt_ids
    target = str(qwen05_dir())
    tokenizer = transformers.AutoTokenizer.from_pretrained(target)
    items = [p for name in DATASETS for p in datasets.load(name, n)]
    meta = [{"dataset": p.dataset, "id": p.id} for p in items]
    (work / "prompts.json").write_text(json.dumps([prompt_ids(tokenizer, p.messages) for p in items]))
    hf = transformers.AutoModelForCausalLM.from_pretrained(target, dtype="float32")
    export_dflash("checkpoints/dflash-qwen2.5-coder-0.5b", work / "dflash", target=hf)
    export_flashmap("checkpoints/flashmap-qwen2.5-coder-0.5b", work / "flashmap")  # as the README
    return target, meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=8, help="n-gram draft length (the block drafters use their own K)")
    ap.add_argument("--methods", default=",".join(METHODS))
    args = ap.parse_args()
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    target, meta = prepare(work, args.n)
    results = {}
    for method in args.methods.split(","):
        out = work / f"{method}.json"
        cmd = [sys.executable, "-m", "flashmap_ext.integrations.vllm.bench_worker", target, str(work / "prompts.json"),
               json.dumps(_spec(method, work, args.k)), str(out), str(args.max_new_tokens)]
        print(f"[vllm bench] {method} ...", flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        results[method] = json.loads(out.read_text())
    (work / "results.json").write_text(json.dumps({"prompts": meta, "results": results}, indent=1))
    print(table(meta, results))


def table(meta: list[dict], results: dict) -> str:
    """Markdown rows per dataset and method: γ, tokens/s, speedup vs vLLM AR, identical to vLLM AR."""
    rows = ["| dataset | method | γ | tokens/s | speedup vs vLLM AR | identical to vLLM AR |", "|---|---|---|---|---|---|"]
    for name in DATASETS:
        idx = [i for i, m in enumerate(meta) if m["dataset"] == name]
        ar_tps = _tokens_per_s(results["ar"], idx)
        for method, r in results.items():
            tps = _tokens_per_s(r, idx)
            drafts, accepted = (sum(r[i][k] for i in idx) for k in ("drafts", "accepted"))
            gamma = "–" if method == "ar" else f"{1 + accepted / max(drafts, 1):.2f}"
            same = "–" if method == "ar" else \
                f"{sum(r[i]['tokens'] == results['ar'][i]['tokens'] for i in idx)}/{len(idx)}"
            rows.append(f"| {name} | vLLM {method} | {gamma} | {tps:.1f} | {tps / ar_tps:.2f}× | {same} |")
    return "\n".join(rows)


def _tokens_per_s(rows: list[dict], idx: list[int]) -> float:
    return sum(len(rows[i]["tokens"]) for i in idx) / sum(rows[i]["seconds"] for i in idx)


if __name__ == "__main__":
    main()
