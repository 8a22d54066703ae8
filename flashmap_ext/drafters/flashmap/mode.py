"""Mode-seeking FlashMap drafting (DESIGN.md §4): several noise draws, the block the drafter itself rates best.

At T = 0 the verifier accepts the leading run of draft tokens that equal the target's greedy chain, so a
point-mass draft is worth most at the mode, while one FlashMap draw is a sample. `draft_best_of` drafts `draws`
blocks from independent noise draws (draw 0 is exactly the single draw of `draft_flashmap` with the same seed) and
keeps, per row, the block with the highest expected accepted length under the drafter's own per-slot
probabilities p_k = softmax(logits_k)[d_k]:

    score(d) = Σ_{j=1..K} Π_{k≤j} p_k          (ties: the lowest draw index)

Verification is unchanged, so decoding stays lossless at any temperature; only the proposal changes.
"""
from __future__ import annotations

import torch

from flashmap_ext.checks import check_int
from flashmap_ext.drafters.flashmap.draft import draft_flashmap

#: seed offset between draws (a prime, far from request seeds); seeds wrap inside [0, 2**63)
DRAW_SEED_STRIDE = 1_000_033
_SEED_MAX = 2**63 - 1


def draw_seed(seed, i: int):
    """The Philox key of draw i: seed + i·DRAW_SEED_STRIDE wrapped into [0, 2**63) (int or int64 tensor)."""
    off = i * DRAW_SEED_STRIDE
    if isinstance(seed, torch.Tensor):
        return torch.where(seed > _SEED_MAX - off, seed - (_SEED_MAX - off) - 1, seed + off)
    return seed + off if seed <= _SEED_MAX - off else seed - (_SEED_MAX - off) - 1


def own_acceptance(logits: torch.Tensor) -> torch.Tensor:
    """[B, K, V] logits → [B] Σ_j Π_{k≤j} max softmax_k: the block's expected accepted length if the drafter's
    own per-slot probabilities were the verifier's (fp32)."""
    p = torch.softmax(logits.float(), dim=-1).amax(dim=-1)
    return torch.cumprod(p, dim=-1).sum(dim=-1)


@torch.no_grad()
def draft_best_of(drafter, memory, anchor_tokens: torch.Tensor, *, draws: int, seed, position,
                  steps: int | None = None) -> torch.Tensor:
    """[B, K] int64 target ids: the best of `draws` FlashMap blocks by `own_acceptance` (module docstring).

    draws: ≥ 1 (1 is `draft_flashmap` itself). seed, position: as `draft_flashmap` (draw i uses `draw_seed(seed, i)`).
    Raises ValueError naming `draws`, or what `draft_flashmap` raises for its arguments.
    """
    check_int("draws", draws, 1, 1 << 16)
    best_tokens, best_score = None, None
    for i in range(draws):
        block = draft_flashmap(drafter, memory, anchor_tokens, steps=steps, seed=draw_seed(seed, i),
                            position=position, return_logits=draws > 1)
        if draws == 1:
            return block.tokens
        score = own_acceptance(block.logits)
        if best_tokens is None:
            best_tokens, best_score = block.tokens.clone(), score
            continue
        better = score > best_score
        best_tokens = torch.where(better[:, None], block.tokens, best_tokens)
        best_score = torch.where(better, score, best_score)
    return best_tokens
