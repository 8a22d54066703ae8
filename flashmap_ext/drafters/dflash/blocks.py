"""Training-time DFlash blocks: many anchors per sequence in one forward (SpecForge-style).

Keys/values are laid out as [context (T positions) | block 0 | block 1 | …], queries as [block 0 | …].
Rules (SpecForge `create_dflash_block_mask`, after PR #473 fixed `<=` to `<`):
  1. block a sees context positions j < anchor_a, strictly (the anchor's taps do not exist at inference);
  2. attention inside a block is bidirectional;
  3. blocks never see each other.
A padded block (anchor −1) sees only itself, so its softmax rows stay finite.
"""
from __future__ import annotations

import torch

from flashmap_ext.drafters.common.base import check_anchors
from flashmap_ext.drafters.common.window import visible_context
from flashmap_ext.drafters.dflash.config import DFlashConfig


def train_block_inputs(input_ids: torch.Tensor, anchor_pos: torch.Tensor,
                       config: DFlashConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Block token ids and absolute positions, both [B, A·block_size] int64.

    Block a = [input_ids[anchor_a], MASK × (block_size−1)] at positions anchor_a … anchor_a+block_size−1
    (a padded block uses anchor 0)."""
    if input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError(f"input_ids must be [B, T] int64, got {tuple(input_ids.shape)} {input_ids.dtype}")
    b, t = input_ids.shape
    check_anchors(anchor_pos, b, t)
    bs = config.block_size
    anchors = anchor_pos.clamp(min=0)
    ids = torch.full((b, anchors.shape[1], bs), config.mask_token_id, dtype=torch.long, device=input_ids.device)
    ids[:, :, 0] = input_ids.gather(1, anchors)
    positions = anchors[:, :, None] + torch.arange(bs, device=anchors.device)
    return ids.flatten(1), positions.flatten(1)


def attention_rule(query_pos: torch.Tensor, key_pos: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor:
    """bool [B, Q, K], True = may attend, for absolute positions query_pos [B, Q] and key_pos [B, K]:
    causal keeps keys at or before the query; a window w keeps keys at distance < w (behind the query,
    and ahead of it too when not causal). z-lab `dflash/model.py::_attention_mask`."""
    q, k = query_pos[:, :, None], key_pos[:, None, :]
    visible = torch.ones(q.shape[0], q.shape[1], k.shape[2], dtype=torch.bool, device=query_pos.device)
    if causal:
        visible &= k <= q
    if window is not None:
        visible &= q - k < window
        if not causal:
            visible &= k - q < window
    return visible


def train_attention_mask(anchor_pos: torch.Tensor, length: int, block_size: int,
                         window: int | None = None) -> torch.Tensor:
    """Dense visibility mask [B, 1, A·bs, T + A·bs] bool (True = may attend) for the layout above; with a
    context window W, rule 1 keeps only anchor_a − W <= j (common/window.py)."""
    b, a = anchor_pos.shape
    device = anchor_pos.device
    context = visible_context(anchor_pos, length, window)                                 # [B, A, T]
    context = context.repeat_interleave(block_size, dim=1)                              # [B, A·bs, T]
    block_of = torch.arange(a * block_size, device=device) // block_size
    own = (block_of[:, None] == block_of[None, :]).expand(b, -1, -1)                    # [B, A·bs, A·bs]
    return torch.cat([context, own], dim=2)[:, None]


def ragged_structure(lengths: torch.Tensor, start: int, window: int | None, block_size: int) -> torch.Tensor:
    """bool [B, 1, bs, max(lengths) − start + bs] for inference over rows of different lengths: the block
    of row b reads its context entries j < lengths[b] (j >= lengths[b] − W with a window W) among
    start..max(lengths) − 1, and its whole block. lengths [B] int64 (CPU)."""
    j = torch.arange(start, int(lengths.max()))[None]
    low = lengths - window if window is not None else torch.zeros_like(lengths)
    context = (j < lengths[:, None]) & (j >= low[:, None])
    visible = torch.cat([context, torch.ones(len(lengths), block_size, dtype=torch.bool)], dim=1)
    return visible[:, None, None, :].expand(-1, 1, block_size, -1)
