"""`flashmap bench`: every method on the same prompts in one process (DESIGN.md §9).

Per prompt turn, AR runs first; every other method then decodes the same prompt and is checked against
it (T = 0: token-identical, or the first divergence is traced to the target's logit margin there).
Methods are interleaved prompt by prompt, so a machine whose load drifts penalises them alike.
MT-Bench's second turn uses AR's first answer as the history for every method.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from flashmap_ext.assets import datasets
from flashmap_ext.bench import machine, report
from flashmap_ext.bench.methods import Method, build_methods, run_peer
from flashmap_ext.bench.metrics import Record, summarize
from flashmap_ext.bench.shuffle import shuffle_test
from flashmap_ext.speculate import generate
from flashmap_ext.target import load_target, resolve_dtype
from flashmap_ext.train.data import prompt_ids, stop_token_ids
from flashmap_ext.tree import TreeSpec

DEFAULT_DATASETS = ("gsm8k", "aime25", "humaneval", "mtbench", "arena-hard", "alpaca")


@dataclass
class BenchConfig:
    target: str = "qwen2.5-coder-0.5b"
    drafter: str | None = None          # FlashMap checkpoint dir (or "random")
    dflash: str | None = None
    eagle3: str | None = None
    eagle3_tree: TreeSpec | None = TreeSpec()  # the EAGLE-3 tree row (with `eagle3`); None: chain only
    datasets: tuple = DEFAULT_DATASETS
    n: int = 10                         # prompts per dataset
    spread: bool = False                # the n prompts round-robin over the set's categories (datasets.load)
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    dtype: str = "auto"                 # auto: bf16 where the hardware has it (machine.auto_dtype)
    peers: bool = True                  # HF greedy + prompt lookup rows
    shuffle_n: int = 2                  # prompts per dataset for the shuffle test (0: skip it)
    shapes: bool = False                # draft-shape rows: lookup hybrids, multi-noise and top-k trees
    auto: bool = False                  # the --auto row (cost model picks the shape per round)
    recalibrate: bool = False           # --auto: measure the cost table again (else the cached one)
    methods: tuple = ()                 # only these method names (AR always runs); () = all
    cuda_graphs: bool = False           # generate(..., cuda_graphs=True): chain rows only (no tree, no batch)
    out: str = "runs/bench"


def decode(target, method: Method, ids: list[int], cfg: BenchConfig, stop) -> Record:
    """One method on one prompt (no dataset/prompt labels yet)."""
    if method.drafter in ("hf", "pld"):
        out = run_peer(target.model, method.drafter, ids, cfg.max_new_tokens, cfg.temperature, stop, cfg.seed)
        return Record(method.name, "", "", out.tokens, out.time_s, draft_time_s=None, verify_time_s=None,
                      prefill_time_s=None)
    out = generate(target, method.drafter, ids, cfg.max_new_tokens, temperature=cfg.temperature,
                   seed=cfg.seed, stop_token_ids=stop, tree=method.tree, cuda_graphs=cfg.cuda_graphs)
    s = out.stats
    return Record(method.name, "", "", out.tokens, s.total_time_s, drafted=list(s.drafted),
                  accepted=list(s.accepted), depths=list(s.depths), draft_time_s=s.draft_time_s,
                  verify_time_s=s.verify_time_s, prefill_time_s=s.prefill_time_s)


def divergence(target, ids: list[int], ar: list[int], other: list[int]) -> dict | None:
    """Where `other` first leaves AR's tokens, and the target's logit margin there (AR's choice minus the
    other's, one forward over the shared prefix): a margin near 0 is a numerical near-tie."""
    i = next((j for j, (a, b) in enumerate(zip(ar, other)) if a != b), min(len(ar), len(other)))
    if i == len(ar) == len(other):
        return None
    if i == min(len(ar), len(other)):
        return {"position": i, "kind": "length", "ar_len": len(ar), "len": len(other)}
    prefix = torch.tensor([ids + ar[:i]], device=target.device)
    logits = target.forward(prefix, target.new_cache(), num_logits=1).logits[0, -1].float()
    return {"position": i, "kind": "token", "ar_token": ar[i], "token": other[i],
            "margin": float(logits[ar[i]] - logits[other[i]])}


def run_turns(target, tokenizer, methods: list[Method], prompt, cfg: BenchConfig, stop) -> list[Record]:
    """All methods on every user turn of one prompt."""
    records, answers = [], []
    for turn in range(len(prompt.turns)):
        ids = prompt_ids(tokenizer, prompt.messages_for_turn(turn, answers))
        ar = None
        for method in methods:
            rec = decode(target, method, ids, cfg, stop)
            rec.dataset, rec.prompt_id, rec.category = prompt.dataset, f"{prompt.id}#{turn + 1}", prompt.category
            if ar is None:
                ar = rec
            elif cfg.temperature == 0:
                rec.divergence = divergence(target, ids, ar.tokens, rec.tokens)
                rec.identical = rec.divergence is None
            records.append(rec)
        answers.append(tokenizer.decode([t for t in ar.tokens if t not in stop], skip_special_tokens=True))
    return records


def warm_up(target, tokenizer, methods: list[Method], cfg: BenchConfig, stop) -> None:
    """One short untimed call per method (first-call allocations, lazy init)."""
    ids = tokenizer.encode("def fib(n):", add_special_tokens=False)
    short = dataclasses.replace(cfg, max_new_tokens=8)
    for method in methods:
        decode(target, method, ids, short, stop)


def run(cfg: BenchConfig) -> dict:
    """Runs the benchmark, writes results.json / results.md / *.png under cfg.out, returns the results.
    After each prompt, results.json / results.md hold the prompts finished so far, marked `partial`."""
    dtype = machine.chosen_dtype(cfg.dtype)
    meta = machine.describe() | {"dtype": dtype}  # taken at the start: date, load, threads
    target, tokenizer = load_target(cfg.target, dtype)
    methods = build_methods(target, resolve_dtype(dtype), cfg.drafter, cfg.dflash, cfg.eagle3, cfg.peers,
                            cfg.eagle3_tree, cfg.shapes, cfg.auto, cfg.recalibrate)
    unknown = sorted(set(cfg.methods) - {m.name for m in methods})
    if unknown:  # a typo would silently drop a row from a long run
        hint = "" if cfg.shapes or not any(w in u for u in unknown for w in ("top-k", "selector", "noise", "lookup")) \
            else " (--shapes adds the draft-shape rows: lookup hybrids and trees)"
        raise ValueError(f"--methods: no row named {', '.join(map(repr, unknown))} with these options; rows: "
                         f"{', '.join(m.name for m in methods)}{hint}")
    methods = [m for m in methods if not cfg.methods or m.name == "AR" or m.name in cfg.methods]
    stop = stop_token_ids(tokenizer)
    warm_up(target, tokenizer, methods, cfg, stop)
    records: list[Record] = []
    for i, name in enumerate(cfg.datasets):
        prompts = datasets.load(name, cfg.n, spread=cfg.spread)
        for k, prompt in enumerate(tqdm(prompts, desc=name, unit="prompt")):
            records += run_turns(target, tokenizer, methods, prompt, cfg, stop)
            at = None if k + 1 == len(prompts) else (prompt.dataset, k + 1, len(prompts))
            write_partial(cfg, meta, methods, records, cfg.datasets[i + 1:], target, at)  # an interrupt keeps these
    shuffle = shuffle_test(target, tokenizer, methods, records, cfg.datasets, min(cfg.shuffle_n, cfg.n),
                           partial(decode, cfg=cfg, stop=stop), cfg.spread) if cfg.shuffle_n else {}
    from flashmap_ext.bench.shapes import projection_skipped
    results = assemble(cfg, meta, methods, records, shuffle, projection_skipped(target))
    report.write_all(results, Path(cfg.out))
    return results


def write_partial(cfg: BenchConfig, meta: dict, methods: list[Method], records: list[Record], left: tuple,
                  target, at: tuple[str, int, int] | None = None) -> None:
    """results.json and results.md of the prompts finished so far, marked `partial` (the datasets still to run,
    `in_progress` {dataset, prompts_done, prompts} while `at` = (dataset, done, of) is mid-set, no shuffle test, no
    plots): an interrupted bench keeps every finished prompt. The complete run overwrites both."""
    from flashmap_ext.bench.shapes import projection_skipped
    results = assemble(cfg, meta, methods, records, {}, projection_skipped(target))
    results["partial"] = {"datasets_left": list(left), "shuffle_test": "not run yet" if cfg.shuffle_n else "off"}
    if at:
        results["partial"]["in_progress"] = dict(zip(("dataset", "prompts_done", "prompts"), at))
    report.write_tables(results, Path(cfg.out))


def assemble(cfg: BenchConfig, meta: dict, methods: list[Method], records: list[Record], shuffle: dict,
             no_projection: str | None = None) -> dict:
    """The results document: meta, per-dataset summaries per method, tree shapes of the tree rows, shuffle
    test, per-record rows."""
    table: dict = {}
    for name in dict.fromkeys(r.dataset for r in records):
        ar = [r for r in records if r.dataset == name and r.method == "AR"]
        table[name] = {m.name: summarize([r for r in records if r.dataset == name and r.method == m.name], ar,
                                         meta["dtype"]) for m in methods}
    rows = [{k: v for k, v in dataclasses.asdict(r).items() if k != "tokens"} | {"new_tokens": len(r.tokens)}
            for r in records]
    meta = meta | {"finished": machine.describe()["date"]}
    trees = {m.name: dataclasses.asdict(m.tree) for m in methods if m.tree}
    from flashmap_ext.bench.shapes import projections
    return {"meta": meta, "config": dataclasses.asdict(cfg), "methods": [m.name for m in methods],
            "trees": trees, "datasets": table, "shuffle": shuffle, "records": rows,
            "projected_h200": {} if no_projection else projections(methods, records), "no_projection": no_projection}
