"""EAGLE-3 tree drafting (EAGLE-2 dynamic draft tree; arXiv:2406.16858 §4, used by EAGLE-3).

From the anchor, the drafter expands `depth` levels: at each level the `topk` frontier nodes (highest
cumulative draft log-probability) run as one batch of queries, each attending to the context pairs, the
anchor's pair and its own ancestors (tree attention), and each proposes its `topk` most likely children.
Finally the `num_nodes` nodes of highest cumulative log-probability form the tree; since a child never
scores above its parent (ties go to the earlier, i.e. the parent) this set contains every ancestor of its
members. Batch size 1. The verifier side (tree attention in the target, acceptance, KV compaction) is
`flashmap_ext/tree.py`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """A draft tree in topological order (parents before children).

    tokens [N] int64 target ids; parents [N] int64 (−1 = the anchor, else an index < own index);
    depths [N] int64 (1 = child of the anchor); scores [N] fp32 cumulative draft log-probabilities.
    """
    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor

    def ancestors_mask(self) -> torch.Tensor:
        """[N, N] bool: entry (i, j) iff node j is node i or one of its ancestors."""
        n = self.tokens.shape[0]
        mask = torch.eye(n, dtype=torch.bool)
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                mask[i] |= mask[p]
        return mask


class _Grow:
    """Bookkeeping while expanding: every candidate node, and the K/V of the nodes already run."""

    def __init__(self):
        self.tokens, self.parents, self.depths, self.scores = [], [], [], []
        self.ancestors: list[set] = []   # node ids on the path from the root to the node, itself included
        self.run_ids: list[int] = []     # nodes whose K/V sit after the context + anchor keys, in order

    def add(self, token: int, parent: int, depth: int, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(depth)
        self.scores.append(score)
        self.ancestors.append((self.ancestors[parent] if parent >= 0 else set()) | {len(self.tokens) - 1})
        return len(self.tokens) - 1


def _children(grow: _Grow, drafter, logits: torch.Tensor, parents: list[int], depth: int, topk: int) -> list[int]:
    """Adds the top-k children of each parent (logits [P, Vd]); returns the new node ids."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = logp.topk(min(topk, logp.shape[-1]), dim=-1)
    ids = drafter.draft_ids[top.indices].tolist()
    new = []
    for r, parent in enumerate(parents):
        base = grow.scores[parent] if parent >= 0 else 0.0
        for tok, lp in zip(ids[r], top.values[r].tolist()):
            new.append(grow.add(tok, parent, depth, base + lp))
    return new


@torch.no_grad()
def draft_tree(drafter, memory, anchor_token: torch.Tensor, position: torch.Tensor, *, depth: int = 7,
               topk: int = 10, num_nodes: int = 16) -> DraftTree:
    """Draft tree after the anchor [1] int64 at absolute `position` [1] (see the module docstring)."""
    if anchor_token.shape != (1,) or position.shape != (1,):
        raise ValueError("tree drafting supports batch size 1: anchor_token and position must be [1]")
    if depth < 1 or topk < 1 or num_nodes < 1:
        raise ValueError(f"need depth, topk, num_nodes >= 1 (got {depth}, {topk}, {num_nodes})")
    if memory.pending is None:
        raise ValueError("empty memory: extend_memory with at least one committed position first")
    layer, grow = drafter.midlayer, _Grow()
    cos, sin = drafter.rotary(position[:, None] - 1, memory.pending.dtype)
    emb = drafter.tables.embed(anchor_token[:, None], memory.pending.dtype)
    root, k, v = layer(memory.pending, emb, cos, sin, memory.cache.keys[0], memory.cache.values[0])
    keys = torch.cat([memory.cache.keys[0], k], dim=2)
    values = torch.cat([memory.cache.values[0], v], dim=2)
    outputs: dict[int, torch.Tensor] = {-1: drafter.carry(root)[0, 0]}
    frontier = _children(grow, drafter, drafter.draft_logits(root)[0], [-1], 1, topk)
    for d in range(1, depth):
        frontier = sorted(frontier, key=lambda i: (-grow.scores[i], i))[:topk]
        hidden = torch.stack([outputs[grow.parents[i]] for i in frontier])[None]
        tokens = torch.tensor([[grow.tokens[i] for i in frontier]], device=hidden.device)
        cos, sin = drafter.rotary((position[:, None] - 1 + d).expand(1, len(frontier)), hidden.dtype)
        mask = _tree_mask(grow, frontier, keys.shape[2]).to(hidden.device)
        out, k, v = layer(hidden, drafter.tables.embed(tokens, hidden.dtype), cos, sin, keys, values, mask)
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        grow.run_ids.extend(frontier)
        carried = drafter.carry(out)
        outputs.update({i: carried[0, r] for r, i in enumerate(frontier)})
        frontier = _children(grow, drafter, drafter.draft_logits(out)[0], frontier, d + 1, topk)
    return _select(grow, num_nodes)


def _tree_mask(grow: _Grow, frontier: list[int], prefix: int) -> torch.Tensor:
    """[1, 1, F, prefix + F] bool: context and anchor keys, the run keys of ancestors, itself."""
    n_ctx = prefix - len(grow.run_ids)
    mask = torch.zeros(len(frontier), prefix + len(frontier), dtype=torch.bool)
    mask[:, :n_ctx] = True
    for r, i in enumerate(frontier):
        for c, j in enumerate(grow.run_ids):
            mask[r, n_ctx + c] = j in grow.ancestors[i]
        mask[r, prefix + r] = True
    return mask[None, None]


def _select(grow: _Grow, num_nodes: int) -> DraftTree:
    """The `num_nodes` best nodes (ties: earlier first), renumbered in creation order."""
    best = sorted(range(len(grow.tokens)), key=lambda i: (-grow.scores[i], i))[:num_nodes]
    keep = sorted(best)
    index = {old: new for new, old in enumerate(keep)}
    parents = [index[grow.parents[i]] if grow.parents[i] >= 0 else -1 for i in keep]
    return DraftTree(torch.tensor([grow.tokens[i] for i in keep]), torch.tensor(parents),
                     torch.tensor([grow.depths[i] for i in keep]), torch.tensor([grow.scores[i] for i in keep]))
