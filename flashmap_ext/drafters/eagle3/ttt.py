"""EAGLE-3 training-time test (TTT), batched over anchors (arXiv:2503.01840 §3; SafeAILab/EAGLE
`cnets.py`, SpecForge `OnlineEagle3Model.forward`).

Context pairs (g_s, x_{s+1}) get their K/V once for the whole sequence. Each anchor a then unrolls
`steps` drafting steps exactly as at inference (`Eagle3Drafter.chain`): queries only at the anchor,
keys = [context pairs | steps 1 … j−1 of this anchor | itself]. Layout of keys at step j:
[context (T) | chain step 1 (A) | … | chain step j−1 (A) | self (A)], so the mask is a context prefix
mask plus identity blocks. This equals SpecForge's dense TTT (causal over step-0 keys + diagonal over
later steps) evaluated at the anchors only: O(T + steps·A·T) instead of steps dense passes.
"""
from __future__ import annotations

import torch

from flashmap_ext.drafters.common.base import check_anchors


def _gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, T, d], idx [B, A] -> [B, A, d]."""
    return x.gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))


def ttt_forward(drafter, taps: torch.Tensor, input_ids: torch.Tensor, anchor_pos: torch.Tensor,
                steps: int) -> torch.Tensor:
    """See `Eagle3Drafter.forward`. Returns draft-vocab logits [B, A, steps, Vd]."""
    b, t = input_ids.shape
    check_anchors(anchor_pos, b, t)
    width = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    if taps.shape != (b, t, width):
        raise ValueError(f"taps must be [B={b}, T={t}, n_taps·d={width}], got {tuple(taps.shape)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    parts, layer, rotary = drafter.tables, drafter.midlayer, drafter.rotary
    g = drafter.fuse(taps)
    nxt = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], dim=1)       # x_{s+1} (last one: unused)
    cos, sin = rotary(torch.arange(t, device=g.device).expand(b, -1), g.dtype)
    k0, v0 = layer.kv(g, parts.embed(nxt, g.dtype), cos, sin)
    anchors = anchor_pos.clamp(min=0)
    query_pos = (anchors - 1).clamp(min=0)                              # position of the anchor's pair
    hidden = _gather_rows(g, query_pos)
    keys, values, logits = [k0], [v0], []
    eye = torch.eye(anchors.shape[1], dtype=torch.bool, device=g.device)
    for j in range(steps):
        token = input_ids.gather(1, (anchors + j).clamp(max=t - 1))
        cos, sin = rotary(query_pos + j, g.dtype)
        context = torch.arange(t, device=g.device) < (query_pos + (j > 0))[..., None]   # [B, A, T]
        own = eye.repeat(1, len(keys)).expand(b, -1, -1)                # chain steps 1…j−1 and self
        mask = torch.cat([context, own], dim=-1)[:, None]
        out, k, v = layer(hidden, parts.embed(token, g.dtype), cos, sin,
                          torch.cat(keys, dim=2), torch.cat(values, dim=2), mask)
        if j > 0:  # step 0's pair is already the context pair at query_pos
            keys.append(k)
            values.append(v)
        logits.append(drafter.draft_logits(out))
        hidden = drafter.carry(out)
    return torch.stack(logits, dim=2)
