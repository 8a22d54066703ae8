"""Token trees from block drafters, verified by the EAGLE-3 tree round (`flashmap_ext/tree.py`).

- `MultiNoiseDrafter(flashmap)`: N = `topk` FlashMap blocks from N independent noise draws (the drafter's own
  stream, draw j keyed by seed + j·NOISE_SEED_STRIDE; draw 0 is the chain's noise) → N chains merged into
  a prefix tree, nodes ranked by cumulative draft log-probability (max over the chains through a node).
  FlowMap notes §4.2: point-mass drafts from independent noise stay lossless under multi-draft acceptance.
- `TopKTreeDrafter(block drafter)`: the block's per-slot logits (FlashMap or DFlash); each node at depth d
  gets slot d+1's `topk` most likely tokens as children; nodes are taken best-first by cumulative draft
  log-probability until `num_nodes` (DDTree-style top-k-per-slot tree).
- `SelectorTreeDrafter(dflash2)`: DFlash2's edge scores: a node's children are the `topk` best of its slot's
  selector candidates given the node's own token (unary + the selector term given its parent, normalised
  over the candidates), taken best-first by cumulative edge log-probability until `num_nodes`.

Both are batch 1 and take `generate(..., tree=TreeSpec(depth, topk, num_nodes))`; `draft` passes through to
the wrapped drafter, so the same object also drafts chains.
All are verified by the same tree round, so any tree is lossless whatever its scores.
"""
from __future__ import annotations

import heapq
from typing import Optional, Sequence

import torch

from flashmap_ext.checks import OneSequenceOnly
from flashmap_ext.drafters.dflash import DFlashDrafter
from flashmap_ext.drafters.drafting import draft_block
from flashmap_ext.drafters.eagle3.tree import DraftTree
from flashmap_ext.drafters.flashmap import FlashMapDrafter

#: seed offset between the noise draws of a multi-noise tree (an odd constant far from request seeds)
NOISE_SEED_STRIDE = 0x9E3779B1


def check_one_sequence(drafter, batch_size) -> None:
    """OneSequenceOnly (a ValueError naming batch_size) unless it is 1: tree and lookup drafters draft one
    sequence at a time."""
    if batch_size != 1:
        raise OneSequenceOnly(type(drafter).__name__, batch_size)


def merge_chains(chains: Sequence[Sequence[int]], scores: Optional[Sequence[Sequence[float]]] = None, *,
                 num_nodes: int, depth: int) -> DraftTree:
    """Prefix tree of `chains` (token id lists; each cut at `depth` and at its first negative id).

    A node's score is the best cumulative score among the chains through it (`scores[c][j]`, non-increasing
    along each chain; default −(j + c/len(chains)): earlier chains first at equal depth). The
    `num_nodes` best nodes are kept (ties: shallower, then earlier), which keeps every kept node's
    ancestors; nodes come out in topological order."""
    ids: dict = {}
    tokens, parents, depths, best = [], [], [], []
    for c, chain in enumerate(chains):
        parent = -1
        for j, tok in enumerate(list(chain)[:depth]):
            if tok < 0:
                break
            score = scores[c][j] if scores is not None else -(j + c / len(chains))
            key = (parent, int(tok))
            if key not in ids:
                ids[key] = len(tokens)
                tokens.append(int(tok)), parents.append(parent), depths.append(j + 1), best.append(score)
            node = ids[key]
            best[node] = max(best[node], score)
            parent = node
    keep = sorted(sorted(range(len(tokens)), key=lambda i: (-best[i], depths[i], i))[:max(num_nodes, 0)])
    return _subtree(keep, tokens, parents, depths, best)


def _subtree(keep: list, tokens, parents, depths, scores) -> DraftTree:
    """The nodes `keep` (ascending, closed under parents) renumbered 0..n-1."""
    new = {old: i for i, old in enumerate(keep)}
    return DraftTree(torch.tensor([tokens[i] for i in keep], dtype=torch.int64),
                     torch.tensor([new[parents[i]] if parents[i] >= 0 else -1 for i in keep], dtype=torch.int64),
                     torch.tensor([depths[i] for i in keep], dtype=torch.int64),
                     torch.tensor([scores[i] for i in keep], dtype=torch.float32))


def topk_tree(logp: torch.Tensor, *, topk: int, num_nodes: int, depth: int) -> DraftTree:
    """Best-first top-k-per-slot tree from per-slot log-probabilities logp [D, V] (row d = depth d + 1,
    target ids as columns): children of a depth-d node are row d's `topk` best tokens; nodes are added in
    order of cumulative log-probability (ties: earlier pushed) until `num_nodes` or no candidate is left."""
    depth = min(depth, logp.shape[0])
    if depth <= 0 or num_nodes <= 0:
        return merge_chains([], num_nodes=0, depth=0)
    top = logp[:depth].float().topk(min(topk, logp.shape[1]), dim=-1)
    vals, toks = top.values.tolist(), top.indices.tolist()
    heap = [(-vals[0][r], r, -1, 0, toks[0][r]) for r in range(len(toks[0]))]  # (−score, tiebreak, parent, d, tok)
    heapq.heapify(heap)
    tokens, parents, depths, scores, pushed = [], [], [], [], len(heap)
    while heap and len(tokens) < num_nodes:
        neg, _, parent, d, tok = heapq.heappop(heap)
        if neg == float("inf"):  # -inf log-probability (outside a draft vocabulary): never a candidate
            break
        node = len(tokens)
        tokens.append(tok), parents.append(parent), depths.append(d + 1), scores.append(-neg)
        if d + 1 < depth:
            for r, t in enumerate(toks[d + 1]):
                heapq.heappush(heap, (neg - vals[d + 1][r], pushed, node, d + 1, t))
                pushed += 1
    return _subtree(list(range(len(tokens))), tokens, parents, depths, scores)


def has_block_log_probs(drafter) -> bool:
    """Whether `block_log_probs` can score `drafter`'s block (FlashMap, DFlash or `draft_log_probs`)."""
    fm = drafter.inner if hasattr(drafter, "steps") else drafter
    return callable(getattr(drafter, "draft_log_probs", None)) or isinstance(fm, (FlashMapDrafter, DFlashDrafter))


def block_log_probs(drafter, memory, anchor: torch.Tensor, position: torch.Tensor, seed: torch.Tensor,
                    noise_draw: int = 0) -> torch.Tensor:
    """Per-slot draft log-probabilities [K, V_target] (−inf outside a draft vocabulary) of a FlashMap
    (steps as configured; a bench `StepsDrafter` keeps its steps) or DFlash block, batch 1; any other
    drafter may offer them as `draft_log_probs(memory, anchor, position, seed, noise_draw)`."""
    if callable(getattr(drafter, "draft_log_probs", None)):
        return drafter.draft_log_probs(memory, anchor, position, seed, noise_draw)
    fm, steps = (drafter.inner, drafter.steps) if hasattr(drafter, "steps") else (drafter, None)
    if isinstance(fm, FlashMapDrafter):
        small = _flashmap_log_probs(fm, steps, memory, anchor, position, seed, noise_draw)
        if fm.config.draft_vocab_size is None:
            return small
        rows = fm.to_target_ids(torch.arange(small.shape[-1], device=small.device))
        full = small.new_full((small.shape[0], fm.tables.embedding.shape[0]), float("-inf"))
        return full.index_copy_(-1, rows, small)
    if isinstance(fm, DFlashDrafter):
        if noise_draw:
            raise ValueError("DFlash drafts deterministically: multi-noise trees need a FlashMap drafter")
        return torch.log_softmax(fm.draft_logits(memory, anchor, position)[0].float(), dim=-1)
    raise ValueError(f"block trees need a FlashMapDrafter or DFlashDrafter, got {type(fm).__name__}")


def block_top_k(drafter, memory, anchor: torch.Tensor, position: torch.Tensor, seed: torch.Tensor,
                topk: int) -> tuple:
    """Each slot's `topk` most likely draft tokens of `block_log_probs`: (log-probs [K, topk] fp32, target
    ids [K, topk] int64, −1 where the log-probability is −inf), ranked within the FlashMap draft vocabulary
    when there is one (no [K, V_target] matrix)."""
    fm, steps = (drafter.inner, drafter.steps) if hasattr(drafter, "steps") else (drafter, None)
    if (not callable(getattr(drafter, "draft_log_probs", None)) and isinstance(fm, FlashMapDrafter)
            and fm.config.draft_vocab_size is not None):
        small = _flashmap_log_probs(fm, steps, memory, anchor, position, seed, 0)
        top = small.topk(min(topk, small.shape[-1]), dim=-1)
        return top.values, fm.to_target_ids(top.indices)
    logp = block_log_probs(drafter, memory, anchor, position, seed)
    top = logp.topk(min(topk, logp.shape[-1]), dim=-1)
    return top.values, torch.where(torch.isinf(top.values), -1, top.indices)


def _flashmap_log_probs(fm, steps, memory, anchor, position, seed, noise_draw: int) -> torch.Tensor:
    """[K, V_draft] log-probabilities of one FlashMap block from noise draw `noise_draw`."""
    if noise_draw and not fm.draws_differ(steps):
        raise ValueError("a tau_gated_input FlashMap drafter at 1 step drafts the same block for every noise "
                         "draw: multi-noise trees need 2 steps, or use a top-k tree")
    block = draft_block(fm, memory, anchor, steps=steps, seed=seed + noise_draw * NOISE_SEED_STRIDE,
                        position=position, return_logits=True)
    return torch.log_softmax(block.logits[0].float(), dim=-1)


class _BlockTreeBase:
    """Passes the BlockDrafter interface through to the wrapped drafter."""

    def __init__(self, drafter):
        self.inner = drafter
        self.num_draft_tokens = drafter.num_draft_tokens
        self.target_layer_ids = tuple(drafter.target_layer_ids)

    def new_memory(self, batch_size, device=None):
        check_one_sequence(self, batch_size)
        return self.inner.new_memory(batch_size, device)

    def extend_memory(self, memory, token_ids, taps):
        self.inner.extend_memory(memory, token_ids, taps)

    def draft(self, memory, anchor_tokens, *, num_tokens, seed, position):
        return self.inner.draft(memory, anchor_tokens, num_tokens=num_tokens, seed=seed, position=position)


class MultiNoiseDrafter(_BlockTreeBase):
    """FlashMap multi-noise trees: `topk` noise draws → `topk` argmax chains → one prefix tree."""

    @torch.no_grad()
    def draft_tree(self, memory, anchor_token: torch.Tensor, position: torch.Tensor, *, depth: int, topk: int,
                   num_nodes: int, seed: Optional[torch.Tensor] = None) -> DraftTree:
        seed = torch.zeros_like(position) if seed is None else seed
        depth = min(depth, self.num_draft_tokens)
        chains, scores = [], []
        for j in range(topk):
            logp = block_log_probs(self.inner, memory, anchor_token, position, seed, noise_draw=j)[:depth]
            best = logp.max(dim=-1)
            chains.append(best.indices.tolist())
            scores.append(best.values.cumsum(0).tolist())
        return merge_chains(chains, scores, num_nodes=num_nodes, depth=depth)


class TopKTreeDrafter(_BlockTreeBase):
    """Top-k-per-slot trees from one block's per-slot logits (FlashMap or DFlash)."""

    @torch.no_grad()
    def draft_tree(self, memory, anchor_token: torch.Tensor, position: torch.Tensor, *, depth: int, topk: int,
                   num_nodes: int, seed: Optional[torch.Tensor] = None) -> DraftTree:
        seed = torch.zeros_like(position) if seed is None else seed
        logp = block_log_probs(self.inner, memory, anchor_token, position, seed)
        return topk_tree(logp, topk=topk, num_nodes=num_nodes, depth=min(depth, self.num_draft_tokens))


class SelectorRanks:
    """One DFlash2 block's candidates ranked by its selector given the token before them (the anchor at slot 0):
    what `AutoDrafter` plans its trees on for a DFlash2 drafter, in place of one ranking per slot. `ranked(d,
    prev)`: the `topk` best target ids at slot d (0-based) given target id `prev`; `plan_tokens(plan)`: a
    `tree_plan` plan's nodes as token chains (a node's rank is among its parent's children); `ranks(committed)`:
    the rank of each committed token among the children of the one before it (None outside the top-k)."""

    def __init__(self, drafter, memory, anchor: torch.Tensor, position: torch.Tensor, depth: int, topk: int):
        self.drafter, self.topk, self.anchor = drafter, topk, int(anchor[0])
        self.hidden = drafter.block_hidden(memory, anchor, position)[0, :depth]
        self.unary = drafter.vocab_logits(self.hidden)
        self._cache: dict = {}

    def __len__(self) -> int:
        return self.hidden.shape[0]

    def ranked(self, d: int, prev: int) -> list:
        if (d, prev) not in self._cache:
            vocab = self.drafter.vocab
            row = int(vocab.to_draft(torch.tensor([prev], device=self.unary.device))[0])
            cands, logp = self.drafter.candidate_selector.edge_log_probs(self.unary[d], self.hidden[d], row)
            best = logp.topk(min(self.topk, logp.numel())).indices
            self._cache[d, prev] = vocab.to_target(cands[best]).tolist()
        return self._cache[d, prev]

    def plan_tokens(self, plan) -> list:
        paths: list = []
        for node in plan:
            parent = paths[node.parent] if node.parent >= 0 else []
            if parent is None or node.depth > len(self):
                paths.append(None)
                continue
            row = self.ranked(node.depth - 1, parent[-1] if parent else self.anchor)
            paths.append(parent + [row[node.rank]] if node.rank < len(row) else None)
        return [p for p in paths if p is not None]

    def ranks(self, committed: list) -> list:
        prev, out = self.anchor, []
        for d, tok in enumerate(committed[:len(self)]):
            row = self.ranked(d, prev)
            out.append(row.index(tok) if tok in row else None)
            prev = tok
        return out


class SelectorTreeDrafter(_BlockTreeBase):
    """Best-first trees scored by a DFlash2 drafter's candidate selector (one block forward per round)."""

    def __init__(self, drafter):
        if not hasattr(drafter, "candidate_selector"):
            raise ValueError(f"selector trees need a DFlash2 drafter (a candidate selector), got {type(drafter).__name__}")
        super().__init__(drafter)

    @torch.no_grad()
    def draft_tree(self, memory, anchor_token: torch.Tensor, position: torch.Tensor, *, depth: int, topk: int,
                   num_nodes: int, seed: Optional[torch.Tensor] = None) -> DraftTree:
        d = self.inner
        depth = min(depth, self.num_draft_tokens)
        hidden = d.block_hidden(memory, anchor_token, position)[0, :depth]
        unary = d.vocab_logits(hidden)
        sel = d.candidate_selector

        def children(slot: int, row: int) -> list:
            cands, logp = sel.edge_log_probs(unary[slot], hidden[slot], row)
            best = logp.topk(min(topk, logp.numel()))
            return list(zip(best.values.tolist(), cands[best.indices].tolist()))
        if depth <= 0 or num_nodes <= 0:
            return merge_chains([], num_nodes=0, depth=0)
        anchor_row = int(d.vocab.to_draft(anchor_token)[0])
        heap = [(-v, r, -1, 0, tok) for r, (v, tok) in enumerate(children(0, anchor_row))]
        heapq.heapify(heap)
        tokens, parents, depths, scores, pushed = [], [], [], [], len(heap)
        while heap and len(tokens) < num_nodes:
            neg, _, parent, level, row = heapq.heappop(heap)
            node = len(tokens)
            tokens.append(row), parents.append(parent), depths.append(level + 1), scores.append(-neg)
            if level + 1 < depth:
                for v, tok in children(level + 1, row):
                    heapq.heappush(heap, (neg - v, pushed, node, level + 1, tok))
                    pushed += 1
        ids = d.vocab.to_target(torch.tensor(tokens, dtype=torch.int64, device=unary.device)).tolist()
        return _subtree(list(range(len(tokens))), ids, parents, depths, scores)
