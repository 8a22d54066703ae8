"""Draft trees in the testbed (DESIGN.md §13): the bench's tree rows, scored exactly against the language.

The tree round (`flashmap_ext/tree.py::tree_accept`) verifies a tree of point-mass drafts by sequential
multi-draft speculative sampling: at a node with target distribution p and children x_1 … x_m tried in order,
x_i is accepted iff u_i < p_i(x_i), p_i being p with x_1 … x_{i−1} set to 0 and renormalised; if none is, a
sample of the rest is emitted. For distinct children, x_i is accepted with probability
Π_{j<i} (1 − p_j(x_j)) · p_i(x_i) = (1 − Σ_{j<i} p(x_j)) · p(x_i) / (1 − Σ_{j<i} p(x_j)) = p(x_i): the walk
descends exactly as a sample of p would. A node v is therefore reached with probability
Π_{edges e on the root→v path} p(token of e | the path before it), and per round

    T = 1:  accepted = Σ_v Π_{e on root→v} p(e)     (exact expectation over the verifier's coins)
    T = 0:  accepted = the depth of the root path that follows the greedy chain (the target's argmax at each
            node, lowest id on ties, as `tree_accept` at T = 0)

with the bonus token not included, as the chain rows count: γ = 1 + ΣA / ΣR. A token repeated among one node's
children is never accepted after its first copy (its p was set to 0), so only the first copy and its subtree
count. The slot sums of `Tally` hold P(accepted ≥ j) = Σ_{v at depth j} Π p (T = 1) and [accepted ≥ j] (T = 0).

The trees are those the bench drafts (`bench/shapes.py`): top-k trees (`TopKTreeDrafter`) over a block
drafter's per-slot distributions and DFlash2's selector trees (`SelectorTreeDrafter`), TreeSpec(K, 4, N). A
FlashMap block is drafted from one noise draw (the request seed's, as the chain row's), so its tree is fixed
given the round, as a DFlash tree is. Multi-noise trees (`MultiNoiseDrafter`) are refused: the expectation
over their several noise draws is not what this computes.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from flashmap_ext.draft_shapes.block_tree import MultiNoiseDrafter, SelectorTreeDrafter, TopKTreeDrafter
from flashmap_ext.drafters.common.base import TreeSpec
from flashmap_ext.evaluate.heldout import iter_trees
from flashmap_ext.synthetic.ceilings import argmax
from flashmap_ext.synthetic.language import Language, Parser
from flashmap_ext.synthetic.testbed import Tally, anchor_kind

NODES = (16, 32)    # the bench's tree sizes (`flashmap testbed run --trees`)
TOPK = 4            # children per expanded node, as the bench's trees
BASES = ("flow-1", "FlashMap-1", "DFlash", "DFlash2")  # the chain rows that get top-k trees
SELECTOR = "DFlash2"  # the chain row that also gets selector trees


def _children(parents) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for node, parent in enumerate(parents):
        out[int(parent)].append(node)
    return out


def _depths(parents) -> list[int]:
    depths: list[int] = []
    for node, parent in enumerate(parents):
        if not -1 <= parent < node:
            raise ValueError(f"parents: node {node} has parent {parent} (expected -1 or an earlier node)")
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def tree_accepted(parser: Parser, state, tokens, parents, k: int) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(accepted at T = 0, expected accepted at T = 1, [k] P(accepted ≥ j) at T = 0, the same at T = 1) of one
    tree after the anchor `state`: tokens / parents [N] (parents −1 or an earlier node, as `DraftTree`)."""
    tokens, parents = [int(t) for t in tokens], [int(p) for p in parents]
    depths = _depths(parents)
    if depths and max(depths) > k:
        raise ValueError(f"tree: {max(depths)} levels deep, more than k = {k}")
    children = _children(parents)
    reach0, reach1 = np.zeros(k), np.zeros(k)
    node, s, depth = -1, state, 0
    while True:  # T = 0: the greedy walk
        best = argmax(parser.probs(s))
        node = next((c for c in children[node] if tokens[c] == best), None)
        if node is None:
            break
        reach0[depth] = 1.0
        s, depth = parser.lang.step(s, best), depth + 1
    stack = [(-1, state, 1.0)]
    while stack:  # T = 1: every reachable node with its path probability
        node, s, mass = stack.pop()
        probs, seen = parser.probs(s), set()
        for c in children[node]:
            tok = tokens[c]
            p = probs.get(tok, 0.0) if tok not in seen else 0.0
            seen.add(tok)
            if p > 0:
                reach1[depths[c] - 1] += mass * p
                stack.append((c, parser.lang.step(s, tok), mass * p))
    return float(reach0.sum()), float(reach1.sum()), reach0, reach1


def score_trees(lang: Language, seqs, trees: dict, k: int) -> Tally:
    """trees: {(prompt, anchor): DraftTree} → Tally verified by the language (`tree_accepted`)."""
    tally = Tally(len(seqs), k)
    parsers = [Parser(lang, s.input_ids) for s in seqs]
    for (i, a), tree in trees.items():
        parser, state = parsers[i], parsers[i].states[a]
        acc0, acc1, slots0, slots1 = tree_accepted(parser, state, tree.tokens.tolist(), tree.parents.tolist(), k)
        tally.add(i, anchor_kind(parser, state), acc0, acc1, slots0, slots1)
    return tally


def tree_drafters(drafters: dict, nodes, k: int) -> dict[str, tuple[object, TreeSpec, str]]:
    """{tree row: (tree drafter, TreeSpec(k, TOPK, n), its chain row)} for the chain rows of BASES present in
    `drafters` ({row: block drafter}): "<row> top-k <n>" and, for DFlash2, "DFlash2 selector <n>"."""
    out = {}
    for base in (b for b in BASES if b in drafters):
        for n in nodes:
            out[f"{base} top-k {n}"] = (TopKTreeDrafter(drafters[base]), TreeSpec(k, TOPK, n), base)
        if base == SELECTOR:
            for n in nodes:
                out[f"{base} selector {n}"] = (SelectorTreeDrafter(drafters[base]), TreeSpec(k, TOPK, n), base)
    return out


def tree_tallies(lang: Language, seqs, rows: dict, k: int, stride: int, seed: int = 0) -> dict[str, dict]:
    """{tree row: {"tally": Tally, "nodes": mean nodes per round}} for `rows` (as `tree_drafters` returns),
    drafted on the anchors `testbed.drafter_drafts` scores (the rows sharing a block drafter share one pass)."""
    for name, (drafter, _, _) in rows.items():
        if isinstance(drafter, MultiNoiseDrafter):
            raise ValueError(f"{name}: multi-noise trees are drafted from several noise draws; their expected "
                             "acceptance at T = 1 is not computed by the testbed")
    groups: dict = defaultdict(dict)
    for name, (drafter, spec, _) in rows.items():
        groups[id(drafter.inner)][name] = (drafter, spec)
    out = {}
    for group in groups.values():
        trees: dict = defaultdict(dict)
        for i, a, name, tree in iter_trees({n: d for n, (d, _) in group.items()}, seqs,
                                           {n: s for n, (_, s) in group.items()}, stride=stride, seed=seed):
            trees[name][i, a] = tree
        for name in group:
            count = sum(len(t.tokens) for t in trees[name].values())
            out[name] = {"tally": score_trees(lang, seqs, trees[name], k),
                         "nodes": count / max(len(trees[name]), 1)}
    return {name: out[name] for name in rows}
