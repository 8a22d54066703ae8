"""Random supervised anchors, their labels, and the training batch every drafter loss consumes (DESIGN.md §8).

An anchor `a` plays the role of the last committed token at inference: the drafter sees the target's taps
strictly before `a` (its own hidden state does not exist yet), the token `input_ids[a]`, and predicts the
K tokens at a+1 … a+K. Candidate anchors are positions where `loss_mask[a]` and `loss_mask[a+1]` are both
set (a response token followed by another: the anchor is always something the target emitted), as in the
DFlash recipe (DESIGN.md §8). Labels past the sequence end or where the loss mask is 0 are −100.

Batch format (a dict of tensors):
    input_ids  [B, T]        int64   right-padded with 0
    taps       [B, T, F]     float   F = n_taps · d_target, zero-padded
    anchor_pos [B, A]        int64   sorted per row, −1 = padded block (no anchor)
    labels     [B, A, K]     int64   tokens at anchor_pos+1 … anchor_pos+K, −100 = no loss
  with soft labels (items carry "topk_logp"/"topk_ids", a cache made with `features --topk k`):
    soft_logp  [B, A, K, k+1] fp16   the target's distribution of label (a, s): its top-k log-probs at
                                     position a+s (which predicts a+1+s) and the rest's log-mass
    soft_ids   [B, A, K, k]  int64   their target ids, −1 where the label is −100
"""
from __future__ import annotations

from typing import Sequence

import torch

IGNORE = -100


def candidate_anchors(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a with loss_mask[a] and loss_mask[a+1] set. loss_mask: [T] bool -> [n] int64 ascending."""
    m = loss_mask.bool()
    return torch.nonzero(m[:-1] & m[1:]).flatten()


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Up to `num_anchors` distinct candidate anchors drawn uniformly without replacement, sorted.

    loss_mask: [T] bool. Returns [min(num_anchors, #candidates)] int64 (CPU). Raises ValueError for
    num_anchors < 1.
    """
    if num_anchors < 1:
        raise ValueError(f"num_anchors must be >= 1 (got {num_anchors})")
    cand = candidate_anchors(loss_mask.cpu())
    pick = torch.randperm(len(cand), generator=generator)[:num_anchors]
    return cand[pick].sort().values


def block_labels(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchor_pos: torch.Tensor, k: int) -> torch.Tensor:
    """labels[j, i] = input_ids[anchor_pos[j] + 1 + i] where that position exists and is supervised, else −100.

    input_ids: [T] int64, loss_mask: [T] bool, anchor_pos: [A] int64 (−1 = padded: all −100) -> [A, K] int64.
    """
    t = input_ids.shape[0]
    pos = anchor_pos[:, None] + torch.arange(1, k + 1)
    ok = (anchor_pos[:, None] >= 0) & (pos < t)
    safe = pos.clamp(0, t - 1)
    ok &= loss_mask.bool()[safe]
    return torch.where(ok, input_ids[safe], torch.full_like(safe, IGNORE))


def block_soft_labels(topk_logp: torch.Tensor, topk_ids: torch.Tensor, labels: torch.Tensor,
                      anchor_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(soft_logp [A, K, k+1], soft_ids [A, K, k]) of one sequence: label (j, s) = the target's distribution
    at position anchor_pos[j] + s, which predicts the token at anchor_pos[j] + 1 + s; ids −1 where
    labels [A, K] is −100. topk_logp [T, k+1], topk_ids [T, k] (features.FeatureCache items)."""
    t, k = topk_ids.shape
    pos = (anchor_pos.clamp_min(0)[:, None] + torch.arange(labels.shape[1])).clamp_max(t - 1)
    ids = torch.where((labels != IGNORE)[..., None], topk_ids[pos], torch.full((k,), -1, dtype=torch.long))
    return topk_logp[pos], ids


def collate(items: Sequence[dict], num_anchors: int, block_size: int,
            generator: torch.Generator | None = None, taps_dtype: torch.dtype | None = None) -> dict:
    """Pads sequences (dicts with input_ids [T], loss_mask [T], taps [T, F]) into one batch (module docstring).

    A = the largest number of anchors drawn for any row (≤ num_anchors); K = block_size. `taps_dtype`
    casts the taps (default: keep the cache dtype). Items with "topk_logp"/"topk_ids" add the soft labels.
    Raises ValueError when items disagree on F or are empty.
    """
    if not items:
        raise ValueError("collate: no items")
    feats = {it["taps"].shape[-1] for it in items}
    if len(feats) != 1:
        raise ValueError(f"collate: items have different feature widths {sorted(feats)}")
    b, t = len(items), max(it["input_ids"].shape[0] for it in items)
    anchors = [sample_anchors(it["loss_mask"], num_anchors, generator) for it in items]
    a = max(1, max(len(x) for x in anchors))
    input_ids = torch.zeros(b, t, dtype=torch.long)
    taps = torch.zeros(b, t, feats.pop(), dtype=taps_dtype or items[0]["taps"].dtype)
    anchor_pos = torch.full((b, a), -1, dtype=torch.long)
    labels = torch.full((b, a, block_size), IGNORE, dtype=torch.long)
    soft = all("topk_ids" in it for it in items)
    if soft:
        k = items[0]["topk_ids"].shape[-1]
        soft_logp = torch.zeros(b, a, block_size, k + 1, dtype=items[0]["topk_logp"].dtype)
        soft_ids = torch.full((b, a, block_size, k), -1, dtype=torch.long)
    for i, (it, anc) in enumerate(zip(items, anchors)):
        n = it["input_ids"].shape[0]
        input_ids[i, :n], taps[i, :n] = it["input_ids"], it["taps"]
        anchor_pos[i, :len(anc)] = anc
        labels[i, :len(anc)] = block_labels(it["input_ids"], it["loss_mask"], anc, block_size)
        if soft and len(anc):
            soft_logp[i, :len(anc)], soft_ids[i, :len(anc)] = block_soft_labels(
                it["topk_logp"], it["topk_ids"], labels[i, :len(anc)], anc)
    batch = {"input_ids": input_ids, "taps": taps, "anchor_pos": anchor_pos, "labels": labels}
    return {**batch, "soft_logp": soft_logp, "soft_ids": soft_ids} if soft else batch
