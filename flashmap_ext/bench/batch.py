"""`flashmap bench --batch-size B`: throughput of `generate` over batches of B prompts (DESIGN.md §7, §9).

The prompts (the first turn of `--n` per dataset, all datasets pooled) are cut into batches of B in order (fewer
prompts than B are refused; the Markdown names a shorter last batch); every method decodes
each batch in one `generate` call, interleaved batch by batch, AR first. tokens/s = new tokens of all rows
/ wall time of all calls (prefill included); speedup = method tokens/s / AR tokens/s at the same B. At
T = 0 each row is checked against AR's row. The verify-cost ratio is the time of one batched (K + 1)-token
target forward over that of a 1-token one on the same cache (median of 5), this machine's price of a round.
Methods: AR, FlashMap-1/2, DFlash (the drafters whose memories hold ragged rows).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from flashmap_ext.assets import datasets
from flashmap_ext.bench import machine
from flashmap_ext.bench.methods import build_methods
from flashmap_ext.speculate import generate
from flashmap_ext.target import load_target, resolve_dtype
from flashmap_ext.target.ragged import left_pad, ragged_inputs, rollback_rows
from flashmap_ext.train.data import prompt_ids, stop_token_ids

BATCHED = ("AR", "FlashMap-1", "FlashMap-2", "DFlash")


def run_batch(cfg, batch_size: int) -> dict:
    """Runs the batch benchmark; writes batch-B.json and batch-B.md under cfg.out after every batch (the
    prompts done so far, "complete": false until the last one and the verify-cost ratio); returns the results."""
    dtype = machine.chosen_dtype(cfg.dtype)
    meta = machine.describe() | {"dtype": dtype, "batch_size": batch_size}
    chosen = [p for name in cfg.datasets for p in datasets.load(name, cfg.n, spread=cfg.spread)]
    if len(chosen) < batch_size:  # a prompt file may hold fewer than --n
        raise ValueError(f"--batch-size {batch_size}: more than the {len(chosen)} prompt(s) of --datasets "
                         f"{','.join(cfg.datasets)} at --n {cfg.n}, so no batch would be full: give a smaller "
                         "--batch-size")
    target, tokenizer = load_target(cfg.target, dtype)
    methods = [m for m in build_methods(target, resolve_dtype(dtype), cfg.drafter, cfg.dflash, None, False)
               if m.name in BATCHED and (not cfg.methods or m.name == "AR" or m.name in cfg.methods)]
    stop = stop_token_ids(tokenizer)
    prompts = [prompt_ids(tokenizer, p.messages_for_turn(0, [])) for p in chosen]
    batches = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
    for m in methods:  # untimed warm-up
        generate(target, m.drafter, batches[0], 4, stop_token_ids=stop)
    totals = {m.name: {"tokens": 0, "time_s": 0.0, "rounds": 0, "accepted": 0, "identical": 0} for m in methods}
    K = max((m.drafter.num_draft_tokens for m in methods if m.drafter is not None), default=0)
    done = 0
    for batch in tqdm(batches, desc=f"batch {batch_size}", unit="batch"):
        run_methods(cfg, target, methods, batch, stop, totals)
        done += len(batch)
        results = collect(cfg, meta, totals, done, K, None, complete=done == len(prompts) and not K)
        write(cfg.out, batch_size, results)
    if K:
        results = collect(cfg, meta, totals, done, K, verify_cost_ratio(target, batches[0], K), complete=True)
        write(cfg.out, batch_size, results)
    return results


def run_methods(cfg, target, methods, batch: list, stop, totals: dict) -> None:
    """Generates `batch` with every method (timed); adds tokens, time, rounds, accepted and AR-identical rows."""
    ar = None
    for m in methods:
        start = time.perf_counter()
        outs = generate(target, m.drafter, batch, cfg.max_new_tokens, temperature=cfg.temperature,
                        seed=cfg.seed, stop_token_ids=stop)
        t, ar = totals[m.name], ar or outs
        t["time_s"] += time.perf_counter() - start
        t["tokens"] += sum(len(o.tokens) for o in outs)
        t["rounds"] += sum(o.stats.rounds for o in outs)
        t["accepted"] += sum(sum(o.stats.accepted) for o in outs)
        t["identical"] += sum(o.tokens == a.tokens for o, a in zip(outs, ar))


def collect(cfg, meta: dict, totals: dict, prompts: int, K: int, ratio, *, complete: bool) -> dict:
    rows = {name: summary(t, totals["AR"], prompts, cfg.temperature) for name, t in totals.items()}
    return {"meta": meta | {"finished": machine.describe()["date"]}, "complete": complete, "prompts": prompts,
            "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "K": K,
            "verify_cost_ratio": ratio, "methods": rows}


def write(out, batch_size: int, results: dict) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"batch-{batch_size}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / f"batch-{batch_size}.md").write_text(markdown(results) + "\n")


def summary(t: dict, ar: dict, prompts: int, temperature: float) -> dict:
    tps = t["tokens"] / t["time_s"]
    return {"tokens_per_s": tps, "speedup": tps / (ar["tokens"] / ar["time_s"]),
            "gamma": (t["accepted"] + t["rounds"]) / t["rounds"] if t["rounds"] else float("nan"),
            "new_tokens": t["tokens"], "time_s": t["time_s"],
            "identical_to_ar": f"{t['identical']}/{prompts}" if temperature == 0 else None}


@torch.inference_mode()
def verify_cost_ratio(target, prompts: list, k: int, reps: int = 5) -> float:
    """Median time of a batched (k + 1)-token forward / that of a 1-token forward, after a ragged prefill."""
    ids, lengths = left_pad(prompts)
    cache = target.new_cache()
    mask, pos = ragged_inputs(lengths, ids.shape[1])
    target.forward(ids.to(target.device), cache, attention_mask=mask.to(target.device), position_ids=pos.to(target.device))
    times = {}
    for n in (1, k + 1):
        samples = []
        for _ in range(reps):
            block = ids[:, -n:].to(target.device)
            mask, pos = ragged_inputs(lengths + n, n)
            start = time.perf_counter()
            target.forward(block, cache, num_logits=n, attention_mask=mask.to(target.device),
                           position_ids=pos.to(target.device))
            samples.append(time.perf_counter() - start)
            rollback_rows(cache, lengths + n, torch.full_like(lengths, n))
        times[n] = statistics.median(samples)
    return times[k + 1] / times[1]


def markdown(results: dict) -> str:
    m = results["meta"]
    last = results["prompts"] % m["batch_size"]  # the prompts do not fill the last batch
    head = (f"B = {m['batch_size']}{f' (the last batch {last})' if last else ''}, {m['dtype']}, "
            f"T = {results['temperature']}, {results['prompts']} prompts, "
            f"{results['max_new_tokens']} new tokens; {machine.summary_line(m)}; verify-cost ratio "
            f"(K + 1 = {results['K'] + 1} vs 1 token) {results['verify_cost_ratio'] or float('nan'):.2f}"
            + ("" if results.get("complete", True) else "; **partial** (the run has not finished)"))
    lines = [head, "", "| method | tokens/s | speedup vs batched AR | γ | identical to AR |", "|---|---|---|---|---|"]
    for name, r in results["methods"].items():
        lines.append(f"| {name} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}× | {r['gamma']:.2f} | "
                     f"{r['identical_to_ar'] or '–'} |")
    return "\n".join(lines)
