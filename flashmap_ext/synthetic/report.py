"""The testbed's report: results.md (the tables of BENCHMARKS.md), a one-screen summary and the learning curves."""
from __future__ import annotations

import math

CEILINGS = {"independent_sampled": "ideal independent, sampled per slot",
            "independent_argmax": "ideal independent, argmax per slot",
            "joint_sampled": "ideal joint, one sample of the joint",
            "joint_greedy": "ideal joint, greedy chain", "joint_best": "best point-mass draft"}


def _fmt(cell: dict) -> str:
    g, iv = cell["gamma"], cell["interval"]
    if g is None or (isinstance(g, float) and math.isnan(g)):
        return "–"
    return f"{g:.3f}" + (f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "")


def _delta(pair) -> str:
    d, iv = pair
    return f"{d:+.3f}" + (f" [{iv[0]:+.3f}, {iv[1]:+.3f}]" if iv else "")


def markdown(r: dict) -> str:
    lines = [f"{r['prompts']} held-out sequences, {r['anchors']} anchors, K = {r['options']['block_size']}; "
             f"target held-out CE {r['target']['model_entropy']:.4f} vs language {r['target']['true_entropy']:.4f} "
             "nats/token. γ = 1 + mean accepted per round, verified by the language (95 % paired bootstrap "
             "over sequences). flow-n: the flow model (the teacher), n Euler steps; FlashMap-n: the distilled flow "
             f"map, n steps; data: {r['options'].get('data', 'sampled')}.", "",
             "| drafter | γ T=0 all | γ T=1 all | γ T=1 bimodal | γ T=0 forced | γ T=1 free |", "|---|---|---|---|---|---|"]
    rows = [(n, row) for n, row in r["rows"].items()] + [(CEILINGS[n], row) for n, row in r["ceilings"].items()]
    for name, row in rows:
        lines.append(f"| {name} | {_fmt(row['all/t0'])} | {_fmt(row['all/t1'])} | {_fmt(row['bimodal/t1'])} | "
                     f"{_fmt(row['forced/t0'])} | {_fmt(row['free/t1'])} |")
    lines += ["", "| paired Δγ | T=0 all | T=1 all | T=1 bimodal |", "|---|---|---|---|"]
    for name, d in r["deltas"].items():
        a, _, b = name.partition(" - ")
        lines.append(f"| {a} - {CEILINGS.get(b, b)} | {_delta(d['all/t0'])} | {_delta(d['all/t1'])} | "
                     f"{_delta(d['bimodal/t1'])} |")
    for name, d in r["shuffle"].items():
        lines.append(f"| shuffle {name} (shared − per-slot noise) | {_delta(d['all/t0'])} | {_delta(d['all/t1'])} | "
                     f"{_delta(d['bimodal/t1'])} |")
    lines += _tree_lines(r.get("trees") or {})
    lines += ["", "| per-slot acceptance P(slot j | slots < j), T=1 | " + " | ".join(
        f"{j + 1}" for j in range(r["options"]["block_size"])) + " |",
              "|---|" + "---|" * r["options"]["block_size"]]
    for name, row in r["rows"].items():
        lines.append(f"| {name} | " + " | ".join(f"{x:.2f}" for x in row["slots_t1"]) + " |")
    lines += ["", "| draws per prompt | draws | distinct drafts per bimodal anchor | bimodal anchors with 2 modes | "
                  "possible blocks |", "|---|---|---|---|---|"]
    for name, d in r["diversity"].items():
        lines.append(f"| {name} | {d['draws']} | {d['distinct_per_bimodal']:.2f} | {d['bimodal_with_two_modes']:.2f}"
                     f" | {d['possible_blocks']:.2f} |")
    lines += ["", "| learning curve (held-out γ T=1 at 1 step) | steps | γ | flattened (< 0.02 over the last doubling) |",
              "|---|---|---|---|"]
    for name, c in r["curves"].items():
        lines.append(f"| {name} | {', '.join(map(str, c['steps']))} | {', '.join(f'{g:.3f}' for g in c['gamma_t1'])}"
                     f" | {'yes' if c['flat'] else 'no'} |")
    if r.get("selected"):
        lines.append("\nmeasured at the checkpoint of best validation γ (T = 1, `--select best`): " + ", ".join(
            f"{name} step {p['step']} of {p['last']}" for name, p in r["selected"].items()))
    lines.append("\ntrainable parameters: " + ", ".join(f"{k} {v:,}" for k, v in r["parameters"].items()))
    return "\n".join(lines) + "\n"


def _tree_lines(trees: dict) -> list[str]:
    """The tree rows' table and their paired differences (none without tree rows)."""
    if not trees.get("rows"):
        return []
    lines = ["", f"| draft tree (depth K, top-{trees['topk']} per node, N nodes) | nodes per round | γ T=0 all | "
                 "γ T=1 all | γ T=0 bimodal | γ T=1 bimodal |", "|---|---|---|---|---|---|"]
    for name, row in trees["rows"].items():
        lines.append(f"| {name} | {row['nodes']:.1f} | {_fmt(row['all/t0'])} | {_fmt(row['all/t1'])} | "
                     f"{_fmt(row['bimodal/t0'])} | {_fmt(row['bimodal/t1'])} |")
    lines += ["", "| paired Δγ, tree − chain | T=0 all | T=1 all | T=0 bimodal | T=1 bimodal |", "|---|---|---|---|---|"]
    for name, d in trees["deltas"].items():
        lines.append(f"| {name} | {_delta(d['all/t0'])} | {_delta(d['all/t1'])} | {_delta(d['bimodal/t0'])} | "
                     f"{_delta(d['bimodal/t1'])} |")
    return lines


def summary(r: dict) -> dict:
    """γ (T = 0, T = 1) of every drafter, tree row and ideal drafter, pooled over all anchors."""
    both = {**r["rows"], **(r.get("trees") or {}).get("rows", {}), **r["ceilings"]}
    return {name: [round(row["all/t0"]["gamma"], 3), round(row["all/t1"]["gamma"], 3)] for name, row in both.items()}


def plot_curves(curves: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharex=True)
    for ax, key, temp in zip(axes, ("gamma_t0", "gamma_t1"), (0, 1)):
        for name, c in curves.items():
            if c.get(key):
                ax.plot(c["steps"], c[key], marker="o", markersize=3, label=name)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels overlap
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("optimizer step (map: distillation steps)")
        ax.set_ylabel(f"held-out γ, T = {temp} (1 step)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
