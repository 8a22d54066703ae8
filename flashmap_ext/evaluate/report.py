"""eval.json, eval.md (one table) and eval.png (accuracy by slot, one panel per domain) for `flashmap eval`."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

SKIP_HINT = "pip install '.[bench]' adds matplotlib"


def plot_or_skip(draw: Callable[[dict, Path], None], data: dict, path: Path) -> bool:
    """draw(data, path) and True; without matplotlib (a plain `pip install .`) one line on stderr that the
    plot was skipped and why, and False: the command's tables are written all the same."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        print(f"{path} skipped: {err} ({SKIP_HINT})", file=sys.stderr)
        return False
    draw(data, path)
    return True


def figure(x: float | None, spec: str = ".3f") -> str:
    """A figure of a summary row as text: "no anchors" for None (nothing was scored: undefined, not 0)."""
    return "no anchors" if x is None else format(x, spec)


def markdown(report: dict) -> str:
    """The results as a Markdown table, with the command, machine, dtype and date under it."""
    meta, res = report["meta"], report["results"]
    k = max(len(r["all"]["slot_accuracy"]) for r in res.values())
    shown = min(k, 4)
    head = "| drafter | domain | anchors | " + " | ".join(f"slot {i + 1}" for i in range(shown)) + " | γ implied |"
    lines = [head, "|" + "---|" * (shown + 4)]
    for name, r in res.items():
        for dom, s in r.items():
            if not isinstance(s, dict):
                continue
            accs = s["slot_accuracy"][:shown]
            accs = " | ".join([figure(a) for a in accs] + ["–"] * (shown - len(accs)))  # fewer slots: "–" cells
            lines.append(f"| {name} | {dom} | {s['anchors']} | {accs} | {figure(s['gamma'])} |")
    if k > shown:
        lines += ["", f"Slots {shown + 1}–{k}: eval.json (slot_accuracy) and eval.png; γ implied counts all {k}."]
    cover = ", ".join(f"{n} {figure(r['draft_vocab_coverage'])}" for n, r in res.items() if "draft_vocab_coverage" in r)
    if cover:
        lines += ["", f"Share of slot-1 labels inside each drafter's draft vocabulary (the rest can never be "
                      f"accepted): {cover}."]
    held = ", ".join(f"{d} {v['sequences']} seq / {v['answer_tokens']} answer tokens"
                     for d, v in report["heldout"].items())
    lines += ["", f"Held-out set: {held} ({meta['heldout']}); target greedy agrees with the held-out answer "
              f"tokens at {report['target_greedy_agreement']:.4f} of positions.",
              f"Command: `{meta['command']}`; target {meta['target']} in {meta['dtype']}; {meta['cpu']}"
              f"{' (avx512_bf16)' if meta['bf16_hw'] else ' (AVX2, no avx512_bf16)'}, {meta['torch_threads']} "
              f"torch thread(s); {meta['date']}."]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """Top-1 accuracy by slot, one line per drafter, one panel per domain (and all)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    res = report["results"]
    domains = [d for d in next(iter(res.values())) if isinstance(next(iter(res.values()))[d], dict)]
    fig, axes = plt.subplots(1, len(domains), figsize=(4 * len(domains), 3.4), sharey=True, squeeze=False)
    for ax, dom in zip(axes[0], domains):
        for name, r in res.items():
            if not r[dom]["anchors"]:
                continue  # nothing scored in this domain: no line
            acc = r[dom]["slot_accuracy"]
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{name} (γ {r[dom]['gamma']:.2f})")
        ax.set_title(dom)
        ax.set_xlabel("slot")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "no anchors", ha="center", va="center", transform=ax.transAxes)
    axes[0][0].set_ylabel("teacher-forced top-1 accuracy")
    meta = report["meta"]
    fig.suptitle(f"held-out accuracy by slot — {meta['target']} {meta['dtype']}, {meta['cpu']}, "
                 f"{meta['date'][:10]}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(report: dict, out: Path) -> list[Path]:
    """Writes eval.json (strict JSON: an undefined figure is null, a NaN is refused), eval.md and eval.png
    (skipped without matplotlib: `plot_or_skip`) into `out` (created); returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "eval.json", out / "eval.md", out / "eval.png"]
    paths[0].write_text(json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    paths[1].write_text(markdown(report))
    return paths if plot_or_skip(plot, report, paths[2]) else paths[:2]
