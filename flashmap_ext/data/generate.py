"""`flashmap data generate`: grow the self-answered corpus under `data/`.

Prompts (math / code / chat, benchmark-decontaminated: ShareGPT first turns and the packaged prompt sets
chosen with --source, `data.prompts`; or any jsonl of `{"id", "messages"}` via --prompts) are answered
greedily by the target and appended to `<out>/part-NNNNN.jsonl.gz` (`train.store`). Two engines answer the
same token prompts into the same records: ours, the refill-batch engine (`data.engine`, default), and vLLM's
offline `LLM.generate` (`--engine vllm`, `data.vllm_engine`; a Python with vLLM). Every record carries its
prompt source, licence, target, dtype and generation settings, the engine and its version among them. Rerunning the same command skips the prompts already
answered, so the corpus accumulates across runs and machines.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Iterator

import torch
from tqdm.auto import tqdm

from flashmap_ext.assets.prompt_sets import PROMPT_SETS
from flashmap_ext.bench.machine import add_threads_argument, positive_int
from flashmap_ext.checks import check_output_path
from flashmap_ext.data.engine import EngineStats, Job, generate_refill, length_sorted
from flashmap_ext.train.data import prompt_ids, read_jsonl, stop_token_ids
from flashmap_ext.train.store import ShardWriter

PROMPT_SET_NAMES = tuple(PROMPT_SETS)
GENERATED_SET_NAMES = ("mathgen",)  # procedural sets (`data.math_gen`)


def prompt_records(args) -> Iterator[dict]:
    """The prompt records to answer: --prompts (jsonl), or the --split side of each --source (packaged
    ShareGPT and prompt sets, benchmark-decontaminated), the sources taken in turn."""
    if args.prompts:
        for r in read_jsonl(args.prompts):
            r.setdefault("domain", "chat")
            r.setdefault("source", args.prompts)
            r.setdefault("licence", "unknown")
            yield r
        return
    from flashmap_ext.data.prompts import round_robin
    yield from round_robin([source_records(name, args.split) for name in args.source or ["sharegpt"]])


def source_records(name: str, which: str) -> Iterator[dict]:
    """The `which` split of one packaged source: 'sharegpt', 'mathgen' (procedural, `data.math_gen`) or a name
    of `assets.prompt_sets.PROMPT_SETS`."""
    from flashmap_ext.assets import sharegpt
    from flashmap_ext.data import prompts
    if name == "sharegpt":
        yield from prompts.sharegpt_prompts(sharegpt.conversations(max_turns=1), which)
        return
    if name == "mathgen":
        from flashmap_ext.data.math_gen import MATHGEN
        yield from prompts.packaged_prompts(MATHGEN.items(), MATHGEN, which, sharegpt.benchmark_ngrams())
        return
    from flashmap_ext.assets.prompt_sets import load_prompt_set
    yield from prompts.packaged_prompts(load_prompt_set(name), PROMPT_SETS[name], which, sharegpt.benchmark_ngrams())


def per_domain(records: Iterator[dict], n: int | None) -> Iterator[dict]:
    """At most `n` records of each domain (all when n is None)."""
    counts: dict[str, int] = {}
    for r in records:
        if n is None or counts.get(r["domain"], 0) < n:
            counts[r["domain"]] = counts.get(r["domain"], 0) + 1
            yield r


def target_description(path: str) -> str:
    """A name for the record's `target` field: the model folder's name (the GGUF's for the offline target)."""
    p = Path(path)
    return p.parent.name if p.name == "hf" else (p.name or path)


ENGINES = ("flashmap", "vllm")
ENGINE_NAMES = {"flashmap": "flashmap data generate (refill batches)",
                "vllm": "vllm LLM.generate (token prompts, greedy)"}


def build_record(prompt: dict, job: Job, text: str, *, target: str, dtype: str, machine: str,
                 settings: dict) -> dict:
    """One corpus record (data/README.md) of an answered prompt, whichever engine answered: `prompt` the
    prompt record, `job` the engine's answer (ids; `stopped` at an end-of-turn id), `text` its decoding,
    `settings` the `generation` field (it names the engine)."""
    return {"id": prompt["id"], "domain": prompt["domain"], "split": prompt.get("split", "train"),
            "source": prompt["source"], "licence": prompt["licence"], "target": target, "dtype": dtype,
            "generation": settings, "machine": machine, "finish": "stop" if job.stopped else "length",
            "prompt_tokens": len(job.prompt), "answer_tokens": len(job.answer),
            "messages": prompt["messages"] + [{"role": "assistant", "content": text}]}


def generation_settings(args, engine_version: str) -> dict:
    """The `generation` field of every record of this run."""
    return {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "enable_thinking": False,
            "engine": ENGINE_NAMES[args.engine], "engine_version": engine_version, "batch_size": args.batch_size}


def load_engine(args, target_path: str, dtype: str):
    """(answer function, tokenizer, engine version, start seconds) of --engine. The answer function maps
    (jobs, stop ids, stats) to an iterator of answered jobs."""
    start = time.perf_counter()
    if args.engine == "vllm":
        from transformers import AutoTokenizer

        from flashmap_ext.data.vllm_engine import VllmEngine
        if not (Path(target_path) / "config.json").is_file():
            raise ValueError(f"--engine vllm: --target must be a model folder with config.json (got {target_path})")
        tokenizer = AutoTokenizer.from_pretrained(target_path)
        engine = VllmEngine(target_path, dtype, args.batch_size, args.max_model_len)

        def answer(jobs, stops, stats):
            return engine.generate(jobs, stop_ids=stops, max_new_tokens=args.max_new_tokens, chunk=args.chunk,
                                   stats=stats)
        return answer, tokenizer, engine.version, time.perf_counter() - start
    from importlib.metadata import version

    from flashmap_ext.target import load_target
    target, tokenizer = load_target(target_path, dtype, "cpu" if not torch.cuda.is_available() else "cuda")
    pad = getattr(tokenizer, "pad_token_id", None)

    def answer(jobs, stops, stats):
        return generate_refill(target.model, length_sorted(jobs, args.bucket_window), stop_ids=stops,
                               pad_id=pad if pad is not None else min(stops), max_new_tokens=args.max_new_tokens,
                               batch_size=args.batch_size, refill_at=args.refill_at, stats=stats)
    return answer, tokenizer, version("flashmap"), time.perf_counter() - start


def vllm_environment(threads: int) -> None:
    """vLLM CPU defaults for a pinned run (kept where already set): in-process engine, `threads` OpenMP
    threads left unbound (bind with VLLM_CPU_OMP_THREADS_BIND=0 under `taskset -c 0`), 2 GiB KV cache."""
    for key, value in (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
                       ("VLLM_CPU_KVCACHE_SPACE", "2"), ("OMP_NUM_THREADS", str(threads))):
        os.environ.setdefault(key, value)


def run(args) -> int:
    from flashmap_ext.assets.models import resolve_target
    from flashmap_ext.bench.machine import auto_dtype, describe, set_threads
    try:
        check_output_path("--out", args.out, folder=True)
    except ValueError as err:
        raise ValueError(f"{err}; give a corpus folder: a new one, or a corpus to append to") from None
    threads = set_threads(args.threads)
    if args.engine == "vllm":
        vllm_environment(threads)
        from flashmap_ext.data.vllm_engine import vllm_version
        vllm_version()  # refuses before any work where vLLM does not import
    dtype = args.dtype or auto_dtype()
    target_path = resolve_target(args.target)
    answer, tokenizer, engine_version, start_s = load_engine(args, target_path, dtype)
    stops = stop_token_ids(tokenizer)
    meta = describe()
    machine = f"{meta['cpu']}, {threads} thread(s)" if not meta["gpu"] else meta["gpu"]
    writer = ShardWriter(args.out, records_per_part=args.records_per_part, flush_every=args.flush_every)
    records = per_domain(prompt_records(args), args.per_domain)
    todo = [r for r in records if r["id"] not in writer.done]  # read before the clock starts
    print(f"generate: {len(writer.done)} already answered in {args.out}, {len(todo)} to go", file=sys.stderr)
    jobs, skipped = fitting_jobs(todo, tokenizer, args.max_prompt_tokens, args.limit)
    report_skipped(skipped, len(jobs) + len(skipped), args.max_prompt_tokens)
    stats = EngineStats()
    answered = answer(jobs, stops, stats)
    settings = generation_settings(args, engine_version)
    print(f"generate: engine {args.engine} {engine_version} ready in {start_s:.1f} s", file=sys.stderr)
    bar = tqdm(desc=f"generate {Path(args.out).name}", unit="conv", disable=args.no_progress, mininterval=10)
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    for job in answered:
        text = tokenizer.decode(job.answer, skip_special_tokens=False)
        writer.add(build_record(job.key, job, text, target=target_description(target_path), dtype=dtype,
                                machine=machine, settings=settings))
        n += 1
        wall = time.perf_counter() - start
        bar.update(1)
        bar.set_postfix(ans_tok_s=f"{stats.answer_tokens / wall:.1f}", ans_tok=stats.answer_tokens)
        if n % args.flush_every == 0:
            print(json.dumps(throughput(stats, wall, n, time.process_time() - cpu)), file=sys.stderr, flush=True)
    writer.close()
    bar.close()
    wall = time.perf_counter() - start
    print(json.dumps({**throughput(stats, wall, n, time.process_time() - cpu), "engine": args.engine,
                      "engine_version": engine_version, "engine_start_s": round(start_s, 1),
                      "skipped_long_prompts": len(skipped), "done": True}),
          file=sys.stderr, flush=True)
    return 0


def fitting_jobs(todo: list[dict], tokenizer, max_tokens: int, limit: int | None) -> tuple[list[Job], list]:
    """(jobs of the first `limit` prompts of `todo` within `max_tokens` (None: all of them), the ids of the
    longer prompts met before them): --limit counts the prompts answered, not the ones skipped."""
    jobs: list[Job] = []
    skipped = []
    for record in todo:
        if limit is not None and len(jobs) == limit:
            break
        job = Job(record, prompt_ids(tokenizer, record["messages"]))
        if len(job.prompt) <= max_tokens:
            jobs.append(job)
        else:
            skipped.append(record["id"])
    return jobs, skipped


def report_skipped(skipped: list, total: int, limit: int) -> None:
    """One stderr line naming the prompts longer than --max-prompt-tokens; ValueError when that is all."""
    if not skipped:
        return
    ids = ", ".join(map(str, skipped[:8])) + (", ..." if len(skipped) > 8 else "")
    line = f"{len(skipped)} of {total} prompts skipped (longer than --max-prompt-tokens {limit}): {ids}"
    if len(skipped) == total:
        raise ValueError(f"every prompt is longer than --max-prompt-tokens {limit}: nothing to answer ({line})")
    print(f"generate: {line}", file=sys.stderr)


def throughput(stats: EngineStats, wall: float, n: int, cpu: float) -> dict:
    """Progress line: records, answer (supervised) tokens, useful tok/s (per wall second, and per CPU second
    of this process: per core on a shared core) and the engine's efficiencies."""
    return {"records": n, "answer_tokens": stats.answer_tokens, "prompt_tokens": stats.prompt_tokens,
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "answer_tok_per_s": round(stats.answer_tokens / max(wall, 1e-9), 2),
            "answer_tok_per_cpu_s": round(stats.answer_tokens / max(cpu, 1e-9), 2),
            "answer_tok_per_hour": round(3600 * stats.answer_tokens / max(wall, 1e-9)),
            "decode_rows_per_step": round(stats.row_steps / max(stats.decode_steps, 1), 1),
            "prefill_fill": round(stats.prompt_tokens / max(stats.prefill_padded_tokens, 1), 3)}


def add_arguments(p) -> None:
    p.add_argument("--target", default="qwen2.5-coder-0.5b",
                   help="the model that answers: 'qwen2.5-coder-0.5b' (offline), a local dir, hub name, 'tiny-random'")
    p.add_argument("--out", required=True, help="corpus folder (part-NNNNN.jsonl.gz files; appended to)")
    p.add_argument("--split", choices=["train", "heldout"], default="train",
                   help="which side of the split to answer (held-out prompts are fixed by a hash of their text)")
    p.add_argument("--source", action="append", choices=["sharegpt", *PROMPT_SET_NAMES, *GENERATED_SET_NAMES],
                   help="prompt source, repeatable (taken in turn): sharegpt (default; domain by keywords), "
                        "asdiv (math word problems), codeio (code tasks), mathgen (procedural math word "
                        "problems, arithmetic and algebra); see data/README.md")
    p.add_argument("--prompts", help="answer this jsonl of {id, messages[, domain, source, licence]} instead")
    p.add_argument("--per-domain", type=positive_int, help="at most N prompts of each domain (math, code, chat)")
    p.add_argument("--limit", type=positive_int,
                   help="answer at most N new prompts in this run (prompts skipped by --max-prompt-tokens do "
                        "not count)")
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--max-prompt-tokens", type=positive_int, default=256, help="skip longer prompts")
    p.add_argument("--batch-size", type=positive_int, default=48, help="rows decoded together")
    p.add_argument("--refill-at", type=positive_int, default=4, help="free rows that trigger a prefill of new prompts")
    p.add_argument("--bucket-window", type=positive_int, default=256, help="prompts sorted by length in windows of N")
    p.add_argument("--records-per-part", type=positive_int, default=1000)
    p.add_argument("--flush-every", type=positive_int, default=16, help="records per fsynced gzip member")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"],
                   help="default: bf16 on a GPU or a CPU with avx512_bf16 / amx_bf16, else fp32 "
                   "(data regenerate: bf16 on a GPU, else fp32)")
    p.add_argument("--engine", choices=ENGINES, default="flashmap",
                   help="who answers: flashmap (the refill-batch engine, default) or vllm (vLLM's offline "
                        "LLM.generate on the same token prompts; needs a Python with vLLM, e.g. .venv-vllm)")
    p.add_argument("--max-model-len", type=positive_int, default=1024,
                   help="vllm engine: prompt + answer tokens per sequence")
    p.add_argument("--chunk", type=positive_int, default=768,
                   help="vllm engine: prompts per LLM.generate call (answers are written when a call returns)")
    add_threads_argument(p)
    p.add_argument("--no-progress", action="store_true")
