"""`flashmap eval ablation`: the table of an ablation run (research/ablate.sh) as Markdown: one row per arm
(RUN/<arm>/arm.json + RUN/<arm>/eval/eval.json), in the order the arms ran.

    flashmap eval ablation runs/ablate [--baseline flow] > table.md

Columns: the arm and its flags, steps and training wall time, held-out slot-1 accuracy per domain, slots 1-4
over all anchors, implied γ per domain and overall (Δγ against --baseline), draft-vocabulary coverage.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from flashmap_ext.evaluate.report import figure


def load_arms(run: Path) -> list[dict]:
    """[{arm, kind, flags, steps, train_seconds, name, result}] of every arm with both files, by finish time."""
    arms = []
    for meta_path in run.glob("*/arm.json"):
        eval_path = meta_path.parent / "eval" / "eval.json"
        if not eval_path.exists():
            continue
        meta = json.loads(meta_path.read_text())
        report = json.loads(eval_path.read_text())
        (name, result), = report["results"].items()
        arms.append({**meta, "name": name, "result": result, "mtime": eval_path.stat().st_mtime})
    return sorted(arms, key=lambda a: a["mtime"])


def markdown(arms: list[dict], baseline: str | None = None) -> str:
    """The table; raises ValueError when --baseline names no finished arm."""
    base = next((a for a in arms if a["arm"] == baseline), None)
    if baseline is not None and base is None:
        raise ValueError(f"--baseline {baseline!r}: no finished arm of that name ({[a['arm'] for a in arms]})")
    lines = ["| arm | flags | steps | train min | slot 1 math / code / chat | slots 1–4 (all) | "
             "γ implied math / code / chat / all | Δγ all | vocab cover |",
             "|---|---|---|---|---|---|---|---|---|"]
    for a in arms:
        r = a["result"]
        doms = [d for d in ("math", "code", "chat") if d in r]
        slot1 = " / ".join(figure(r[d]["slot_accuracy"][0]) for d in doms)
        first4 = " ".join(f"{x:.3f}".lstrip("0") for x in r["all"]["slot_accuracy"][:4])
        gammas = " / ".join(figure(r[d]["gamma"]) for d in [*doms, "all"])
        delta = "" if base is None else f"{r['all']['gamma'] - base['result']['all']['gamma']:+.3f}"
        minutes = "" if a.get("train_seconds") is None else f"{a['train_seconds'] / 60:.1f}"
        flags = f"{a['kind']} {a['flags']}".strip()
        lines.append(f"| {a['arm']} | `{flags}` | {a['steps']} | {minutes} | {slot1} | {first4} | {gammas} | "
                     f"{delta} | {figure(r.get('draft_vocab_coverage', float('nan')))} |")
    return "\n".join(lines) + "\n"


def add_arguments(p) -> None:
    p.add_argument("run", type=Path, help="the RUN folder of the ablation (one sub-folder per arm)")
    p.add_argument("--baseline", default="flow", help="arm the Δγ column is measured against (default flow)")


def run(args) -> int:
    """Prints the table; ValueError naming RUN when no arm has finished."""
    arms = load_arms(args.run)
    if not arms:
        raise ValueError(f"{args.run}: no finished arm (arm.json + eval/eval.json)")
    has_base = any(a["arm"] == args.baseline for a in arms)
    sys.stdout.write(markdown(arms, args.baseline if has_base else None))
    return 0
