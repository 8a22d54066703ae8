"""Prompt lookup, alone or as a hybrid around any block drafter.

`lookup_continuation` is transformers' prompt-lookup rule (`PromptLookupCandidateGenerator.get_candidates`,
transformers 5.x): for n from `max_ngram` down to `min_ngram`, take the **leftmost** earlier occurrence of
the sequence's last n tokens that has a non-empty continuation, and propose up to `num_tokens` tokens
after it (they may run into the suffix itself); no match → no proposal.

`LookupDrafter(inner)` proposes that continuation when a match exists and the wrapped block drafter's
tokens otherwise (`inner=None`: prompt lookup alone, nothing otherwise). Its memory is the inner memory,
exactly as the inner drafter would keep it alone, plus the list of committed token ids. With
`generate(..., tree=TreeSpec(depth, topk >= 2, num_nodes))` both proposals go into one two-branch tree
(lookup first), verified in one forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from flashmap_ext.checks import check_int
from flashmap_ext.draft_shapes.block_tree import check_one_sequence, merge_chains
from flashmap_ext.drafters.eagle3.tree import DraftTree


def lookup_continuation(tokens: Sequence[int], num_tokens: int, max_ngram: int = 2, min_ngram: int = 1) -> list:
    """transformers' prompt-lookup proposal for `tokens` (prompt + committed output, anchor last):
    a list of at most `num_tokens` ids ([] when no n-gram of length min_ngram..max_ngram matches)."""
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = list(tokens[length - n:])
        for start in range(length - n):
            if tokens[start] == suffix[0] and list(tokens[start:start + n]) == suffix:
                cont = tokens[start + n:min(start + n + num_tokens, length)]
                if cont:
                    return list(cont)
    return []


@dataclass
class LookupMemory:
    inner: Any                                   # the wrapped drafter's own memory (None without one)
    token_ids: list = field(default_factory=list)   # committed ids (prompt + output, anchor excluded)


class LookupDrafter:
    """Prompt lookup wrapped around a block drafter (or alone): a `BlockDrafter` with `draft_tree`.

    Args:
        inner: a BlockDrafter (FlashMap, DFlash, EAGLE-3 chain, ...) or None (prompt lookup alone).
        num_lookup_tokens: longest n-gram continuation proposed (transformers' `prompt_lookup_num_tokens`).
        max_ngram, min_ngram: n-gram sizes tried, longest first (transformers: 2 and 1).
    Chain rounds (`generate(..., tree=None)`) propose the lookup continuation where a match exists, else
    the inner drafter's tokens; tree rounds add the inner drafter's chain as a second branch when
    `topk >= 2` and nodes are left. Raises ValueError for sizes < 1 or min_ngram > max_ngram.
    """

    def __init__(self, inner=None, *, num_lookup_tokens: int = 10, max_ngram: int = 2, min_ngram: int = 1):
        for name, value in (("num_lookup_tokens", num_lookup_tokens), ("max_ngram", max_ngram),
                            ("min_ngram", min_ngram)):
            check_int(f"LookupDrafter: {name}", value, 1)
        if inner is not None and not all(hasattr(inner, a) for a in ("new_memory", "extend_memory", "draft")):
            raise TypeError(f"LookupDrafter: inner must be a block drafter (new_memory, extend_memory, draft) "
                            f"or None, got {type(inner).__name__}")
        if min(num_lookup_tokens, max_ngram, min_ngram) < 1 or min_ngram > max_ngram:
            raise ValueError(f"num_lookup_tokens, max_ngram, min_ngram must be >= 1 with min_ngram <= max_ngram "
                             f"(got {num_lookup_tokens}, {max_ngram}, {min_ngram})")
        self.inner = inner
        self.num_lookup_tokens, self.max_ngram, self.min_ngram = num_lookup_tokens, max_ngram, min_ngram
        self.num_draft_tokens = max(num_lookup_tokens, inner.num_draft_tokens if inner is not None else 0)
        self.target_layer_ids = tuple(inner.target_layer_ids) if inner is not None else ()

    memory_type = LookupMemory  # what new_memory makes (draft_block refuses another drafter's)

    def new_memory(self, batch_size: int, device=None) -> LookupMemory:
        check_one_sequence(self, batch_size)
        return LookupMemory(self.inner.new_memory(batch_size, device) if self.inner is not None else None)

    def extend_memory(self, memory: LookupMemory, token_ids: torch.Tensor, taps) -> None:
        if not isinstance(token_ids, torch.Tensor) or token_ids.is_floating_point() or token_ids.dtype == torch.bool:
            raise TypeError(f"token_ids: expected a [1, T] tensor of integer token ids, got "
                            f"{getattr(token_ids, 'dtype', type(token_ids).__name__)}")
        if self.inner is not None:
            self.inner.extend_memory(memory.inner, token_ids, taps)
        memory.token_ids.extend(token_ids[0].tolist())

    def lookup(self, memory: LookupMemory, anchor_tokens: torch.Tensor, num_tokens: int) -> list:
        """The n-gram continuation after [committed tokens, anchor] (at most `num_tokens` ids; [] if none)."""
        n = min(num_tokens, self.num_lookup_tokens)
        return lookup_continuation(memory.token_ids + [int(anchor_tokens[0])], n, self.max_ngram, self.min_ngram)

    def inner_chain(self, memory: LookupMemory, anchor_tokens, num_tokens: int, seed, position) -> list:
        """The inner drafter's first `num_tokens` drafts up to its first invalid (-1) slot ([] without one)."""
        k = min(num_tokens, self.inner.num_draft_tokens) if self.inner is not None else 0
        if k <= 0:
            return []
        drafts = self.inner.draft(memory.inner, anchor_tokens, num_tokens=k, seed=seed, position=position)[0].tolist()
        return drafts[:drafts.index(-1)] if -1 in drafts else drafts

    def draft(self, memory: LookupMemory, anchor_tokens: torch.Tensor, *, num_tokens: int, seed, position) -> torch.Tensor:
        """[1, n] int64 with n <= num_tokens: the lookup continuation if any, else the inner drafter's."""
        chain = self.lookup(memory, anchor_tokens, num_tokens) or self.inner_chain(
            memory, anchor_tokens, num_tokens, seed, position)
        return torch.tensor([chain], dtype=torch.int64, device=anchor_tokens.device).view(1, len(chain))

    def draft_tree(self, memory: LookupMemory, anchor_token: torch.Tensor, position: torch.Tensor, *, depth: int,
                   topk: int, num_nodes: int, seed: Optional[torch.Tensor] = None) -> DraftTree:
        """Lookup chain (if a match) and, with topk >= 2 or no match, the inner drafter's chain, merged into
        a prefix tree of at most `num_nodes` nodes and `depth` levels (lookup nodes first at equal depth)."""
        seed = torch.zeros_like(position) if seed is None else seed
        chains = [self.lookup(memory, anchor_token, depth)]
        if topk >= 2 or not chains[0]:
            chains.append(self.inner_chain(memory, anchor_token, depth, seed, position))
        return merge_chains(chains, num_nodes=num_nodes, depth=depth)
