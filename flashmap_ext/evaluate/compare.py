"""`flashmap eval compare`: held-out γ of several drafters with paired bootstrap intervals of their differences.

    flashmap eval compare --drafter A=runs/x/drafter:1 --drafter B=runs/y/drafter:2 \
        [--per-domain 8] [--heldout ...] [--dtype fp32] [--out runs/x/paired.json]

Teacher-forced slot hits as `flashmap eval` (evaluate/heldout.py) on the same held-out sequences; per
sequence the counts [Σ leading run, anchors] of each drafter; γ = 1 + Σ run / anchors pooled over
sequences; for every pair (first named minus each later one) Δγ with the paired percentile bootstrap
interval over sequences, resampled within each domain (bench/interval.py, 95 %). Prints a Markdown table:
pooled over the domains, then each domain's γ and pairs (the bootstrap over that domain's sequences).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("--drafter", action="append", required=True, help="NAME=DIR[:STEPS[xDRAWS]], two or more")
    p.add_argument("--target", default="qwen2.5-coder-0.5b")
    p.add_argument("--heldout", default="data/qwen2.5-coder-0.5b-instruct/heldout")
    p.add_argument("--per-domain", type=int, default=8)
    p.add_argument("--slots", type=int, default=8, help="K: slots scored, as in flashmap eval --slots")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                   help="target dtype, as in flashmap eval --dtype (auto: bench.machine.auto_dtype, bf16 on a CPU "
                        "with avx512_bf16, else fp32)")
    p.add_argument("--pair", action="append", metavar="A,B",
                   help="Δγ = γ(A) − γ(B) to report (repeatable); default: the first drafter minus each later one")
    p.add_argument("--out", help="JSON file for the per-sequence counts and the table (its folder must exist)")


def check_args(args) -> tuple[list, list[tuple[str, str]]]:
    """(drafter specs, pairs to report); ValueError naming --out (a folder, or a file in no existing folder: as
    `flashmap bench compare --out`), --per-domain, --drafter (as `flashmap eval`: a repeated NAME too) or --pair
    before any model loads."""
    from flashmap_ext.bench.compare import check_out
    from flashmap_ext.evaluate.run import check_specs
    if args.out:
        check_out(args.out)
    if args.per_domain < 2:
        raise ValueError(f"--per-domain: must be >= 2 for compare (the paired bootstrap resamples the sequences "
                         f"within each domain: one has no spread), got {args.per_domain}")
    if len(args.drafter) < 2:
        raise ValueError("--drafter: give two or more (the first is compared with each later one)")
    specs = check_specs(args.drafter)
    names = [n for n, *_ in specs]
    pairs = []
    for pair in args.pair or []:
        if len(pair.split(",")) != 2 or not set(pair.split(",")) <= set(names):
            raise ValueError(f"--pair {pair!r}: expected A,B with A and B among the --drafter names {sorted(names)}")
        pairs.append(tuple(pair.split(",")))
    return specs, pairs or [(names[0], n) for n in names[1:]]


def sequence_counts(args, specs, dtype: str) -> tuple[dict, list]:
    """({drafter: [[Σ leading run, anchors] per held-out sequence]}, the sequences)."""
    from flashmap_ext.evaluate.heldout import add_taps, check_anchors_left, slot_hits
    from flashmap_ext.evaluate.run import (
        load_heldout,
        note_fewer_slots,
        scored_slots,
        spec_drafter,
        warn_other_answering_model,
    )
    from flashmap_ext.target import load_target
    target, tok = load_target(args.target, dtype, "cpu")
    drafters = {spec[0]: spec_drafter(target, *spec[1:], text) for spec, text in zip(specs, args.drafter)}
    seqs = load_heldout(args.heldout, tok, args.per_domain, args.max_length)
    warn_other_answering_model(seqs, args.target, target, "flashmap eval compare")
    scored = {name: scored_slots(args.slots, d) for name, d in drafters.items()}
    check_anchors_left(seqs, max(scored.values()), 1, args.max_length)
    note_fewer_slots(args.slots, scored)
    add_taps(target, seqs, sorted({i for d in drafters.values() for i in d.target_layer_ids}))
    counts = {}
    for name, d in drafters.items():
        hits = slot_hits(d, seqs, scored[name], dtype=target.dtype)
        counts[name] = [[int(h.long().cumprod(1).sum()), int(h.shape[0])] for h in hits]
        print(f"{name}: γ {gamma(counts[name]):.4f}", file=sys.stderr, flush=True)
    return counts, seqs


def paired_deltas(counts: dict, domains: list[str], todo: list[tuple[str, str]]) -> dict:
    """{"A - B": {delta, interval [lo, hi] or None}}: the bootstrap resamples sequences within their domain;
    None (undefined) when every domain holds a single scored sequence (nothing to resample)."""
    from flashmap_ext.bench.interval import delta_interval
    first = next(iter(counts))
    keep = [i for i in range(len(domains)) if counts[first][i][1]]
    strata = [domains[i] for i in keep]
    pairs = {}
    for a, b in todo:
        c = [counts[a][i] + counts[b][i] for i in keep]
        interval = delta_interval(c, strata)
        pairs[f"{a} - {b}"] = {"delta": gamma(counts[a]) - gamma(counts[b]),
                               "interval": None if interval is None else list(interval)}
    return pairs


def by_domain(counts: dict, domains: list[str], todo: list[tuple[str, str]]) -> dict:
    """{domain: {"gamma": {drafter: γ}, "pairs": paired_deltas of that domain's sequences}}, domains in order of
    first appearance; empty when there is a single domain (the pooled table says it all)."""
    names = list(dict.fromkeys(domains))
    if len(names) < 2:
        return {}
    out = {}
    for d in names:
        idx = [i for i, x in enumerate(domains) if x == d]
        sub = {n: [c[i] for i in idx] for n, c in counts.items()}
        out[d] = {"gamma": {n: gamma(c) for n, c in sub.items()}, "pairs": paired_deltas(sub, [d] * len(idx), todo)}
    return out


def domain_markdown(table: dict) -> list[str]:
    """The per-domain rows of `by_domain`: γ of each drafter, then each pair's Δγ with its interval."""
    if not table:
        return []
    names = list(next(iter(table.values()))["gamma"])
    lines = ["", "| domain | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {d} | " + " | ".join(f"{v['gamma'][n]:.4f}" for n in names) + " |" for d, v in table.items()]
    pairs = list(next(iter(table.values()))["pairs"])
    if pairs:
        lines += ["", "| pair | domain | Δγ | 95 % paired bootstrap |", "|---|---|---|---|"]
        lines += [f"| {p} | {d} | {v['pairs'][p]['delta']:+.4f} | {interval_text(v['pairs'][p]['interval'])} |"
                  for p in pairs for d, v in table.items()]
    return lines


def interval_text(interval: list[float] | None) -> str:
    """"[lo, hi]", or why there is none: a single scored sequence in every domain leaves nothing to resample."""
    if interval is None:
        return "undefined (one scored sequence per domain)"
    return f"[{interval[0]:+.4f}, {interval[1]:+.4f}]"


def markdown(counts: dict, pairs: dict, meta: dict, domains: dict | None = None) -> list[str]:
    """The pooled γ and pairs, then (`domains`: `by_domain`) the same per domain, then the run's line."""
    table = ["| drafter | γ |", "|---|---|"] + [f"| {n} | {gamma(c):.4f} |" for n, c in counts.items()]
    table += ["", "| pair | Δγ | 95 % paired bootstrap |", "|---|---|---|"]
    table += [f"| {k} | {v['delta']:+.4f} | {interval_text(v['interval'])} |" for k, v in pairs.items()]
    table += domain_markdown(domains or {})
    anchors = meta["anchors"] if isinstance(meta.get("anchors"), dict) else anchor_counts(counts)
    table += ["", f"{meta['sequences']} held-out sequences, {anchors_text(anchors)}; `{meta['command']}`; "
                  f"{meta['cpu']}, {meta['torch_threads']} thread(s), {meta['dtype']}, load {meta['load_average']}; "
                  f"{meta['date']}"]
    return table


def anchor_counts(counts: dict) -> dict[str, int]:
    """{drafter: anchors scored over all sequences} of the per-sequence counts (the "anchors" of `run`'s meta)."""
    return {name: sum(c[1] for c in seqs) for name, seqs in counts.items()}


def anchors_text(n: dict[str, int]) -> str:
    """"N anchors" when every drafter was scored on as many (`anchor_counts`), else each drafter's count: an
    anchor needs K answer tokens after it, so drafters of another K are scored on other anchors."""
    if len(set(n.values())) == 1:
        return f"{next(iter(n.values()))} anchors"
    return f"anchors {', '.join(f'{name} {k}' for name, k in n.items())} (another K, other anchors)"


def run(args) -> int:
    from flashmap_ext.bench.machine import chosen_dtype, describe, set_threads
    specs, todo = check_args(args)
    set_threads(args.threads)
    dtype = chosen_dtype(args.dtype)
    counts, seqs = sequence_counts(args, specs, dtype)
    domains = [s.domain for s in seqs]
    pairs, per_domain = paired_deltas(counts, domains, todo), by_domain(counts, domains, todo)
    meta = {**describe(), "dtype": dtype, "heldout": args.heldout, "per_domain": args.per_domain,
            "sequences": len(seqs), "anchors": anchor_counts(counts),
            "domains": domains}
    table = markdown(counts, pairs, meta, per_domain)
    print("\n".join(table))
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "counts": counts, "pairs": pairs, "domains": domains,
                                              "by_domain": per_domain, "specs": args.drafter, "table": table},
                                             indent=1) + "\n")
    return 0


def gamma(counts: list[list[int]]) -> float:
    """Pooled γ = 1 + Σ leading run / Σ anchors over sequences (nan without anchors)."""
    runs, n = sum(c[0] for c in counts), sum(c[1] for c in counts)
    return 1.0 + runs / n if n else float("nan")
