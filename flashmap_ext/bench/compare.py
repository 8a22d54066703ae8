"""`flashmap bench compare`: paired Δγ between rows of `flashmap bench` results.json files, and their
shuffle-test Δγ, as Markdown.

    flashmap bench compare runs/x/results.json [--pair FlashMap-2,FlashMap-1] [--out delta.json]
    flashmap bench compare runs/gsm8k/results.json runs/mtbench/results.json ...   # one set each
    flashmap bench compare runs/*/results.json --rows      # every row's γ per set (bench/row_table.py)
    flashmap bench compare runs/x/results.json --pair DFlash,FlashMap-1 --by-category   # + MT-Bench's categories
    flashmap bench compare runs/x/results.json --gamma FlashMap-1       # a row's own γ with its interval

Several results files (one dataset, or one drafter, per core) are pooled when their settings agree and no row
(method, dataset) is in two; AR, which every run has, is kept from the first file holding each dataset.

Per prompt (every turn of a multi-turn prompt summed) the counts [accepted drafts, rounds] of each row;
Δγ = pooled γ(A) − pooled γ(B) (γ = (Σ accepted + Σ rounds) / Σ rounds, bench/metrics.acceptance_length) with
the paired percentile-bootstrap 95 % interval over prompts, resampled within each dataset (bench/interval.py),
per dataset and over all of them. Default pair: FlashMap-2 − FlashMap-1. The shuffle rows (shared − per-slot
noise) are copied from the results' own "shuffle" section, which bench computed with the same interval.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from flashmap_ext.bench.row_table import ALL, markdown_rows, prompt_counts


def pair_delta(results: dict, a: str, b: str, by_category: bool = False) -> dict:
    """{dataset, ..., "all datasets": {gamma_a, gamma_b, delta, interval [lo, hi] or None, prompts}} of Δγ = γ(a) −
    γ(b) over the prompts where both rows have rounds; by_category adds one entry per "dataset / category" after
    them (records without a category: none). ValueError naming the row when results lack it or it has no γ (AR and
    the peer rows draft nothing), naming both when they share no prompt with rounds, and naming --by-category when
    no record of the two rows has a category."""
    if a == b:
        raise ValueError(f"--pair {a},{b}: a row paired with itself (Δγ is 0 by construction): name two rows")
    for m in (a, b):
        if m not in results["methods"]:
            raise ValueError(f"--pair: no row {m!r} in these results (rows: {', '.join(results['methods'])})")
    ca, cb = prompt_counts(results["records"], a), prompt_counts(results["records"], b)
    for m, counts in ((a, ca), (b, cb)):
        if m == "AR" or not any(c[1] for c in counts.values()):  # AR's one-token steps are not drafting rounds
            raise ValueError(f"--pair {a},{b}: row {m!r} has no γ (no drafting rounds: AR and the peer rows such "
                             "as HF greedy and prompt lookup draft nothing)")
    out = _deltas(ca, cb, with_all=True)
    if not out:
        raise ValueError(f"--pair {a},{b}: rows {a!r} and {b!r} share no (dataset, prompt) with rounds in both, "
                         "so there is nothing to pair")
    if by_category:
        cats = _deltas(*(prompt_counts(results["records"], m, by_category=True) for m in (a, b)), with_all=False)
        cats = {g: v for g, v in cats.items() if " / " in g}
        if not cats:
            raise ValueError(f"--by-category: no record of rows {a!r} and {b!r} has a category (a record has one "
                             "when its prompt set does: MT-Bench, a JSONL with `category`; results of a bench "
                             "older than the option have none)")
        out |= cats
    return out


def gamma_table(results: dict, row: str, by_category: bool = False) -> dict:
    """{dataset, ..., "all datasets"(, "dataset / category", ...)}: {gamma, interval [lo, hi] or None, prompts} of
    one row: its pooled γ with the same percentile bootstrap over prompts as Δγ (bench/interval.py), taken as
    the Δγ against an arm whose every prompt has γ = 1, plus 1. ValueError naming --gamma for a row that is not
    in the results or has no γ."""
    if row not in results["methods"] or row == "AR":
        raise ValueError(f"--gamma: no drafter row {row!r} in these results (rows: {', '.join(results['methods'])})")
    out = {}
    for split in (False, True) if by_category else (False,):
        counts = prompt_counts(results["records"], row, by_category=split)
        ones = {k: [0, 1] for k in counts}  # 0 accepted over 1 round: γ = 1 in every resample
        for group, v in _deltas(counts, ones, with_all=not split).items():
            if not split or " / " in group:
                iv = v["interval"]
                out[group] = {"gamma": v["gamma_a"], "interval": [iv[0] + 1, iv[1] + 1] if iv else None,
                              "prompts": v["prompts"]}
    if not out:
        raise ValueError(f"--gamma {row}: the row has no γ (no drafting rounds)")
    return out


def _deltas(ca: dict, cb: dict, with_all: bool) -> dict:
    """{group, ...(, "all datasets")}: Δγ with its paired bootstrap (resampled within each group) over the
    (group, prompt) keys with rounds in both counts."""
    from flashmap_ext.bench.interval import delta_interval
    keys = [k for k in ca if k in cb and ca[k][1] and cb[k][1]]
    out = {}
    for name in [*dict.fromkeys(d for d, _ in keys), *([ALL] if with_all and keys else [])]:
        sel = [k for k in keys if name in (ALL, k[0])]
        counts = [ca[k] + cb[k] for k in sel]
        a1, r1, a2, r2 = (sum(c[i] for c in counts) for i in range(4))
        ga, gb = (a1 + r1) / r1, (a2 + r2) / r2
        iv = delta_interval(counts, [k[0] for k in sel]) if counts else None
        out[name] = {"gamma_a": ga, "gamma_b": gb, "delta": ga - gb, "interval": list(iv) if iv else None,
                     "prompts": len(sel)}
    return out


SAME = ("target", "temperature", "max_new_tokens", "seed")


def check_same_drafter(method: str, config: dict, name: str, first: tuple[dict, str]) -> None:
    """ValueError when rows of one name come from two checkpoints (e.g. "FlashMap-1" of two --drafter runs):
    pooled, their Δγ would mix two drafters under one name."""
    flag = "eagle3" if "EAGLE" in method else "dflash" if "DFlash" in method else \
        "drafter" if "FlashMap" in method else None
    if flag is None:
        return
    mine, theirs = (c.get(flag) for c in (config, first[0]))
    if _where(mine) != _where(theirs):
        raise ValueError(f"{name}: its {method!r} rows come from --{flag} {mine}, {first[1]}'s from {theirs}: rows "
                         "of one name pool only from one checkpoint")


def _spec(config: dict, dataset: str) -> str:
    """The --datasets spec a run gave for `dataset` ("gsm8k", or "mine=FILE.jsonl" with FILE resolved), else the
    name (results written without config.datasets)."""
    for spec in config.get("datasets") or ():
        name, _, path = spec.partition("=")
        if name.strip() == dataset:
            return f"{name.strip()}={_where(path.strip())}" if path else name.strip()
    return dataset


def _where(path):
    return os.path.realpath(path) if isinstance(path, str) and os.path.exists(path) else path


def merge(parts: list[dict], names: list[str]) -> dict:
    """One results dict from several bench runs over the same prompts (records, rows and shuffle sections pooled;
    config and meta of the first; AR's records of a dataset from the first file that has them). ValueError
    naming the file whose settings (SAME, dtype; `n` and the --datasets spec among the runs of one dataset) differ
    or whose row (method, dataset) another file has."""
    first, seen, records, n_of, drafters = parts[0], {}, [], {}, {}
    for part, name in zip(parts, names):
        for key in SAME:
            if part["config"].get(key) != first["config"].get(key):
                raise ValueError(f"{name}: {key} {part['config'].get(key)} differs from {names[0]}'s "
                                 f"{first['config'].get(key)}: only runs of equal settings pool")
        if part["meta"].get("dtype") != first["meta"].get("dtype"):
            raise ValueError(f"{name}: dtype {part['meta'].get('dtype')} differs from {names[0]}'s")
        for dataset in dict.fromkeys(r["dataset"] for r in part["records"]):
            spec = _spec(part["config"], dataset)
            chosen = (part["config"].get("n"), part["config"].get("spread", False))
            other, n, other_spec = n_of.setdefault(dataset, (name, chosen, spec))
            if n != chosen:
                raise ValueError(f"{name}: n, spread {chosen} differ from {other}'s {n} on {dataset}: "
                                 f"only runs of equal settings pool")
            if spec != other_spec:
                raise ValueError(f"{name}: dataset {spec} differs from {other}'s {other_spec}: only runs of the "
                                 "same prompts pool")
        rows = dict.fromkeys((r["method"], r["dataset"]) for r in part["records"])
        for method in dict.fromkeys(m for m, _ in rows):
            check_same_drafter(method, part["config"], name, drafters.setdefault(method, (part["config"], name)))
        for row in rows:
            if row in seen and row[0] != "AR":
                raise ValueError(f"{name}: {row[0]} on {row[1]} is in {seen[row]} too (each row from one run only)")
        records += [r for r in part["records"] if (r["method"], r["dataset"]) not in seen]
        seen.update({row: seen.get(row, name) for row in rows})
    return {**first, "methods": list(dict.fromkeys(m for p in parts for m in p["methods"])), "records": records,
            "shuffle": _pooled(parts, lambda p: (p.get("shuffle") or {}).items()),
            "projected_h200": _pooled(parts, lambda p: (p.get("projected_h200") or {}).items()),
            "identical": _pooled(parts, lambda p: ((m, {d: row.get("identical")}) for d, rows in
                                                    p.get("datasets", {}).items() for m, row in rows.items()))}


def _pooled(parts: list[dict], items) -> dict:
    """{key: {sub: value}} pooled over the parts' (key, {sub: value}) items: a row's value per dataset, or a
    dataset's shuffle rows per method, from whichever run holds it."""
    out: dict = {}
    for part in parts:
        for method, by_set in items(part):
            out.setdefault(method, {}).update(by_set)
    return out


def fmt(iv) -> str:
    return f"[{iv[0]:+.3f}, {iv[1]:+.3f}]" if iv else "— (one prompt)"


def partial_lines(parts: list[dict], names: list[str]) -> list[str]:
    """One line per results file that is partial (an interrupted or running bench): what it holds."""
    out = []
    for part, name in zip(parts, names):
        p = part.get("partial")
        if p is None:
            continue
        now = p.get("in_progress")
        held = f"{now['dataset']}: {now['prompts_done']} of {now['prompts']} prompts" if now else "finished sets only"
        out.append(f"**partial**: {name} ({held}; still to run: {', '.join(p.get('datasets_left', [])) or 'none'})")
    return out + [""] if out else []


def markdown(results: dict, pairs: dict, notes: list[str] = ()) -> list[str]:
    meta, cfg = results["meta"], results["config"]
    picked = " (spread over categories)" if cfg.get("spread") else ""
    lines = [*notes, f"T = {cfg['temperature']}, {meta['dtype']}, {cfg['max_new_tokens']} new "
             f"tokens, {cfg['n']} prompts per dataset{picked}; {meta.get('cpu')}, {meta.get('torch_threads')} "
             f"thread(s), load {meta.get('load_average')}; {meta.get('date')}", "",
             "| pair | dataset | γ A | γ B | Δγ | 95 % paired bootstrap | prompts |", "|---|---|---|---|---|---|---|"]
    for (a, b), table in pairs.items():
        lines += [f"| {a} − {b} | {d} | {v['gamma_a']:.3f} | {v['gamma_b']:.3f} | {v['delta']:+.3f} | "
                  f"{fmt(v['interval'])} | {v['prompts']} |" for d, v in table.items()]
    for d, rows in results.get("shuffle", {}).items():
        lines += [f"| {m} shared − per-slot noise | {d} | {v['shared']:.3f} | {v['per_slot']:.3f} | "
                  f"{v['delta']:+.3f} | {fmt(v['interval'])} | {v['prompts']} |" for m, v in rows.items()]
    return lines


def gamma_markdown(gammas: dict) -> list[str]:
    lines = ["| row | dataset | γ | 95 % bootstrap | prompts |", "|---|---|---|---|---|"]
    for row, table in gammas.items():
        lines += [f"| {row} | {d} | {v['gamma']:.3f} | {fmt(v['interval']).replace('+', '')} | {v['prompts']} |"
                  for d, v in table.items()]
    return lines


def add_arguments(p) -> None:
    p.add_argument("results", nargs="+", help="`flashmap bench` results.json files (pooled: see above)")
    p.add_argument("--pair", action="append", metavar="A,B", help="rows A,B (repeatable; default FlashMap-2,FlashMap-1)")
    p.add_argument("--out", help="JSON file path for the pairs (its folder must exist)")
    p.add_argument("--by-category", action="store_true",
                   help="after each pair's (and --gamma row's) datasets, one line per dataset / category "
                        "(MT-Bench's eight, a JSONL's `category`)")
    p.add_argument("--gamma", action="append", metavar="ROW",
                   help="a row's own γ with its 95 %% bootstrap interval over prompts, per dataset (repeatable)")
    p.add_argument("--rows", action="store_true",
                   help="first a table of every row's pooled γ per dataset, projected H200 speedup and lossless "
                        "check (bench/row_table.py); with --rows and no --pair, only that table")


DEFAULT_PAIR = "FlashMap-2,FlashMap-1"


def parse_pairs(specs: list[str] | None) -> list[tuple[str, str]]:
    """--pair values → [(A, B)]; ValueError naming the option for anything but two row names."""
    todo = []
    for spec in specs or [DEFAULT_PAIR]:
        names = [n.strip() for n in spec.split(",")]
        if len(names) != 2 or not all(names):
            raise ValueError(f"--pair {spec!r}: expected A,B (two bench row names)")
        todo.append((names[0], names[1]))
    return todo


def read_results(path: str) -> dict:
    """One bench results.json; ValueError naming the file when it is missing or not one."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{path}: no such file (a `flashmap bench --out DIR` run writes DIR/results.json)")
    if p.is_dir():
        raise ValueError(f"{path}: a folder; give its results.json ({p / 'results.json'})")
    try:
        res = json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a `flashmap bench` results.json ({e})") from None
    if not isinstance(res, dict) or not {"config", "records", "methods"} <= res.keys():
        raise ValueError(f"{path}: not a `flashmap bench` results.json (no config, records and methods)")
    return res


def check_out(path: str) -> None:
    """ValueError naming --out when it is a folder or its folder does not exist (before anything is computed)."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"--out {path}: a folder; --out is a JSON file path (e.g. {os.path.join(path, 'delta.json')})")
    if not os.path.isdir(parent):
        raise ValueError(f"--out {path}: no folder {parent}; --out is a JSON file path in an existing folder")


def run(args) -> int:
    """Prints the Markdown table of every --pair (and the shuffle rows); writes --out when given."""
    todo = parse_pairs(args.pair) if args.pair or not (args.rows or args.gamma) else []
    if args.out:
        check_out(args.out)
    parts = [read_results(f) for f in args.results]
    results = merge(parts, args.results)
    missing = [m for pair in todo for m in pair if m not in results["methods"]]
    if missing and not args.pair:
        raise ValueError(f"no row {missing[0]!r} for the default pair {DEFAULT_PAIR} (rows: "
                         f"{', '.join(results['methods'])}): give --pair A,B, or --rows for every row's γ")
    if args.by_category and not (todo or args.gamma):
        raise ValueError("--by-category splits the --pair and --gamma tables: give --pair A,B or --gamma ROW")
    pairs = {(a, b): pair_delta(results, a, b, args.by_category) for a, b in todo}
    gammas = {row: gamma_table(results, row, args.by_category) for row in args.gamma or []}
    if args.rows:
        print("\n".join(markdown_rows(results)), end="\n\n" if todo else "\n")
    if todo:
        print("\n".join(markdown(results, pairs, partial_lines(parts, args.results))))
    if gammas:
        print(("\n" if todo else "") + "\n".join(gamma_markdown(gammas)))
    if args.out:
        out = {f"{a} - {b}": v for (a, b), v in pairs.items()} | {f"{row} gamma": v for row, v in gammas.items()}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0
