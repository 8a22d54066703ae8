"""`flashmap bench compare --rows`: one line per bench row (drafter and shape) with its pooled γ on each dataset
and over all of them, the projected H200 speedup bench wrote for it, and whether its outputs were identical to AR.

γ of a row on a set = (Σ accepted + Σ rounds) / Σ rounds over the set's records (bench/metrics.acceptance_length,
pooled as `flashmap bench compare` pools Δγ); "all datasets" pools every record of the row.
"""
from __future__ import annotations

ALL = "all datasets"


def prompt_counts(rows: list[dict], method: str) -> dict:
    """{(dataset, prompt): [Σ accepted, rounds]} of one bench row over its records (turns "id#n" merged)."""
    out: dict = {}
    for r in rows:
        if r["method"] == method:
            c = out.setdefault((r["dataset"], r["prompt_id"].split("#")[0]), [0, 0])
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


def markdown_rows(results: dict) -> list[str]:
    """The Markdown table: row | γ per dataset | γ all | projected H200 speedup per dataset | identical to AR."""
    datasets = list(dict.fromkeys(r["dataset"] for r in results["records"]))
    projected, identical = results.get("projected_h200", {}), results.get("identical", {})
    lines = ["| row | " + " | ".join(datasets) + f" | {ALL} | projected H200 speedup " + " / ".join(datasets)
             + " | identical to AR |", "|---" * (len(datasets) + 4) + "|"]
    for m in results["methods"]:
        if m == "AR":
            continue
        g = row_gammas(results, m)
        cells = [f"{g[d]:.3f}" if g.get(d) else "–" for d in [*datasets, ALL]]
        speed = " / ".join(f"{projected[m][d]:.2f}×" if d in projected.get(m, {}) else "–" for d in datasets)
        same = ", ".join(sorted({str(identical.get(m, {}).get(d, "–")) for d in datasets}))
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {speed} | {same} |")
    return lines
