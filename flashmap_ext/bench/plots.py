"""PNG plots of a benchmark run (matplotlib, headless): acceptance by slot (tree rows: by depth, dashed),
γ by method, γ histogram. Every figure's footer names the command, machine and date."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from flashmap_ext.bench.machine import summary_line  # noqa: E402


def _footer(fig, results: dict) -> None:
    meta = results["meta"]
    fig.text(0.01, 0.005, f"{meta['command']}\n{summary_line(meta)}; dtype {meta['dtype']}; "
             f"T={results['config']['temperature']}", fontsize=6, color="gray", va="bottom")
    fig.tight_layout(rect=(0, 0.06, 1, 1))


def _drafters(results: dict) -> list[str]:
    return [m for m in results["methods"] if any(rows[m]["slot_acceptance"] for rows in results["datasets"].values())]


def acceptance_by_slot(results: dict, path: Path) -> None:
    names, trees = list(results["datasets"]), results.get("trees", {})
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names) + 1, 3.2), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], names):
        for method in _drafters(results):
            acc = results["datasets"][name][method]["slot_acceptance"]
            ax.plot(range(1, len(acc) + 1), acc, marker="o", ms=3, label=method, ls="--" if method in trees else "-")
        ax.set_title(name), ax.set_xlabel("slot (tree rows: depth)" if trees else "slot"), ax.set_ylim(0, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][0].set_ylabel("P(accept | previous accepted)")
    axes[0][-1].legend(fontsize=7)
    _footer(fig, results)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def gamma_by_method(results: dict, path: Path) -> None:
    names, methods = list(results["datasets"]), _drafters(results)
    fig, ax = plt.subplots(figsize=(1.2 * len(names) * max(1, len(methods)) / 2 + 3, 3.4))
    width = 0.8 / max(1, len(methods))
    for j, method in enumerate(methods):
        gammas = [results["datasets"][n][method]["gamma"] for n in names]
        ax.bar([i + j * width for i in range(len(names))], [0 if math.isnan(g) else g for g in gammas],
               width, label=method)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
    ax.set_ylabel("γ (tokens per target forward)")
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.legend(fontsize=7)
    _footer(fig, results)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def gamma_histogram(results: dict, path: Path) -> None:
    """Share of rounds by tokens committed, all datasets pooled."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for method in _drafters(results):
        hist: dict[int, int] = {}
        for rows in results["datasets"].values():
            for committed, count in enumerate(rows[method]["committed_histogram"]):
                hist[committed] = hist.get(committed, 0) + count
        total, xs = sum(hist.values()) or 1, range(1, max(hist, default=0) + 1)
        ax.plot(xs, [hist.get(x, 0) / total for x in xs], marker="o", ms=3, label=method)
    ax.set_xlabel("tokens committed in a round (bonus included)"), ax.set_ylabel("share of rounds")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    _footer(fig, results)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(results: dict, out: Path) -> None:
    acceptance_by_slot(results, out / "acceptance_by_slot.png")
    gamma_by_method(results, out / "gamma_by_method.png")
    gamma_histogram(results, out / "gamma_hist.png")
