"""`flashmap bench compare --rows`: one line per bench row (drafter and shape) with its pooled γ on each dataset
and over all of them, the projected H200 speedup bench wrote for it, and whether its outputs were identical to AR.

γ of a row on a set = (Σ accepted + Σ rounds) / Σ rounds over the set's records (bench/metrics.acceptance_length,
pooled as `flashmap bench compare` pools Δγ); "all datasets" pools every record of the row. When the rows have γ
on different sets of datasets, their "all datasets" γ would average different prompts, so that column reads "n/a"
and a footnote names each row's sets.
"""
from __future__ import annotations

ALL = "all datasets"


def prompt_counts(rows: list[dict], method: str, by_category: bool = False) -> dict:
    """{(dataset, prompt): [Σ accepted, rounds]} of one bench row over its records (turns "id#n" merged).
    by_category: the group is "dataset / category" for records with a category (bench/run.py writes one where the
    prompt set has them), else the dataset."""
    out: dict = {}
    for r in rows:
        if r["method"] == method:
            group = f"{r['dataset']} / {r['category']}" if by_category and r.get("category") else r["dataset"]
            c = out.setdefault((group, r["prompt_id"].split("#")[0]), [0, 0])
            c[0] += sum(r["accepted"])
            c[1] += len(r["accepted"])
    return out


def row_gammas(results: dict, method: str) -> dict:
    """{dataset, ..., "all datasets": pooled γ} of one row; datasets in the order the records name them."""
    counts = prompt_counts(results["records"], method)
    out = {}
    for name in [*dict.fromkeys(d for d, _ in counts), ALL]:
        acc, rounds = (sum(c[i] for k, c in counts.items() if name in (ALL, k[0])) for i in range(2))
        out[name] = (acc + rounds) / rounds if rounds else None
    return out


def _cell(gamma) -> str:
    return f"{gamma:.3f}" if gamma else "–"


def gamma_sets(gammas: dict, datasets: list[str]) -> dict:
    """{(dataset, ...): [row, ...]}: the rows grouped by the datasets they have γ on, in the order of `datasets`
    (rows with none left out)."""
    out: dict = {}
    for m, g in gammas.items():
        sets = tuple(d for d in datasets if g.get(d) is not None)
        if sets:
            out.setdefault(sets, []).append(m)
    return out


def markdown_rows(results: dict) -> list[str]:
    """The Markdown table: row | γ per dataset | γ all | projected H200 speedup per dataset | identical to AR; "all"
    is "n/a" under a footnote when the rows have γ on different sets of datasets."""
    datasets = list(dict.fromkeys(r["dataset"] for r in results["records"]))
    projected, identical = results.get("projected_h200", {}), results.get("identical", {})
    gammas = {m: row_gammas(results, m) for m in results["methods"] if m != "AR"}
    sets = gamma_sets(gammas, datasets)
    lines = ["| row | " + " | ".join(datasets) + f" | {ALL} | projected H200 speedup " + " / ".join(datasets)
             + " | identical to AR |", "|---" * (len(datasets) + 4) + "|"]
    for m, g in gammas.items():
        cells = [_cell(g.get(d)) for d in datasets] + ["n/a" if len(sets) > 1 and g[ALL] else _cell(g[ALL])]
        speed = " / ".join(f"{projected[m][d]:.2f}×" if d in projected.get(m, {}) else "–" for d in datasets)
        same = ", ".join(sorted({str(identical.get(m, {}).get(d, "–")) for d in datasets}))
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {speed} | {same} |")
    if len(sets) > 1:
        groups = "; ".join(f"{', '.join(rows)} on {', '.join(s)}" for s, rows in sets.items())
        lines += ["", f"{ALL} n/a: the rows were measured on different dataset sets ({groups}), so their pooled γ "
                  "would average different prompts; compare them per dataset"]
    return lines
