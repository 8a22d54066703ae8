"""Bench rows of the draft shapes (lookup, block-drafter trees, --auto) and their projected H200 speedups.

- lookup: prompt lookup through this library's loop (`LookupDrafter(None)`, transformers' rule, 10 tokens).
- lookup + FlashMap-1 / lookup + DFlash: the hybrid, chain rounds (n-gram continuation where one
  matches, the drafter's block otherwise).
- FlashMap-1 multi-noise N=2 / N=4: N noise draws merged into a prefix tree of at most 16 nodes.
- FlashMap-1 top-k 8 / 16 / 32, DFlash top-k 16 / 32: top-4-per-slot trees of 8 / 16 / 32 nodes.
- DFlash2 (a --dflash checkpoint that is DFlash2): top-k 16 / 32 (its unary marginals) and selector 16 / 32
  (its selector's edge scores, block_tree.SelectorTreeDrafter), top-4 per node.
- auto: `AutoDrafter` around FlashMap-1 (or lookup alone), shape (lookup, chain, top-k tree and its node
  budget, two branches) picked per round from the cost table measured on this machine (draft_shapes/calibrate.py,
  cached; `--recalibrate` measures again).
"""
from __future__ import annotations

from flashmap_ext.bench.metrics import Method
from flashmap_ext.draft_shapes.block_tree import MultiNoiseDrafter, SelectorTreeDrafter, TopKTreeDrafter
from flashmap_ext.draft_shapes.cost_model import H200_QWEN3_8B, projected_speedup
from flashmap_ext.draft_shapes.lookup import LookupDrafter
from flashmap_ext.tree import TreeSpec


def shape_methods(flashmap1=None, dflash=None) -> list[Method]:
    """The shape rows for a FlashMap-1 drafter (a StepsDrafter) and/or a DFlash drafter (None: skipped)."""
    rows = [Method("lookup", LookupDrafter(None))]
    if flashmap1 is not None:
        k = flashmap1.num_draft_tokens
        rows += [Method("lookup + FlashMap-1", LookupDrafter(flashmap1)),
                 Method("FlashMap-1 multi-noise N=2", MultiNoiseDrafter(flashmap1), TreeSpec(k, 2, 16)),
                 Method("FlashMap-1 multi-noise N=4", MultiNoiseDrafter(flashmap1), TreeSpec(k, 4, 16)),
                 Method("FlashMap-1 top-k 8", TopKTreeDrafter(flashmap1), TreeSpec(min(k, 8), 4, 8)),
                 Method("FlashMap-1 top-k 16", TopKTreeDrafter(flashmap1), TreeSpec(k, 4, 16)),
                 Method("FlashMap-1 top-k 32", TopKTreeDrafter(flashmap1), TreeSpec(k, 4, 32))]
    if dflash is not None and hasattr(dflash, "candidate_selector"):
        k = dflash.num_draft_tokens
        rows += [Method("lookup + DFlash2", LookupDrafter(dflash))]
        rows += [Method(f"DFlash2 {kind} {n}", cls(dflash), TreeSpec(k, 4, n))
                 for kind, cls in (("top-k", TopKTreeDrafter), ("selector", SelectorTreeDrafter)) for n in (16, 32)]
    elif dflash is not None:
        k = dflash.num_draft_tokens
        rows += [Method("lookup + DFlash", LookupDrafter(dflash))]
        rows += [Method(f"DFlash top-k {n}", TopKTreeDrafter(dflash), TreeSpec(k, 4, n)) for n in (16, 32)]
    return rows


def auto_methods(target, flashmap1=None, refresh: bool = False) -> list[Method]:
    """The `auto` row: AutoDrafter around `flashmap1` (or prompt lookup alone) with this machine's costs
    (the cached table, or measured again with `refresh`)."""
    from flashmap_ext.draft_shapes.auto import AutoDrafter
    from flashmap_ext.draft_shapes.calibrate import load_or_calibrate
    auto = AutoDrafter(flashmap1, load_or_calibrate(target, flashmap1, refresh=refresh))
    print(f"[flashmap] {auto.explain()}")
    return [Method("auto", auto, auto.tree_spec())]


def draft_calls(method: Method) -> float:
    """Drafter calls per round of a method (0 without a neural drafter; N for multi-noise trees)."""
    d = method.drafter
    if d is None or isinstance(d, str):
        return 0.0
    if isinstance(d, MultiNoiseDrafter):
        return float(method.tree.topk)
    if isinstance(d, LookupDrafter) and d.inner is None:
        return 0.0
    return 1.0


#: a target below this many parameters is a test double (tiny-random, a stub): its γ says nothing about a
#: Qwen3-8B on an H200, so no projection is made from it
PROJECTABLE_PARAMS = 100_000_000


def projection_skipped(target) -> str | None:
    """Why an H200 projection from runs on `target` (a Target) would be meaningless, or None when it is not."""
    n = sum(p.numel() for p in target.model.parameters())
    if n >= PROJECTABLE_PARAMS:
        return None
    return (f"no H200 projection: the target has {n / 1e6:.2f} M parameters (under {PROJECTABLE_PARAMS / 1e6:.0f} M: "
            f"a test double, whose γ says nothing about Qwen3-8B on an H200)")


def projections(methods: list[Method], records: list) -> dict:
    """{method: {dataset: projected H200 speedup}} from each method's measured γ and mean draft nodes per
    round under `H200_QWEN3_8B` (HF peers and AR skipped)."""
    table = H200_QWEN3_8B.table()
    out: dict = {}
    for m in methods:
        if isinstance(m.drafter, str) or m.drafter is None:
            continue
        for name in dict.fromkeys(r.dataset for r in records):
            recs = [r for r in records if r.method == m.name and r.dataset == name]
            rounds = sum(len(r.accepted) for r in recs)
            if not rounds:
                continue
            gamma = (sum(sum(r.accepted) for r in recs) + rounds) / rounds
            nodes = sum(sum(r.drafted) for r in recs) / rounds
            out.setdefault(m.name, {})[name] = projected_speedup(gamma, nodes, table, draft_calls(m))
    return out
