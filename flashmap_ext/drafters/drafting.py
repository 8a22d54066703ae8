"""`draft_block`: one drafting call for every drafter (DESIGN.md §3.2) — FlashMap, DFlash, EAGLE-3 chains
and the wrappers built on the `BlockDrafter` protocol (drafters/common/base.py) — returning one `DraftBlock`.

K is `drafter.num_draft_tokens` for every drafter: the most draft tokens one call proposes (the verify
block is the anchor + K tokens). It is FlashMap's `block_size` (every slot drafts), DFlash's
`block_size − 1` (its block counts the anchor) and EAGLE-3's `num_draft_tokens` (the chain's length).
"""
from __future__ import annotations

import numbers
from typing import Any

import torch

from flashmap_ext.checks import describe, with_article
from flashmap_ext.drafters.common.base import DraftBlock, check_memory_type, check_token_ids, per_row
from flashmap_ext.drafters.flashmap.draft import draft_flashmap
from flashmap_ext.drafters.flashmap.model import FlashMapDrafter


@torch.no_grad()
def draft_block(drafter: Any, memory: Any, anchor_tokens: torch.Tensor, *, num_tokens: int | None = None,
                seed: torch.Tensor | int = 0, position: torch.Tensor | int | None = None,
                steps: int | None = None, noise: torch.Tensor | None = None,
                return_logits: bool = False) -> DraftBlock:
    """Drafts up to K tokens after each row's anchor (DESIGN.md §3.2).

    drafter: a FlashMapDrafter, DFlashDrafter, Eagle3Drafter (chains) or any `BlockDrafter`.
    memory: `drafter.new_memory(B)` holding every committed position of each row except its anchor
        (`extend_memory`; rows may hold different lengths, `truncate_memory`).
    anchor_tokens: [B] int64, each row's last committed token (not in `memory`).
    num_tokens: drafts per row, 0 <= num_tokens <= K = `drafter.num_draft_tokens` (default K).
    position: [B] int64 tensor or int, each anchor's absolute position = the row's committed length in
        `memory` (a CPU value that disagrees is refused: a missed `extend_memory`). Required, except for
        FlashMap with explicit `noise`. It keys FlashMap's noise and places DFlash's and EAGLE-3's RoPE.
    seed: [B] int64 or int (default 0), the request seed of FlashMap's noise stream (DESIGN.md §5.4):
        the same (seed, position) always drafts the same block, and `generate(..., seed=s)` drafts with
        seed s, so the default reproduces `generate`'s default. A greedy decoder need not pass it: the
        drafts stay deterministic, and verification keeps the output lossless whatever the seed. DFlash
        and EAGLE-3 draft greedily and ignore it.
    steps, noise: FlashMap only (1 or 2 flow-map steps; explicit d-space noise [B, K, d_target]).
    return_logits: also return the logits [B, num_tokens, V_s] fp32 over the draft vocabulary's rows.
    Returns DraftBlock(tokens [B, num_tokens] int64 target ids, logits or None).
    Raises ValueError naming the argument (TypeError for a drafter without the BlockDrafter API, a non-integer
    num_tokens, or a memory another drafter type made); an anchor batch that differs from the memory's, or an anchor id outside the
    target's vocabulary, is named as such (`anchor_tokens`).
    """
    if not all(hasattr(drafter, name) for name in ("num_draft_tokens", "new_memory")):
        raise TypeError(f"drafter: expected a block drafter (FlashMapDrafter, DFlashDrafter, Eagle3Drafter or any "
                        f"BlockDrafter), got {type(drafter).__name__}"
                        + (" (in Python load one with fm.FlashMapDrafter.from_pretrained(path, target))"
                           if isinstance(drafter, str) else ""))
    K = drafter.num_draft_tokens
    num_tokens = K if num_tokens is None else num_tokens
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, numbers.Integral):
        raise TypeError(f"num_tokens: expected an int in [0, {K}], got {num_tokens!r}")
    if not 0 <= num_tokens <= K:
        raise ValueError(f"num_tokens: expected an int in [0, K={K}] (drafter.num_draft_tokens), got {num_tokens}")
    if not isinstance(anchor_tokens, torch.Tensor) or anchor_tokens.dim() != 1 or anchor_tokens.dtype != torch.int64:
        raise ValueError(f"anchor_tokens: expected a [B] int64 tensor (each row's last committed token id), "
                         f"got {describe(anchor_tokens)}")
    if seed is None:
        raise ValueError("seed: expected an int or a [B] int64 tensor (default 0), got None")
    for name, value in (("anchor_tokens", anchor_tokens), ("position", position), ("seed", seed)):
        if isinstance(value, torch.Tensor) and value.is_meta:
            raise ValueError(f"{name}: a meta tensor (no values): pass a cpu or cuda tensor")
    check_memory_type(drafter, memory)
    check_batch(memory, anchor_tokens.shape[0])
    if position is not None:
        check_position(memory, per_row(position, anchor_tokens.shape[0], anchor_tokens.device, "position"))
    if isinstance(drafter, FlashMapDrafter):
        block = draft_flashmap(drafter, memory, anchor_tokens, steps=steps, noise=noise, seed=seed,
                                     position=position, return_logits=return_logits)
        return DraftBlock(block.tokens[:, :num_tokens], None if block.logits is None else block.logits[:, :num_tokens])
    for name, value in (("steps", steps), ("noise", noise)):
        if value is not None:
            raise ValueError(f"{name}: only a FlashMapDrafter takes it, not {with_article(type(drafter).__name__)}")
    if position is None:
        raise ValueError("position: required (the anchors' absolute positions, [B] int64 or an int)")
    vocab_size = getattr(getattr(drafter, "config", None), "vocab_size", None)
    if vocab_size is not None:
        check_token_ids("anchor_tokens", anchor_tokens, vocab_size)
    B, device = anchor_tokens.shape[0], anchor_tokens.device
    args = dict(num_tokens=num_tokens, seed=per_row(seed, B, device, "seed"),
                position=per_row(position, B, device, "position"))
    if not return_logits:
        return DraftBlock(drafter.draft(memory, anchor_tokens, **args), None)
    if not hasattr(drafter, "draft_with_logits"):
        raise ValueError(f"return_logits: {with_article(type(drafter).__name__)} gives no logits")
    tokens, logits = drafter.draft_with_logits(memory, anchor_tokens, **args)
    return DraftBlock(tokens, logits.float())


def check_batch(memory: Any, batch: int) -> None:
    """ValueError when the anchors' batch size differs from the memory's row count (`memory.lengths`, [B],
    where the memory type has it; its shape needs no host sync)."""
    lengths = getattr(memory, "lengths", None)
    if lengths is not None and lengths.shape[0] != batch:
        raise ValueError(f"anchor_tokens: batch {batch}, but the memory has batch {lengths.shape[0]} "
                         f"(drafter.new_memory(batch_size={lengths.shape[0]})): pass one anchor per memory row")


def check_position(memory: Any, position: torch.Tensor) -> None:
    """ValueError when a CPU `position` [B] differs from the committed length of its row in `memory`
    (`memory.lengths`, where the memory type has it); CUDA positions are not read (no host sync)."""
    lengths = getattr(memory, "lengths", None)
    if lengths is None or position.is_cuda or torch.compiler.is_compiling():
        return
    if position.shape != lengths.shape or not torch.equal(position.cpu(), lengths):
        raise ValueError(f"position: {position.tolist()[:8]} disagrees with the memory's committed lengths "
                         f"{lengths.tolist()[:8]} (each anchor sits right after its row's memory: a missed or "
                         f"extra extend_memory?)")
