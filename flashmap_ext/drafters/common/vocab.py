"""The draft vocabulary: the V_d target ids a drafter proposes from (EAGLE-3's convention, used by all).

Stored as the buffer `d2t` [V_d] int64 of offsets: target id = draft id + d2t[draft id]. A target id
outside the draft vocabulary (or a negative id) maps to the one sentinel IGNORE = −100, which is also the
loss's ignore index. No `d2t` (None) means the full vocabulary: both maps are the identity.
"""
from __future__ import annotations

import torch

IGNORE = -100


class DraftVocab:
    """A view of a drafter's `d2t` buffer (None: the full vocabulary)."""

    def __init__(self, d2t: torch.Tensor | None):
        self.d2t = d2t

    @property
    def target_ids(self) -> torch.Tensor | None:
        """[V_d] int64: the target id of each draft row, or None for the full vocabulary."""
        if self.d2t is None:
            return None
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft rows [...] -> target ids [...]."""
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def to_draft(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target ids [...] -> draft rows [...]; IGNORE for negative ids and ids outside the vocabulary."""
        if self.d2t is None:
            return token_ids
        ids = self.target_ids.to(token_ids.device)
        order = torch.argsort(ids)
        pos = torch.searchsorted(ids[order], token_ids.clamp_min(0)).clamp_max(ids.numel() - 1)
        hit = (token_ids >= 0) & (ids[order][pos] == token_ids)
        return torch.where(hit, order[pos], torch.full_like(pos, IGNORE))

    @staticmethod
    def offsets(token_ids: torch.Tensor, size: int, vocab_size: int | None = None, *,
                sort: bool = True) -> torch.Tensor:
        """d2t [size] int64 for the draft vocabulary `token_ids` (distinct target ids; sorted ascending
        unless sort=False, which keeps the given row order). ValueError naming `token_ids` otherwise."""
        ids = torch.as_tensor(token_ids, dtype=torch.int64).flatten()
        ids = ids.sort().values if sort else ids
        if ids.numel() != size or ids.unique().numel() != ids.numel():
            raise ValueError(f"token_ids: expected {size} distinct ids, got {ids.numel()}")
        if vocab_size is not None and ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token_ids: draft vocabulary ids must be in [0, {vocab_size})")
        return ids - torch.arange(ids.numel(), device=ids.device)
