"""`AutoDrafter`: each round, the draft shape the cost model expects to be fastest (`--auto`).

Per round, with the n-gram match m (prompt lookup, `draft_shapes/lookup.py`) and the wrapped block drafter's
K slots, `cost_model.best_shape` picks plain decoding (no draft: a width-1 verify), a lookup chain of l ≤ m
tokens, a drafter chain or top-k-per-slot tree of b ≤ `tree_nodes` nodes (`tree_plan`: the best tree of
b nodes under the per-rank acceptance; a chain when that is best), or the lookup chain and the drafter's
chain/tree as two branches, maximising E[γ] / round seconds under the machine's `CostTable`. Trees need
the drafter's per-slot log-probabilities (FlashMap, DFlash, or `draft_log_probs`); any other drafter
drafts chains. A DFlash2 drafter's trees follow its selector: a node's rank-r child is the r-th best
candidate given the node's token (block_tree.SelectorRanks), and its chain is the selector's greedy path. Multi-noise trees are not among the choices: N drafter calls buy what one call's
top-k ranks give (bench rows, BENCHMARKS.md).

The acceptance profiles (lookup per slot, drafter per slot and rank) start every request from the prior:
`carry` (default 0) is the fraction of the previous requests' counts kept, so one request's profile does
not steer the next. Within a request they learn from every round: the committed tokens (accepted path
and bonus) are the target's, so their ranks in the drafter's slots teach the tree model whatever shape
was verified. A drafter that cannot pay even when every draft is accepted is never run (nor is its
memory kept); one whose profile says it does not pay is still tried every `explore_every` rounds.

Rounds go through the tree round (`generate(..., tree=auto.tree_spec())`); any shape is verified with the
same lossless multi-draft acceptance, so the output is the target's whatever the choices.
"""
from __future__ import annotations

from typing import Optional

import torch

from flashmap_ext.checks import check_int, check_real
from flashmap_ext.draft_shapes.block_tree import (
    SelectorRanks,
    block_top_k,
    check_one_sequence,
    has_block_log_probs,
    merge_chains,
)
from flashmap_ext.draft_shapes.cost_model import AcceptanceProfile, CostTable, Shape, best_shape
from flashmap_ext.draft_shapes.lookup import LookupDrafter, LookupMemory
from flashmap_ext.draft_shapes.tree_plan import RankProfile, chain_plan, plan_tokens
from flashmap_ext.drafters.common.base import TreeSpec
from flashmap_ext.drafters.eagle3.tree import DraftTree


class AutoDrafter(LookupDrafter):
    """Args: inner (block drafter or None), table (CostTable of this machine with the inner drafter's
    draft_s / memory_s), drafter_prior / lookup_prior (slot-0 acceptance before any round), two_branch
    (allow lookup + drafter trees), explore_every (rounds between forced drafter tries; 0 = never),
    tree_topk / tree_nodes (ranks per slot and most drafter nodes of a tree; 1 / K: chains only), carry
    (fraction of the profiles' counts kept from one request to the next), plus LookupDrafter's n-gram
    settings. `choices` counts the shapes picked as (lookup tokens, drafter nodes) pairs.
    Raises ValueError without a table, for tree_topk or tree_nodes < 1 or carry outside [0, 1]."""

    def __init__(self, inner=None, table: Optional[CostTable] = None, *, drafter_prior: float = 0.5,
                 lookup_prior: float = 0.6, two_branch: bool = True, explore_every: int = 32, tree_topk: int = 4,
                 tree_nodes: int = 16, carry: float = 0.0, num_lookup_tokens: int = 10, max_ngram: int = 2,
                 min_ngram: int = 1):
        super().__init__(inner, num_lookup_tokens=num_lookup_tokens, max_ngram=max_ngram, min_ngram=min_ngram)
        if table is None:
            raise ValueError("AutoDrafter: table (a CostTable of this machine) is required")
        if not isinstance(table, CostTable):
            raise TypeError(f"AutoDrafter: table must be a CostTable, got {type(table).__name__}")
        for name, value in (("drafter_prior", drafter_prior), ("lookup_prior", lookup_prior), ("carry", carry)):
            check_real(f"AutoDrafter: {name}", value, 0.0, 1.0)
        for name, value, low in (("tree_topk", tree_topk, 1), ("tree_nodes", tree_nodes, 1),
                                 ("explore_every", explore_every, 0)):
            check_int(f"AutoDrafter: {name}", value, low)
        self.table, self.two_branch, self.explore_every, self.carry = table, two_branch, explore_every, carry
        self.ranked = inner is not None and has_block_log_probs(inner)
        k = inner.num_draft_tokens if inner is not None else 0
        self.tree_nodes = tree_nodes if self.ranked else k
        self.lookup_profile = AcceptanceProfile(lookup_prior)
        self.drafter_profile = RankProfile(drafter_prior, tree_topk if self.ranked else 1)
        self.choices: dict = {}
        self._pending: Optional[tuple] = None     # (lookup chain, drafter's ranked slots) of the last round
        self._path: list = []                     # its accepted path (the bonus is the next anchor)
        self._rounds_without_drafter = 0
        self.drafter_enabled = inner is not None and self.drafter_can_pay()

    def tree_spec(self) -> TreeSpec:
        """The TreeSpec to pass to `generate`: depth = the longest chain, nodes = lookup + drafter nodes."""
        topk = max(2 if self.two_branch else 1, self.drafter_profile.topk)
        return TreeSpec(depth=self.num_draft_tokens, topk=topk,
                        num_nodes=self.num_lookup_tokens + (self.tree_nodes if self.inner else 0))

    def drafter_can_pay(self) -> bool:
        """Whether some drafter chain beats plain decoding even if every draft were accepted."""
        perfect = AcceptanceProfile(1.0, weight=1.0)
        shape = best_shape(self.table, perfect, self.inner.num_draft_tokens, drafter_active=True)
        return shape.drafter > 0 and shape.rate > 1.0 / self.table.plain_s()

    def explain(self) -> str:
        """One line: what pays on this machine and why (the measured costs)."""
        t = self.table
        costs = (f"verify 1/2/9/17 tokens {t.verify(1) * 1e3:.0f}/{t.verify(2) * 1e3:.0f}/{t.verify(9) * 1e3:.0f}/"
                 f"{t.verify(17) * 1e3:.0f} ms, draft {t.draft_s * 1e3:.0f} ms, memory {t.memory_s * 1e3:.0f} ms")
        if self.inner is None:
            return f"auto: prompt lookup only ({costs})"
        if not self.drafter_enabled:
            return (f"auto: no drafter shape can pay on this machine even at 100% acceptance ({costs}); "
                    f"prompt lookup only, plain decoding elsewhere")
        trees = (f"trees of up to {self.tree_nodes} nodes (top-{self.drafter_profile.topk} per slot)"
                 if self.drafter_profile.topk > 1 else "chains")
        return f"auto: lookup, drafter K / {trees} and two-branch rounds chosen per round ({costs})"

    # --- memory: the inner memory only while the drafter is in use; the profiles per request ----------
    def new_memory(self, batch_size: int, device=None) -> LookupMemory:
        check_one_sequence(self, batch_size)
        self._pending, self._path, self._rounds_without_drafter = None, [], 0
        self.lookup_profile.decay(self.carry)
        self.drafter_profile.decay(self.carry)
        inner = self.inner.new_memory(1, device) if self.drafter_enabled else None
        return LookupMemory(inner)

    def extend_memory(self, memory: LookupMemory, token_ids: torch.Tensor, taps) -> None:
        if memory.inner is not None:
            self.inner.extend_memory(memory.inner, token_ids, taps)
        memory.token_ids.extend(token_ids[0].tolist())
        if self._pending is not None:
            self._path = token_ids[0, 1:].tolist()

    def _learn(self, committed: list) -> None:
        """The last round's committed tokens (accepted path + bonus) against what it proposed."""
        lookup_chain, ranked = self._pending
        self._pending = None
        if lookup_chain:
            n = 0
            while n < min(len(lookup_chain), len(committed)) and lookup_chain[n] == committed[n]:
                n += 1
            self.lookup_profile.record(len(lookup_chain), n)
        if isinstance(ranked, SelectorRanks):
            self.drafter_profile.record(ranked.ranks(committed))
        elif ranked:
            self.drafter_profile.record([ranked[d].index(tok) if tok in ranked[d] else None
                                         for d, tok in enumerate(committed[:len(ranked)])])

    # --- the round ---------------------------------------------------------------------------------------
    def choose(self, memory: LookupMemory, match_len: int, depth: int) -> Shape:
        active = memory.inner is not None
        k = min(depth, self.inner.num_draft_tokens) if active else 0
        shape = best_shape(self.table, self.drafter_profile if active else None, k, self.lookup_profile,
                           match_len, self.two_branch, active, max_nodes=self.tree_nodes,
                           context=len(memory.token_ids) + 1)  # priced at this round's context length
        self._rounds_without_drafter = 0 if shape.drafter or not active else self._rounds_without_drafter + 1
        if active and self.explore_every and self._rounds_without_drafter >= self.explore_every and k > 0:
            self._rounds_without_drafter = 0
            shape = Shape(0, k, 1.0, 1.0, tuple(chain_plan(k)))
        return shape

    def ranked_slots(self, memory: LookupMemory, anchor_token, position, seed, depth: int):
        """[slot][rank] target ids of the drafter's block (−1: outside its vocabulary), `depth` slots:
        the top `topk` per slot from its log-probabilities, or its chain (one rank) without them; for a
        DFlash2 drafter its selector's ranks given each parent (SelectorRanks)."""
        if self.ranked and hasattr(self.inner, "candidate_selector"):
            return SelectorRanks(self.inner, memory.inner, anchor_token, position, depth, self.drafter_profile.topk)
        if not self.ranked:
            return [[tok] for tok in self.inner_chain(memory, anchor_token, depth, seed, position)]
        _, ids = block_top_k(self.inner, memory.inner, anchor_token, position, seed, self.drafter_profile.topk)
        return ids[:depth].tolist()

    @torch.no_grad()
    def draft_tree(self, memory: LookupMemory, anchor_token: torch.Tensor, position: torch.Tensor, *, depth: int,
                   topk: int, num_nodes: int, seed: Optional[torch.Tensor] = None) -> DraftTree:
        seed = torch.zeros_like(position) if seed is None else seed
        if self._pending is not None:
            self._learn(self._path + [int(anchor_token[0])])
        match = self.lookup(memory, anchor_token, depth)
        shape = self.choose(memory, len(match), depth)
        self.choices[(shape.lookup, shape.drafter)] = self.choices.get((shape.lookup, shape.drafter), 0) + 1
        lookup_chain = match[:shape.lookup]
        plan = shape.plan or tuple(chain_plan(shape.drafter))
        slots = min(depth, self.inner.num_draft_tokens) if self.ranked else max((n.depth for n in plan), default=0)
        ranked = self.ranked_slots(memory, anchor_token, position, seed, slots) if plan else []
        self._pending, self._path = (lookup_chain, ranked), []
        chains = ranked.plan_tokens(plan) if isinstance(ranked, SelectorRanks) else plan_tokens(plan, ranked)
        return merge_chains([lookup_chain] + chains, num_nodes=num_nodes, depth=depth)
