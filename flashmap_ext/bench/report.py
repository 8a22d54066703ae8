"""Benchmark outputs: results.json, results.md (tables) and PNG plots, each naming command, machine, date."""
from __future__ import annotations

import json
import math
from pathlib import Path

from flashmap_ext.bench.interval import RESAMPLES, SEED
from flashmap_ext.bench.machine import summary_line


def _num(x, fmt: str = "{:.2f}") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def caption(results: dict) -> list[str]:
    """The lines that say how and where the numbers were measured."""
    meta, cfg = results["meta"], results["config"]
    trees = "".join(f" {name}: depth {t['depth']}, top-k {t['topk']}, {t['num_nodes']} nodes per round."
                    for name, t in results.get("trees", {}).items())
    return [f"Command: `{meta['command']}`  ",
            f"Machine: {summary_line(meta)}; dtype {meta['dtype']}; transformers {meta['transformers']}  ",
            f"Target `{cfg['target']}`, temperature {cfg['temperature']}, max_new_tokens {cfg['max_new_tokens']}, "
            f"{cfg['n']} prompts per dataset, seed {cfg['seed']}.{trees}"]


def tree_note(results: dict) -> list[str]:
    """What the per-slot columns mean for tree rows (nothing when there are none)."""
    if not results.get("trees"):
        return []
    return ["", f"Tree rows ({', '.join(results['trees'])}): slot i is depth i of the draft tree, "
            "P(the accepted path reaches depth i | it reached depth i − 1 and the tree has depth i); "
            "its γ is the accepted path's length plus the bonus token, per target forward."]


def method_table(rows: dict) -> list[str]:
    """One dataset: a row per method."""
    out = ["| method | γ | tokens/s | speedup vs AR | identical to AR (T=0) | draft s | verify s | prefill s |",
           "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        out.append(f"| {name} | {_num(r['gamma'])} | {_num(r['tokens_per_s'], '{:.1f}')} | "
                   f"{_num(r.get('speedup'), '{:.2f}×')} | {r['identical']} | {_num(r['draft_time_s'], '{:.1f}')} | "
                   f"{_num(r['verify_time_s'], '{:.1f}')} | {_num(r['prefill_time_s'], '{:.1f}')} |")
    return out


def slot_table(results: dict) -> list[str]:
    """Per-slot conditional acceptance, a row per (dataset, drafter); tree rows by depth (`tree_note`)."""
    width = max((len(r["slot_acceptance"]) for d in results["datasets"].values() for r in d.values()), default=0)
    if not width:
        return []
    out = ["| dataset | method | " + " | ".join(f"slot {i + 1}" for i in range(width)) + " |",
           "|---|---|" + "---|" * width]
    for name, rows in results["datasets"].items():
        for method, r in rows.items():
            if r["slot_acceptance"]:
                cells = [_num(a) for a in r["slot_acceptance"]] + ["–"] * (width - len(r["slot_acceptance"]))
                out.append(f"| {name} | {method} | " + " | ".join(cells) + " |")
    return out + tree_note(results)


def _interval(r: dict) -> str:
    """"[low, high]" of the shuffle test's Δγ, or "–" (one prompt per dataset: no interval)."""
    iv = r.get("interval")
    return f"[{iv[0]:+.2f}, {iv[1]:+.2f}]" if iv else "–"


def shuffle_table(shuffle: dict) -> list[str]:
    """Shared vs per-slot noise γ per (dataset, FlashMap row), Δγ and its paired bootstrap interval."""
    level = next((r["level"] for rows in shuffle.values() for r in rows.values() if "level" in r), 0.95)
    out = [f"| dataset | method | γ shared noise | γ per-slot noise | Δγ | {level:.0%} interval of Δγ | prompts |",
           "|---|---|---|---|---|---|---|"]
    for name, rows in shuffle.items():
        for method, r in rows.items():
            out.append(f"| {name} | {method} | {_num(r['shared'])} | {_num(r['per_slot'])} | "
                       f"{_num(r['delta'], '{:+.2f}')} | {_interval(r)} | {r['prompts']} |")
    if len(out) == 2:
        return []
    return out + ["", "Interval: percentile bootstrap over prompts, both arms of a prompt resampled together "
                  f"({RESAMPLES:,} resamples, seed {SEED}; \"all datasets\" resamples within each dataset). Few "
                  "prompts make it too narrow: one near 0 is inconclusive."]


def projection_table(results: dict) -> list[str]:
    """Measured γ and nodes per round turned into a projected H200 speedup per (method, dataset)."""
    proj = results.get("projected_h200") or {}
    names = list(results["datasets"])
    if results.get("no_projection"):
        return [results["no_projection"] + "."]
    if not proj:
        return []
    from flashmap_ext.draft_shapes.cost_model import H200_QWEN3_8B
    out = [f"{H200_QWEN3_8B.label}; drafter 0.5 B + LM head read per draft call.", "",
           "| method | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for method, per in proj.items():
        out.append(f"| {method} | " + " | ".join(_num(per.get(n), '{:.2f}×') for n in names) + " |")
    return out


def summary_table(results: dict) -> list[str]:
    """One row per (dataset, method) with γ, measured speedup, projected H200 speedup and the lossless
    check: the shape of BENCHMARKS.md's tables, to paste under the caption (empty without projections; the
    projection "–" where none is made: a test-double target)."""
    proj = results.get("projected_h200") or {}
    if not proj and not results.get("no_projection"):
        return []
    out = ["| dataset | method | γ | speedup vs AR (measured) | projected H200 speedup | identical to AR |",
           "|---|---|---|---|---|---|"]
    for name, rows in results["datasets"].items():
        for method, r in rows.items():
            out.append(f"| {name} | {method} | {_num(r['gamma'])} | {_num(r.get('speedup'), '{:.2f}×')} | "
                       f"{_num(proj.get(method, {}).get(name), '{:.2f}×')} | {r['identical']} |")
    return out


def divergence_lines(results: dict) -> list[str]:
    out = []
    for name, rows in results["datasets"].items():
        for method, r in rows.items():
            for d in r["divergences"]:
                margin = f", AR-vs-method logit margin {d['margin']:.3f}" if "margin" in d else ""
                out.append(f"- {name} / {method} / {d['prompt_id']}: first difference at token {d['position']} "
                           f"({d['kind']}{margin})")
    return out


def partial_note(results: dict) -> list[str]:
    """The banner of a partial results file (bench/run.py::write_partial); nothing for a complete one."""
    partial = results.get("partial")
    if partial is None:
        return []
    left = ", ".join(partial["datasets_left"]) or "none"
    now = partial.get("in_progress")
    done = [d for d in results["datasets"] if not now or d != now["dataset"]]
    mid = f"; in progress: {now['dataset']} ({now['prompts_done']} of {now['prompts']} prompts, kept)" if now else ""
    return [f"**PARTIAL RESULTS**: datasets finished: {', '.join(done) or 'none'}{mid}; still to run: "
            f"{left}; shuffle test: {partial['shuffle_test']}; no plots. The bench was interrupted or is still "
            "running: a complete run overwrites this file.", ""]


def markdown(results: dict) -> str:
    title = "# FlashMap benchmark (PARTIAL)" if results.get("partial") else "# FlashMap benchmark"
    lines = [title, ""] + partial_note(results) + caption(results) + [""]
    if summary_table(results):
        lines += ["## Summary (γ, measured and projected speedup, lossless check)", ""] + summary_table(results) + [""]
    for name, rows in results["datasets"].items():
        gens = next(iter(rows.values()))["generations"]
        lines += [f"## {name} ({gens} generations)", ""] + method_table(rows) + [""]
    for title, body in (("Per-slot conditional acceptance", slot_table(results)),
                        ("Shuffle test (shared vs per-slot noise)", shuffle_table(results["shuffle"])),
                        ("Projected H200 speedup (a roofline projection, not a measurement)",
                         projection_table(results)),
                        ("Divergences from AR", divergence_lines(results))):
        if body:
            lines += [f"## {title}", ""] + body + [""]
    if not results.get("partial"):
        lines += ["Plots: ![acceptance by slot](acceptance_by_slot.png) ![γ by method](gamma_by_method.png) "
                  "![committed per round](gamma_hist.png)", ""]
    return "\n".join(lines)


#: the files `write_all` writes into --out (the plots: bench/plots.py)
RESULT_FILES = ("results.json", "results.md", "acceptance_by_slot.png", "gamma_by_method.png", "gamma_hist.png")


def write_tables(results: dict, out: Path) -> None:
    """results.json and results.md, no plots (alone: a partial run's, after each prompt, which also removes an
    earlier run's plots: they would sit beside tables of other settings). Each file is written whole to a
    temporary name and then renamed: an interrupt never leaves half a file."""
    out.mkdir(parents=True, exist_ok=True)
    if results.get("partial") is not None:
        for name in RESULT_FILES[2:]:
            (out / name).unlink(missing_ok=True)
    for name, text in (("results.json", json.dumps(results, indent=1, default=str) + "\n"),
                       ("results.md", markdown(results))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


def write_all(results: dict, out: Path) -> None:
    """results.json, results.md and the PNG plots (plots skipped with a note if matplotlib is missing)."""
    write_tables(results, out)
    try:
        from flashmap_ext.bench import plots
    except ImportError as err:
        print(f"[flashmap] plots skipped ({err}); pip install matplotlib")
        return
    plots.write_plots(results, out)
