"""The shuffle test of `flashmap bench`: is a FlashMap block jointly coherent?

Each FlashMap-s row (s flow-map steps) decodes the first turn of the first `shuffle_n` prompts of every dataset
again with `PerSlotNoiseDrafter` (slot j from a block drafted with its own noise draw: same per-slot marginals, no
shared noise). Δγ = γ(shared noise) − γ(per-slot noise), both pooled over the prompts, with a paired percentile
bootstrap interval over prompts (bench/interval.py); the "all datasets" row pools every prompt and resamples
within each dataset.
"""
from __future__ import annotations

from tqdm.auto import tqdm

from flashmap_ext.assets import datasets
from flashmap_ext.bench.interval import delta_interval
from flashmap_ext.bench.methods import Method, PerSlotNoiseDrafter, StepsDrafter
from flashmap_ext.bench.metrics import Record, acceptance_length
from flashmap_ext.train.data import prompt_ids

LEVEL = 0.95
ALL = "all datasets"


def prompt_counts(shared: Record, per_slot: Record) -> dict:
    """One prompt's pair: counts [A shared, R shared, A per-slot, R per-slot] (accepted drafts, rounds) and its
    own γ of each arm (nan without rounds)."""
    return {"prompt_id": shared.prompt_id,
            "counts": [sum(shared.accepted), len(shared.accepted), sum(per_slot.accepted), len(per_slot.accepted)],
            "shared": acceptance_length([shared]), "per_slot": acceptance_length([per_slot])}


def summary(pairs: list[dict], strata: list[str]) -> dict:
    """Pooled γ of both arms, Δγ and its interval over the prompts that have rounds in both arms (a prompt
    without rounds adds nothing to either pooled γ). interval: [low, high], or None with one prompt per stratum."""
    kept = [(p, s) for p, s in zip(pairs, strata) if p["counts"][1] and p["counts"][3]]
    a1, r1, a2, r2 = (sum(p["counts"][i] for p, _ in kept) for i in range(4))
    shared = (a1 + r1) / r1 if r1 else float("nan")
    per_slot = (a2 + r2) / r2 if r2 else float("nan")
    interval = delta_interval([p["counts"] for p, _ in kept], [s for _, s in kept], LEVEL) if kept else None
    return {"shared": shared, "per_slot": per_slot, "delta": shared - per_slot, "prompts": len(pairs),
            "interval": list(interval) if interval else None, "level": LEVEL, "per_prompt": pairs}


def probe_pairs(target, tokenizer, method: Method, records: list[Record], prompts, decode) -> list[dict]:
    """Per prompt: the main run's record (shared noise) and a per-slot-noise decode of the same first turn."""
    probe = Method(method.name, PerSlotNoiseDrafter(method.drafter.inner, method.drafter.steps))
    shared = {(r.dataset, r.prompt_id): r for r in records if r.method == method.name}
    pairs = []
    for p in tqdm(prompts, desc=f"shuffle {method.name}", leave=False):
        per_slot = decode(target, probe, prompt_ids(tokenizer, p.messages))
        pairs.append(prompt_counts(shared[p.dataset, f"{p.id}#1"], per_slot))
    return pairs


def shuffle_test(target, tokenizer, methods: list[Method], records: list[Record], names, count: int,
                 decode, spread: bool = False) -> dict:
    """{dataset or "all datasets": {method: summary}} for every FlashMap-s row; `count` prompts per dataset,
    `decode(target, method, ids) -> Record`. The "all datasets" row appears with two or more datasets (its
    per_prompt list is empty: the pairs are in the dataset rows)."""
    out: dict = {}
    pooled: dict = {}
    for spec in names:
        prompts, name = datasets.load(spec, count, spread=spread), spec.partition("=")[0]  # keyed by name
        for method in (m for m in methods if isinstance(m.drafter, StepsDrafter)):
            pairs = probe_pairs(target, tokenizer, method, records, prompts, decode)
            out.setdefault(name, {})[method.name] = summary(pairs, [name] * len(pairs))
            pooled.setdefault(method.name, []).extend((pair, name) for pair in pairs)
    if len(out) > 1:
        out[ALL] = {m: summary([p for p, _ in rows], [s for _, s in rows]) | {"per_prompt": []}
                    for m, rows in pooled.items()}
    return out
