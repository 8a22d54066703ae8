"""Held-out learning curves and the testbed's table data (DESIGN.md §13; definitions in synthetic/testbed.py)."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from flashmap_ext.bench.methods import (
    BestOfDrafter,
    MarginalArgmaxDrafter,
    NoiseMeanDrafter,
    PerSlotNoiseDrafter,
    StepsDrafter,
)
from flashmap_ext.drafters.load import load_drafter
from flashmap_ext.evaluate.heldout import add_taps
from flashmap_ext.synthetic.language import Language
from flashmap_ext.synthetic.target import load_spec
from flashmap_ext.synthetic.testbed import (
    KINDS,
    ceiling_tallies,
    drafter_drafts,
    draw_diversity,
    gamma_interval,
    heldout_sequences,
    paired_delta,
    score_drafts,
)
from flashmap_ext.synthetic.trees import NODES, TOPK, tree_drafters, tree_tallies
from flashmap_ext.target.load import load_target

FLAT = 0.02  # a curve has flattened when its held-out γ (T = 1) moves < 0.02 over the last doubling of steps


def flattened(steps: list[int], gamma: list[float], tol: float = FLAT) -> bool:
    """True when |γ(last) − γ(half)| < tol, γ(half) the point with the most steps ≤ half the last's; False
    without such a point (a curve needs at least one doubling)."""
    half = [i for i, s in enumerate(steps) if 2 * s <= steps[-1]] if steps else []
    return bool(half) and abs(gamma[-1] - gamma[half[-1]]) < tol


def _drafters(runs: dict[str, Path], target, draws: int, probes: bool = True) -> dict:
    """{row name: drafter} of the table for the runs present: the flow model's one Euler step (the control) and
    two steps (the target distillation's 0 → 1 jumps start from), the distilled map at 1 and 2 steps, both 1-step
    drafters from the noise mean z = 0, the mode-seeking 1-step drafters (best of `draws` noise draws by the
    drafter's own probabilities; the map's per-slot marginal argmax over `draws` draws), DFlash, DFlash2 (its
    selector's greedy walk, and its best path through the block's top-k lattice) and EAGLE-3; without `probes`
    no z = 0 rows."""
    out = {}
    for name, label in (("flow", "flow"), ("map", "FlashMap")):
        if name in runs:
            d = load_drafter(str(runs[name] / "drafter"), target, "flashmap", dtype=torch.float32)
            out.update({f"{label}-1": StepsDrafter(d, 1), f"{label}-2": StepsDrafter(d, 2),
                        f"{label}-1 best-of-{draws}": BestOfDrafter(d, 1, draws)})
            if probes:
                out[f"{label}-1 z=0"] = NoiseMeanDrafter(d, 1)
            if name == "map":
                out[f"FlashMap-1 marginal argmax x{draws}"] = MarginalArgmaxDrafter(d, 1, draws)
    for name, label in (("dflash", "DFlash"), ("dflash2", "DFlash2"), ("eagle3", "EAGLE-3")):
        if name in runs:
            out[label] = load_drafter(str(runs[name] / "drafter"), target, name, dtype=torch.float32)
    if "dflash2" in runs:
        out["DFlash2 best path"] = load_drafter(str(runs["dflash2"] / "drafter"), target, "dflash2",
                                                dtype=torch.float32)
        out["DFlash2 best path"].path = "best"
    return out


def _pairs(names, draws: int) -> list[tuple[str, str]]:
    """The paired differences of the table whose rows are present."""
    best, marg = f"best-of-{draws}", f"marginal argmax x{draws}"
    pairs = [("FlashMap-1", "DFlash"), ("FlashMap-2", "FlashMap-1"), ("FlashMap-2", "DFlash"), ("flow-1", "DFlash"),
             ("FlashMap-1", "flow-1"), ("flow-2", "flow-1"), ("flow-1 z=0", "flow-1"), ("FlashMap-1 z=0", "FlashMap-1"),
             (f"FlashMap-1 {best}", "FlashMap-1"), (f"FlashMap-1 {marg}", "FlashMap-1"), (f"flow-1 {best}", "flow-1"),
             (f"FlashMap-1 {best}", "DFlash"), (f"flow-1 {best}", "DFlash"), (f"FlashMap-1 {best}", "flow-1"),
             ("FlashMap-1", "independent_sampled"), ("FlashMap-1", "independent_argmax"), ("DFlash2", "DFlash"),
             ("DFlash2 best path", "DFlash2"), ("DFlash2", "independent_argmax"), ("DFlash", "independent_argmax"),
             ("FlashMap-1", "DFlash2"), ("FlashMap-2", "DFlash2")]
    return [(a, b) for a, b in pairs if a in names and b in names]


def _setup(target_dir: Path, prompts: int, seed: int, data: str):
    target, _ = load_target(str(target_dir), dtype="fp32", device="cpu")
    lang = Language(load_spec(target_dir))
    seqs = heldout_sequences(lang, prompts, seed, data)
    add_taps(target, seqs, [1, 2, 3])
    return target, lang, seqs


def learning_curves(target_dir: Path, runs: dict[str, Path], opts: dict, seed: int) -> dict:
    """{run: {"steps", "gamma_t0", "gamma_t1", "slot1": [...], "flat": bool (`flattened`)}} on a small held-out
    set (8 sequences, every 3rd anchor) at each saved checkpoint (the testbed keeps them all); flow and map
    drafted at 1 step."""
    target, lang, seqs = _setup(target_dir, 8, seed, opts.get("data", "sampled"))
    k, out = opts["block_size"], {}
    for name, run in runs.items():
        kind = {"flow": "flashmap", "map": "flashmap"}.get(name, name)
        drafter = load_drafter(str(run / "drafter"), target, kind, dtype=torch.float32)
        probe = StepsDrafter(drafter, 1) if kind == "flashmap" else drafter
        curve = {"steps": [], "gamma_t0": [], "gamma_t1": [], "slot1": []}
        for ckpt in sorted((run / "checkpoints").glob("step-*[0-9]")):
            drafter.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=False)
            drafter.drop_packed() if hasattr(drafter, "drop_packed") else None
            tally = score_drafts(lang, seqs, drafter_drafts(probe, seqs, k, 3), k)
            curve["steps"].append(int(ckpt.name.split("-")[1]))
            curve["gamma_t0"].append(float(tally.gamma("all", 0)))
            curve["gamma_t1"].append(float(tally.gamma("all", 1)))
            curve["slot1"].append(float(tally.slot_rates("all", 0)[0]))
        curve["flat"] = flattened(curve["steps"], curve["gamma_t1"])
        out[name] = curve
    return out


def _row(tally) -> dict:
    row = {}
    for kind in KINDS:
        for t in (0, 1):
            row[f"{kind}/t{t}"] = {"gamma": float(tally.gamma(kind, t)), "interval": gamma_interval(tally, kind, t)}
    row["slots_t0"], row["slots_t1"] = tally.slot_rates("all", 0), tally.slot_rates("all", 1)
    return row


def measure(target_dir: Path, runs: dict[str, Path], opts: dict, seed: int) -> dict:
    """The table's data: rows per drafter and ideal drafter, paired differences, the tree rows of opts["trees"]
    (`_tree_section`), and with opts["probes"] (default) the z = 0 rows, the shuffle test and the draw diversity."""
    target, lang, seqs = _setup(target_dir, opts["prompts"], seed, opts.get("data", "sampled"))
    k, stride, draws = opts["block_size"], opts["stride"], opts.get("mode_draws", 8)
    probes = opts.get("probes", True)
    drafters = _drafters(runs, target, draws, probes)
    drafts = {name: drafter_drafts(d, seqs, k, stride) for name, d in drafters.items()}
    tallies = {name: score_drafts(lang, seqs, d, k) for name, d in drafts.items()}
    ceilings = ceiling_tallies(lang, seqs, k, stride)
    shuffle, diversity = {}, {}
    for steps in (1, 2) if "FlashMap-1" in drafters and probes else ():
        fmap, name = drafters["FlashMap-1"].inner, f"FlashMap-{steps}"
        per_slot = score_drafts(lang, seqs, drafter_drafts(PerSlotNoiseDrafter(fmap, steps), seqs, k, stride), k)
        shuffle[name] = {f"{kind}/t{t}": paired_delta(tallies[name], per_slot, kind, t)
                         for kind in ("all", "bimodal") for t in (0, 1)}
        draws_ = [drafts[name]] + [drafter_drafts(StepsDrafter(fmap, steps), seqs, k, stride, seed=s)
                                   for s in range(1, opts["draws"])]
        diversity[name] = draw_diversity(lang, seqs, draws_)
    pool = {**tallies, **ceilings}  # the ideal drafters score the same anchors: claim (i) is a paired Δ too
    deltas = {f"{a} - {b}": {f"{kind}/t{t}": paired_delta(pool[a], pool[b], kind, t)
                             for kind in KINDS for t in (0, 1)} for a, b in _pairs(pool, draws)}
    params = {name: sum(p.numel() for p in getattr(d, "inner", d).parameters() if p.requires_grad)
              for name, d in drafters.items()}
    out = {"rows": {name: _row(t) for name, t in tallies.items()},
           "ceilings": {name: _row(t) for name, t in ceilings.items()},
           "deltas": deltas, "shuffle": shuffle, "diversity": diversity, "parameters": params,
           "anchors": int(sum(t.counts("all", 0)[:, 1].sum() for t in list(tallies.values())[:1])),
           "prompts": len(seqs)}
    out["trees"] = _tree_section(lang, seqs, drafters, tallies, opts)
    return out


def _tree_section(lang, seqs, drafters: dict, chains: dict, opts: dict) -> dict:
    """The tree rows (synthetic/trees.py) of opts["trees"] node counts (default NODES; () for none) with their
    paired differences against their own chain row and, for DFlash2, selector minus top-k at equal N."""
    nodes, k = tuple(opts.get("trees", NODES)), opts["block_size"]
    rows = tree_drafters(drafters, nodes, k) if nodes else {}
    scored = tree_tallies(lang, seqs, rows, k, opts["stride"])
    pool = {**chains, **{name: r["tally"] for name, r in scored.items()}}
    pairs = [(name, base) for name, (_, _, base) in rows.items()]
    pairs += [(name, name.replace(" selector ", " top-k ")) for name in rows if " selector " in name]
    return {"nodes": list(nodes), "topk": TOPK,
            "rows": {name: {**_row(r["tally"]), "nodes": r["nodes"]} for name, r in scored.items()},
            "deltas": {f"{a} - {b}": {f"{kind}/t{t}": paired_delta(pool[a], pool[b], kind, t)
                                      for kind in KINDS for t in (0, 1)} for a, b in pairs}}
