"""Checkpoint selection on the validation learning curve (`flashmap testbed run --select best`).

The learning curves (`measure.learning_curves`) score every kept checkpoint of a run on a validation set drawn
with its own seed, disjoint from the held-out set the table is measured on. `--select best` measures each run at
its checkpoint of highest validation γ at T = 1 (the exact expectation: the smoother of the two temperatures on
a small set; ties go to the later step, the one trained longer: a saturated curve selects the last) instead of at its last step, so that a run that falls late (the map's
distillation can) is measured where it stood best, as a user would keep it. Every run is selected by the same
rule, so the comparison stays at equal footing.
"""
from __future__ import annotations

from pathlib import Path

from flashmap_ext.train.snapshot import snapshot

CURVE_KEY = "gamma_t1"


def best_step(curve: dict, key: str = CURVE_KEY) -> int:
    """The step of the highest `curve[key]` (the latest of equal ones)."""
    steps, values = curve["steps"], curve[key]
    if not steps or len(steps) != len(values):
        raise ValueError(f"a curve needs as many steps as {key} values, at least one (got {len(steps)}, {len(values)})")
    i = max(range(len(steps)), key=lambda j: (values[j], steps[j]))
    return int(steps[i])


def select_checkpoints(runs: dict[str, Path], curves: dict, key: str = CURVE_KEY) -> tuple[dict[str, Path], dict]:
    """({name: run folder to measure}, {name: {"step", "last", key}}): each run with a curve at its best step. A
    run whose best step is its last is measured as exported; otherwise its checkpoint is written as a drafter to
    `<run>/selected/drafter` (`train.snapshot`) and that folder measured."""
    chosen, picked = {}, {}
    for name, run in runs.items():
        curve = curves.get(name)
        if not curve or not curve["steps"]:
            chosen[name] = run
            continue
        step, last = best_step(curve, key), int(curve["steps"][-1])
        picked[name] = {"step": step, "last": last, key: curve[key][curve["steps"].index(step)]}
        if step == last:
            chosen[name] = run
            continue
        snapshot(run, step, run / "selected" / "drafter")
        chosen[name] = run / "selected"
    return chosen, picked
