"""Expected tokens of block-drafter trees (`--auto`): per-slot, per-rank acceptance and the best
tree of b nodes under it.

A block drafter (FlashMap, DFlash) scores every slot of its block at once, so a tree's node at depth d is
"rank r of slot d's draft distribution" whatever its parent is (DDTree-style top-k-per-slot trees). With

    c_d(r) = P(the target's token at depth d is the drafter's rank-r token of slot d | the path reached d)

(slots independent, as in the chain model `cost_model.AcceptanceProfile`), a node with ranks (r_1 … r_d)
is on the accepted path with probability Π c_i(r_i), and a tree's E[γ] = 1 + Σ_nodes Π c_i(r_i). The b
nodes of highest probability (best first; a child never beats its parent, so the set keeps every
ancestor) are the tree of b nodes with the highest E[γ] (Medusa's sparse-tree construction,
arXiv:2401.10774 §3.3.1). With topk = 1 the plan is the chain.

Observations need no particular tree: every committed token (accepted draft or bonus) is the target's
token at its depth (at T > 0 a sample of the target's distribution there: the acceptance is lossless),
so its rank in the drafter's slot distribution is one unbiased draw of c_d, from chain and tree rounds alike.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence


class PlanNode(NamedTuple):
    parent: int   # index of the parent in the plan (−1: a child of the anchor)
    depth: int    # 1 = child of the anchor; the node is slot depth − 1 of the block
    rank: int     # rank of the node's token in that slot's draft distribution (0 = argmax)
    prob: float   # P(the accepted path contains this node) under the profile


@dataclass
class RankProfile:
    """c_d(r) for ranks r < topk from counts with a prior of `weight` pseudo-rounds.

    Prior: slot 0 has c(0) = prior, c(r) = (1 − prior) · rank_decay^r for r ≥ 1 (sums to < 1 for
    rank_decay ≤ ½); every later slot's prior is the estimate of the slot before (as `AcceptanceProfile`),
    so a profile learned on short trees still predicts deeper ones. `tried[d]` counts rounds whose path
    reached depth d + 1's parent, `hits[d][r]` those where the target's token there had rank r."""
    prior: float = 0.5
    topk: int = 1
    weight: float = 4.0
    rank_decay: float = 0.25
    tried: list = field(default_factory=list)
    hits: list = field(default_factory=list)

    def __post_init__(self):
        if self.topk < 1 or not 0.0 <= self.prior <= 1.0 or not 0.0 <= self.rank_decay <= 0.5:
            raise ValueError(f"RankProfile: topk >= 1, prior in [0, 1], rank_decay in [0, 0.5] "
                             f"(got {self.topk}, {self.prior}, {self.rank_decay})")

    def rates(self, k: int) -> list:
        """[[c_d(0) … c_d(topk − 1)] for d in 0 … k − 1]."""
        prev = [self.prior] + [(1 - self.prior) * self.rank_decay ** r for r in range(1, self.topk)]
        out = []
        for d in range(k):
            n = self.tried[d] if d < len(self.tried) else 0.0
            hits = self.hits[d] if d < len(self.hits) else [0.0] * self.topk
            prev = [(h + p * self.weight) / (n + self.weight) for h, p in zip(hits, prev)]
            out.append(prev)
        return out

    def record(self, ranks: Sequence[Optional[int]]) -> None:
        """One round: ranks[d] = rank of the target's token at depth d + 1 in slot d's draft distribution
        (None: not among the first topk), for every depth the committed tokens reached."""
        for d, r in enumerate(ranks):
            if d == len(self.tried):
                self.tried.append(0.0)
                self.hits.append([0.0] * self.topk)
            self.tried[d] += 1
            if r is not None and r < self.topk:
                self.hits[d][r] += 1

    def decay(self, keep: float) -> None:
        """Multiplies every count by `keep` (0: back to the prior; 1: unchanged)."""
        self.tried = [t * keep for t in self.tried]
        self.hits = [[h * keep for h in row] for row in self.hits]

    def plan(self, depth: int, max_nodes: int) -> list:
        """The best tree of at most `max_nodes` nodes and `depth` levels, best first (`PlanNode`s; every
        prefix of the list is the best tree of its size, parents before children)."""
        if depth <= 0 or max_nodes <= 0:
            return []
        rates = self.rates(depth)
        heap = [(-rates[0][r], r, -1, 1, r) for r in range(self.topk)]  # (−prob, tiebreak, parent, depth, rank)
        heapq.heapify(heap)
        nodes, pushed = [], len(heap)
        while heap and len(nodes) < max_nodes:
            neg, _, parent, d, r = heapq.heappop(heap)
            nodes.append(PlanNode(parent, d, r, -neg))
            if d < depth:
                for child in range(self.topk):
                    heapq.heappush(heap, (neg * rates[d][child], pushed, len(nodes) - 1, d + 1, child))
                    pushed += 1
        return nodes


def chain_plan(k: int, profile: Optional[RankProfile] = None) -> list:
    """A chain of k rank-0 nodes (probabilities from `profile`, else 1)."""
    rates = profile.rates(k) if profile is not None else [[1.0]] * k
    nodes, p = [], 1.0
    for d in range(k):
        p *= rates[d][0]
        nodes.append(PlanNode(d - 1, d + 1, 0, p))
    return nodes


def reach_by_depth(nodes: Sequence[PlanNode], depth: int) -> list:
    """[P(the accepted path reaches depth j + 1) for j < depth] = Σ of the node probabilities per depth."""
    out = [0.0] * depth
    for node in nodes:
        if node.depth <= depth:
            out[node.depth - 1] += node.prob
    return out


def plan_tokens(nodes: Sequence[PlanNode], ranked: Sequence[Sequence[int]]) -> list:
    """The plan's nodes as token chains (root to node, in plan order; `merge_chains` shares their
    prefixes), `ranked[d][r]` the rank-r token of slot d (−1 or missing: none, e.g. outside a draft
    vocabulary; such a node and its subtree are dropped)."""
    paths: list = []
    for node in nodes:
        row = ranked[node.depth - 1] if node.depth - 1 < len(ranked) else []
        tok = row[node.rank] if node.rank < len(row) else -1
        parent = paths[node.parent] if node.parent >= 0 else []
        paths.append(None if tok < 0 or parent is None else parent + [int(tok)])
    return [p for p in paths if p is not None]
