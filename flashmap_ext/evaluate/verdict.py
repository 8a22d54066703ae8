"""`flashmap eval verdict`: does one piece of a long run (recipes/long_run.sh) beat the committed checkpoint
on held-out?

    flashmap eval verdict RUN KIND INIT --history HISTORY.json

Reads RUN/eval-KIND/eval.json (`flashmap eval` of drafters "piece" and "committed"), RUN/KIND.piece.json and
the committed weights' training history (HISTORY.json: steps and core-hours per kind; a piece warm-started from
an uncommitted piece that beat carries that piece's own totals as "past" in its record instead); prints the held-out implied γ of both with a 95 % interval of the
difference and appends one learning-curve line (a piece recorded with "warm_start": false, the map distilled
from a new teacher, counts only its own steps and hours: its teacher's are on the flow's curve) to RUN/curve-KIND.jsonl. The interval treats anchors as
independent (anchors of one sequence are correlated, so it is too narrow rather than too wide); "beats"
needs the whole interval above 0, else the piece "ties" or is "worse" and is not committed.
"""
from __future__ import annotations

import json
import math
import os


def gamma_and_var(entry: dict) -> tuple[float, float]:
    """(implied γ, variance of its mean) from an eval entry's run-length histogram over its anchors."""
    hist, n = entry["run_histogram"], entry["anchors"]
    mean = sum(r * p for r, p in enumerate(hist))
    second = sum(r * r * p for r, p in enumerate(hist))
    return 1.0 + mean, max(second - mean * mean, 0.0) / max(n, 1)


def verdict(piece: dict, committed: dict) -> dict:
    """Δγ (piece − committed) over all domains with its 95 % interval, and the verdict word."""
    g1, v1 = gamma_and_var(piece["all"])
    g0, v0 = gamma_and_var(committed["all"])
    half = 1.96 * math.sqrt(v1 + v0)
    delta = g1 - g0
    word = "beats" if delta - half > 0 else ("worse" if delta + half < 0 else "ties")
    return {"gamma_piece": g1, "gamma_committed": g0, "delta": delta, "interval": [delta - half, delta + half],
            "verdict": word}


def piece_core_s(piece: dict) -> float:
    """Core seconds a piece cost: its training's CPU time (user + sys; `cpu_s`, recorded since 2026-12-04, the
    budget even on a shared core) where recorded, else its wall time on the pinned core (older pieces)."""
    return float(piece["cpu_s"]) if "cpu_s" in piece else float(piece["wall_s"])


def piece_epochs(piece: dict) -> dict:
    """Passes over the training sequences the piece made (steps x batch / sequences), where recorded."""
    if not piece.get("sequences"):
        return {}
    return {"corpus_sequences": piece["sequences"],
            "piece_epochs": round(piece["piece_steps"] * piece["batch_size"] / piece["sequences"], 3)}


def judge(run: str, kind: str, init: str, history: str) -> int:
    """Prints the verdict line and appends the piece's learning-curve line to RUN/curve-KIND.jsonl."""
    with open(os.path.join(run, f"eval-{kind}", "eval.json")) as f:
        ev = json.load(f)
    with open(os.path.join(run, f"{kind}.piece.json")) as f:
        piece = json.load(f)
    past = {"steps": 0, "core_hours": 0.0}  # a fresh student (the map of a new teacher) starts at zero
    if "past" in piece:  # continues an uncommitted piece (recipes/long_run.sh FROM=): its own curve totals
        past = piece["past"]
    elif piece.get("warm_start", True):
        with open(history) as f:
            past = json.load(f)[piece.get("history_kind", kind)]  # dflash2 starts from the committed DFlash
    out = verdict(ev["results"]["piece"], ev["results"]["committed"])
    slot1 = {d: ev["results"]["piece"][d]["slot_accuracy"][0] for d in ("math", "code", "chat", "all")}
    line = {"kind": kind, "cumulative_steps": past["steps"] + piece["piece_steps"],
            "core_hours": round(past["core_hours"] + piece_core_s(piece) / 3600, 3),
            "piece_wall_s": piece["wall_s"], "slot1": slot1, **piece_epochs(piece),
            "gamma": out["gamma_piece"], "committed_gamma": out["gamma_committed"], "verdict": out["verdict"],
            "date": ev["meta"]["date"], "dtype": ev["meta"]["dtype"], "cpu": ev["meta"]["cpu"],
            "bf16_hw": ev["meta"]["bf16_hw"], "warm_start": init}
    with open(os.path.join(run, f"curve-{kind}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
    lo, hi = out["interval"]
    print(f"{kind}: held-out γ piece {out['gamma_piece']:.3f} vs committed {out['gamma_committed']:.3f}: "
          f"Δ {out['delta']:+.3f} [{lo:+.3f}, {hi:+.3f}] → {out['verdict']}"
          + (" (commit it: checkpoints/README.md 'Adding a checkpoint')" if out["verdict"] == "beats" else
             " (not committed)"))
    return 0


def add_arguments(p) -> None:
    p.add_argument("run", help="the long run's folder (RUN of recipes/long_run.sh)")
    p.add_argument("kind", choices=("dflash", "dflash2", "flow", "map"), help="the piece's drafter kind")
    p.add_argument("init", help="the checkpoint the piece started from (recorded in the curve line; its training "
                   "history is the piece record's \"past\" where given, else HISTORY's entry for the record's "
                   "history_kind, else KIND's)")
    p.add_argument("--history", required=True,
                   help="training history of the committed weights (JSON: {kind: {steps, core_hours}})")


def run(args) -> int:
    return judge(args.run, args.kind, args.init, args.history)
