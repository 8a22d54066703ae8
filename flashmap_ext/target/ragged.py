"""A ragged batch in one transformers `DynamicCache` (DESIGN.md §6): B rows of different lengths, each
right-aligned — row b's positions 0 … n_b − 1 fill the last n_b columns, the columns before them are
left padding — so a forward appends every row's new tokens right after its own last position (no holes)
and the cache's width is max(n_b). The three helpers below keep that layout; any HF causal LM with a
padding-aware attention mask (Qwen3, Qwen2, Llama: `attention_mask` [B, width] 1 = real) takes it.

    ids, lengths = left_pad(prompts)                                # prefill
    mask, pos = ragged_inputs(lengths, ids.shape[1])
    model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_kwarg(model): cache})
    drafter.extend_memory(memory, left_align(ids, lengths), left_align(taps, lengths))
    memory.truncate(lengths)                                        # drafter memories are left-aligned
    block = ...                                                     # a round: [B, T] new tokens per row
    lengths = lengths + T; mask, pos = ragged_inputs(lengths, T); model(block, mask, pos, cache)
    lengths = rollback_rows(cache, lengths, T - kept)               # each row keeps its own prefix
"""
from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import DynamicLayer


def left_pad(prompts: Sequence, pad_id: int = 0, device: torch.device | str | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """prompts: B token-id sequences (lists or 1-D int tensors, each non-empty) -> (input_ids [B, S] int64
    left-padded with `pad_id` to the longest S, lengths [B] int64). ValueError naming `prompts` for an
    empty batch or row."""
    rows = [torch.as_tensor(p, dtype=torch.int64).reshape(-1) for p in prompts]
    if not rows or min(r.numel() for r in rows) == 0:
        raise ValueError("prompts: expected a non-empty list of non-empty token-id sequences")
    lengths = torch.tensor([r.numel() for r in rows], dtype=torch.int64)
    ids = torch.full((len(rows), int(lengths.max())), pad_id, dtype=torch.int64)
    for b, r in enumerate(rows):
        ids[b, ids.shape[1] - r.numel():] = r
    return ids.to(device or "cpu"), lengths.to(device or "cpu")


def ragged_inputs(lengths: torch.Tensor, num_new: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's `attention_mask` [B, W] int64 (1 = real position, W = max(lengths)) and
    `position_ids` [B, num_new] int64 (each row's absolute positions; padding columns get 0) for
    `num_new` new columns appended to a right-aligned cache of width W − num_new. lengths: [B] int64,
    each row's length *after* the new tokens."""
    width = int(lengths.max())
    if num_new > width:
        raise ValueError(f"num_new: {num_new} new columns exceed the longest row ({width})")
    cols = torch.arange(width, device=lengths.device)
    mask = (cols[None] >= width - lengths[:, None]).long()
    positions = (lengths[:, None] - num_new + torch.arange(num_new, device=lengths.device)).clamp(min=0)
    return mask, positions


def left_align(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A right-aligned batch x [B, S, ...] (row b's lengths[b] real entries last) with each row's real
    entries moved to the front, [B, S, ...] (what a drafter's `extend_memory` takes: row b's entries at
    its positions 0, 1, ...; the tail is scratch for `truncate` to cut)."""
    S = x.shape[1]
    src = (torch.arange(S, device=x.device)[None] + (S - lengths.to(x.device))[:, None]).clamp(max=S - 1)
    return x.gather(1, src.view(*src.shape, *[1] * (x.dim() - 2)).expand(x.shape))


@torch.no_grad()
def rollback_rows(cache, lengths: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
    """Drops the last num_tokens[b] positions of each row b of a right-aligned DynamicCache in place:
    each row keeps its own prefix, shifted right to stay right-aligned, and the columns that became
    padding in every row are cropped (width = max of the new lengths). lengths, num_tokens: [B] int64
    (0 <= num_tokens <= lengths). Returns the new lengths [B]. Full-attention `DynamicLayer`s only
    (TypeError otherwise, as `Target.keep_positions`); ValueError naming `num_tokens` when out of range."""
    num_tokens = torch.as_tensor(num_tokens, dtype=torch.int64, device=lengths.device)
    if num_tokens.shape != lengths.shape or bool((num_tokens < 0).any() or (num_tokens > lengths).any()):
        raise ValueError(f"num_tokens: expected [B={lengths.numel()}] ints in [0, lengths], got {num_tokens.tolist()}")
    new_lengths = lengths - num_tokens
    width, new_width = int(lengths.max()), int(new_lengths.max())
    # destination column j of row b (of the new width) reads old column j + (width − new_width) − num_tokens[b]
    src = torch.arange(new_width, device=lengths.device)[None] + (width - new_width) - num_tokens[:, None]
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise TypeError(f"rollback_rows supports full-attention DynamicLayer caches, not {type(layer).__name__}")
        if layer.is_initialized:
            if layer.keys.shape[-2] != width:
                raise ValueError(f"lengths: the longest row ({width}) is not the cache's width "
                                 f"({layer.keys.shape[-2]}): the cache is not right-aligned to these lengths")
            index = src.clamp(min=0).to(layer.keys.device)[:, None, :, None]
            layer.keys = layer.keys.gather(-2, index.expand(*layer.keys.shape[:2], new_width, layer.keys.shape[-1]))
            layer.values = layer.values.gather(-2, index.expand(*layer.values.shape[:2], new_width,
                                                                layer.values.shape[-1]))
    return new_lengths
