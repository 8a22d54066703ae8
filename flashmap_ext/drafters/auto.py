"""`AutoDrafter`: each round, the draft shape the cost model expects to be fastest (issue 15, `--auto`).

Per round, with the n-gram match m (prompt lookup, `drafters/lookup.py`) and the wrapped block drafter's
K slots, `cost_model.best_shape` picks plain decoding (no draft: a width-1 verify), a lookup chain of l ≤ m
tokens, a drafter chain of k ≤ K tokens, or both as a two-branch tree, maximising E[γ] / round seconds
under the machine's `CostTable`. The acceptance profiles (lookup and drafter, per slot) start from a
prior and learn online from every round, across calls of the same AutoDrafter. A drafter that cannot pay
even when every draft is accepted is never run (nor is its memory kept); one whose profile says it does
not pay is still tried once every `explore_every` rounds so the profile can recover.

Rounds go through the tree round (`generate(..., tree=auto.tree_spec())`); any shape is verified with the
same lossless multi-draft acceptance, so the output is the target's whatever the choices.
"""
from __future__ import annotations

from typing import Optional

import torch

from flashmap_ext.cost_model import AcceptanceProfile, CostTable, Shape, best_shape
from flashmap_ext.drafters.block_tree import merge_chains
from flashmap_ext.drafters.common.base import TreeSpec
from flashmap_ext.drafters.eagle3.tree import DraftTree
from flashmap_ext.drafters.lookup import LookupDrafter, LookupMemory


class AutoDrafter(LookupDrafter):
    """Args: inner (block drafter or None), table (CostTable of this machine with the inner drafter's
    draft_s / memory_s), drafter_prior / lookup_prior (per-slot acceptance before any round), two_branch
    (allow lookup + drafter trees), explore_every (rounds between forced drafter tries; 0 = never),
    plus LookupDrafter's n-gram settings. `choices` counts the shapes picked as (lookup, drafter) pairs."""

    def __init__(self, inner=None, table: Optional[CostTable] = None, *, drafter_prior: float = 0.5,
                 lookup_prior: float = 0.6, two_branch: bool = True, explore_every: int = 32,
                 num_lookup_tokens: int = 10, max_ngram: int = 2, min_ngram: int = 1):
        super().__init__(inner, num_lookup_tokens=num_lookup_tokens, max_ngram=max_ngram, min_ngram=min_ngram)
        if table is None:
            raise ValueError("AutoDrafter: table (a CostTable of this machine) is required")
        self.table, self.two_branch, self.explore_every = table, two_branch, explore_every
        self.lookup_profile = AcceptanceProfile(lookup_prior)
        self.drafter_profile = AcceptanceProfile(drafter_prior)
        self.choices: dict = {}
        self._pending: Optional[tuple] = None
        self._rounds_without_drafter = 0
        self.drafter_enabled = inner is not None and self.drafter_can_pay()

    def tree_spec(self):
        """The TreeSpec to pass to `generate`: depth = the longest chain, topk 2, nodes = both chains."""
        return TreeSpec(depth=self.num_draft_tokens, topk=2 if self.two_branch else 1,
                        num_nodes=self.num_lookup_tokens + (self.inner.num_draft_tokens if self.inner else 0))

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
        return f"auto: drafter K, lookup and two-branch trees chosen per round ({costs})"

    # --- memory: the inner memory only while the drafter is in use -------------------------------------
    def new_memory(self, batch_size: int, device) -> LookupMemory:
        if batch_size != 1:
            raise ValueError(f"AutoDrafter: batch size 1 only (got {batch_size})")
        self._pending = None
        inner = self.inner.new_memory(1, device) if self.drafter_enabled else None
        return LookupMemory(inner)

    def extend_memory(self, memory: LookupMemory, token_ids: torch.Tensor, taps) -> None:
        if memory.inner is not None:
            self.inner.extend_memory(memory.inner, token_ids, taps)
        memory.token_ids.extend(token_ids[0].tolist())
        if self._pending is not None:
            self._learn(token_ids[0, 1:].tolist())

    def _learn(self, accepted_path: list) -> None:
        lookup_chain, drafter_chain = self._pending
        self._pending = None
        for profile, chain in ((self.lookup_profile, lookup_chain), (self.drafter_profile, drafter_chain)):
            if chain:
                n = 0
                while n < min(len(chain), len(accepted_path)) and chain[n] == accepted_path[n]:
                    n += 1
                profile.record(len(chain), n)

    # --- the round ---------------------------------------------------------------------------------------
    def choose(self, memory: LookupMemory, match_len: int, depth: int) -> Shape:
        active = memory.inner is not None
        shape = best_shape(self.table, self.drafter_profile if active else None, min(depth, self.inner.num_draft_tokens)
                           if active else 0, self.lookup_profile, match_len, self.two_branch, active)
        self._rounds_without_drafter = 0 if shape.drafter or not active else self._rounds_without_drafter + 1
        if active and self.explore_every and self._rounds_without_drafter >= self.explore_every and depth > 0:
            self._rounds_without_drafter = 0
            shape = Shape(0, min(depth, self.inner.num_draft_tokens), 1.0, 1.0)
        return shape

    @torch.no_grad()
    def draft_tree(self, memory: LookupMemory, anchor_token: torch.Tensor, position: torch.Tensor, *, depth: int,
                   topk: int, num_nodes: int, seed: Optional[torch.Tensor] = None) -> DraftTree:
        seed = torch.zeros_like(position) if seed is None else seed
        match = self.lookup(memory, anchor_token, depth)
        shape = self.choose(memory, len(match), depth)
        self.choices[(shape.lookup, shape.drafter)] = self.choices.get((shape.lookup, shape.drafter), 0) + 1
        lookup_chain = match[:shape.lookup]
        drafter_chain = self.inner_chain(memory, anchor_token, shape.drafter, seed, position) if shape.drafter else []
        self._pending = (lookup_chain, drafter_chain)
        return merge_chains([lookup_chain, drafter_chain], num_nodes=num_nodes, depth=depth)
